"""``engine.costs``: a strategy's estimates equal what the modeled clock charges for the same operation."""

import pytest
import torch
from support import configure

from specterbench import Strategy
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.scheduler import DEMAND_PRIORITY


@pytest.fixture
def engine():
    model, tok = tiny_random("mixtral")  # 2 MoE layers, 8 experts, top-2
    engine = Engine(model, name="tiny-random-mixtral", tokenizer=tok)
    engine.geometry = project(engine.own_geometry, "mixtral")
    return engine


def test_copy_estimate_is_the_time_an_idle_link_takes(engine):
    clock = configure(engine, Strategy(), slots=16, host=True)
    estimate = engine.costs.copy_s()
    t = clock.issue((0, 0), engine.priced_expert_bytes, DEMAND_PRIORITY)
    clock.wait(t)
    assert clock.now() == pytest.approx(estimate)


def test_expert_and_fused_estimates_are_what_compute_charges(engine):
    clock = configure(engine, Strategy(), slots=16, host=True)
    for n in (1, 7):
        before = clock.now()
        engine.charge_expert(n)
        assert clock.now() - before == pytest.approx(engine.costs.expert_s(n))
    before = clock.now()
    engine.charge(clock.costs.experts_fused([1, 2, 3], 0.25))
    assert clock.now() - before == pytest.approx(engine.costs.experts_fused_s([1, 2, 3], 0.25))


def test_a_layer_is_charged_its_grouped_op_and_one_more_expert_adds_no_launches(engine):
    clock = configure(engine, Strategy(), slots=4, host=True)
    for key in ((0, 1), (0, 3)):
        engine.prefetch(key)
    clock.settle()
    before = clock.now()
    engine.run_moe_layer(0, torch.nn.functional.silu, torch.randn(3, 64), torch.tensor([[1, 3], [3, 1], [1, 3]]),
                         torch.full((3, 2), 0.5))
    charged = clock.now() - before - engine.costs.layer_s(3)  # the layer's dense part is charged first
    assert charged == pytest.approx(engine.costs.experts_grouped_s([3, 3]))
    two, three = engine.costs.experts_grouped_s([3, 3]), engine.costs.experts_grouped_s([3, 3, 3])
    assert three - two == pytest.approx(engine.costs.expert_in_layer_s(3))
    assert engine.costs.expert_in_layer_s(3) < engine.costs.expert_s(3)  # a lone expert pays its own launches


def test_host_expert_estimate_is_what_an_idle_host_takes(engine):
    clock = configure(engine, Strategy(), slots=16, host=True)
    job = clock.run_on_host(lambda: None, clock.costs.host_expert(3), engine.host_threads)
    assert job.done_s - clock.now() == pytest.approx(engine.costs.host_expert_s(3))
    assert engine.costs.host_backlog_s() > 0


def test_link_backlog_is_when_a_copy_issued_now_would_start(engine):
    clock = configure(engine, Strategy(), slots=16, host=True)
    for e in range(3):
        clock.issue((0, e), engine.priced_expert_bytes, 0.0)
    backlog = engine.costs.link_backlog_s()
    assert backlog == pytest.approx(3 * engine.costs.copy_s())
    t = clock.issue((1, 0), engine.priced_expert_bytes, -1.0)
    clock.settle()  # let the queue drain, t included
    assert t.start_s == pytest.approx(backlog)
    assert engine.costs.copy_arrival_s() == pytest.approx(engine.costs.copy_s())


def test_until_layer_is_when_that_layer_runs_when_every_expert_hits(engine):
    class Watch(Strategy):
        name = "watch"
        version = "1"

        def prepare(self, engine, calibration=None):
            for key in engine.store.weights:
                engine.prefetch(key)

        def before_layer(self, layer, experts, n):
            if layer == 0:
                self.guess = engine.costs.now_s() + engine.costs.until_layer_s(1)
            else:
                self.at = engine.costs.now_s()

    strategy = Watch()
    configure(engine, strategy, slots=16, host=True)
    strategy.prepare(engine)
    engine.clock.settle()
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([[1, 2, 3]]), kv)
    engine.forward(torch.tensor([[4]]), kv)  # one decode token: top-2 distinct experts in every layer
    assert strategy.guess == pytest.approx(strategy.at)


def test_a_measured_clock_without_prices_gets_the_default_profile(engine):
    from specterbench.engine.host_clock import HostWallClock

    engine.configure(Strategy(), 16 * engine.expert_bytes, HostWallClock())
    assert engine.costs.copy_s() > 0 and engine.costs.link_bytes_per_s() > 0
