"""Reading a GPU's PCIe bytes through NVML: the cumulative byte counters, unwrapped, or sampled throughput.

The counters (``nvmlDeviceGetFieldValues`` with ``NVML_FI_DEV_PCIE_COUNT_RX_BYTES`` / ``_TX_BYTES``: bytes the GPU
received / sent since the driver loaded) are exact but wrap at the width of the value type NVML returns (a 32-bit
counter after 4 GiB: 86 ms at 50 GB/s), so a :class:`CounterPoller` thread reads them every
:data:`COUNTER_INTERVAL_S` and unwraps each step. Only where the driver or GPU lacks them does a :class:`Sampler`
thread fall back to the throughput counters (``nvmlDeviceGetPcieThroughput``: KB/s over NVML's ~20 ms window),
integrated over time (trapezoid rule) — short copies alias with that window, so the fallback is noisy. Every NVML
failure is a :class:`NvmlUnavailable` whose text says why, for the row's note; the hooks that use all this are
:mod:`specterbench.bench.nvml`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

KB = 1024  # NVML reports PCIe throughput in KB/s; taken as KiB, as NVIDIA's samples convert it
DEFAULT_INTERVAL_S = 0.02  # NVML's own sample window is ~20 ms


class NvmlUnavailable(Exception):
    """NVML cannot sample this engine; ``str(err)`` is the note that goes into the row."""


class CounterSource(Protocol):
    """Something that reads the link: ``(rx_bytes_per_s, tx_bytes_per_s, memory_used_bytes or None)``."""

    def read(self) -> tuple[float, float, int | None]: ...


# ---- the sampled fallback: throughput integrated over time ------------------------------------------
@dataclass(slots=True)
class Integrated:
    rx_bytes: float = 0.0  # host -> device, as the GPU receives
    tx_bytes: float = 0.0  # device -> host
    peak_memory_used_bytes: int | None = None
    samples: int = 0
    duration_s: float = 0.0


class Integrator:
    """Integrates sampled rates over time with the trapezoid rule; call :meth:`add` with increasing times."""

    def __init__(self):
        self.total = Integrated()
        self._last: tuple[float, float, float] | None = None  # (t, rx, tx)
        self._t0: float | None = None

    def add(self, t: float, rx_bytes_per_s: float, tx_bytes_per_s: float, memory_used: int | None = None) -> None:
        total = self.total
        if self._last is not None:
            t_prev, rx_prev, tx_prev = self._last
            dt = max(0.0, t - t_prev)
            total.rx_bytes += 0.5 * (rx_prev + rx_bytes_per_s) * dt
            total.tx_bytes += 0.5 * (tx_prev + tx_bytes_per_s) * dt
        else:
            self._t0 = t
        self._last = (t, rx_bytes_per_s, tx_bytes_per_s)
        total.samples += 1
        total.duration_s = t - self._t0
        if memory_used is not None:
            peak = total.peak_memory_used_bytes
            total.peak_memory_used_bytes = memory_used if peak is None else max(peak, memory_used)


class Sampler:
    """Reads ``source`` every ``interval_s`` in a background thread and integrates what it reads.

    ``clock`` (default ``time.monotonic``) is read once per sample, so a fake clock makes the integral exact in
    tests. The first sample is taken in :meth:`start`, the last in :meth:`stop`.
    """

    def __init__(self, source: CounterSource, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self.clock = clock
        self.integrator = Integrator()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        with self._lock:
            rx, tx, mem = self.source.read()
            self.integrator.add(self.clock(), float(rx), float(tx), mem)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.sample_once()
        except Exception as err:  # noqa: BLE001 - reported by stop(), the cell itself goes on
            self.error = err

    def start(self) -> "Sampler":
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="specterbench-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Integrated:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self.sample_once()
        return self.integrator.total


# ---- NVML ----------------------------------------------------------------------------------------
def _pynvml():
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("no NVML: nvidia-ml-py is not installed") from None
    return pynvml


def _reason(pynvml, err) -> str:
    if isinstance(err, pynvml.NVMLError_LibraryNotFound):
        return "no NVML: library not found"
    if isinstance(err, getattr(pynvml, "NVMLError_DriverNotLoaded", ())):
        return "no NVML: NVIDIA driver not loaded"
    if isinstance(err, getattr(pynvml, "NVMLError_NoPermission", ())):
        return "no NVML: no permission"
    return f"no NVML: {err}"


def init() -> object:
    """``nvmlInit`` (reference-counted; pair with :func:`shutdown`); raises :class:`NvmlUnavailable`."""
    pynvml = _pynvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise NvmlUnavailable(_reason(pynvml, err)) from None
    return pynvml


def shutdown() -> None:
    try:
        _pynvml().nvmlShutdown()
    except Exception:  # noqa: BLE001 - nothing to do about a failing shutdown
        pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_handle(pynvml, device):
    """The NVML handle of a torch CUDA device: by UUID (robust to CUDA_VISIBLE_DEVICES), else by index."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
        except pynvml.NVMLError:
            pass  # fall back to the index (equal unless CUDA_VISIBLE_DEVICES reorders devices)
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class NvmlSource:
    """Reads one GPU's PCIe RX/TX throughput (bytes/s) and memory used (bytes) through NVML."""

    def __init__(self, pynvml, handle):
        self.pynvml = pynvml
        self.handle = handle
        self.name = _text(pynvml.nvmlDeviceGetName(handle))

    def read(self) -> tuple[float, float, int | None]:
        nv, h = self.pynvml, self.handle
        rx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * KB
        tx = nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * KB
        return float(rx), float(tx), int(nv.nvmlDeviceGetMemoryInfo(h).used)


