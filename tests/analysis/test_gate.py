import pytest

from specterbench import hookimpl
from specterbench.analysis.gate import load_reference, parse_rule, render, run_gate
from specterbench.analysis.gate_rules import RegressionRule, SpeedupRule, load_rules
from specterbench.baselines.lru import LRU
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow, read_rows


def row(**kw) -> ResultRow:
    base = dict(run_id="r", cell="c", model="m", geometry="m", geometry_label="m", priced_total_expert_bytes=100,
                strategy="lru", strategy_version="1", strategy_plugin="baselines", lossless_strategy=True,
                budget_bytes=35, budget_fraction=0.35, total_expert_bytes=100, profile="a100-40g-pcie4",
                clock="modeled", workload="w", prompts=2, new_tokens=8, seed=0, repeat=0, tpot_ms=1.0, hit_rate=0.5)
    base.update(kw)
    return ResultRow(**base)


def grid(tpot: dict[str, float], budgets=(0.35, 0.5), **kw) -> list[ResultRow]:
    return [row(strategy=s, budget_fraction=b, tpot_ms=t, **kw) for b in budgets for s, t in tpot.items()]


# ---- rules --------------------------------------------------------------------------------------------

def test_rules_parse_into_frozen_dataclasses_with_defaults():
    s = parse_rule("speedup strategy=specter over=best-other metric=tpot_ms min=1.5")
    bounds = ("resident", "oracle", "oracle-spec")
    assert s == SpeedupRule(s.text, "specter", 1.5, "tpot_ms", "best-other", bounds, ())
    r = parse_rule("regression metric=hit_rate max_pct=5 strategies=lru,specter")
    assert (r.metric, r.max_pct, r.strategies) == ("hit_rate", 5.0, ("lru", "specter"))
    assert parse_rule("regression max_pct=0").strategies == ()  # all
    assert parse_rule("speedup strategy=specter min=2 budgets=35%,0.5").budgets == (0.35, 0.5)
    with pytest.raises(AttributeError):
        s.min_speedup = 1.0


@pytest.mark.parametrize("text, why", [
    ("speedup strategy=specter", "missing min"),
    ("speedup strategy=specter min=fast", "min='fast' is not a number"),
    ("speedup strategy=specter min=0", "min must be > 0"),
    ("speedup strategy=specter min=1.5 budgets=lots", "budgets='lots'"),
    ("regression max_pct=5 metric=tpot", "unknown metric 'tpot'"),
    ("regression max_pct=-1", "max_pct must be ≥ 0"),
    ("regression max_pct", "'max_pct' is not key=value"),
    ("regression max_pct=5 strategy=lru", "unknown key 'strategy'"),
    ("regression max_pct=5 max_pct=6", "given twice"),
    ("speedups strategy=specter min=1.5", "unknown kind 'speedups'"),
    ("", "unknown kind ''"),
])
def test_a_malformed_rule_is_an_error_naming_the_rule(text, why):
    with pytest.raises(UsageError) as err:
        parse_rule(text)
    assert f"malformed gate rule {text!r}" in str(err.value) and why in str(err.value)


