"""Meta-tests: every hook, every Strategy decision point, every public engine method and every cost estimate is
documented in docs/plugins.md with its exact signature and exercised by a test; the walk-throughs quote their
example packages verbatim; the doc's 40-line example is a working plugin."""

import importlib.util
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from specterbench import Strategy
from specterbench.engine.engine import Engine
from specterbench.engine.estimates import CostEstimates
from specterbench.plugins import hookspecs
from specterbench.testing import conformance
from specterbench.testing.lab import Lab

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins.md"
HOOKS = {name: fn for name, fn in vars(hookspecs).items()
         if name.startswith("specterbench_") and inspect.isfunction(fn)}
DECISION_POINTS = sorted(name for name, value in vars(Strategy).items()
                         if not name.startswith("_") and callable(getattr(Strategy, name)))
# Engine methods the runner and the seam call: listed in their own section, not one heading each.
RUNNER_ONLY = ("configure", "begin_request", "begin_warmup", "end_warmup", "run_moe_layer", "start_recording",
               "stop_recording", "set_precision", "end_cell", "setup_graphs")


def public_methods(cls) -> dict:
    """Public functions of ``cls`` and the package's classes it is built from (plain, static and class methods; not
    properties): a method a mixin such as :class:`~specterbench.engine.cell_setup.CellSetup` gives the engine counts."""
    out = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("specterbench"):
            continue
        for name, member in vars(klass).items():
            fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if not name.startswith("_") and inspect.isfunction(fn):
                out[name] = (fn, not isinstance(member, staticmethod))
    return out


ENGINE = public_methods(Engine)
COSTS = public_methods(CostEstimates)


def headings() -> set[str]:
    return {line.lstrip("#").strip().strip("`") for line in DOC.read_text().splitlines() if line.startswith("#")}


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def signature(fn, skip_self: bool = False) -> str:
    """``name(a, b=None)``: parameter names and defaults, without annotations."""
    params = list(inspect.signature(fn).parameters.values())[1 if skip_self else 0:]
    parts = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params]
    return f"{fn.__name__}({', '.join(parts)})"


def test_the_hookspecs_are_found():
    assert {"specterbench_register_strategies", "specterbench_run_start", "specterbench_environment"} <= set(HOOKS)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_has_a_heading_with_its_exact_signature(name):
    expected = signature(HOOKS[name])
    assert expected in headings(), f"docs/plugins.md needs a heading `### {expected}`"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_is_exercised_by_a_test(name):
    tests = [p for p in (ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name]
    users = [p.name for p in tests if name in p.read_text()]
    assert users, f"no test under tests/ mentions {name}; write one that implements or calls it"


@pytest.mark.parametrize("name", DECISION_POINTS)
def test_every_strategy_decision_point_has_a_heading_with_its_signature(name):
    member = inspect.getattr_static(Strategy, name)
    fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
    expected = "Strategy." + signature(fn, skip_self=not isinstance(member, staticmethod))
    assert expected in headings(), f"docs/plugins.md needs a heading `### {expected}`"


@pytest.mark.parametrize("name", sorted(set(ENGINE) - set(RUNNER_ONLY)))
def test_every_engine_method_a_strategy_may_call_has_a_heading_with_its_signature(name):
    fn, bound = ENGINE[name]
    expected = "engine." + signature(fn, skip_self=bound)
    assert expected in headings(), f"docs/plugins.md needs a heading `### {expected}`"


@pytest.mark.parametrize("name", RUNNER_ONLY)
def test_the_engine_methods_of_the_runner_are_listed_as_such(name):
    assert name in ENGINE, f"Engine.{name} is gone: update RUNNER_ONLY and the doc"
    text = section("What a strategy may ask and do: the engine")
    part = text[text.index("### Called by the runner and the seam, not by strategies"):]
    assert f"`engine.{name}(" in part


@pytest.mark.parametrize("name", sorted(COSTS))
def test_every_cost_estimate_has_a_heading_with_its_signature(name):
    fn, bound = COSTS[name]
    expected = "engine.costs." + signature(fn, skip_self=bound)
    assert expected in headings(), f"docs/plugins.md needs a heading `### {expected}`"


@pytest.mark.parametrize("owner, cls", [("engine", Engine), ("engine.costs", CostEstimates)])
def test_every_public_property_is_documented(owner, cls):
    properties = [n for n, v in vars(cls).items() if isinstance(v, property) and not n.startswith("_")]
    text = DOC.read_text()
    assert properties and not [n for n in properties if f"`{owner}.{n}`" not in text]


def exercised(name: str) -> list[str]:
    """Test files (this one aside) that call or define ``name``."""
    pattern = re.compile(rf"(\.|def ){re.escape(name)}\(")
    files = [p for p in (ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name]
    files += list((ROOT / "plugins").glob("*/tests/test_*.py"))
    return [p.name for p in files if pattern.search(p.read_text())]


@pytest.mark.parametrize("name", sorted({*DECISION_POINTS, *(f"engine.{n}" for n in ENGINE),
                                         *(f"engine.costs.{n}" for n in COSTS)}))
def test_every_strategy_method_engine_method_and_cost_estimate_is_exercised_by_a_test(name):
    assert exercised(name.rsplit(".", 1)[-1]), f"no test calls or implements {name}; write one"


WALKTHROUGHS = {"An ARC cache": "examples/arc/specterbench_example_arc/__init__.py",
                "A router predictor that prefetches in time":
                    "examples/router_prefetch/specterbench_router_prefetch/__init__.py",
                "Speculative strategies": "examples/draft_verify/specterbench_draft_verify/__init__.py"}


@pytest.mark.parametrize("title", sorted(WALKTHROUGHS))
def test_a_walkthrough_quotes_its_example_package_verbatim(title):
    source = (ROOT / WALKTHROUGHS[title]).read_text()
    blocks = code_blocks(section(title), "python")
    assert blocks, f"section {title!r} shows no code"
    for block in blocks:
        assert block in source, f"a code block of {title!r} is not in {WALKTHROUGHS[title]} as written:\n{block}"


def test_the_example_pyproject_declares_the_entry_point():
    (toml,) = code_blocks(section("Write a strategy in 40 lines"), "toml")
    data = tomllib.loads(toml)
    assert data["project"]["entry-points"]["specterbench"] == {"cyclic": "specterbench_cyclic"}


def test_the_example_strategy_fits_in_40_lines_and_passes_conformance_checks(host, tmp_path):
    (source,) = code_blocks(section("Write a strategy in 40 lines"), "python")
    assert len(source.strip().splitlines()) <= 40
    path = tmp_path / "specterbench_cyclic.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("specterbench_cyclic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    host.register(module, "cyclic")
    lab = Lab(host, tmp_path / "runs")
    conformance.test_no_expert_in_use_is_evicted("cyclic", lab)  # runs at 35%, 50% and 60%
    conformance.test_budget_is_never_exceeded("cyclic", lab)
    conformance.test_tokens_are_lossless_on_every_family("cyclic", "mixtral", lab)
    assert {r.status for r in lab.run("cyclic", budgets=conformance.LOW_BUDGETS).rows} == {"ok"}


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_every_link_inside_the_doc_points_at_a_heading():
    anchors = {slug(title) for title in headings()}
    links = re.findall(r"\]\(#([^)]+)\)", DOC.read_text())
    assert links and not [a for a in links if a not in anchors]


def test_every_relative_link_of_the_doc_exists():
    targets = re.findall(r"\]\((\.\./[^)#]+)\)", DOC.read_text())
    assert targets and not [t for t in targets if not (DOC.parent / t).exists()]
