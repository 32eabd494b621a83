"""The self-draft's quantizers: bytes known before quantizing, error shrinking with bits, packed storage that holds
what it is charged, computing equal to the dequantized values, and copies released with their cell."""

import pytest
import torch

from specterbench.catalog.tiny import tiny_random
from specterbench.engine import bitpack, lowbit_ops, packing
from specterbench.engine.dense_copy import QuantizedDense, dense_spec, shared_dense
from specterbench.engine.draft import (
    QuantizedExperts,
    QuantSpec,
    drafts_allocated_bytes,
    live_drafts,
    quantized_bytes,
    shared_quantized,
)
from specterbench.engine.engine import Engine
from specterbench.engine.quant_spec import pack, roundtrip
from specterbench.errors import UsageError


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_int_quantizer_bytes_are_the_packed_values_plus_group_metadata(bits):
    spec = QuantSpec(bits=bits, blocksize=128, quantizer="int")
    n = 4096 * 128
    assert spec.tensor_bytes(n) == n * bits // 8 + (n // 128) * (16 + bits) // 8
    assert spec.bits_per_weight() == pytest.approx(bits + (16 + bits) / 128, abs=1e-3)


def test_int4_g128_is_the_gptq_layout():
    assert 4.125 <= QuantSpec(bits=4, blocksize=128, quantizer="int").bits_per_weight() <= 4.25


