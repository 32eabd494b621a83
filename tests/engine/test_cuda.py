"""The measured CUDA path: pinned store, copies on their own stream, device memory within the budget, prefetching
that really overlaps, NVML bytes that match the ledger, the packed 4-bit draft and host experts beside the device.

Skipped without a CUDA device; ``scripts/gpu_check.sh`` runs them on a GPU. Models are bf16 (what the GPU serves)
and large enough that expert copies take real time: a random-init Mixtral-layout checkpoint of ~200 MB of experts.
"""

import pytest
import torch

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SLACK_BYTES = 32 * 2**20  # activations, KV cache, logits and allocator rounding of a short decode


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


# without bitsandbytes (not in every GPU image) Specter's draft uses the project's own int4 g128 quantizer
SPECTER_OPTIONS = {} if _has_bitsandbytes() else {"specter": {"quantizer": "int", "blocksize": 128}}


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):  # pragma: no cover - needs CUDA
    from transformers import MixtralConfig

    from specterbench.catalog.checkpoint import write_random_checkpoint

    config = MixtralConfig(vocab_size=512, hidden_size=1024, intermediate_size=1536, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=2, num_local_experts=8,
                           num_experts_per_tok=2, max_position_embeddings=512)
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "cuda-mixtral", config)


@pytest.fixture
def gpu_host(local_model):  # pragma: no cover - needs CUDA
    from specterbench.plugins.host import get_host, reset_host

    reset_host()
    host = get_host()
    name = host.register_local_model(local_model)
    yield host, name
    reset_host()


def run(host, model, strategies, budget="50%", tmp_path=None, clock="measured", **kw):  # pragma: no cover
    cfg = BenchConfig(models=(model,), strategies=tuple(strategies), budgets=(parse_budget(budget),),
                      profile="h100-pcie5", clock=clock, device="cuda", prompts=kw.pop("prompts", 2),
                      tokens=kw.pop("tokens", 12), geometry="own", **kw)
    return {r.strategy: r for r in Runner(host, cfg, tmp_path).run()}


def ok_or_numerics(row) -> bool:  # pragma: no cover - needs CUDA
    return row.status == "ok" and (row.lossless or "numerics" in str(row.extra.get("divergence", "")))


@pytest.mark.parametrize("strategy", ["lru", "on-demand", "oracle", "specter", "cpu-experts"])
def test_measured_clock_on_cuda_is_lossless_and_counts_copies(host, small_prompts, tmp_path, strategy):
    cfg = BenchConfig(models=("tiny-random-qwen2-moe",), strategies=(strategy,), budgets=(parse_budget("60%"),),
                      profile="a100-40g-pcie4", clock="measured", device="cuda", prompts=2, tokens=8,
                      strategy_options=SPECTER_OPTIONS if strategy == "specter" else {})
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok", row.error
    assert row.clock == "measured" and row.tpot_ms > 0
    assert ok_or_numerics(row)
    if strategy != "cpu-experts":
        assert row.h2d_bytes > 0


def test_the_store_is_pinned_and_large_layers_are_registered_in_place(gpu_host):
    from specterbench.engine.engine import Engine

    host, name = gpu_host
    model, tok = host.models().get(name).load()
    engine = Engine(model, name=name, device="cuda", tokenizer=tok)
    assert all(w.is_pinned() for pair in engine.store.weights.values() for w in pair)
    assert next(engine.model.parameters()).is_cuda


def dense_device_bytes(host, name) -> int:  # pragma: no cover - needs CUDA
    """What the model needs on the device besides experts: its dense weights, measured."""
    import gc

    from specterbench.engine.engine import Engine

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model, tok = host.models().get(name).load()
    engine = Engine(model, name=name, device="cuda", tokenizer=tok)
    dense = torch.cuda.memory_allocated() - before
    del engine, model
    gc.collect()
    torch.cuda.empty_cache()
    return dense


def test_device_memory_stays_within_the_budget_reference_pass_included(gpu_host, tmp_path):
    host, name = gpu_host
    dense = dense_device_bytes(host, name)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    rows = run(host, name, ["lru", "on-demand"], "25%", tmp_path)
    whole_run_peak = torch.cuda.max_memory_allocated() - base
    budget = next(iter(rows.values())).budget_bytes
    for row in rows.values():
        assert row.status == "ok", row.error
        assert row.peak_cache_bytes <= row.budget_bytes
        assert row.peak_device_bytes - base <= row.budget_bytes + dense + SLACK_BYTES, (
            f"{row.strategy}: {row.peak_device_bytes - base} bytes on the device, budget {row.budget_bytes} + "
            f"dense {dense}")
    # the reference pass (streaming at the smallest budget) included: never more than the largest cell budget
    assert whole_run_peak <= budget + dense + SLACK_BYTES, (whole_run_peak, budget, dense)


