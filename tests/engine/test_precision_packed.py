"""A quantized target holds and moves what it is charged: its experts packed in the host store, packed in the device
slots, copied packed, and computed from the packed slots (dequantized into one reused scratch) — the same values on
every path, so the reference and every strategy agree."""

from __future__ import annotations

import pytest
import torch

from specterbench import Strategy
from specterbench.catalog.tiny import tiny_random
from specterbench.engine import residency
from specterbench.engine.engine import Engine
from specterbench.engine.kernels import LaunchCounter
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.packing import PackedWeight
from specterbench.engine.precision import Precision, quantize_model
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.quant_spec import roundtrip
from specterbench.strategy import ON_HOST

CACHED = 8  # experts the cache holds, at their charged bytes


def quantized_engine(bits: int, dense_bits: int = 16):
    model, tok = tiny_random("mixtral")
    originals = [b.mlp.experts.gate_up_proj.detach().clone() for b in model.model.layers]
    precision = Precision.parse(bits, dense_bits)
    quantize_model(model, precision)
    return Engine(model, name="tiny-random-mixtral", tokenizer=tok, precision=precision), originals


def configure(engine, strategy, budget_bytes):
    engine.configure(strategy, budget_bytes, ModeledClock(default_profile(), engine.geometry,
                                                          default_host_profile()))


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_the_host_store_holds_packed_codes_and_metadata_at_the_billed_bytes(bits):
    engine, originals = quantized_engine(bits)
    store, precision = engine.store, engine.precision
    assert store.packed and all(isinstance(w, PackedWeight) for w in store.weights[(0, 0)])
    billed = precision.expert_bytes(*store.shapes)
    assert engine.expert_bytes == billed
    # every byte the store holds (unique storages: the per-layer stacks) is billed, within a few %
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for key in store.weights for t in store.tensors(key)}
    assert sum(storages.values()) <= 1.03 * billed * len(store.weights)
    # the values are the quantized model's: the originals' group-wise round trip
    spec = precision.expert_spec
    want = roundtrip(originals[1][5].float(), spec)
    assert torch.equal(store.values((1, 5), torch.float32)[0], want)


@pytest.mark.parametrize("bits", [16, 4, 3])
def test_slots_hold_and_copies_move_the_charged_bytes(bits, monkeypatch):
    if bits == 16:
        model, tok = tiny_random("mixtral")
        engine = Engine(model, name="tiny-random-mixtral", tokenizer=tok)
    else:
        engine, _ = quantized_engine(bits)
    copied = []
    real = residency.slot_copy

    def counting(dst, src, reuse_after=None):
        copied.append((sum(d.numel() * d.element_size() for d in dst), sum(s.numel() * s.element_size()
                                                                            for s in src)))
        return real(dst, src, reuse_after)

    monkeypatch.setattr(residency, "slot_copy", counting)
    configure(engine, Strategy(), CACHED * engine.expert_bytes)
    before = engine.stats.h2d_bytes
    for e in range(CACHED):
        engine.prefetch((1, e))
    ledgered = (engine.stats.h2d_bytes - before) / CACHED
    charged = engine.cache.capacity_bytes
    allocated = engine.pool.allocated_bytes()
    assert len(copied) == CACHED and all(src == ledgered for _, src in copied)  # what leaves the host is ledgered
    if bits == 16:  # the CPU pool computes in fp32 from a bf16 store: the known 2x of an fp32 model off CUDA
        assert engine.pool.mode != "packed" and allocated == 2 * charged
        assert all(dst == 2 * ledgered for dst, _ in copied)
        return
    assert engine.pool.mode == "packed"
    assert allocated <= 1.05 * charged
    assert all(dst == ledgered for dst, _ in copied)  # the slot receives exactly those bytes, packed


class OnHost(Strategy):
    """Every miss of layer 0 on the host, the rest fetched (a host path and a device path in the same forward)."""

    name = "on-host-layer-0"
    version = "1"

    def place_miss(self, key, n_tokens):
        return ON_HOST if key[0] == 0 else super().place_miss(key, n_tokens)


@pytest.mark.parametrize("bits", [4, 2])
def test_device_and_host_paths_compute_the_same_values_from_packed_experts(bits):
    engine, _ = quantized_engine(bits)
    prompt = torch.tensor([list(range(3, 12))])
    outs = []
    for strategy, budget in ((Strategy(), engine.total_expert_bytes), (OnHost(), engine.min_budget_bytes())):
        configure(engine, strategy, budget)
        outs.append(engine.forward(prompt, engine.new_kv_cache(), all_logits=True))
    assert engine.stats.host_experts > 0
    assert torch.equal(outs[0], outs[1])


def test_the_packed_expert_path_is_charged_the_launches_it_issues():
    engine, _ = quantized_engine(3)
    configure(engine, Strategy(), engine.total_expert_bytes)
    for key in engine.store.weights:
        engine.prefetch(key)
    assert engine.kernels.target_expert > 0 and engine.kernels.target_layer > 0
    x = torch.randn(1, engine.store.shapes[0][1])
    for k in (1, 2):
        idx = torch.tensor([list(range(k))])
        w = torch.full((1, k), 1.0 / k)
        engine._pending = {(0, e) for e in range(k)}
        before = engine.clock.totals.launches
        with torch.inference_mode(), LaunchCounter() as counter:  # as engine.forward runs it
            engine.run_moe_layer(0, torch.nn.functional.silu, x, idx, w)
        charged = engine.clock.totals.launches - before
        dense = engine.clock.costs.dense_layer(1, 1, moe=True).launches  # the layer's non-expert part, charged too
        assert charged - dense == engine.kernels.target_layer + k * engine.kernels.target_expert
        assert counter.total == engine.kernels.target_layer + k * engine.kernels.target_expert


def test_a_packed_expert_is_priced_as_dequantization_into_the_scratch_and_a_16_bit_gemm():
    engine, _ = quantized_engine(2)
    configure(engine, Strategy(), engine.total_expert_bytes)
    costs = engine.costs
    g = engine.geometry
    ratio, kernel = engine.clock.costs.target_read()
    stored = g.expert_bytes / (g.expert_params * g.dtype_bytes)
    assert kernel.name == "bf16" and ratio == pytest.approx(stored + 2.0)
    assert costs.expert_s(1) > costs.expert_s(1, bytes_ratio=stored)  # the scratch's write and read are paid


def test_a_quantized_run_stays_lossless_with_every_kind_of_placement(tmp_path, capsys):
    from specterbench.cli import main
    from specterbench.runfiles.results import read_rows

    code = main(["run", "--model", "tiny-random-mixtral", "--prompts", "1", "--tokens", "6", "--quiet",
                 "--geometry", "own", "--strategies", "lru,cpu-experts,on-demand", "--budgets", "40%",
                 "--expert-bits", "3", "--out", str(tmp_path), "--run-id", "q"])
    assert code == 0, capsys.readouterr().err
    rows = read_rows(tmp_path / "q")
    assert all(r.status == "ok" and r.lossless for r in rows)
