"""``specterbench calibrate``: measure this machine and write a hardware profile file for ``--profile PATH``.

What is measured (medians over repetitions, after a warm-up; CUDA timings with events, host ones with
``perf_counter``):

- **link**: host→device copies from pinned memory of 64 KiB … 64 MiB (on a CPU-only machine: host→host
  copies, the "link" of the host-wall engine). A least-squares fit ``t = latency + bytes / bandwidth`` over the
  sizes (relative error, so small and large copies
  count alike) gives ``link_latency_us`` and ``link_bytes_per_s``; the curve itself is kept under ``[measured]``;
- **launch overhead**: back-to-back tiny kernels (a [1, 64] x [64, 64] linear), per launch → ``launch_us``;
- **compute at decode shapes**: ``x @ W.T`` with ``W`` [I, H] in the run's dtype (``--shape``: use the real model's
  expert shape, e.g. 4096,14336 for Mixtral), calls back to back with one launch's cost taken off each (the profile
  prices launches apart) — one token (gemv, memory bound) gives ``mem_bytes_per_s`` (weight bytes / time); 64
  tokens (a verification or prefill block) give ``flops_per_s``; the achieved FLOP/s at one token is kept as well;
- **host experts**: the same gemv and matmul on the host CPU with its threads → the host profile's DRAM
  bandwidth, FLOP/s and per-expert dispatch cost (``launch_us``).

The file is TOML with ``[profile]`` (a :class:`~specterbench.engine.profiles.HardwareProfile`),
``[host_profile]`` (a :class:`~specterbench.engine.profiles.HostProfile`) and ``[measured]`` (raw figures).
:func:`~specterbench.engine.profiles.load_profile_file` reads it back with one-line errors;
:meth:`~specterbench.plugins.host.PluginHost.register_profile_file` makes its profiles known to the plugin host under
their names, so ``--profile PATH`` works wherever a profile name does.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specterbench.engine.profiles import HardwareProfile, HostProfile, write_profile_file
from specterbench.errors import UsageError

COPY_SIZES = tuple(2**k for k in range(16, 27, 2))  # 64 KiB .. 64 MiB
QUICK_COPY_SIZES = tuple(2**k for k in range(16, 23, 2))  # 64 KiB .. 4 MiB


@dataclass(frozen=True, slots=True)
class MachineMeasurement:
    """What ``specterbench calibrate`` measured: this machine's profiles and the raw figures behind them."""

    profile: HardwareProfile
    host: HostProfile
    measured: dict  # raw curves and figures

    def write(self, path) -> Path:
        """Write the profile file (``--profile PATH``)."""
        return write_profile_file(path, self.profile, self.host, self.measured)


# ---- timing ----------------------------------------------------------------------------------------------
class _Timer:
    """Times ``fn`` on ``device``: CUDA events around the call, or host wall time."""

    def __init__(self, device: torch.device):
        self.device = device

    def seconds(self, fn, reps: int, inner: int = 1) -> float:
        """Median seconds of one call of ``fn`` (``inner`` calls per sample), after one warm-up sample."""
        samples = []
        for i in range(reps + 1):
            if self.device.type == "cuda":  # pragma: no cover - needs CUDA
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                dt = time.perf_counter() - t0
            if i:
                samples.append(dt / inner)
        return statistics.median(samples)


def fit_link(sizes, seconds) -> tuple[float, float]:
    """Fit ``t = a + b·bytes`` minimising *relative* error (weights 1/t², so the small copies that fix the
    latency count as much as the large ones that fix the bandwidth) → ``(latency_s, bytes_per_s)``; the latency
    is clamped at 0.1 µs."""
    w = [1.0 / (t * t) for t in seconds]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, sizes))
    sy = sum(wi * y for wi, y in zip(w, seconds))
    sxx = sum(wi * x * x for wi, x in zip(w, sizes))
    sxy = sum(wi * x * y for wi, x, y in zip(w, sizes, seconds))
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det if det else seconds[-1] / sizes[-1]
    if b <= 0:  # noise on a tiny curve: bandwidth from the largest copy
        b = seconds[-1] / sizes[-1]
    a = (sy - b * sx) / sw
    return max(a, 1e-7), 1.0 / b


def measure_link(device: torch.device, sizes=COPY_SIZES, reps: int = 5) -> dict:
    timer = _Timer(device)
    curve = []
    for n in sizes:
        if device.type == "cuda":  # pragma: no cover - needs CUDA
            src = torch.empty(n, dtype=torch.uint8).pin_memory()
            dst = torch.empty(n, dtype=torch.uint8, device=device)
        else:
            src, dst = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
        curve.append(timer.seconds(lambda src=src, dst=dst: dst.copy_(src, non_blocking=True), reps, inner=4))
        del src, dst
    latency_s, bandwidth = fit_link(list(sizes), curve)
    return {"copy_bytes": list(sizes), "copy_seconds": curve, "copy_bytes_per_s": [n / t for n, t in
                                                                                   zip(sizes, curve)],
            "link_latency_us": latency_s * 1e6, "link_bytes_per_s": bandwidth}


def measure_launch(device: torch.device, reps: int = 5, inner: int = 200) -> float:
    """Seconds per back-to-back tiny kernel: a [1, 64] x [64, 64] linear (dispatch and launch, almost no work)."""
    x, w = torch.zeros(1, 64, device=device), torch.zeros(64, 64, device=device)
    return _Timer(device).seconds(lambda: torch.nn.functional.linear(x, w), reps, inner)


COMPUTE_INNER = 8  # back-to-back calls per timed sample: the device stays busy, dispatch gaps do not count


