"""Host memory while loading a real-layout checkpoint, and the expert store built layer by layer.

The loader fills an uninitialised model straight from the safetensors files, so the peak resident set while
loading is about the model's own bytes (``transformers.from_pretrained`` peaks near twice that); the store then
takes the fused expert tensors over without copying them (CPU) or converts them one layer at a time.
"""

import json
import os
import sys

import pytest
import torch

from specterbench.catalog.checkpoint import load_checkpoint, model_bytes, write_random_checkpoint
from specterbench.catalog.tiny import TINY_FAMILIES, tiny_config, tiny_random
from specterbench.engine.seam import find_moe_blocks
from specterbench.engine.store import ExpertStore

SLOW_ENV = "SPECTERBENCH_SLOW_TESTS"
PEAK_RATIO_MAX = 1.15  # host RAM while loading: about the model's bytes (expert + dense), not from_pretrained's 2x

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Return freed heap pages to the OS and reset this process's peak RSS (VmHWM); False where Linux refuses."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kib("VmHWM"), _status_kib("VmRSS")
    except (OSError, KeyError):  # no such /proc support (e.g. a gVisor sandbox)
        return False
    return True


def measure_loading(path) -> dict:
    """Peak resident bytes added while loading ``path`` and building its store, in this process."""
    tiny_random("mixtral")  # the modeling code is imported first: its memory is not the loader's
    if not _reset_peak():
        pytest.skip("cannot reset or read the peak RSS here (/proc/self/clear_refs, VmHWM)")
    base = _status_kib("VmRSS") * 1024
    model, _ = load_checkpoint(path)
    loaded, nbytes = _status_kib("VmHWM") * 1024 - base, model_bytes(model)
    store = ExpertStore(find_moe_blocks(model), torch.bfloat16, pin=False)
    return {"model_bytes": nbytes, "expert_bytes": store.total_bytes, "load_peak": loaded,
            "store_peak": _status_kib("VmHWM") * 1024 - base}


def mixtral_config(hidden, inter, layers, experts=8):
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=2, num_local_experts=experts,
                         num_experts_per_tok=2, max_position_embeddings=256)


@pytest.mark.skipif(not os.environ.get(SLOW_ENV), reason=f"slow (writes a 1 GB checkpoint, 25-80 s on 2 cores); set "
                    f"{SLOW_ENV}=1 (scripts/gpu_check.sh does); the small checkpoint test below always runs")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS is read from /proc (Linux)")
def test_loading_a_1gb_mixtral_checkpoint_peaks_near_its_own_bytes(tmp_path):
    path = write_random_checkpoint(tmp_path / "mixtral-1g", mixtral_config(1024, 2048, 10))
    assert len(list(path.glob("model-*.safetensors"))) > 1  # sharded like the Hub's, with an index
    m = measure_loading(path)
    assert m["expert_bytes"] >= 10**9
    ratio = m["store_peak"] / m["model_bytes"]
    assert ratio <= PEAK_RATIO_MAX, f"peak RSS {ratio:.3f} x the model's bytes"
    assert m["store_peak"] - m["load_peak"] < 0.01 * m["model_bytes"]  # the store copied nothing


RUN_STRATEGIES = "specmoeoff,specter,lru,cpu-experts"  # speculative cells first, then cells that must not inherit


@pytest.mark.skipif(not os.environ.get(SLOW_ENV), reason=f"slow (a 1 GB checkpoint through four strategies, minutes "
                    f"on 2 cores); set {SLOW_ENV}=1 (scripts/gpu_check.sh does)")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS is read from getrusage (Linux: KiB)")
def test_a_run_over_a_1gb_checkpoint_keeps_nothing_of_a_cell_after_it_ends(tmp_path):
    """Drafts, scratch and host threads go with their cell: a run of speculative and plain strategies peaks at
    about the checkpoint, plus the largest cell's device bytes (host memory here), plus 1 GB."""
    import resource
    import subprocess

    path = write_random_checkpoint(tmp_path / "mixtral-1g", mixtral_config(1024, 2048, 10))
    ckpt = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    assert ckpt >= 10**9
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cmd = [sys.executable, "-c", "import sys; from specterbench.cli import main; sys.exit(main())", "run",
           "--model-path", str(path), "--strategies", RUN_STRATEGIES, "--budgets", "35%", "--prompts", "1",
           "--tokens", "4", "--out", str(tmp_path / "runs"), "--run-id", "r", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert before * 1024 < peak  # this child's peak, not an earlier one's
    rows = [json.loads(line) for line in (tmp_path / "runs" / "r" / "rows.jsonl").read_text().splitlines()]
    assert [r["strategy"] for r in rows] == RUN_STRATEGIES.split(",") and all(r["status"] == "ok" for r in rows)
    for r in rows:
        if r["strategy_device_bytes"]:
            assert r["strategy_device_bytes_allocated"] <= 1.02 * r["strategy_device_bytes"]
    largest_cell = max(r["budget_bytes"] for r in rows)
    bound = 1.15 * ckpt + largest_cell + 2**30
    print(f"peak RSS {peak / 2**30:.2f} GiB for a {ckpt / 2**30:.2f} GiB checkpoint (bound {bound / 2**30:.2f} GiB)")
    assert peak <= bound, f"peak RSS {peak / 2**30:.2f} GiB over {bound / 2**30:.2f} GiB"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS is read from /proc (Linux)")
def test_loading_a_small_checkpoint_also_stays_under_the_ratio(tmp_path):
    path = write_random_checkpoint(tmp_path / "mixtral-s", mixtral_config(256, 512, 4), shard_bytes=4 * 2**20)
    m = measure_loading(path)
    assert m["store_peak"] / m["model_bytes"] <= PEAK_RATIO_MAX


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_streaming_loader_equals_transformers_from_pretrained(tmp_path, family):
    from transformers import AutoModelForCausalLM

    path = write_random_checkpoint(tmp_path / family, tiny_config(family), shard_bytes=50_000)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True)
    model, _ = load_checkpoint(path)
    want, got = reference.state_dict(), model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_checkpoint_in_another_dtype_is_converted_on_read(tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_random_checkpoint(tmp_path / "m", tiny_config("qwen2_moe"), dtype=torch.float32)
    model, _ = load_checkpoint(path, torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), model.state_dict().values()))


