"""The conformance battery (``pytest --specterbench-strategy=NAME``) passes a good strategy and catches bad ones."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from specterbench import Strategy, hookimpl
from specterbench.testing import conformance
from specterbench.testing.lab import Lab
from specterbench.testing.pytest_plugin import install_dist

# Strategies that each break one rule of the battery, installed as a real distribution (entry point and all).
BROKEN = '''
import random

from specterbench import Strategy, hookimpl


class OverBudget(Strategy):
    """Grows its cache behind the engine's back."""

    name = "broken-over-budget"
    version = "1"

    def attach(self, engine):
        super().attach(engine)
        engine.cache.capacity_bytes *= 2


class EvictsInUse(Strategy):
    """On a miss, evicts another expert the running layer is routed to (tokens stay right: the engine refetches)."""

    name = "broken-evicts-in-use"
    version = "1"

    def before_layer(self, layer, experts, tokens_per_expert):
        self.routed = [(layer, e) for e in experts]

    def on_miss(self, key):
        for other in self.routed:
            if other != key and other in self.engine.evictable():
                self.engine.evict(other)
                return


class Nondeterministic(Strategy):
    """Evicts at random from an unseeded source."""

    name = "broken-nondeterministic"
    version = "1"

    def choose_victim(self, candidates, needed):
        return random.SystemRandom().choice(candidates)


class LeaksState(Strategy):
    """Carries the last token of one request into the next."""

    name = "broken-leaks-state"
    version = "1"
    last = None

    def generate(self, engine, request):
        tokens = engine.greedy_decode(request)
        first, self.last = self.last, tokens[-1]
        return tokens if first is None else [first] + tokens[1:]


@hookimpl
def specterbench_register_strategies(register):
    for cls in (OverBudget, EvictsInUse, Nondeterministic, LeaksState):
        register(cls)
