"""The strategy-facing API does what docs/plugins.md says, where tests/contract/test_engine_contract.py and
tests/engine/test_costs.py do not already check it: landed/arrival/barrier, the candidates view, what engine.charge
returns, router signals in prefill and decode, router_guess, emit, substitutes and the routing recorder. One tiny
engine (2 MoE layers, 8 experts, top-2) on the modeled clock."""

import pytest
import torch
from support import configure, route

from specterbench import Request, Strategy
from specterbench.engine.profiles import default_profile
from specterbench.strategy import SUBSTITUTE


class Recorder(Strategy):
    name = "contract-recorder"
    version = "1"

    def attach(self, engine):
        super().attach(engine)
        self.steps, self.seen = [], []

    def on_step_start(self, n_tokens):
        self.steps.append(n_tokens)

    def before_layer(self, layer, experts, tokens_per_expert):
        r = self.engine.routing
        self.seen.append((layer, tuple(r.top_k_index.shape), tuple(r.logits.shape), float(r.probs.sum(-1)[0]),
                          self.engine.costs.until_layer_s(layer), list(experts) == r.experts))


def test_the_smallest_cache_is_one_layers_top_k(engine):
    assert engine.min_budget_bytes() == engine.top_k * engine.expert_bytes


def test_landed_expected_arrival_and_wait_for_answer_about_one_copy(engine):
    configure(engine, Recorder(), host=True)
    engine.prefetch((1, 3), 1.0)
    assert engine.expected_arrival((1, 3)) > engine.costs.now_s() and not engine.landed((1, 3))
    assert engine.expected_arrival((1, 4)) is None  # not cached
    engine.wait_for([(1, 3)])
    assert engine.landed((1, 3)) and engine.expected_arrival((1, 3)) <= engine.costs.now_s()


def test_candidates_leave_out_protected_and_in_flight_experts(engine):
    configure(engine, Recorder(), host=True)
    engine.prefetch((0, 1))
    engine.wait_for([(0, 1)])
    engine.prefetch((0, 2))
    engine.prefetch((0, 3))  # (0, 2) is on the link, (0, 3) queued
    view = engine.candidates(protect={(0, 3)})
    assert (0, 1) in view and (0, 3) not in view and list(view) == [k for k in view]
    assert engine.evictable() == list(engine.candidates())


def test_cost_estimates_are_what_the_modeled_clock_charges(engine):
    configure(engine, Recorder(), host=True)
    costs, profile = engine.costs, default_profile()
    assert costs.copy_s() == pytest.approx(profile.link_latency_us * 1e-6 +
                                           engine.priced_expert_bytes / profile.link_bytes_per_s)
    assert costs.link_bytes_per_s() == profile.link_bytes_per_s  # no copy timed yet
    assert engine.charge_expert(3) == pytest.approx(costs.expert_s(3))
    assert engine.charge(costs.model.experts_fused([1, 2], 0.25)) == pytest.approx(costs.experts_fused_s([1, 2], 0.25))
    assert min(costs.layer_s(1), costs.head_s(), costs.router_s(4), costs.host_expert_s(1)) > 0
    assert costs.host_backlog_s() == 0.0 and costs.link_backlog_s() == 0.0
    engine.prefetch((0, 1), 1.0)
    engine.prefetch((0, 2), 0.5)
    assert costs.link_backlog_s(0.75) < costs.link_backlog_s(0.25)  # a copy at 0.75 would pass (0, 2)
    assert costs.copy_arrival_s(0.25) == pytest.approx(costs.link_backlog_s(0.25) + costs.copy_s())
    assert engine.link_bytes_per_s() is None or engine.link_bytes_per_s() > 0


def test_router_signals_are_there_in_prefill_and_decode_and_gone_between_layers(engine):
    s = Recorder()
    configure(engine, s, slots=8, host=True)
    request = Request("r", (5, 6, 7, 8), max_new_tokens=2)
    engine.begin_request(request)
    engine.decode(request)
    assert s.steps == [4, 1]  # on_step_start: the prefill's tokens, then one per decode forward
    prefill = s.seen[0]
    assert prefill[:3] == (0, (4, 2), (4, 8)) and prefill[3] == pytest.approx(1.0) and prefill[5]
    assert all(until == 0.0 for *_, until, _ in s.seen)  # the running layer's experts are needed now
    assert engine.routing is None
    with pytest.raises(Exception, match="only possible while a MoE layer runs"):
        engine.router_guess(1)


def test_router_guess_applies_another_layers_router_and_is_charged(engine):
    configure(engine, Recorder(), host=True)
    hidden = torch.randn(3, engine.own_geometry.hidden)  # [T, H]
    before = engine.costs.now_s()
    guess = engine.router_guess(1, hidden)
    assert guess.logits.shape == (3, 8) and guess.top_k_index.shape == (3, 2)
    assert set(guess.experts()) <= set(range(8)) and engine.costs.now_s() > before


def test_emit_records_one_sample_per_call(engine):
    configure(engine, Recorder(), host=True)
    engine.begin_request(Request("r", (1,), 4))
    engine.emit(1)
    engine.emit(3)
    assert [x.tokens for x in engine.samples] == [1, 3]


def test_a_substitute_computes_a_miss_with_the_strategys_own_weights(engine):
    class Substituting(Strategy):
        name, version, lossless = "contract-substitute", "1", False

        def place_miss(self, key, n_tokens):
            return SUBSTITUTE

        def substitute(self, key):
            weights = tuple(w.to(self.engine.compute_dtype) for w in self.engine.store.weights[key])
            return weights, 1.0  # the full weights, as a fetch would bring them

    configure(engine, Substituting(), host=True)
    torch.manual_seed(0)
    out = route(engine, 0, [[0, 1], [2, 3]])
    assert engine.stats.substituted == 4 and len(engine.cache) == 0 and out.shape == (2, engine.own_geometry.hidden)


def test_the_routing_recorder_keeps_each_layer_calls_experts(engine):
    configure(engine, Recorder(), slots=8, host=True)
    rec = engine.start_recording()
    route(engine, 0, [[0, 1], [1, 5]])
    route(engine, 1, [[2, 3]])
    assert engine.stop_recording() is rec and engine.recorder is None
    assert rec.trace == [(0, (0, 1, 5)), (1, (2, 3))]
    assert rec.counts[0].tolist() == [1, 2, 0, 0, 0, 1, 0, 0]


def test_the_runner_ends_the_warm_up_before_the_measured_requests(host, small_prompts, tmp_path):
    from specterbench import hookimpl
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner

    class Counting(Strategy):
        name, version = "contract-warmup", "1"

        def attach(self, engine):
            super().attach(engine)
            self.requests, self.flags, self.ended = 0, [], 0

        def on_request_start(self, request):
            self.requests += 1
            self.flags.append(self.engine.warming_up)

        def on_warmup_end(self):
            self.ended += 1
            self.requests = 0  # what metrics() reports restarts here

        def metrics(self):
            return {"requests": self.requests, "ended": self.ended, "flags": self.flags}

    class Plugin:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Counting)

    host.register(Plugin(), "contract-warmup")
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("contract-warmup",),
                         budgets=(parse_budget("50%"),), profile="a100-40g-pcie4", prompts=2, tokens=2)
    (row,) = Runner(host, config, tmp_path).run()
    assert row.status == "ok", row.error
    assert row.extra["ended"] == 1 and row.extra["requests"] == 2  # the warm-up request is not counted
    assert row.extra["flags"] == [True, False, False]  # engine.warming_up during the warm-up request only