def test_the_store_holds_views_of_the_fused_tensors_when_nothing_needs_converting(tmp_path):
    path = write_random_checkpoint(tmp_path / "m", tiny_config("mixtral"))
    model, _ = load_checkpoint(path, torch.bfloat16)
    blocks = find_moe_blocks(model)
    storage = blocks[0].experts.gate_up_proj.untyped_storage().data_ptr()
    expert_bytes = sum(b.experts.gate_up_proj.nbytes + b.experts.down_proj.nbytes for b in blocks)
    store = ExpertStore(blocks, torch.bfloat16, pin=False)
    assert store.copied_layers == 0
    assert store.weights[(0, 1)][0].untyped_storage().data_ptr() == storage
    assert blocks[0].experts.gate_up_proj is None  # the module let go; the store holds the only reference
    assert store.total_bytes == expert_bytes


def test_converting_a_layer_frees_its_original_before_the_next():
    model, _ = tiny_random("qwen2_moe")  # fp32
    blocks = find_moe_blocks(model)
    originals = [b.experts.gate_up_proj.detach() for b in blocks]
    import weakref

    alive = [weakref.ref(b.experts.gate_up_proj) for b in blocks]
    del originals
    store = ExpertStore(blocks, torch.bfloat16, pin=False, device_dtype=torch.float32)
    assert store.copied_layers == len(blocks)
    assert all(ref() is None for ref in alive)
    assert store.weights[(0, 0)][0].dtype == torch.bfloat16


def test_device_bytes_count_the_compute_dtype_not_the_store_dtype():
    model, _ = tiny_random("mixtral")
    fp32 = ExpertStore(find_moe_blocks(model), torch.bfloat16, pin=False, device_dtype=torch.float32)
    assert fp32.device_expert_bytes == 2 * fp32.expert_bytes  # a bf16 store copied to an fp32 device slot
    model, _ = tiny_random("mixtral")
    bf16 = ExpertStore(find_moe_blocks(model), torch.bfloat16, pin=False, device_dtype=torch.bfloat16)
    assert bf16.device_expert_bytes == bf16.expert_bytes
    assert bf16.total_device_bytes == bf16.total_bytes


def test_pinning_registers_large_layers_in_place_and_copies_only_the_rest(monkeypatch):
    """The CUDA path without CUDA: registration and pinned copies are faked, the bookkeeping is real."""
    import gc

    from specterbench.engine import store as store_mod

    registered, unregistered, copies = [], [], []

    def fake_register(tensors):
        done = [t for t in tensors if t.dim() == 3 and t.shape[1] > t.shape[2]]  # pretend gate_up is large
        registered.extend(done)
        return done

    def fake_copy(t):
        copies.append(t.shape)
        return t.clone()

    monkeypatch.setattr(store_mod, "_register_in_place", fake_register)
    monkeypatch.setattr(store_mod, "_copy_to_pinned", fake_copy)
    monkeypatch.setattr(store_mod, "_unregister", lambda tensors: unregistered.extend(tensors))
    model, _ = tiny_random("mixtral")
    model = model.to(torch.bfloat16)
    blocks = find_moe_blocks(model)
    gate_up_ptr = blocks[0].experts.gate_up_proj.data_ptr()
    store = ExpertStore(blocks, torch.bfloat16, pin=True)
    assert store.weights[(0, 0)][0].data_ptr() == gate_up_ptr  # registered where it lay: no copy
    assert len(copies) == len(blocks)  # one down_proj per layer was copied into pinned memory
    assert store.registered_bytes == sum(t.numel() * t.element_size() for t in registered)
    del store
    gc.collect()
    assert len(unregistered) == len(registered)  # unregistered when the store goes away


def _first_slot(model, tok, device):
    from specterbench.engine.engine import Engine
    from specterbench.strategy import Strategy

    engine = Engine(model, name="m", device=device, tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes, engine.clock)
    engine.prefetch((0, 0))
    return engine, engine.cache.get((0, 0))


def test_a_bf16_cache_slot_is_charged_the_bytes_it_allocates():
    model, tok = tiny_random("mixtral")
    engine, slot = _first_slot(model.to(torch.bfloat16), tok, "cpu")
    allocated = sum(w.numel() * w.element_size() for w in slot.weights)
    assert slot.nbytes == allocated == engine.cache.used_bytes == engine.store.device_expert_bytes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device budget is physical on CUDA only")
@pytest.mark.xfail(reason="engine-core: on CUDA charge store.device_expert_bytes when the compute dtype is not the "
                          "store's (coord.md 20:40)", strict=False)
def test_an_fp32_cache_slot_on_cuda_is_charged_the_bytes_it_allocates():  # pragma: no cover - needs CUDA
    model, tok = tiny_random("mixtral")  # fp32 compute, bf16 store
    engine, slot = _first_slot(model, tok, "cuda")
    allocated = sum(w.numel() * w.element_size() for w in slot.weights)
    assert slot.nbytes == allocated