def test_prefetching_stalls_less_than_on_demand(gpu_host, tmp_path):
    host, name = gpu_host
    rows = run(host, name, ["on-demand", "oracle"], "50%", tmp_path, tokens=16)
    demand, oracle = rows["on-demand"], rows["oracle"]
    assert demand.status == oracle.status == "ok"
    assert oracle.stall_ms_per_token < demand.stall_ms_per_token, (oracle.stall_ms_per_token,
                                                                    demand.stall_ms_per_token)
    assert oracle.h2d_bytes < demand.h2d_bytes


def test_nvml_counts_what_the_ledger_counts(gpu_host, tmp_path):
    host, name = gpu_host
    row = run(host, name, ["on-demand"], "25%", tmp_path, tokens=16)["on-demand"]
    assert row.status == "ok", row.error
    if row.nvml_h2d_bytes is None:
        pytest.skip(f"NVML gave no bytes: {row.nvml_note}")
    ratio = row.nvml_h2d_bytes / row.h2d_bytes
    assert 0.9 <= ratio <= 1.3, f"NVML/ledger = {ratio:.3f} ({row.extra.get('nvml_source')})"


def test_copies_from_the_store_run_at_pinned_speed(gpu_host):
    from specterbench.engine.engine import Engine

    host, name = gpu_host
    model, tok = host.models().get(name).load()
    engine = Engine(model, name=name, device="cuda", tokenizer=tok)
    pinned = engine.store.weights[(0, 0)][0]
    dst = torch.empty_like(pinned, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(pinned, non_blocking=True)
    end.record()
    end.synchronize()
    gbps = 10 * pinned.nbytes / (start.elapsed_time(end) / 1e3) / 1e9
    assert gbps > 5, f"pinned copies from the store run at {gbps:.1f} GB/s: not pinned?"


@pytest.mark.parametrize("spec", [
    dict(bits=4, quant_type="nf4", blocksize=64, quantizer="bnb"),
    dict(bits=4, blocksize=128, quantizer="int"),
    dict(bits=3, blocksize=128, quantizer="int"),
    dict(bits=2, blocksize=128, quantizer="int"),
    dict(bits=8, blocksize=128, quantizer="int"),
])
def test_a_draft_on_cuda_allocates_what_it_is_charged_and_computes_the_dequantized_values(gpu_host, spec):
    from specterbench.engine.draft import QuantizedExperts, QuantSpec
    from specterbench.engine.engine import Engine
    from specterbench.engine.quant_spec import roundtrip

    if spec["quantizer"] == "bnb":
        pytest.importorskip("bitsandbytes", reason="the packed 4-bit kernels are bitsandbytes'")
    spec = QuantSpec(**spec)
    host, name = gpu_host
    model, tok = host.models().get(name).load()
    engine = Engine(model, name=name, device="cuda", tokenizer=tok)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    draft = QuantizedExperts(engine, spec)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert draft.allocated_bytes() <= 1.02 * draft.nbytes
    assert held <= 1.02 * draft.nbytes + SLACK_BYTES  # packed codes and scales, no 16-bit copy kept
    if spec.quantizer == "int" and spec.bits == 4:
        assert draft.runs == "int4mm", "torch's int4 weight-only matmul should run on this GPU"
    gate_up = draft.packed[(0, 0)][0]
    x = torch.randn(1, gate_up.shape[1], device="cuda", dtype=torch.bfloat16)
    w = engine.store.weights[(0, 0)][0].to("cuda")
    want = torch.nn.functional.linear(x.float(), roundtrip(w.float(), spec))
    got = gate_up.linear(x, draft.scratch).float()
    assert torch.allclose(got, want, rtol=3e-2, atol=3e-2 * float(want.abs().mean()))


def test_a_copy_into_a_reused_slot_never_overwrites_what_the_compute_stream_still_reads():
    """The stress that corrupts a read without the eviction event (scripts/gpu_probe.py prints the control)."""
    from specterbench.engine.residency import slot_copy

    n = 32 * 2**20 // 2
    zeros = torch.zeros(n, dtype=torch.bfloat16).pin_memory()
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    copy_stream = torch.cuda.Stream()
    for _ in range(10):
        slot = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        for _ in range(8):
            big @ big  # the compute stream is busy, then reads the slot
        total = slot.float().sum()
        evicted = torch.cuda.Event()
        evicted.record(torch.cuda.current_stream())
        del slot
        new = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        with torch.cuda.stream(copy_stream):
            slot_copy((new,), (zeros,), evicted)()
        torch.cuda.synchronize()
        assert total.item() == n


def test_cpu_experts_run_host_experts_beside_the_device_with_their_threads(gpu_host, tmp_path):
    host, name = gpu_host
    rows = run(host, name, ["cpu-experts"], "25%", tmp_path, strategy_options={"cpu-experts": {"threads": 2}})
    row = rows["cpu-experts"]
    assert row.status == "ok", row.error
    assert ok_or_numerics(row)
    assert row.host_experts > 0
    assert row.extra["host_threads"] == 2


def test_host_experts_leave_the_launching_thread_a_core():
    import os

    from specterbench.engine.cuda_clock import host_threads

    assert host_threads() == max(1, (os.cpu_count() or 1) - 1)