'''

RULES = ("test_reports_a_name_and_a_version", "test_budget_is_never_exceeded", "test_no_expert_in_use_is_evicted",
         "test_runs_are_deterministic_with_a_seed", "test_state_resets_between_requests")
CAUGHT = [  # (strategy, the one rule it breaks, what the failure says)
    ("broken-over-budget", "test_budget_is_never_exceeded", "cache capacity changed"),
    ("broken-evicts-in-use", "test_no_expert_in_use_is_evicted", "which the running layer is routed to"),
    ("broken-nondeterministic", "test_runs_are_deterministic_with_a_seed", "two runs with seed 1234 gave"),
    ("broken-leaks-state", "test_state_resets_between_requests", "reset per-request state in on_request_start"),
]

# the engine refuses these at run time too (their cells end in an error row), so every rule that runs them fails
REFUSED_AT_RUN_TIME = {"broken-evicts-in-use"}


def run_pytest(cwd, *args, pythonpath=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    """One battery run, from an empty directory, over the broken strategies and ``lru`` as the control."""
    site = install_dist(tmp_path_factory.mktemp("site"), "specterbench-broken-examples",
                        "specterbench_broken_examples", BROKEN, "broken")
    empty = tmp_path_factory.mktemp("empty")
    report = empty.parent / "battery.xml"
    names = ",".join(["lru"] + [name for name, _, _ in CAUGHT])
    proc = run_pytest(empty, f"--specterbench-strategy={names}", "-k", " or ".join(RULES),
                      f"--junitxml={report}", pythonpath=site)
    if not report.exists():
        pytest.fail(f"the battery did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        outcome = "failed" if bad is not None else "skipped" if skipped is not None else "passed"
        message = (bad.get("message", "") + (bad.text or "")) if bad is not None else ""
        outcomes[case.get("name")] = (outcome, message)
    return proc, outcomes


def test_the_battery_runs_from_an_empty_directory_through_the_pytest11_entry_point(battery):
    proc, outcomes = battery
    assert proc.returncode == 1  # the broken strategies fail; nothing errors
    assert {f"{rule}[lru]" for rule in RULES} <= set(outcomes)


def test_a_good_strategy_passes_every_rule(battery):
    _, outcomes = battery
    assert {rule: outcomes[f"{rule}[lru]"][0] for rule in RULES} == {rule: "passed" for rule in RULES}


@pytest.mark.parametrize("strategy, rule, message", CAUGHT, ids=[c[0] for c in CAUGHT])
def test_a_broken_strategy_fails_exactly_the_rule_it_breaks(battery, strategy, rule, message):
    _, outcomes = battery
    outcome, text = outcomes[f"{rule}[{strategy}]"]
    assert outcome == "failed" and message in text, text
    if strategy in REFUSED_AT_RUN_TIME:
        return
    others = {r: outcomes[f"{r}[{strategy}]"][0] for r in RULES if r != rule}
    assert set(others.values()) == {"passed"}, others


def test_an_unknown_strategy_is_a_usage_error_with_a_suggestion(tmp_path):
    proc = run_pytest(tmp_path, "--specterbench-strategy=lur")
    assert proc.returncode == 4
    assert "--specterbench-strategy: unknown strategy 'lur'; did you mean 'lru'" in proc.stderr


# ---- the watch and the lab, in process -----------------------------------------------------------------

@pytest.fixture
def lab_with(host, tmp_path):
    """``lab_with(*classes)``: a conformance Lab over the plugins plus an in-process plugin registering them."""

    def make(*classes):
        class Plugin:
            @hookimpl
            def specterbench_register_strategies(self, register):
                for cls in classes:
                    register(cls)

        host.register(Plugin(), "conformance-test-plugin")
        return Lab(host, tmp_path)

    return make


def test_the_watch_sees_slots_changed_behind_the_ledger(lab_with):
    class Sneaky(Strategy):
        name = "sneaky"
        version = "1"

        def after_layer(self, layer, experts):
            cache = self.engine.cache
            if cache.slots:
                cache.slots.pop(next(iter(cache.slots)))  # no remove(): the ledger still counts it

    lab = lab_with(Sneaky)
    with pytest.raises(pytest.fail.Exception, match="slots changed behind insert"):
        conformance.test_budget_is_never_exceeded("sneaky", lab)


def test_a_strategy_that_refuses_every_low_budget_is_skipped_with_the_reason(lab_with):
    class Roomy(Strategy):
        name = "roomy"
        version = "1"

        def min_cache_bytes(self, engine):
            return int(0.55 * engine.total_expert_bytes)

    lab = lab_with(Roomy)
    with pytest.raises(pytest.skip.Exception, match="roomy refuses every low budget.*needs at least"):
        conformance.test_budget_is_never_exceeded("roomy", lab)
    conformance.test_tokens_are_lossless_on_every_family("roomy", "mixtral", lab)  # 75% is fine


def test_a_strategy_that_refuses_the_standard_budget_fails(lab_with):
    class Greedy(Strategy):
        name = "greedy"
        version = "1"

        def device_bytes(self, engine):
            return int(0.8 * engine.total_expert_bytes)

    with pytest.raises(pytest.fail.Exception, match="refused 75% of expert bytes.*every strategy must work"):
        conformance.test_state_resets_between_requests("greedy", lab_with(Greedy))


def test_a_lossy_strategy_must_report_agreement_instead(lab_with):
    class Lossy(Strategy):
        name = "lossy"
        version = "1"
        lossless = False

        def generate(self, engine, request):
            tokens = engine.greedy_decode(request)
            return tokens[:-1] + [(tokens[-1] + 1) % 256]

    lab = lab_with(Lossy)
    conformance.test_tokens_are_lossless_on_every_family("lossy", "mixtral", lab)
    (row,) = lab.run("lossy").rows
    assert row.status == "ok" and row.token_agreement < 1


def test_runs_are_shared_between_the_rules_that_read_them(lab_with):
    lab = lab_with()
    assert lab.run("lru") is lab.run("lru")
    assert lab.run("lru", tag="again") is not lab.run("lru")
