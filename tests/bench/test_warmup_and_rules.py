"""An honest warm-up (a calibration prompt, never a measured one) and engine rules enforced at run time, each broken
rule a row that names the strategy, the decision point, the layer and the plugin's own frame."""

from __future__ import annotations

import pytest

from specterbench import Strategy, hookimpl
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner

MEASURED = 2


def run(host, tmp_path, *classes, warmup=True, prompts=MEASURED):
    class Plugin:
        @hookimpl
        def specterbench_register_strategies(self, register):
            for cls in classes:
                register(cls)

    host.register(Plugin(), "rules-plugin")
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=tuple(c.name for c in classes),
                         budgets=(parse_budget("50%"),), profile="a100-40g-pcie4", prompts=prompts, tokens=3,
                         warmup=warmup)
    return Runner(host, config, tmp_path).run()


class Watcher(Strategy):
    name = "watcher"
    version = "1"
    seen: list = []  # (request id, prompt ids, warming up) of every request, in order

    def on_request_start(self, request):
        Watcher.seen.append((request.id, request.prompt_ids, self.engine.warming_up))


def test_no_measured_prompt_is_seen_before_it_is_measured(host, small_prompts, tmp_path):
    Watcher.seen = []
    row = run(host, tmp_path, Watcher)[0]
    measured = {pid: tuple(ids) for pid, ids, warming in Watcher.seen if not warming}
    assert len(measured) == MEASURED
    warmups = [(pid, ids) for pid, ids, warming in Watcher.seen if warming]
    assert warmups, "no warm-up request ran"
    for pid, ids in warmups:
        assert pid not in measured and ids not in measured.values()
    assert Watcher.seen[0][2] is True  # the warm-up runs first
    assert row.warmup["prompt"] == warmups[0][0] and row.warmup["prompt"].startswith("warmup:")


def test_the_warm_up_falls_back_to_a_separate_prompt_when_every_calibration_prompt_is_measured(
        host, small_prompts, tmp_path):
    Watcher.seen = []
    run(host, tmp_path, Watcher, prompts=len(small_prompts))  # the fixture serves the calibration set too
    (warmup,) = [pid for pid, _, warming in Watcher.seen if warming]
    assert warmup == "warmup:text"


class Counts(Strategy):
    name = "counts-without-reset"
    version = "1"

    def attach(self, engine):
        super().attach(engine)
        self.requests = 0

    def on_request_start(self, request):
        self.requests += 1

    def metrics(self):
        return {"requests": self.requests}


class CountsWithReset(Counts):
    name = "counts-with-reset"
    version = "1"

    def on_warmup_end(self):
        self.requests = 0


def test_metrics_without_on_warmup_end_are_told_in_one_warning_and_marked_on_the_row(host, small_prompts, tmp_path,
                                                                                     capsys):
    rows = {r.strategy: r for r in run(host, tmp_path, Counts, CountsWithReset)}
    lines = [line for line in capsys.readouterr().err.splitlines() if "on_warmup_end" in line]
    assert len(lines) == 1 and "strategy 'counts-without-reset' (plugin 'rules-plugin')" in lines[0]
    assert rows["counts-without-reset"].extra["metrics_include_warmup"] is True
    assert rows["counts-without-reset"].extra["requests"] == MEASURED + 1
    assert "metrics_include_warmup" not in rows["counts-with-reset"].extra
    assert rows["counts-with-reset"].extra["requests"] == MEASURED


def test_every_shipped_strategy_with_metrics_restarts_them_after_the_warm_up(host):
    for name in host.strategies().names():
        cls = host.strategies().get(name)
        if cls.metrics is not Strategy.metrics:
            assert cls.on_warmup_end is not Strategy.on_warmup_end, name


class EvictsRouted(Strategy):
    name = "evicts-routed"
    version = "1"

    def before_layer(self, layer, experts, tokens_per_expert):
        key = (layer, int(experts[0]))
        if self.engine.landed(key):
            self.engine.evict(key)  # the layer is about to compute with it


class PrefetchesNothing(Strategy):
    name = "prefetches-nothing"
    version = "1"

    def before_layer(self, layer, experts, tokens_per_expert):
        self.engine.prefetch((layer, self.engine.num_experts))  # one past the last expert


class EvictsUncached(Strategy):
    name = "evicts-uncached"
    version = "1"

    def after_layer(self, layer, experts):
        if layer == 1:
            self.engine.evict((0, 10**6))


@pytest.mark.parametrize("cls, problem, point", [
    (EvictsRouted, "which the running layer is routed to and has not computed yet, is refused",
     "before_layer"),
    (PrefetchesNothing, "no such expert; keys are (moe_layer, expert)", "before_layer"),
    (EvictsUncached, "is not cached, so it cannot be evicted", "after_layer"),
])
def test_a_broken_engine_rule_is_a_row_naming_strategy_decision_point_layer_and_plugin_frame(
        host, small_prompts, tmp_path, cls, problem, point):
    (row,) = run(host, tmp_path, cls, warmup=False)
    assert row.status == "error" and row.error.startswith("EngineViolation: ") and problem in row.error
    assert f"strategy {cls.name!r} in {point}, layer " in row.error
    assert f"{__file__}:" in row.error and row.extra["failure"]["plugin_frame"].startswith(__file__)
