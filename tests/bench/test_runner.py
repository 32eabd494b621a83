import json

import pytest

from specterbench import Strategy, hookimpl
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.tiny import TINY_FAMILIES
from specterbench.errors import BudgetError, UsageError
from specterbench.runfiles.results import read_rows

BASELINES = ("on-demand", "lru", "static", "resident", "oracle")


def config(**kw):
    base = dict(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("35%"),),
                profile="a100-40g-pcie4", prompts=2, tokens=6)
    base.update(kw)
    return BenchConfig(**base)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_baseline_is_lossless_on_every_family(host, small_prompts, tmp_path, family):
    model = f"tiny-random-{family.replace('_', '-')}"
    rows = Runner(host, config(models=(model,), strategies=BASELINES,
                               budgets=(parse_budget("35%"), parse_budget("50%"))), tmp_path).run()
    assert len(rows) == 9  # four strategies at two budgets, resident once at 100%
    for row in rows:
        assert row.status == "ok", row.error
        assert row.lossless is True
        assert row.peak_cache_bytes <= row.budget_bytes - row.strategy_device_bytes


def test_resident_is_reported_once_at_full_budget(host, small_prompts, tmp_path):
    rows = Runner(host, config(strategies=("resident",), budgets=(parse_budget("35%"), parse_budget("50%"))),
                  tmp_path).run()
    assert [r.budget_fraction for r in rows] == [1.0]
    assert rows[0].hit_rate == 1.0 and rows[0].h2d_bytes == 0


def test_oracle_misses_no_more_than_lru_at_the_same_budget(host, small_prompts, tmp_path):
    rows = {r.strategy: r for r in Runner(host, config(strategies=("lru", "oracle"), prompts=3, tokens=12),
                                          tmp_path).run()}
    assert rows["oracle"].misses <= rows["lru"].misses
    assert rows["oracle"].tpot_ms <= rows["lru"].tpot_ms


def test_row_has_samples_units_and_environment(host, small_prompts, tmp_path):
    row = Runner(host, config(), tmp_path).run()[0]
    assert len(row.samples["tpot_ms"]) == 2 * 5  # decode tokens after the first, per prompt
    assert len(row.samples["ttft_ms"]) == 2
    assert row.warmup["tokens"]  # the warm-up request is kept apart
    assert row.env["packages"]["torch"]
    assert row.tpot_ms > 0 and row.host_ms_per_token > 0 and 0 <= row.hit_rate <= 1


def test_modeled_results_are_deterministic(host, small_prompts, tmp_path):
    a = Runner(host, config(), tmp_path / "a").run()[0]
    b = Runner(host, config(), tmp_path / "b").run()[0]
    assert a.samples["tpot_ms"] == b.samples["tpot_ms"] and a.h2d_bytes == b.h2d_bytes


class Exploding(Strategy):
    name = "exploding"
    version = "1"

    def after_layer(self, layer, experts):
        raise RuntimeError("boom")


class Plugin:
    @hookimpl
    def specterbench_register_strategies(self, register):
        register(Exploding)


def test_a_strategy_that_raises_becomes_an_error_row_and_the_others_still_run(host, small_prompts, tmp_path):
    host.register(Plugin(), "exploding-plugin")
    rows = Runner(host, config(strategies=("exploding", "lru")), tmp_path).run()
    assert [r.status for r in rows] == ["error", "ok"]
    assert "RuntimeError: boom" in rows[0].error
    assert len(read_rows(tmp_path)) == 2


def test_a_lossless_strategy_that_diverges_fails_its_row_with_the_position(host, small_prompts, tmp_path):
    class Liar(Strategy):
        name = "liar"
        version = "1"

        def generate(self, engine, request):
            tokens = engine.greedy_decode(request)
            tokens[3] = (tokens[3] + 1) % 256
            return tokens

    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Liar)

    host.register(P(), "liar-plugin")
    row = Runner(host, config(strategies=("liar",)), tmp_path).run()[0]
    assert row.status == "diverged" and row.lossless is False
    assert row.first_divergence["position"] == 3


def test_resume_skips_finished_cells(host, small_prompts, tmp_path):
    Runner(host, config(strategies=("lru",)), tmp_path).run()
    rows = Runner(host, config(strategies=("lru", "on-demand")), tmp_path, resume=True).run()
    assert [r.strategy for r in rows] == ["on-demand"]
    assert len(read_rows(tmp_path)) == 2


def test_interrupt_keeps_finished_rows(host, small_prompts, tmp_path):
    class Interrupting(Strategy):
        name = "interrupting"
        version = "1"

        def on_request_start(self, request):
            raise KeyboardInterrupt

    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Interrupting)

    host.register(P(), "interrupt-plugin")
    runner = Runner(host, config(strategies=("lru", "interrupting")), tmp_path)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert [r.strategy for r in read_rows(tmp_path)] == ["lru"]


@pytest.mark.parametrize("text, fraction, nbytes", [
    ("35%", 0.35, None), ("0.5", 0.5, None), ("120MB", None, 120_000_000), ("1.5GiB", None, int(1.5 * 2**30)),
    ("123456B", None, 123456), ("0%", 0.0, None)])
def test_budget_strings(text, fraction, nbytes):
    b = parse_budget(text)
    assert (b.fraction, b.nbytes) == (fraction, nbytes)


@pytest.mark.parametrize("text", ["lots", "35%%", "-3", "1.5x", "2.5", "35"])
def test_malformed_budget_names_the_forms(text):
    with pytest.raises(UsageError, match="budget"):
        parse_budget(text)


@pytest.mark.parametrize("budget, match", [("1%", "below what lru needs"), ("150%", "above all expert")])
def test_budget_outside_the_model_range_is_refused(host, small_prompts, tmp_path, budget, match):
    with pytest.raises(BudgetError, match=match):
        Runner(host, config(budgets=(parse_budget(budget),)), tmp_path).run()


def test_rows_are_json_lines_with_a_schema_version(host, small_prompts, tmp_path):
    Runner(host, config(), tmp_path).run()
    line = (tmp_path / "rows.jsonl").read_text().splitlines()[0]
    assert json.loads(line)["schema_version"] == 1
