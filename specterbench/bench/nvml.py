"""NVML: the GPU's own count of PCIe bytes and memory, beside the engine's transfer ledger.

A built-in plugin. For each benchmark cell on a CUDA engine it reads the device's PCIe bytes through
:mod:`specterbench.bench.nvml_counters` (the cumulative byte counters where the GPU has them, else sampled
throughput integrated over time). The row gets ``nvml_h2d_bytes`` (RX: host → device), ``nvml_d2h_bytes`` (TX),
``extra["nvml_over_ledger"]`` (NVML's H2D bytes over the engine's ledger), ``extra["nvml_source"]``
(``pcie-counters`` or ``sampled-throughput``) and the memory used (at the end, or the sampled peak); without NVML
or a GPU the row gets ``nvml_note`` saying why, and the byte columns stay empty (never zero).

NVML counts every byte on the link — token ids, logits, other processes on the same GPU — so expect the
ratio to the ledger slightly above 1; far from 1 means the ledger or the copies are wrong.

The run's environment gets the GPU name, driver, and PCIe generation and width (current and max) under
``nvml`` — or ``{"note": <why not>}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specterbench.bench.nvml_counters import (
    CounterPoller,
    CounterSource,
    Integrated,
    NvmlSource,
    NvmlUnavailable,
    PcieCounters,
    Sampler,
    environment,
    open_counters,
    open_source,
    shutdown,
)
from specterbench.plugins import hookimpl

# ---- hooks ---------------------------------------------------------------------------------------
COUNTER_SETTLE_S = 0.05  # let the driver's PCIe counters take in the cell's last copies before the end reading


@dataclass(slots=True)
class CellCounters:
    """What a cell started with: the counters and their first reading, or (without counters) the sampler."""

    source: CounterSource
    counters: PcieCounters | None = None
    poller: CounterPoller | None = None
    sampler: Sampler | None = None


_cells: dict[str, CellCounters | str] = {}  # cell key -> what runs for it, or the note why nothing does


@hookimpl
def specterbench_environment():
    return {"nvml": environment()}


@hookimpl
def specterbench_cell_start(cell, engine):
    try:
        source = open_source(engine.device)
    except NvmlUnavailable as err:
        _cells[cell] = str(err)
        return
    state = CellCounters(source, open_counters(source))
    if state.counters is not None:  # exact: read often enough to unwrap them
        state.poller = CounterPoller(state.counters).start()
    else:
        state.sampler = Sampler(source).start()
    _cells[cell] = state


@hookimpl(tryfirst=True)  # measure first; plugins after it may adjust the row
def specterbench_cell_end(cell, row):
    state = _cells.pop(cell, None)
    if state is None:
        row.nvml_note = row.nvml_note or "no NVML sample: the cell never reached its measured requests"
        return
    if isinstance(state, str):
        row.nvml_note = state
        return
    try:
        if state.counters is not None:
            fill_from_counters(row, state)
        else:
            fill_row(row, state.sampler.stop(), state.sampler.error)
    finally:
        if isinstance(state.source, NvmlSource):
            shutdown()


def fill_from_counters(row, state: CellCounters) -> None:
    time.sleep(COUNTER_SETTLE_S)
    poller = state.poller
    try:
        poller.stop()
        memory = state.source.read()[2]
    except (NvmlUnavailable, state.counters.pynvml.NVMLError) as err:
        row.nvml_note = f"NVML PCIe counters failed at the end of the cell: {err}"
        return
    if poller.error is not None:
        row.nvml_note = f"NVML PCIe counters failed during the cell: {type(poller.error).__name__}: {poller.error}"
        return
    if poller.rx.reset or poller.tx.reset:
        row.nvml_note = "NVML PCIe counters went backwards during the cell (driver reset?); no NVML bytes"
        return
    row.nvml_h2d_bytes, row.nvml_d2h_bytes = poller.rx.total, poller.tx.total
    row.extra["nvml_source"] = "pcie-counters"
    row.extra["nvml_counter_bits"] = [poller.rx.width, poller.tx.width]
    row.extra["nvml_counter_reads"] = poller.reads
    row.extra["nvml_memory_used_bytes"] = memory  # at the cell's end (the peak is peak_device_bytes)
    if row.h2d_bytes:
        row.extra["nvml_over_ledger"] = row.nvml_h2d_bytes / row.h2d_bytes
    if row.d2h_bytes:  # the ledger's device->host bytes (lru.swap's write-backs) against PCIe TX
        row.extra["nvml_d2h_over_ledger"] = row.nvml_d2h_bytes / row.d2h_bytes


def fill_row(row, total: Integrated, error) -> None:
    """Bytes integrated from the sampled throughput (the fallback where a GPU has no PCIe byte counters)."""
    row.extra["nvml_peak_memory_used_bytes"] = total.peak_memory_used_bytes
    row.extra["nvml_samples"] = total.samples
    row.extra["nvml_duration_s"] = total.duration_s
    if error is not None:
        row.nvml_note = f"NVML sampling failed: {type(error).__name__}: {error}"
        return
    if total.samples < 2:
        row.nvml_note = "NVML: fewer than two samples, nothing to integrate"
        return
    row.nvml_h2d_bytes = int(round(total.rx_bytes))
    row.nvml_d2h_bytes = int(round(total.tx_bytes))
    row.extra["nvml_source"] = "sampled-throughput"
    if row.h2d_bytes:
        row.extra["nvml_over_ledger"] = row.nvml_h2d_bytes / row.h2d_bytes
    if row.d2h_bytes:  # the ledger's device->host bytes (lru.swap's write-backs) against PCIe TX
        row.extra["nvml_d2h_over_ledger"] = row.nvml_d2h_bytes / row.d2h_bytes


# ---- report --------------------------------------------------------------------------------------
def nvml_columns(row) -> dict:
    """Report columns: the ledger's H2D bytes, NVML's, and their ratio — or the note why NVML is empty."""
    ledger = row.h2d_bytes
    nvml = row.nvml_h2d_bytes
    if nvml is None:
        return {"ledger H2D bytes": ledger, "NVML H2D bytes": row.nvml_note or "-", "NVML/ledger ratio": "-"}
    ratio = f"{nvml / ledger:.2f}" if ledger else "- (ledger 0)"
    return {"ledger H2D bytes": ledger, "NVML H2D bytes": nvml, "NVML/ledger ratio": ratio}
