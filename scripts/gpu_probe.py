"""The measurements of scripts/gpu_check.sh that are figures, not pass/fail tests: one Markdown report on stdout.

    python scripts/gpu_probe.py            (on a machine with a CUDA device)

- transformers: its version, the KV-cache keyword the engine passes, and the cache's growth over a decode;
- pinned host→device bandwidth at real expert sizes: 17 MB (Qwen1.5-MoE) and 352 MB (Mixtral), back to back;
- copy/compute overlap: a copy on the copy stream beside a matmul on the compute stream;
- the slot race: a copy into memory an evicted slot held, with and without the eviction event;
- NVML's PCIe counter width and the unwrapped count over many GiB against the bytes copied;
- the packed draft on CUDA: the kernel it runs and the device bytes it allocates against its charge.
Exit status 1 when a check with a pass criterion fails (KV growth, the fixed slot race, NVML/bytes, allocation).
"""

from __future__ import annotations

import sys
import time

import torch

FAILED: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)


def check(ok: bool, what: str) -> None:
    say(f"- {'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        FAILED.append(what)


def events_seconds(fn, reps: int = 5, stream=None) -> float:
    """Median seconds of ``fn`` timed by CUDA events on ``stream`` (after one warm-up)."""
    stream = stream or torch.cuda.current_stream()
    out = []
    for i in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        with torch.cuda.stream(stream):
            fn()
        end.record(stream)
        end.synchronize()
        if i:
            out.append(start.elapsed_time(end) / 1e3)
    return sorted(out)[len(out) // 2]


def transformers_and_kv() -> None:
    import transformers

    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine.engine import Engine
    from specterbench.strategy import Strategy

    say("## transformers and the KV cache")
    model, tok = tiny_random("mixtral")
    engine = Engine(model.to(torch.bfloat16), name="mixtral", device="cuda", tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes, engine.clock)
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([[1, 2, 3, 4, 5]]), kv)
    grown = [kv.get_seq_length()]
    for t in range(3):
        engine.forward(torch.tensor([[6 + t]]), kv)
        grown.append(kv.get_seq_length())
    say(f"transformers {transformers.__version__}; the engine passes the cache as `{engine.cache_kwarg}`; "
        f"cache length after prefill and 3 decode steps: {grown}")
    check(grown == [5, 6, 7, 8], "the KV cache grows by the tokens run")


def bandwidth() -> None:
    say("\n## pinned host→device copies at real expert sizes")
    stream = torch.cuda.Stream()
    for label, nbytes in (("Qwen1.5-MoE expert, 17.3 MB", 3 * 2048 * 1408 * 2),
                          ("Mixtral expert, 352 MB", 3 * 4096 * 14336 * 2)):
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        n = 8 if nbytes < 10**8 else 4
        sec = events_seconds(lambda dev=dev, host=host: [dev.copy_(host, non_blocking=True) for _ in range(n)],
                             stream=stream) / n
        say(f"- {label}: {nbytes / sec / 1e9:.1f} GB/s ({sec * 1e3:.2f} ms per copy, {n} back to back)")
        del host, dev


def overlap() -> None:
    say("\n## copy/compute overlap")
    copy_stream = torch.cuda.Stream()
    nbytes = 352 * 2**20
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def copy():
        with torch.cuda.stream(copy_stream):
            dev.copy_(host, non_blocking=True)

    def compute():
        for _ in range(6):
            a @ a

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for fn in (copy, compute):
        timed(fn)
    t_copy, t_compute = timed(copy), timed(compute)
    t_both = timed(lambda: (copy(), compute()))
    hidden = (t_copy + t_compute - t_both) / min(t_copy, t_compute)
    say(f"copy {t_copy * 1e3:.1f} ms, compute {t_compute * 1e3:.1f} ms, both {t_both * 1e3:.1f} ms: "
        f"{hidden:.0%} of the shorter one hidden")
    check(hidden > 0.5, "copies on the copy stream overlap compute on the compute stream")


def slot_race() -> None:
    from specterbench.engine.residency import slot_copy

    say("\n## the slot race (a copy into memory an evicted slot held)")
    n = 64 * 2**20 // 2
    zeros = torch.zeros(n, dtype=torch.bfloat16).pin_memory()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    copy_stream = torch.cuda.Stream()
    results = {}
    for guarded in (False, True):
        bad = 0
        for _ in range(20):
            slot = torch.ones(n, dtype=torch.bfloat16, device="cuda")
            torch.cuda.synchronize()
            for _ in range(4):
                big @ big  # the compute stream is busy ...
            total = slot.float().sum()  # ... then reads the slot
            evicted = torch.cuda.Event()
            evicted.record(torch.cuda.current_stream())
            del slot  # evicted: its memory is free on the compute stream at once
            new = torch.empty(n, dtype=torch.bfloat16, device="cuda")  # most likely the same memory
            with torch.cuda.stream(copy_stream):
                slot_copy((new,), (zeros,), evicted if guarded else None)()
            torch.cuda.synchronize()
            bad += int(total.item() != n)
        results[guarded] = bad
    say(f"corrupted reads in 20 tries: without the eviction event {results[False]}, with it {results[True]}")
    check(results[True] == 0, "a copy into a reused slot waits for the compute stream's reads")


def nvml_width() -> None:
    from specterbench.bench import nvml, nvml_counters

    say("\n## NVML PCIe counters")
    try:
        source = nvml_counters.open_source(torch.device("cuda", 0))
    except nvml_counters.NvmlUnavailable as err:
        say(f"- skipped: {err}")
        return
    counters = nvml_counters.open_counters(source)
    if counters is None:
        say("- this GPU/driver has no PCIe byte counters (the sampled fallback runs)")
        nvml_counters.shutdown()
        return
    widths = counters.widths()
    poller = nvml_counters.CounterPoller(counters).start()
    host = torch.empty(352 * 2**20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    rounds = 40  # 13.75 GiB: a 32-bit counter wraps three times
    for _ in range(rounds):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    time.sleep(nvml.COUNTER_SETTLE_S)
    poller.stop()
    nvml_counters.shutdown()
    moved = rounds * host.numel()
    ratio = poller.rx.total / moved
    say(f"counter widths (rx, tx): {widths} bits; {poller.reads} reads; NVML RX / bytes copied over "
        f"{moved / 2**30:.1f} GiB = {ratio:.3f}")
    check(0.95 <= ratio <= 1.05, "NVML counts what was copied, unwrapped (0.95-1.05)")


def packed_draft() -> None:
    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine import lowbit_ops
    from specterbench.engine.draft import QuantizedExperts, QuantSpec
    from specterbench.engine.engine import Engine

    say("\n## packed drafts on CUDA")
    say(f"torch int4 weight-only matmul works in bf16 here: {lowbit_ops.int4_kernel_works('cuda', torch.bfloat16)}")
    model, tok = tiny_random("qwen2_moe")
    engine = Engine(model.to(torch.bfloat16), name="q", device="cuda", tokenizer=tok)
    for spec in (QuantSpec(bits=3, blocksize=128, quantizer="int"), QuantSpec(bits=4, blocksize=128, quantizer="int")):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        draft = QuantizedExperts(engine, spec)
        torch.cuda.synchronize()
        grew = torch.cuda.memory_allocated() - before
        say(f"- {spec.label()}: kernel {draft.runs}; allocated {grew} B (storage {draft.allocated_bytes()} B), "
            f"charged {draft.nbytes} B")
        check(draft.allocated_bytes() <= 1.02 * draft.nbytes, f"{spec.label()} holds no more than it is charged")
        draft.release()


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_probe: no CUDA device here; run it on the GPU machine (scripts/gpu_check.sh)", file=sys.stderr)
        return 2
    say(f"# GPU probe: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda})\n")
    for part in (transformers_and_kv, bandwidth, overlap, slot_race, nvml_width, packed_draft):
        try:
            part()
        except Exception as err:  # noqa: BLE001 - one failing part is reported, the others still run
            say(f"- FAILED: {part.__name__} raised {type(err).__name__}: {err}")
            FAILED.append(part.__name__)
    say(f"\n{'all checks passed' if not FAILED else 'failed: ' + '; '.join(FAILED)}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
