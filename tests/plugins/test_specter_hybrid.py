"""The queue-aware host-vs-fetch rule ("balanced") shared by cpu-experts and Specter's hybrid verification."""

import pytest

from specterbench.baselines.cpu_experts import CpuExperts
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.errors import UsageError
from specterbench.strategy import FETCH, ON_HOST
from specterbench_specter import Specter


@pytest.fixture
def engine():
    model, tok = tiny_random("mixtral")
    e = Engine(model, name="mixtral", tokenizer=tok)
    e.geometry = project(e.own_geometry, "mixtral")
    return e


def configure(engine, strategy, fraction=0.9):
    engine.configure(strategy, int(fraction * engine.total_expert_bytes),
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))


def busy_host(engine, jobs):
    op = engine.clock.costs.host_expert(1)
    for _ in range(jobs):
        engine.clock.run_on_host(lambda: None, op, engine.host_threads)


def test_balanced_counts_the_hosts_own_queue(engine):
    strategy = CpuExperts()
    configure(engine, strategy)
    assert strategy.rule == "balanced"
    assert strategy.place_miss((0, 3), 1) == ON_HOST  # idle host: its DRAM beats the link for one token
    busy_host(engine, 8)
    assert strategy.place_miss((0, 3), 1) == FETCH  # eight experts queued on the host: the link is sooner


def test_fiddler_rule_ignores_the_host_queue(engine):
    strategy = CpuExperts(rule="fiddler")
    configure(engine, strategy)
    busy_host(engine, 8)
    assert strategy.place_miss((0, 3), 1) == ON_HOST


def test_balanced_does_not_count_prefetches_a_demand_copy_overtakes(engine):
    configure(engine, CpuExperts())
    for i in range(8):
        engine.clock.issue(("busy", i), 10**9, 0)  # low-priority prefetches: a demand copy goes first
    one_copy = engine.costs.copy_s() + 10**9 / engine.clock.costs.profile.link_bytes_per_s
    balanced = engine.costs.host_or_fetch(1)  # what rule=balanced asks
    fiddler = engine.costs.host_or_fetch(1, host_queue_s=0.0, priority=None)  # what rule=fiddler asks
    assert balanced.fetch_s < one_copy + engine.costs.copy_s() + 1e-3  # only the copy on the link
    assert fiddler.fetch_s > 7 * 10**9 / engine.clock.costs.profile.link_bytes_per_s


def test_unknown_rule_is_named():
    with pytest.raises(UsageError, match="use one of balanced, fiddler"):
        CpuExperts(rule="fast")


def test_specter_verifies_a_miss_on_the_host_when_it_is_sooner(engine):
    strategy = Specter(k=2)
    configure(engine, strategy)
    assert strategy.place_miss((0, 3), 1) == ON_HOST
    busy_host(engine, 16)
    assert strategy.place_miss((0, 3), 1) == FETCH
    off = Specter(k=2, host="off")
    configure(engine, off)
    assert off.place_miss((0, 3), 1) == FETCH


class HostEverything(CpuExperts):
    """Records the host backlog each placement saw."""

    def place_miss(self, key, n_tokens):
        self.seen.append(self.engine.costs.host_backlog_s())
        return ON_HOST


def test_the_host_queue_counts_the_misses_already_placed_in_the_same_layer(engine):
    """A verification places many misses of one layer before any host job starts: the balanced rule must see
    the ones it already put on the host, or it sends every miss there."""
    import torch

    strategy = HostEverything()
    strategy.seen = []
    configure(engine, strategy, fraction=0.3)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    engine.forward(ids, engine.new_kv_cache())
    per_expert = engine.clock.costs.host_seconds(engine.clock.costs.host_expert(1), engine.host_threads)
    assert len(strategy.seen) >= 2
    assert max(strategy.seen) >= per_expert  # a later placement of a layer saw the earlier ones queued
    assert engine.host_placed_s == 0.0  # and they became the clock's jobs when the layer ran


def test_balanced_splits_a_wide_layer_between_host_and_link(engine):
    strategy = CpuExperts()
    configure(engine, strategy, fraction=0.3)
    places = []
    for e in range(8):
        where = strategy.place_miss((0, e), 1)
        places.append(where)
        if where == ON_HOST:  # as the engine's placement phase books it
            c = engine.clock.costs
            engine.host_placed_s += c.host_seconds(c.host_expert(1), engine.host_threads)
    assert ON_HOST in places and FETCH in places
    engine.host_placed_s = 0.0
