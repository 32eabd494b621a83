"""The example plugin packages under examples/ (walked through in docs/plugins.md): each installs through its entry
point like a third-party package, passes the registration checks and the conformance rules, and does what its doc
says — ARC's lists and ghosts, the router predictor's in-time rule, and speculative decoding written outside the
package that is lossless under greedy and sampled decoding."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.engine.routing import RouterGuess
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.plugins.checks import check_strategy
from specterbench.plugins.registry import BLOCK_ENV
from specterbench.testing import conformance
from specterbench.testing.lab import Lab

ROOT = Path(__file__).resolve().parents[2]
# strategy -> dir
EXAMPLES = {"example-arc": "arc", "router-prefetch": "router_prefetch", "draft-verify": "draft_verify"}


def fake_install(root: Path) -> list[str]:
    """A ``.dist-info`` per example under ``root`` (what ``pip install -e examples/X`` leaves) and the folders to
    put on ``sys.path``."""
    paths = [str(root)]
    for folder in EXAMPLES.values():
        project = tomllib.loads((ROOT / "examples" / folder / "pyproject.toml").read_text())["project"]
        info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                       f"Version: {project['version']}\n")
        (info / "entry_points.txt").write_text("[specterbench]\n" + "".join(
            f"{k} = {v}\n" for k, v in project["entry-points"]["specterbench"].items()))
        paths.append(str(ROOT / "examples" / folder))
    return paths


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    from specterbench.plugins.host import PluginHost, reset_host

    paths = fake_install(tmp_path_factory.mktemp("site"))
    sys.path[:0] = paths
    blocked = os.environ.get(BLOCK_ENV)  # the suite blocks plugins it did not install (tests/conftest.py)
    if blocked is not None:
        ours = {ep for folder in EXAMPLES.values() for ep in tomllib.loads(
            (ROOT / "examples" / folder / "pyproject.toml").read_text())["project"]["entry-points"]["specterbench"]}
        os.environ[BLOCK_ENV] = ",".join(b for b in blocked.split(",") if b.strip() not in ours)
    reset_host()
    yield PluginHost(), paths
    if blocked is not None:
        os.environ[BLOCK_ENV] = blocked
    del sys.path[:len(paths)]
    for name in [m for m in sys.modules if m.startswith(("specterbench_example_arc", "specterbench_router_prefetch",
                                                          "specterbench_draft_verify"))]:
        del sys.modules[name]
    reset_host()


@pytest.fixture(scope="module")
def lab(installed, tmp_path_factory):
    return Lab(installed[0], tmp_path_factory.mktemp("labs"))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_declares_its_strategy_as_its_entry_point(name):
    project = tomllib.loads((ROOT / "examples" / EXAMPLES[name] / "pyproject.toml").read_text())
    (module,) = project["project"]["entry-points"]["specterbench"].values()
    assert list(project["project"]["entry-points"]["specterbench"]) == [name]
    assert (ROOT / "examples" / EXAMPLES[name] / module / "__init__.py").is_file()
    assert project["tool"]["setuptools"]["packages"] == [module]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_registers_through_its_entry_point_and_passes_the_checks(name, installed):
    entry = installed[0].strategies().entry(name)
    project = tomllib.loads((ROOT / "examples" / EXAMPLES[name] / "pyproject.toml").read_text())["project"]
    assert (entry.plugin.source, entry.plugin.distribution) == ("entry point", project["name"])
    check_strategy(entry.obj, entry.plugin.name)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_keeps_the_budget_spares_experts_in_use_and_is_lossless(name, lab):
    conformance.test_budget_is_never_exceeded(name, lab)  # 35% and 50% (skipped where refused), then 60%
    conformance.test_no_expert_in_use_is_evicted(name, lab)
    conformance.test_tokens_are_lossless_on_every_family(name, "mixtral", lab)  # the default: sampled decode
    conformance.test_runs_are_deterministic_with_a_seed(name, lab)
    conformance.test_state_resets_between_requests(name, lab)


def test_the_battery_runs_on_an_installed_example_from_the_command_line(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(installed[1] + [os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--specterbench-strategy=example-arc", "-k", "name_and_a_version"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


# ---- draft-verify: speculative decoding from outside the package -------------------------------------------

@pytest.mark.parametrize("decode", [GREEDY, DecodeSetting.sample(temperature=1.0)], ids=["greedy", "sampled"])
def test_draft_verify_is_lossless_under_greedy_and_sampled_decode(decode, installed, small_prompts, tmp_path):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("draft-verify",),
                         budgets=(parse_budget("60%"),), profile="a100-40g-pcie4", prompts=2, tokens=10,
                         decode=decode, strategy_options={"draft-verify": {"k": 3}})
    (row,) = Runner(installed[0], config, tmp_path).run()
    assert row.status == "ok" and row.lossless, row.error or row.first_divergence
    assert 0 < row.extra["acceptance_rate"] <= 1  # the draft agrees sometimes: windows emitted several tokens
    assert row.strategy_device_bytes > 0  # the draft is charged to the budget


# ---- the two documented strategies, decision by decision ---------------------------------------------------

class FakeCache(set):
    capacity_bytes = 2
    free_bytes = 0


class FakeEngine:
    """What the two strategies read: sizes, the cache, and (router-prefetch) a router guess and cost estimates."""

    num_layers, num_experts, top_k, expert_bytes = 2, 4, 2, 1

    def __init__(self, arrival_s=0.0, until_s=1.0):
        self.cache, self.prefetched = FakeCache(), []
        self.costs = type("Costs", (), {"copy_arrival_s": lambda _, priority=None: arrival_s + 0.1 * len(
            self.prefetched), "until_layer_s": lambda _, layer: until_s})()

    def router_guess(self, layer):  # one token whose router prefers experts 2, then 0
        logits = torch.tensor([[1.0, 0.0, 3.0, -1.0]])  # [T, E]
        weights, index = logits.softmax(-1).topk(2)
        return RouterGuess(layer, logits, weights, index)

    def make_room(self, nbytes, protect=(), needed=None):
        return True

    def prefetch(self, key, priority=0.0):
        self.prefetched.append((key, priority))
        return True


def strategy(name, engine, **options):
    cls = {"example-arc": "specterbench_example_arc:ARC",
           "router-prefetch": "specterbench_router_prefetch:RouterPrefetch"}[name]
    module, attr = cls.split(":")
    s = getattr(__import__(module), attr)(**options)
    s.attach(engine)
    return s


def test_arc_evicts_from_recency_until_a_ghost_hit_favours_it(installed):
    arc = strategy("example-arc", FakeEngine())
    arc.before_layer(0, [1, 2], [1, 1])  # T1: (0,1), (0,2)
    arc.before_layer(0, [2], [1])  # seen again: (0,2) is frequent
    assert arc.choose_victim([(0, 1), (0, 2)], needed=(0, 3)) == (0, 1)  # T1 over its target p = 0
    assert list(arc.b1) == [(0, 1)]
    arc.before_layer(0, [1], [1])  # a ghost hit in B1: recency was evicted too early
    assert arc.p == 1.0 and list(arc.t2) == [(0, 2), (0, 1)]


def test_arc_falls_back_to_the_least_recently_used_candidate(installed):
    arc = strategy("example-arc", FakeEngine())
    assert arc.choose_victim([(1, 3), (1, 0)], needed=None) == (1, 3)


def test_router_prefetch_copies_the_likeliest_experts_of_the_next_layer_first(installed):
    engine = FakeEngine(arrival_s=0.0, until_s=1.0)
    s = strategy("router-prefetch", engine)
    s.before_layer(0, [1], [1])
    assert [key for key, _ in engine.prefetched] == [(1, 2), (1, 0)]  # by router probability
    assert {p for _, p in engine.prefetched} == {-1}  # earlier layers first; demand outranks it
    s.before_layer(1, [0], [1])  # the last layer: nothing after it to prefetch for
    assert len(engine.prefetched) == 2


def test_router_prefetch_skips_copies_that_would_land_after_the_layer_runs(installed):
    engine = FakeEngine(arrival_s=0.95, until_s=1.0)  # the first copy lands in time, the second 0.1 s later
    s = strategy("router-prefetch", engine)
    s.before_layer(0, [1], [1])
    assert [key for key, _ in engine.prefetched] == [(1, 2)] and s.skipped_late == 1
    late = strategy("router-prefetch", FakeEngine(arrival_s=0.95, until_s=1.0), slack=2.0)
    late.before_layer(0, [1], [1])
    assert late.issued == 2  # slack 2: copies landing up to twice the time left are still made
