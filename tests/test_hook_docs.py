"""Meta-tests: every hook and every Strategy decision point is documented in docs/plugins.md with its exact
signature, every hook is exercised by a test, and the doc's 40-line example is a working plugin."""

import importlib.util
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from specterbench import Strategy, conformance, hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
HOOKS = {name: fn for name, fn in vars(hookspecs).items() if name.startswith("specterbench_") and inspect.isfunction(fn)}
DECISION_POINTS = sorted(name for name, value in vars(Strategy).items()
                         if not name.startswith("_") and callable(getattr(Strategy, name)))


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
    lab = conformance.Lab(host, tmp_path / "runs")
    conformance.test_no_expert_in_use_is_evicted("cyclic", lab)  # runs at 35%, 50% and 60%
    conformance.test_budget_is_never_exceeded("cyclic", lab)
    conformance.test_tokens_are_lossless_on_every_family("cyclic", "mixtral", lab)
    assert {r.status for r in lab.run("cyclic", budgets=conformance.LOW_BUDGETS).rows} == {"ok"}