def test_error_shrinks_with_bits():
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    errors = [float((roundtrip(w, QuantSpec(bits=b, blocksize=128, quantizer="int")) - w).pow(2).mean())
              for b in (2, 3, 4, 8)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3


@pytest.mark.parametrize("options, match", [
    ({"quantizer": "gptq"}, "unknown quantizer 'gptq'; supported: bnb, int, hqq"),
    ({"quantizer": "bnb", "bits": 2}, "unsupported draft bit width 2 for quantizer 'bnb'; supported: 4, 8"),
    ({"bits": "four"}, "must be integers"),
    ({"quantizer": "int", "blocksize": 100}, "power of two from 32 to 4096"),
])
def test_bad_quantization_options_are_one_line(options, match):
    with pytest.raises(UsageError, match=match) as err:
        QuantSpec.from_options(options)
    assert "\n" not in str(err.value)


def _has_bnb() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


EXPERT_SPECS = [QuantSpec(bits=b, blocksize=128, quantizer="int") for b in (2, 3, 4, 8)] + [
    pytest.param(QuantSpec(bits=4, quant_type="nf4", blocksize=64), marks=pytest.mark.skipif(
        not _has_bnb(), reason="bitsandbytes is not installed")),
    pytest.param(QuantSpec(bits=8, blocksize=64), marks=pytest.mark.skipif(
        not _has_bnb(), reason="bitsandbytes is not installed"))]


def _engine(family="qwen2_moe", dtype=torch.float32):
    model, tok = tiny_random(family)
    return Engine(model.to(dtype), name=family, tokenizer=tok)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", EXPERT_SPECS)
def test_a_draft_allocates_no_more_than_it_is_charged(spec, dtype):
    engine = _engine(dtype=dtype)
    draft = QuantizedExperts(engine, spec)
    assert draft.nbytes == quantized_bytes(engine, spec)
    assert draft.nbytes <= draft.allocated_bytes() * 1.02 and draft.allocated_bytes() <= 1.02 * draft.nbytes
    held = [t for pair in draft.packed.values() for p in pair for t in (p.codes, p.scale, p.zero) if t is not None]
    assert all(t.element_size() <= 2 for t in held)  # codes, fp16 scales, packed zeros: never a 32-bit copy
    sixteen_bit = engine.total_expert_bytes
    # the packed weights themselves, scratch aside (a tiny model's top-k scratch is large beside its tiny experts)
    packed = draft.allocated_bytes() - bitpack.storage_bytes(draft.scratch) - bitpack.unpack_table_bytes(spec.bits)
    assert packed < (spec.bits / 16 + 0.2) * sixteen_bit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v2", "mixtral"])
def test_a_dense_copy_allocates_no_more_than_it_is_charged(bits, dtype, family):
    engine = _engine(family, dtype)
    copy = QuantizedDense(engine, dense_spec(bits))
    assert copy.allocated_bytes() <= 1.02 * copy.nbytes


@pytest.mark.parametrize("spec", EXPERT_SPECS)
def test_a_packed_draft_computes_what_the_dequantized_weights_give(spec):
    engine = _engine()
    draft = QuantizedExperts(engine, spec)
    torch.manual_seed(0)
    hidden = torch.randn(5, engine.model.config.hidden_size)
    idx = torch.tensor([[0, 1], [2, 3], [1, 4], [0, 5], [3, 2]])
    weights = torch.rand(5, 2)
    act = torch.nn.functional.silu
    got = draft(0, act, hidden, idx, weights)
    want = torch.zeros_like(hidden)
    for t in range(5):
        for j in range(2):
            gu, dn = (roundtrip(w.float(), spec) for w in engine.store.weights[(0, int(idx[t, j]))])
            gate, up = torch.nn.functional.linear(hidden[t], gu).chunk(2)
            want[t] += torch.nn.functional.linear(act(gate) * up, dn) * weights[t, j]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_the_int4_draft_runs_torchs_int4_kernel_where_the_shapes_allow():

    if not lowbit_ops.int4_kernel_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU int4 weight-only matmul")
    w = torch.randn(64, 256)
    p = packing.PackedWeight(w, QuantSpec(bits=4, blocksize=128, quantizer="int"), torch.float32)
    assert p.kernel == "int4mm"
    x = torch.randn(3, 256)
    want = x @ roundtrip(w, p.spec).t()
    assert torch.allclose(p.linear(x, torch.empty(p.scratch_elems())), want, atol=1e-3)
    assert torch.equal(p.kernel_op()(x), p.linear(x))  # the bound kernel a draft step calls per expert: the same op
    assert torch.equal(p.dequantize(), roundtrip(w, p.spec))


def test_the_int8_dense_format_runs_torchs_int8_kernel_from_its_codes_and_channel_scales():

    if not lowbit_ops.int8_kernel_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU int8 weight-only matmul")
    w = torch.randn(48, 96)
    spec = dense_spec(8)
    assert spec.quantizer == "sym" and spec.label() == "int8/channel"
    p = packing.PackedWeight(w, spec, torch.float32)
    assert p.kernel == "int8mm" and p.scratch_elems() == 0
    assert p.codes.dtype == torch.int8 and p.codes.shape == (48, 96) and p.scale.shape == (48,)  # what the op takes
    assert p.nbytes() == spec.weight_bytes((48, 96), "int8mm", 4) == 48 * 96 + 48 * 4  # codes + one scale per row
    x = torch.randn(3, 96)
    assert torch.allclose(p.linear(x), x @ roundtrip(w, spec).t(), atol=1e-4)
    assert torch.equal(p.kernel_op()(x), p.linear(x))  # the bound kernel a dense copy's modules call: the same op
    assert packing.PackedWeight(w, QuantSpec(bits=3, blocksize=32, quantizer="int"), torch.float32).kernel_op() is None
    assert torch.equal(p.dequantize(), roundtrip(w, spec))
    assert (roundtrip(w, spec) - w).abs().max() <= w.abs().amax(-1, keepdim=True).max() / 127  # symmetric rounding
    with torch.inference_mode():
        from specterbench.engine.kernels import LaunchCounter

        with LaunchCounter() as counter:
            p.linear(x)
    assert counter.total == 1  # one launch per weight, no dequantization


@pytest.mark.parametrize("quantizer", [None, "int"])  # int8 per channel on its kernel; int8/g64 dequantized
def test_an_entered_dense_copy_runs_each_module_through_its_kernel_and_leaves_no_trace(quantizer):
    """Entering the copy (once per draft step) writes each replaced module's forward: straight to the copy's kernel
    where one op computes it, else through the copy's dequantizing path — the same values, ``[..., C]`` inputs of
    any rank, one launch a bias-free module on the int8 kernel; on exit the modules are the target's again."""
    from specterbench.engine.kernels import LaunchCounter

    model, _ = tiny_random("qwen2_moe")
    engine = Engine(model, name="qwen")
    copy = QuantizedDense(engine, dense_spec(8, quantizer=quantizer))
    x = torch.randn(2, 3, model.config.hidden_size)
    for _ in range(2):  # entered again: the forwards bound on the first entry
        with torch.inference_mode(), copy:
            for i, m in enumerate(copy.modules):
                if m.weight.shape[1] != x.shape[-1]:
                    continue
                y = m(x)
                assert y.shape == (2, 3, m.weight.shape[0])
                assert torch.allclose(y, copy._forward(i, x), atol=1e-6)
                if copy.packed[i].kernel == "int8mm":
                    with LaunchCounter() as counter:
                        m(x)
                    assert counter.total == 1 + (m.bias is not None)  # the kernel (and a bias add)
        assert all("forward" not in m.__dict__ for m in copy.modules)
    if lowbit_ops.int8_kernel_works("cpu", torch.float32):
        assert (copy.packed[0].kernel == "int8mm") == (quantizer is None)


def test_the_earlier_int8_g64_dense_copy_stays_reachable_and_dequantizes():
    spec = dense_spec(8, quantizer="int")
    assert spec.label() == "int8/g64"
    p = pack(torch.randn(16, 128), spec)
    assert p.kernel == "dequant" and p.scratch_elems() == 16 * 128
    with pytest.raises(UsageError, match="dense_quantizer=sym is invalid at dense_bits=4: use int") as err:
        dense_spec(4, quantizer="sym")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_the_int8_dense_copy_is_priced_as_the_int8_kernel_reading_its_stored_bytes(family):
    from specterbench.engine.kernels import LaunchCounter
    from specterbench.engine.lowbit import INT8

    if not lowbit_ops.int8_kernel_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU int8 weight-only matmul")
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile, default_profile
    from specterbench.strategy import Strategy

    engine = _engine(family)
    engine.configure(Strategy(), engine.total_expert_bytes,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    copy = QuantizedDense(engine, dense_spec(8))
    assert copy.kernels == ["int8mm"] and copy.kernel is INT8  # gpt-fast's int8 weight-only figure
    weights = sum(p.shape[0] * p.shape[1] for p in copy.packed)
    rows = sum(p.shape[0] for p in copy.packed)
    assert copy.bytes_ratio == pytest.approx((weights + 2 * rows) / (2 * weights))  # no scratch written or read
    assert copy.scratch.numel() == 0 and copy.allocated_bytes() == copy.nbytes
    counters = []
    for dense in (None, copy, QuantizedDense(engine, dense_spec(8, quantizer="int"))):  # target, int8mm, int8/g64
        kv = engine.new_kv_cache()
        engine.forward(torch.tensor([[3, 1, 4]]), kv, dense=dense)
        with LaunchCounter() as counter:  # one decode step
            engine.forward(torch.tensor([[5]]), kv, dense=dense)
        counters.append(counter)
    target, int8, g64 = counters
    replaced = target.ops["linear"] - int8.ops.get("linear", 0)
    assert int8.ops["_weight_int8pack_mm"] == replaced > 0  # one kernel per linear it replaces
    biased = sum(m.bias is not None for m in copy.modules)  # the op takes no bias: one add each
    # the launches the dense layers are priced with (counted on the target's forward) cover the copy's own
    assert int8.total <= target.total + biased
    assert g64.total > target.total + replaced  # dequantizing issues several launches per weight


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_bits_pack_and_unpack_losslessly(bits):
    from specterbench.engine.bitpack import pack_bits, packed_bytes, unpack_bits

    q = torch.randint(0, 1 << bits, (1003,), dtype=torch.uint8)
    packed = pack_bits(q, bits)
    assert packed.numel() == packed_bytes(1003, bits) and torch.equal(unpack_bits(packed, bits, 1003), q)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_packed_bytes_hold_each_value_at_bits_times_its_index_little_endian(bits):
    """The layout every stored draft and unpacking path assumes, against a bit-by-bit reference: value ``j`` of a
    group of 8 at bits ``bits·j`` … of the group's ``bits`` bytes, least significant byte first."""
    from specterbench.engine.bitpack import pack_bits

    q = torch.randint(0, 1 << bits, (21,), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
    values = q.tolist() + [0] * ((-len(q)) % 8)
    want = []
    for g in range(0, len(values), 8):
        word = sum(v << (bits * j) for j, v in enumerate(values[g:g + 8]))
        want += [(word >> (8 * i)) & 0xFF for i in range(bits)] if bits < 8 else values[g:g + 8]
    assert pack_bits(q, bits).tolist() == (want if bits < 8 else q.tolist())


def test_a_dequantized_weight_computes_a_block_of_rows_at_a_time_through_a_small_scratch():
    from specterbench.engine.packing import PackedWeight

    w = torch.randn(96, 128)
    p = PackedWeight(w, QuantSpec(bits=3, blocksize=64, quantizer="int"), torch.float32)
    x = torch.randn(2, 128)
    small = torch.empty(p.scratch_elems(rows=16))
    assert small.numel() == 16 * 128
    assert torch.allclose(p.linear(x, small), x @ roundtrip(w, p.spec).t(), atol=1e-5)


def test_drafts_live_for_one_cell_and_are_freed_when_it_ends():
    engine = _engine()
    spec = QuantSpec(bits=3, blocksize=32, quantizer="int")
    draft = shared_quantized(engine, spec)
    dense = shared_dense(engine, dense_spec(8))
    assert shared_quantized(engine, spec) is draft  # one copy within the cell
    assert drafts_allocated_bytes(engine) == draft.allocated_bytes() + dense.allocated_bytes()
    engine.end_cell()
    assert live_drafts(engine) == [] and drafts_allocated_bytes(engine) == 0
    assert draft.allocated_bytes() == dense.allocated_bytes() == 0  # the shells a strategy may still hold are empty
    assert draft.packed == {} and draft.scratch.numel() == 0
    assert shared_quantized(engine, spec) is not draft  # the next cell quantizes its own


def test_dense_copy_is_swapped_in_for_one_pass_and_priced_at_its_bits():
    from specterbench.engine.dense_copy import QuantizedDense, dense_spec
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile, default_profile
    from specterbench.strategy import Strategy

    model, tok = tiny_random("qwen2_moe")
    engine = Engine(model, name="qwen", tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    target = model.lm_head.weight
    copy = QuantizedDense(engine, dense_spec(4))
    t0 = engine.clock.now()
    full = engine.forward(ids, engine.new_kv_cache())
    t1 = engine.clock.now()
    low = engine.forward(ids, engine.new_kv_cache(), dense=copy)
    t2 = engine.clock.now()
    assert model.lm_head.weight is target  # the target's weights are back after the pass
    assert not torch.equal(full, low) and torch.allclose(full.softmax(-1), low.softmax(-1), atol=0.2)
    assert t2 - t1 < t1 - t0  # fewer weight bytes read
    # read where torch's int4 kernel runs the copy: packed codes plus its 16-bit (scale, zero) table per group
    kernel = "int4mm" if copy.kernels == ["int4mm"] else None
    assert copy.bytes_ratio == pytest.approx(dense_spec(4).bits_per_weight(kernel=kernel) / 16)
    assert 0 < copy.nbytes < engine.total_expert_bytes
    again = engine.forward(ids, engine.new_kv_cache())
    assert torch.equal(again, full)


@pytest.mark.parametrize("value", ["5", "fp8", "32"])
def test_bad_dense_bits_are_one_line(value):
    from specterbench.engine.dense_copy import dense_spec

    with pytest.raises(UsageError, match="use one of 16, 8, 4, 3") as err:
        dense_spec(value)
    assert "\n" not in str(err.value) and f"dense_bits={value} is invalid" in str(err.value)


def test_dense_copy_bytes_are_the_real_models_share_at_a_projection():
    from specterbench.engine.dense_copy import dense_params, dense_quantized_bytes, dense_spec
    from specterbench.engine.geometry import project

    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    engine.geometry = project(engine.own_geometry, "mixtral")
    g = engine.geometry
    spec = dense_spec(8, quantizer="int")  # int8/g64: dequantized into a scratch
    share = dense_params(g) * spec.bits_per_weight(cols=g.hidden) / 8 / g.all_expert_bytes
    packed = share * engine.total_expert_bytes
    charged = dense_quantized_bytes(engine, spec)
    assert packed < charged < 1.2 * packed  # the real model's share, plus its scratch scaled alike
    assert 0.003 < share < 0.03  # Mixtral: attention and head are ~3% of the 16-bit expert bytes
    assert dense_quantized_bytes(engine, None) == 0

    if lowbit_ops.int8_kernel_works("cpu", engine.compute_dtype):  # the int8 kernel's copy: codes and row scales only
        kernel = dense_spec(8)
        bits = kernel.bits_per_weight(kernel="int8mm", cols=g.hidden)
        assert bits == pytest.approx(8 + 16 / g.hidden)
        assert dense_quantized_bytes(engine, kernel) == round(dense_params(g) * bits / 8 / g.all_expert_bytes
                                                              * engine.total_expert_bytes)


def test_the_modeled_clock_prices_the_kernel_that_runs():
    from specterbench.engine.geometry import project
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile, default_profile
    from specterbench.strategy import Strategy

    if not lowbit_ops.int4_kernel_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU int4 weight-only matmul")
    model, tok = tiny_random("qwen2_moe")
    engine = Engine(model, name="qwen", tokenizer=tok)
    engine.geometry = project(engine.own_geometry, "qwen-moe")
    engine.configure(Strategy(), engine.total_expert_bytes,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    kernel = QuantizedExperts(engine, QuantSpec(bits=4, blocksize=32, quantizer="int"))
    dequant = QuantizedExperts(engine, QuantSpec(bits=3, blocksize=32, quantizer="int"))
    assert kernel.runs == "int4mm" and dequant.runs == "dequant"
    assert kernel.bytes_ratio == kernel.stored_ratio  # the kernel reads the packed bytes only
    assert dequant.bytes_ratio == pytest.approx(dequant.stored_ratio + 2)  # + a 16-bit scratch written and read
    costs, model = engine.clock.costs, engine.clock.costs

    def memory_s(draft):  # the op's weight-streaming time, its launches aside
        op = model.experts_fused([1, 1, 1, 1], draft.bytes_ratio, draft.kernel)
        return op.nbytes / (model.profile.mem_bytes_per_s * op.efficiency)

    assert memory_s(dequant) > 2 * memory_s(kernel)  # the scratch's 16-bit write and read
    before = engine.clock.totals.launches
    kernel.charge_fused([1, 1, 1, 1])  # the launches its expert path was counted to issue, at the geometry's scale
    scale = costs.geometry.layer_scale
    assert engine.clock.totals.launches - before == round((kernel.layer_launches + 4 * kernel.expert_launches) * scale)


@pytest.mark.parametrize("geometry", ["mixtral", "qwen1.5-moe", "deepseek-v2-lite"])
def test_a_draft_steps_routed_experts_dequantize_together(geometry):
    """At a real routing geometry a draft step's top-k int3 experts are dequantized in one pass over the layer's
    stacked codes and multiplied in one batched GEMM per projection: the per-expert path's values, a layer's
    launches independent of k, and the scratch of k expert weights allocated as charged."""
    from specterbench.catalog.tiny import routing_geometry_random

    engine = Engine(routing_geometry_random(geometry), name=geometry)
    spec = QuantSpec(bits=3, blocksize=64, quantizer="int")
    draft = QuantizedExperts(engine, spec)
    k = engine.top_k
    assert draft.chunk == k and draft.stacks  # the scratch of k weights is a small share of the draft here
    assert draft.allocated_bytes() == draft.nbytes == quantized_bytes(engine, spec)
    h = engine.store.weights[(0, 0)][1].shape[0]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, h, generator=gen)
    idx = torch.randperm(engine.num_experts, generator=gen)[:k].view(1, k)
    w = torch.softmax(torch.randn(1, k, generator=gen), -1)
    silu = torch.nn.functional.silu
    grouped, groups = draft._compute(1, silu, x, idx, w)
    one_by_one = draft._compute_loop(1, silu, x, groups)
    assert torch.allclose(grouped, one_by_one, rtol=1e-5, atol=1e-6 * float(one_by_one.abs().max()))
    assert draft.expert_launches == 0  # both projections dequantized: nothing is launched once per expert
    assert draft.layer_launches + draft.chunk_launches <= 40  # one chunk: 33 launches per expert one at a time
    assert draft.fused_op([1] * k).launches == draft.fused_op([1]).launches


@pytest.mark.parametrize("geometry", ["qwen1.5-moe", "deepseek-v2-lite"])
def test_an_int4_draft_groups_the_projection_its_kernel_does_not_take(geometry):
    """At hidden 32 (expert intermediate 16) the int4 draft's down projection has 16-value rows, below the int4
    kernel's smallest group: gate_up stays on the kernel (one call per expert), down is dequantized for the step's
    routed experts together — the per-expert path's values, fewer launches than it, the scratch of k down weights
    allocated as charged, and the launches charged the ones counted."""
    from specterbench.catalog.tiny import routing_geometry_random
    from specterbench.engine.kernels import LaunchCounter

    if not lowbit_ops.int4_kernel_works("cpu", torch.float32):
        pytest.skip("this torch has no CPU int4 weight-only matmul")
    engine = Engine(routing_geometry_random(geometry, hidden=32), name=geometry)
    spec = QuantSpec(bits=4, blocksize=128, quantizer="int")
    draft = QuantizedExperts(engine, spec)
    k = engine.top_k
    assert [p.kernel for p in draft.packed[(0, 0)]] == ["int4mm", "dequant"]
    assert draft.chunk == k and draft.stacks[0][0] is None and draft.stacks[0][1] is not None
    assert draft.allocated_bytes() == draft.nbytes == quantized_bytes(engine, spec)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, generator=gen)
    idx = torch.randperm(engine.num_experts, generator=gen)[:k].view(1, k)
    w = torch.softmax(torch.randn(1, k, generator=gen), -1)
    silu = torch.nn.functional.silu
    with torch.inference_mode():
        with LaunchCounter() as grouped_ops:
            grouped, groups = draft._compute(1, silu, x, idx, w)
        with LaunchCounter() as loop_ops:
            one_by_one = draft._compute_loop(1, silu, x, groups)
    assert torch.allclose(grouped, one_by_one, rtol=1e-5, atol=1e-6 * float(one_by_one.abs().max()))
    assert grouped_ops.total < loop_ops.total
    assert draft.expert_launches == 1  # the int4 kernel's call per expert; the rest once per chunk
    scale = engine.clock.costs.geometry.layer_scale
    assert draft.fused_op([1] * k).launches == round(grouped_ops.total * scale)


@pytest.mark.parametrize("stand_in,geometry", [("tiny-mixtral", "mixtral"), ("tiny-qwen-moe", "qwen-moe"),
                                               ("tiny-deepseek", "deepseek-v2-lite")])
def test_the_draft_chunk_at_a_projection_counts_every_real_layer(stand_in, geometry):
    """At a projection each of the stand-in's MoE layers stands for ``layer_scale`` real ones: the draft whose share
    bounds the grouped scratch is the real model's whole draft, so the default int4 draft's dequantized projection
    groups the real model's top-k (Mixtral 2, where the stand-in's six layers counted alone would give 1)."""
    from specterbench.catalog import embedded
    from specterbench.engine.draft import draft_chunk, kernel_name_for
    from specterbench.engine.geometry import project
    from specterbench_specter.specter import Specter

    spec = QuantSpec(**Specter.draft_defaults)  # int4, group 128

    model, tok = embedded.load(stand_in)
    engine = Engine(model, name=stand_in, tokenizer=tok)
    engine.geometry = project(engine.own_geometry, geometry)
    weights = engine.store.weights[next(iter(engine.store.weights))]
    kernels = [kernel_name_for(w.shape, spec, engine) for w in weights]
    if "dequant" not in kernels:
        pytest.skip("this torch runs every projection on a low-bit kernel: nothing is grouped")
    assert draft_chunk(engine, spec, kernels, [w.shape for w in weights]) == engine.top_k


def test_four_bit_codes_unpack_by_mask_and_shift():
    """4-bit codes are nibbles (value 2i low, 2i + 1 high in byte i): unpacked with a mask, a shift and a stack — 3
    counted launches and no table — where the other widths gather from per-byte tables."""
    from specterbench.engine.bitpack import pack_bits, unpack_bits, unpack_table_bytes
    from specterbench.engine.kernels import LaunchCounter

    q = torch.randint(0, 16, (1000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = pack_bits(q, 4)
    assert torch.equal(packed, q[0::2] | q[1::2] << 4)  # the nibble layout the fast path reads
    with torch.inference_mode(), LaunchCounter() as four:
        out = unpack_bits(packed, 4, 1000)
    assert torch.equal(out, q)
    with torch.inference_mode(), LaunchCounter() as three:
        unpack_bits(pack_bits(q % 8, 3), 3, 1000)
    assert four.total == 3 < three.total and unpack_table_bytes(4) == 0