class PcieCounters:
    """The GPU's cumulative PCIe byte counters (NVML field values): ``read() -> (rx_bytes, tx_bytes)``."""

    def __init__(self, pynvml, handle):
        self.pynvml = pynvml
        self.handle = handle
        self.fields = (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES)

    def read(self) -> tuple[int, int]:
        values = self.pynvml.nvmlDeviceGetFieldValues(self.handle, list(self.fields))
        return tuple(_field_value(self.pynvml, v) for v in values)

    def widths(self) -> tuple[int, int]:
        """Bits of each counter: the width of the value type NVML returns it in (where it wraps)."""
        values = self.pynvml.nvmlDeviceGetFieldValues(self.handle, list(self.fields))
        return tuple(_VALUE_BITS.get(int(v.valueType), 64) for v in values)


_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_VALUE_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32, 6: 16}  # nvmlValueType_t: unsigned int, unsigned long, ...
COUNTER_INTERVAL_S = 0.02  # a 32-bit counter at 64 GB/s wraps every 67 ms: read three times as often


class Unwrapped:
    """One cumulative counter of ``width`` bits, unwrapped: :meth:`add` each reading; ``total`` since the first.
    A step backwards is a wrap below 64 bits; at 64 bits it is a reset (a driver reload), flagged in ``reset``."""

    def __init__(self, width: int):
        self.width, self.last, self.total, self.reset = width, None, 0, False

    def add(self, raw: int) -> None:
        if self.last is not None:
            delta = raw - self.last
            if delta < 0:
                if self.width >= 64:
                    self.reset, delta = True, 0
                else:
                    delta += 1 << self.width
            self.total += delta
        self.last = raw


class CounterPoller:
    """Reads :class:`PcieCounters` every ``interval_s`` in a background thread and unwraps them (first reading in
    :meth:`start`, last in :meth:`stop`); ``rx``/``tx``: the :class:`Unwrapped` totals."""

    def __init__(self, counters, interval_s: float = COUNTER_INTERVAL_S, widths: tuple[int, int] | None = None):
        self.counters, self.interval_s = counters, interval_s
        rx_bits, tx_bits = widths or counters.widths()
        self.rx, self.tx = Unwrapped(rx_bits), Unwrapped(tx_bits)
        self.reads = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def read_once(self) -> None:
        with self._lock:
            rx, tx = self.counters.read()
            self.rx.add(rx)
            self.tx.add(tx)
            self.reads += 1

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.read_once()
        except Exception as err:  # noqa: BLE001 - reported by stop(); the cell itself goes on
            self.error = err

    def start(self) -> "CounterPoller":
        self.read_once()
        self._thread = threading.Thread(target=self._run, name="specterbench-nvml-counters", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self.read_once()


def _field_value(pynvml, v) -> int:
    if v.nvmlReturn != pynvml.NVML_SUCCESS:
        raise NvmlUnavailable(f"no NVML PCIe byte counters: field {v.fieldId} returned error {v.nvmlReturn}")
    attr = _VALUE_ATTR.get(int(v.valueType))
    if attr is None:
        raise NvmlUnavailable(f"no NVML PCIe byte counters: field {v.fieldId} has value type {v.valueType}")
    return int(getattr(v.value, attr))


def open_counters(source) -> PcieCounters | None:
    """The cumulative counters of an opened :class:`NvmlSource`'s GPU, or None where the GPU lacks them."""
    if not isinstance(source, NvmlSource):
        return None
    try:
        counters = PcieCounters(source.pynvml, source.handle)
        counters.read()
    except (NvmlUnavailable, AttributeError):
        return None
    except source.pynvml.NVMLError:
        return None
    return counters


def open_source(device) -> CounterSource:
    """A counter source for ``device`` (a torch device); raises :class:`NvmlUnavailable` with the reason."""
    if getattr(device, "type", str(device)) != "cuda":
        raise NvmlUnavailable(f"no CUDA device: engine ran on {getattr(device, 'type', device)}")
    pynvml = init()
    try:
        source = NvmlSource(pynvml, device_handle(pynvml, device))
        try:
            source.read()
        except pynvml.NVMLError_NotSupported:
            raise NvmlUnavailable(f"no NVML PCIe counters: not supported on {source.name}") from None
        return source
    except NvmlUnavailable:
        shutdown()
        raise
    except Exception as err:
        shutdown()
        raise NvmlUnavailable(f"no NVML: {type(err).__name__}: {err}") from None


def environment() -> dict:
    """GPU name, driver and PCIe generation/width (current and max) of every GPU NVML sees, or a note."""
    try:
        pynvml = init()
    except NvmlUnavailable as err:
        return {"note": str(err)}
    try:
        info: dict = {"driver": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpu: dict = {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h))}
            for key, fn in (("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                            ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
                            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
                try:
                    gpu[key] = int(getattr(pynvml, fn)(h))
                except pynvml.NVMLError as err:
                    gpu[key] = None
                    gpu.setdefault("notes", []).append(f"{key}: {err}")
            try:
                gpu["memory_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            except pynvml.NVMLError:
                gpu["memory_total_bytes"] = None
            info["gpus"].append(gpu)
        if not info["gpus"]:
            info["note"] = "NVML found no GPU"
        return info
    except pynvml.NVMLError as err:
        return {"note": _reason(pynvml, err)}
    finally:
        shutdown()