def test_rules_load_from_toml_strings_and_tables(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text('rules = ["regression metric=tpot_ms max_pct=1"]\n\n'
                    '[[rule]]\nkind = "speedup"\nstrategy = "specter"\nmin = 1.2\nbudgets = ["35%", "50%"]\n')
    reg, spd = load_rules(path)
    assert isinstance(reg, RegressionRule) and reg.max_pct == 1.0
    assert isinstance(spd, SpeedupRule) and spd.min_speedup == 1.2 and spd.budgets == (0.35, 0.5)


def test_a_malformed_rule_in_a_file_names_the_file_and_the_rule(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text('rules = ["regression max_pct=5", "speedup strategy=specter min=x"]\n')
    with pytest.raises(UsageError, match=r"gate.toml: malformed gate rule 'speedup strategy=specter min=x'"):
        load_rules(path)
    path.write_text("rules = [")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_rules(path)


# ---- speedup ------------------------------------------------------------------------------------------

def test_speedup_is_over_the_best_other_lossless_strategy_excluding_references():
    rows = grid({"specter": 1.0, "lru": 2.0, "static": 1.6, "resident": 0.5, "oracle": 0.9})
    rows += [row(strategy="lossy", lossless_strategy=False, budget_fraction=b, tpot_ms=0.1) for b in (0.35, 0.5)]
    result = run_gate(rows, None, ["speedup strategy=specter min=1.5"])
    assert result.ok and result.exit_code == 0
    assert all("vs static 1.6 → 1.6000×" in c.message for c in result.checks)


def test_speedup_respects_a_higher_is_better_metric():
    rows = [row(strategy="specter", hit_rate=0.9), row(strategy="lru", hit_rate=0.6)]
    assert run_gate(rows, None, ["speedup strategy=specter metric=hit_rate min=1.5"]).ok
    assert not run_gate(rows, None, ["speedup strategy=specter metric=hit_rate min=1.6"]).ok


def test_speedup_over_a_named_strategy_even_a_reference():
    rows = grid({"specter": 1.0, "lru": 2.0, "static": 1.2, "oracle": 0.8})
    assert run_gate(rows, None, ["speedup strategy=specter over=lru min=2"]).ok
    result = run_gate(rows, None, ["speedup strategy=specter over=oracle min=0.8"])
    assert result.ok and "vs oracle 0.8 → 0.8000×" in result.checks[0].message


def test_a_speedup_rule_about_a_strategy_the_run_lacks_passes_saying_so_and_one_without_a_competitor_fails():
    rows = grid({"lru": 1.0})
    result = run_gate(rows, rows, ["speedup strategy=specter min=1.5", "ratchet strategy=specter metric=tpot_ms"])
    assert result.ok and not result.failures
    assert "not applicable: strategy 'specter' has no rows in this run (it ran: lru)" in result.checks[0].message
    result = run_gate(grid({"specter": 1.0, "resident": 0.5}), None, ["speedup strategy=specter min=1.5"])
    assert len(result.failures) == 2 and "no other lossless status-ok strategy" in result.failures[0].message


# ---- regression ---------------------------------------------------------------------------------------

def test_regression_beyond_the_tolerance_fails_and_within_passes():
    ref = grid({"lru": 1.0, "specter": 1.0})
    new = grid({"lru": 1.04, "specter": 1.06})
    result = run_gate(new, ref, ["regression metric=tpot_ms max_pct=5"])
    assert [c.cell.split(" @")[0] for c in result.failures] == ["m · specter", "m · specter"]
    assert (result.failures[0].reference, result.failures[0].now, result.failures[0].limit) == (1.0, 1.06, 1.05 + 1e-6)
    assert "tpot_ms: reference 1, now 1.06, limit 1.05 — +6.00%, lower is better, tolerance 5%" in render(result)


def test_regression_of_a_higher_is_better_metric_is_a_drop():
    ref, new = [row(hit_rate=0.5)], [row(hit_rate=0.4)]
    assert not run_gate(new, ref, ["regression metric=hit_rate max_pct=5"]).ok
    assert run_gate(ref, new, ["regression metric=hit_rate max_pct=5"]).ok  # a rise is no regression


def test_a_reference_cell_missing_from_the_run_fails():
    result = run_gate(grid({"lru": 1.0}), grid({"lru": 1.0, "static": 1.0}), ["regression max_pct=5"])
    assert [("static" in c.cell and "missing from this run" in c.message) for c in result.failures] == [True] * 2


def test_gate_collects_every_failure():
    ref = grid({"specter": 1.0, "lru": 2.0, "static": 2.0})
    new = grid({"specter": 1.5, "lru": 2.0, "static": 2.5})
    new.append(row(strategy="static", budget_fraction=0.5, repeat=1, status="diverged", tpot_ms=None,
                   error="tokens differ from the reference at prompt p0 position 3"))
    result = run_gate(new, ref, ["speedup strategy=specter min=1.5", "regression metric=tpot_ms max_pct=5"])
    assert result.exit_code == 1
    kinds = [c.rule.split()[0] for c in result.failures]
    # 1 diverged row, specter's speedup at 2 budgets (2.0/1.5 = 1.33), specter and static regressed at 2 budgets
    assert kinds == ["status", "speedup", "speedup", "regression", "regression", "regression", "regression"]
    text = render(result)
    assert text.startswith("gate: FAILED — 7 of 9 checks failed (2 rules")
    assert text.count("\nFAIL  ") == 7 and "position 3" in text


@pytest.mark.parametrize("field, value", [("model", "other"), ("geometry", "mixtral"), ("profile", "h100-pcie5"),
                                          ("schema_version", 2)])
def test_gate_refuses_an_incompatible_reference_with_the_reason(field, value):
    with pytest.raises(UsageError, match=f"refusing to compare runs with a different {field.replace('_', ' ')}: "
                                         f"reference has"):
        run_gate([row(**{field: value})], [row()], ["regression max_pct=5"])


def test_a_missing_reference_says_how_to_make_one(tmp_path):
    with pytest.raises(UsageError, match="no reference result at .*`make reference`"):
        load_reference(tmp_path / "reference")


def test_gate_without_rules_or_reference_is_bad_input():
    with pytest.raises(UsageError, match="no gate rules"):
        run_gate([row()], [row()], [])
    with pytest.raises(UsageError, match="make reference"):
        run_gate([row()], [], ["regression max_pct=5"])


# ---- end to end: a deliberately slowed strategy fails the gate ------------------------------------------

class MyStrat(LRU):
    name = "mystrat"
    version = "1"


class SlowedMyStrat(MyStrat):
    """The same strategy with extra modeled compute on every MoE layer (1 GB of memory traffic)."""

    def before_layer(self, layer, experts, tokens_per_expert):
        self.engine.clock.compute(0, 1e9)


def plugin(cls):
    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(cls)

    return P()


def run(host, cls, run_dir):
    host.register(plugin(cls), "mystrat-plugin")
    try:
        cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("mystrat", "lru"),
                          budgets=(parse_budget("35%"),), profile="a100-40g-pcie4", prompts=2, tokens=6)
        Runner(host, cfg, run_dir).run()
    finally:
        host.unregister("mystrat-plugin")
    return read_rows(run_dir)


def test_a_deliberately_slowed_strategy_fails_the_gate(host, small_prompts, tmp_path):
    rules = [r for r in load_rules("results/reference/gate.toml") if isinstance(r, RegressionRule)]
    reference = run(host, MyStrat, tmp_path / "reference")
    same = run(host, MyStrat, tmp_path / "same")
    assert [r.host_ms_per_token for r in same] != [r.host_ms_per_token for r in reference]  # wall time differs
    assert run_gate(same, reference, rules).exit_code == 0  # the modeled clock is deterministic
    slowed = run(host, SlowedMyStrat, tmp_path / "slowed")
    result = run_gate(slowed, reference, rules)
    assert result.exit_code == 1
    assert {c.cell.split(" @")[0] for c in result.failures} == {"tiny-random-mixtral · mystrat"}  # lru still passes
    assert {"tpot_ms", "tpot_mean_ms", "tpot_p90_ms"} <= {c.metric for c in result.failures}
    assert "FAIL  tiny-random-mixtral · mystrat @ 35%" in render(result)
