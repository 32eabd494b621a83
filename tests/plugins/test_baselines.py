import pytest
import torch
from support import bf16_kernels, route

from specterbench.baselines import LFRU, LRU, ActivationAware, CpuExperts
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.engine.costs import HostOp
from specterbench.engine.geometry import project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import HostProfile, default_host_profile, default_profile
from specterbench.engine.scheduler import DEMAND_PRIORITY
from specterbench.errors import UsageError
from specterbench.strategy import FETCH, ON_HOST, RoutingCalibration

HOST = default_host_profile()


def configure(engine, strategy, slots, host=HOST):
    engine.configure(strategy, slots * engine.expert_bytes, ModeledClock(default_profile(), engine.geometry, host))


@pytest.mark.parametrize("strategy, hits, misses", [(LRU(), 2, 4), (LFRU(decay=0.01), 3, 3)])
def test_lfru_keeps_the_frequent_expert_that_lru_evicts(engine, strategy, hits, misses):
    configure(engine, strategy, slots=4)
    route(engine, 1, [[6], [7]])  # fill layer 1's share so layer 0 lives within its 2 slots
    engine.stats = type(engine.stats)()
    for e in (0, 0, 0, 1, 2, 0):  # top-1 routing, one token per step
        route(engine, 0, [[e]])
    assert (engine.stats.hits, engine.stats.misses) == (hits, misses)


def test_activation_aware_prefetches_what_the_matching_calibration_sequence_used(engine):
    a = torch.zeros(2, 8)
    a[0, [1, 2]], a[1, [5, 6]] = 10, 10
    b = torch.zeros(2, 8)
    b[0, [0, 7]], b[1, [3, 4]] = 10, 10
    strategy = ActivationAware(lookahead=1, width=2)
    configure(engine, strategy, slots=8)
    strategy.prepare(engine, RoutingCalibration(a + b, (), (a, b)))
    strategy.on_request_start(None)
    route(engine, 0, [[1, 2]])
    assert (1, 5) in engine.cache and (1, 6) in engine.cache
    assert (1, 3) not in engine.cache and (1, 4) not in engine.cache


def test_cpu_or_fetch_follows_the_latency_model(engine):
    engine.geometry = project(engine.own_geometry, "mixtral")
    strategy = CpuExperts()
    configure(engine, strategy, slots=4)
    # one token: the host streams 352 MB-per-real-expert weights at 70 GB/s (≈ 80 ms for 16 layers' worth),
    # the link needs ≈ 225 ms for the same bytes at 25 GB/s: the host wins
    choice = engine.costs.host_or_fetch(1)
    assert choice.host_s < choice.fetch_s and choice.place == ON_HOST
    assert strategy.place_miss((0, 3), 1) == ON_HOST
    # a prefill of 8k tokens makes the host compute-bound at 2 TFLOP/s: fetching is cheaper
    assert strategy.place_miss((0, 3), 8192) == FETCH
    # the link busy with a long queue tips a mid-sized batch to the host
    n = next(n for n in (64, 128, 256, 512, 1024, 2048, 4096) if strategy.place_miss((0, 3), n) == FETCH)
    for _ in range(8):
        engine.clock.issue(("busy", _), 10**9, DEMAND_PRIORITY)  # demand copies: the balanced rule counts them
    assert strategy.place_miss((0, 3), n) == ON_HOST


def test_cpu_experts_clamps_threads_with_a_warning(engine):
    strategy = CpuExperts(threads=10_000)
    configure(engine, strategy, slots=4)
    assert strategy.threads == HOST.threads
    assert "clamped" in strategy.metrics()["warning"]


def test_host_compute_overlaps_device_compute():
    from specterbench.engine.geometry import Geometry

    GEO = Geometry("g", hidden=8, expert_intermediate=8, num_experts=4, top_k=2, moe_layers=1, layers=1, heads=1,
                   kv_heads=1, head_dim=8, vocab=16)
    profile = default_profile()
    host = HostProfile("h", "cpu", mem_bytes_per_s=1e6, flops_per_s=1e30, threads=1, launch_us=0.0, sources=("t",),
                       expert_kernels=bf16_kernels(1e6, 1e30))
    clock = ModeledClock(profile, GEO, host)
    job = clock.run_on_host(lambda: None, HostOp(0, 2000, 0), 1)  # ≈ 2 ms on the host (plus two tiny link hops)
    clock.compute(0, profile.mem_bytes_per_s * 0.0015)  # 1.5 ms of device work meanwhile
    stall = clock.wait_host([job])
    assert 0.0004 < stall < 0.0006
    assert clock.totals.host_busy_s == pytest.approx(0.002)


def test_host_profile_missing_a_field_names_it():
    with pytest.raises(UsageError, match="missing field.*mem_bytes_per_s"):
        HostProfile.from_dict({"name": "x", "cpu": "y", "flops_per_s": 1, "threads": 4, "launch_us": 1,
                               "sources": []})


def test_mixed_precision_is_marked_lossy_and_reports_agreement(host, small_prompts, tmp_path):
    cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("mixed-precision",),
                      budgets=(parse_budget("60%"),), profile="a100-40g-pcie4", prompts=2, tokens=8)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok" and row.lossless_strategy is False
    assert row.token_agreement is not None and row.substituted > 0


@pytest.mark.parametrize("strategy", ["lfru", "activation-aware", "cpu-experts"])
def test_new_lossless_baselines_are_lossless(host, small_prompts, tmp_path, strategy):
    cfg = BenchConfig(models=("tiny-random-qwen2-moe",), strategies=(strategy,), budgets=(parse_budget("40%"),),
                      profile="a100-40g-pcie4", prompts=2, tokens=8)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok", row.error
    assert row.lossless is True