def measure_compute(device: torch.device, dtype: torch.dtype, hidden: int, inter: int, reps: int = 5,
                    launch_s: float = 0.0) -> dict:
    """One token and 64 tokens through ``W`` [inter, hidden], :data:`COMPUTE_INNER` calls back to back per sample
    with ``launch_s`` (one launch's cost, priced apart by the profile) taken off each: bandwidth, FLOP/s at each
    shape."""
    w = torch.randn(inter, hidden, device=device).to(dtype)
    timer = _Timer(device)
    out = {}
    for tokens in (1, 64):
        x = torch.randn(tokens, hidden, device=device).to(dtype)
        whole = timer.seconds(lambda: torch.nn.functional.linear(x, w), reps, inner=COMPUTE_INNER)
        s = max(whole - launch_s, 0.25 * whole)
        out[tokens] = {"seconds": s, "flops_per_s": 2 * tokens * hidden * inter / s,
                       "bytes_per_s": (w.numel() + x.numel() + tokens * inter) * w.element_size() / s}
    return {"shape": [inter, hidden], "dtype": str(dtype).replace("torch.", ""),
            "gemv_seconds": out[1]["seconds"], "gemv_bytes_per_s": out[1]["bytes_per_s"],
            "gemv_flops_per_s": out[1]["flops_per_s"], "block64_seconds": out[64]["seconds"],
            "block64_flops_per_s": out[64]["flops_per_s"]}


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * 2**30


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_isa(cpuinfo: str | None = None) -> str | None:
    """The widest instruction set of this CPU that host expert kernels use (``amx``, ``avx512``, ``avx2``), from
    ``/proc/cpuinfo``'s flags; None where it names none of them (not x86, or not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return next((isa for isa, flag in (("amx", "amx_bf16"), ("avx512", "avx512f"), ("avx2", "avx2"))
                 if flag in flags), None)


def calibrate(device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.bfloat16, quick: bool = False,
              threads: int | None = None, name: str | None = None, hidden: int = 2048,
              inter: int = 4096) -> MachineMeasurement:
    """Measure ``device`` (and the host) and return the profiles. ``quick``: fewer sizes and repetitions (tests).

    ``hidden``/``inter``: the weight shape of the compute measurements (default a 16 MiB bf16 matrix, larger
    than a CPU's last-level cache so the gemv reads DRAM)."""
    device = torch.device(device)
    threads = threads or torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    reps = 3 if quick else 7
    try:
        link = measure_link(device, QUICK_COPY_SIZES if quick else COPY_SIZES, reps)
        launch_s = measure_launch(device, reps)
        compute = measure_compute(device, dtype, hidden, inter, reps, launch_s)
        cpu = torch.device("cpu")
        host_launch_s = launch_s if device.type == "cpu" else measure_launch(cpu, reps)
        host = compute if device.type == "cpu" else measure_compute(cpu, dtype, hidden, inter, reps, host_launch_s)
    finally:
        torch.set_num_threads(previous)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    node = platform.node() or "host"
    if device.type == "cuda":  # pragma: no cover - needs CUDA
        props = torch.cuda.get_device_properties(device)
        accelerator, memory = props.name, int(props.total_memory)
    else:
        accelerator, memory = f"host CPU as the device: {_cpu_name()} ({threads} threads)", _host_memory_bytes()
    how = f"measured by `specterbench calibrate` on {node} at {when} (torch {torch.__version__}, {compute['dtype']})"
    profile = HardwareProfile(
        name=name or f"calibrated-{node}-{device.type}", accelerator=accelerator,
        flops_per_s=compute["block64_flops_per_s"], mem_bytes_per_s=compute["gemv_bytes_per_s"],
        link_bytes_per_s=link["link_bytes_per_s"], link_latency_us=link["link_latency_us"],
        launch_us=launch_s * 1e6, device_memory_bytes=memory,
        sources=(how, "link: relative least-squares fit of pinned copies, 64 KiB-64 MiB" if device.type == "cuda" else
                 "link: host-to-host copies (no device on this machine)",
                 f"compute: {compute['shape']} weight, gemv for bandwidth, 64-token block for FLOP/s"))
    isa = host_isa()
    kernels = {} if isa is None else {isa: {"bf16": {
        "flops_per_s": host["block64_flops_per_s"], "bytes_per_s": host["gemv_bytes_per_s"],
        "source": f"{how}: torch {host['dtype']} expert GEMV (bytes/s) and 64-token block (FLOP/s) on {threads} "
                  f"threads, the {isa} kernels torch dispatches to here; int8 / int4 rates are not measured: add "
                  f"them with their source to price quantized host experts"}}}
    host_profile = HostProfile(
        name=f"{profile.name}-host", cpu=_cpu_name(), mem_bytes_per_s=host["gemv_bytes_per_s"],
        flops_per_s=host["block64_flops_per_s"], threads=threads, launch_us=host_launch_s * 1e6,
        sources=(how, f"host experts: {host['shape']} {host['dtype']} gemv and 64-token block, {threads} threads"),
        isa=isa, expert_kernels=kernels)
    measured = {"device": str(device), "threads": threads, **link, "launch_us": launch_s * 1e6,
                **{f"device_{k}": v for k, v in compute.items()}, **{f"host_{k}": v for k, v in host.items()}}
    return MachineMeasurement(profile, host_profile, measured)


def check_device(text: str) -> torch.device:
    """A torch device that exists here; ``cuda`` without CUDA (or ``cuda:7`` past the count) is a UsageError."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: this machine has no CUDA device; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s); use cuda:0..."
                             f"{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise UsageError(f"--device {text}: only cpu and cuda are supported")
    return device
