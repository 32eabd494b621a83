"""Tests of the example plugin. ``host`` and ``small_prompts`` are fixtures specterbench ships for plugin authors
(its ``pytest11`` plugin); ``pytest`` in this folder also runs the conformance battery (see pyproject.toml)."""

import pytest

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.errors import UsageError
from specterbench_lfu import AgingLFU


class FakeEngine:
    """Just what attach() reads: strategies get the real engine at run time."""


def lfu(**options):
    strategy = AgingLFU(**options)
    strategy.attach(FakeEngine())
    return strategy


def test_registered_through_the_entry_point_with_its_distribution(host):
    entry = host.strategies().entry("lfu")
    assert entry.obj is AgingLFU
    assert (entry.plugin.name, entry.plugin.distribution, entry.plugin.source) == ("lfu", "specterbench-lfu",
                                                                                     "entry point")


def test_evicts_the_least_frequently_used_expert():
    s = lfu()
    s.before_layer(0, [1, 2], [1, 1])
    s.before_layer(0, [2], [1])
    assert s.choose_victim([(0, 2), (0, 1)], needed=(0, 3)) == (0, 1)


def test_ties_go_to_the_least_recently_used():
    s = lfu()
    s.before_layer(0, [1, 2], [1, 1])
    assert s.choose_victim([(0, 2), (0, 1)], needed=None) == (0, 2)  # candidates come LRU first


def test_counts_halve_every_half_life_steps():
    s = lfu(half_life=2)
    for _ in range(4):
        s.before_layer(0, [1], [1])
    s.before_layer(0, [2], [1])
    s.on_step_end([7])
    assert s.counts[(0, 1)] == 4
    s.on_step_end([7])
    assert (s.counts[(0, 1)], s.counts[(0, 2)]) == (2, 0)  # a count of 1 ages out


def test_a_bad_half_life_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="half_life must be a positive number of steps"):
        AgingLFU(half_life=0)
    with pytest.raises(UsageError, match="has no option.*accepts: half_life"):
        AgingLFU(halflife=4)


def test_runs_lossless_under_budget_pressure(host, small_prompts, tmp_path):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("lfu",), budgets=(parse_budget("35%"),),
                         profile="a100-40g-pcie4", prompts=2, tokens=8, strategy_options={"lfu": {"half_life": 4}})
    (row,) = Runner(host, config, tmp_path).run()
    assert row.status == "ok" and row.lossless, row.error
    assert row.strategy_plugin.startswith("lfu (specterbench-lfu ") and row.misses > 0
    assert row.extra["lfu_tracked_experts"] > 0
