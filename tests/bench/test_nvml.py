"""NVML: PCIe counters integrated over a cell in a background thread, and notes that say why they are empty."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from specterbench.bench import nvml, nvml_counters
from specterbench.runfiles.results import ResultRow


class FakeSource:
    """Constant rates; memory grows by 1 MB per read. ``fail_after``: raise on that read."""

    def __init__(self, rx=1000.0, tx=10.0, fail_after=None):
        self.rx, self.tx, self.fail_after = rx, tx, fail_after
        self.reads = 0
        self.read_event = threading.Event()

    def read(self):
        self.reads += 1
        self.read_event.set()
        if self.fail_after is not None and self.reads > self.fail_after:
            raise RuntimeError("counter went away")
        return self.rx, self.tx, self.reads * 1_000_000


class TickClock:
    """A clock that advances ``step`` seconds each time it is read."""

    def __init__(self, step=0.5):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def wait_for_reads(source, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while source.reads < n and time.monotonic() < deadline:
        source.read_event.wait(0.01)
        source.read_event.clear()


def row(**kw) -> ResultRow:
    base = dict(run_id="r", cell="c", model="m", geometry="m", geometry_label="m", priced_total_expert_bytes=1,
                strategy="lru", strategy_version="1", strategy_plugin="p", lossless_strategy=True, budget_bytes=1,
                budget_fraction=0.5, total_expert_bytes=2, profile="-", clock="host", workload="w", prompts=1,
                new_tokens=1, seed=0, repeat=0)
    return ResultRow(**{**base, **kw})


def test_integrator_uses_the_trapezoid_rule_over_uneven_intervals():
    it = nvml_counters.Integrator()
    it.add(0.0, 0.0, 10.0, memory_used=5)
    it.add(1.0, 100.0, 10.0, memory_used=9)
    it.add(3.0, 100.0, 30.0, memory_used=7)
    assert it.total.rx_bytes == 0.5 * (0 + 100) * 1 + 100 * 2
    assert it.total.tx_bytes == 10 * 1 + 0.5 * (10 + 30) * 2
    assert it.total.peak_memory_used_bytes == 9
    assert (it.total.samples, it.total.duration_s) == (3, 3.0)


def test_sampler_thread_integrates_a_constant_rate_exactly_with_a_fake_clock():
    source, clock = FakeSource(rx=1000.0, tx=10.0), TickClock(step=0.5)
    sampler = nvml_counters.Sampler(source, interval_s=0.001, clock=clock).start()
    wait_for_reads(source, 5)
    total = sampler.stop()
    assert total.samples >= 6  # start, at least four from the thread, stop
    assert total.rx_bytes == 1000.0 * 0.5 * (total.samples - 1)
    assert total.tx_bytes == 10.0 * 0.5 * (total.samples - 1)
    assert total.peak_memory_used_bytes == total.samples * 1_000_000
    assert total.duration_s == 0.5 * (total.samples - 1)


def test_sampler_keeps_the_error_of_a_failing_source_and_stops():
    source = FakeSource(fail_after=2)
    sampler = nvml_counters.Sampler(source, interval_s=0.001, clock=TickClock()).start()
    wait_for_reads(source, 3)
    sampler.stop()
    assert isinstance(sampler.error, RuntimeError)


def test_cell_hooks_fill_nvml_bytes_and_peak_memory_from_the_sampler(monkeypatch):
    source = FakeSource(rx=4e9, tx=1e9)  # bytes/s; large, so rounding to whole bytes does not matter
    monkeypatch.setattr(nvml, "open_source", lambda device: source)
    engine = SimpleNamespace(device=torch.device("cuda", 0))
    nvml.specterbench_cell_start(cell="c1", engine=engine)
    wait_for_reads(source, 3)
    r = row(cell="c1")
    nvml.specterbench_cell_end(cell="c1", row=r)
    assert r.nvml_note is None
    assert r.nvml_h2d_bytes > 0 and r.nvml_d2h_bytes > 0
    assert r.nvml_h2d_bytes == pytest.approx(4 * r.nvml_d2h_bytes, rel=1e-6)
    assert r.extra["nvml_peak_memory_used_bytes"] == r.extra["nvml_samples"] * 1_000_000


def test_a_cpu_engine_gets_a_note_and_empty_columns_never_zeros():
    r = row(cell="c2")
    nvml.specterbench_cell_start(cell="c2", engine=SimpleNamespace(device=torch.device("cpu")))
    nvml.specterbench_cell_end(cell="c2", row=r)
    assert r.nvml_note == "no CUDA device: engine ran on cpu"
    assert r.nvml_h2d_bytes is None and r.nvml_d2h_bytes is None


@pytest.fixture
def no_nvml_library(monkeypatch):
    import pynvml

    def fail():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


def test_missing_nvml_library_is_the_note_of_a_cuda_cell(no_nvml_library):
    r = row(cell="c3")
    nvml.specterbench_cell_start(cell="c3", engine=SimpleNamespace(device=torch.device("cuda", 0)))
    nvml.specterbench_cell_end(cell="c3", row=r)
    assert r.nvml_note == "no NVML: library not found"
    assert r.nvml_h2d_bytes is None


def test_environment_says_why_there_is_no_gpu_information(no_nvml_library):
    assert nvml.specterbench_environment() == {"nvml": {"note": "no NVML: library not found"}}


def test_report_columns_show_ledger_nvml_and_ratio_or_the_note():
    filled = nvml.nvml_columns(row(h2d_bytes=1000, nvml_h2d_bytes=1100))
    assert filled == {"ledger H2D bytes": 1000, "NVML H2D bytes": 1100, "NVML/ledger ratio": "1.10"}
    empty = nvml.nvml_columns(row(h2d_bytes=1000, nvml_note="no NVML: library not found"))
    assert empty == {"ledger H2D bytes": 1000, "NVML H2D bytes": "no NVML: library not found",
                     "NVML/ledger ratio": "-"}


@pytest.fixture
def nvml_plugin():
    from specterbench.plugins.host import get_host, reset_host

    reset_host()
    host = get_host()
    added = not host.pm.is_registered(nvml)
    if added:  # until it is a default plugin
        host.register(nvml, "nvml")
    yield host
    reset_host()


def test_a_benchmark_row_on_cpu_explains_its_empty_nvml_columns(nvml_plugin, tmp_path, small_prompts):
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner

    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("50%"),),
                         profile="a100-40g-pcie4", prompts=1, tokens=2, warmup=False)
    (r,) = Runner(nvml_plugin, config, tmp_path / "run").run()
    assert r.status == "ok", r.error
    assert r.nvml_note == "no CUDA device: engine ran on cpu"
    assert r.nvml_h2d_bytes is None and r.nvml_d2h_bytes is None
    assert "gpus" in r.env["nvml"] or r.env["nvml"]["note"].startswith("no NVML")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device with NVML")
def test_nvml_counts_the_bytes_of_real_host_to_device_copies():  # pragma: no cover - needs CUDA
    try:
        source = nvml_counters.open_source(torch.device("cuda", 0))
    except nvml_counters.NvmlUnavailable as err:
        pytest.skip(str(err))
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    sampler = nvml_counters.Sampler(source).start()
    for _ in range(8):
        host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    time.sleep(0.1)
    total = sampler.stop()
    nvml_counters.shutdown()
    assert total.rx_bytes > 0.5 * 8 * host.numel()


# ---- cumulative PCIe byte counters (NVML field values) -------------------------------------------------
class FakeNvml:
    """Enough of pynvml for an NvmlSource: throughput, memory, and the cumulative PCIe byte counters."""

    NVML_SUCCESS = 0
    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES = 1, 0
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198

    class NVMLError(Exception):
        pass

    def __init__(self, counters_supported=True):
        self.rx_total, self.tx_total = 10**12, 5 * 10**11  # counters since the driver loaded
        self.counters_supported = counters_supported

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetPcieThroughput(self, handle, which):
        return 1000  # KB/s

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=123)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetFieldValues(self, handle, fields):
        out = []
        for f in fields:
            value = self.rx_total if f == self.NVML_FI_DEV_PCIE_COUNT_RX_BYTES else self.tx_total
            out.append(SimpleNamespace(fieldId=f, valueType=3, nvmlReturn=0 if self.counters_supported else 3,
                                       value=SimpleNamespace(ullVal=value)))
        return out


@pytest.fixture
def fake_gpu(monkeypatch):
    def make(**kw):
        fake = FakeNvml(**kw)
        monkeypatch.setattr(nvml, "open_source", lambda device: nvml_counters.NvmlSource(fake, "handle"))
        monkeypatch.setattr(nvml_counters, "_pynvml", lambda: fake)
        return fake
    return make


def run_cell(fake, cell, moved_rx=0, moved_tx=0):
    nvml.specterbench_cell_start(cell=cell, engine=SimpleNamespace(device=torch.device("cuda", 0)))
    fake.rx_total += moved_rx
    fake.tx_total += moved_tx
    r = row(cell=cell, h2d_bytes=moved_rx)
    nvml.specterbench_cell_end(cell=cell, row=r)
    return r


def test_cumulative_counters_give_the_exact_bytes_of_the_cell(fake_gpu):
    fake = fake_gpu()
    r = run_cell(fake, "k1", moved_rx=7_340_032, moved_tx=4096)
    assert (r.nvml_h2d_bytes, r.nvml_d2h_bytes) == (7_340_032, 4096)
    assert r.extra["nvml_source"] == "pcie-counters"
    assert nvml.nvml_columns(r)["NVML/ledger ratio"] == "1.00"


def test_without_counters_the_sampled_throughput_is_the_fallback(fake_gpu):
    fake = fake_gpu(counters_supported=False)
    r = run_cell(fake, "k2", moved_rx=10**9)
    assert r.extra["nvml_source"] == "sampled-throughput"
    assert r.nvml_h2d_bytes is not None and r.nvml_h2d_bytes != 10**9  # integrated from 1000 KB/s, not counted


def test_a_counter_that_went_backwards_leaves_the_columns_empty_with_a_note(fake_gpu):
    fake = fake_gpu()
    r = run_cell(fake, "k3", moved_rx=-5)  # a driver reload resets the counters
    assert r.nvml_h2d_bytes is None and "went backwards" in r.nvml_note


def test_with_counters_a_poller_reads_them_through_the_cell(fake_gpu):
    fake = fake_gpu()
    nvml.specterbench_cell_start(cell="k4", engine=SimpleNamespace(device=torch.device("cuda", 0)))
    assert nvml._cells["k4"].sampler is None and nvml._cells["k4"].poller is not None
    assert any(t.name == "specterbench-nvml-counters" for t in threading.enumerate())
    time.sleep(0.1)
    r = row(cell="k4", h2d_bytes=4096)
    fake.rx_total += 4096
    nvml.specterbench_cell_end(cell="k4", row=r)
    assert r.extra["nvml_memory_used_bytes"] == 123 and r.extra["nvml_counter_reads"] >= 3
    assert r.extra["nvml_over_ledger"] == 1.0
    assert not any(t.name == "specterbench-nvml-counters" for t in threading.enumerate())


def test_a_32_bit_counter_is_unwrapped_across_many_wraps():
    class Wrapping:
        def __init__(self):
            self.true_rx = 0

        def read(self):
            return self.true_rx % 2**32, 0

    counters = Wrapping()
    poller = nvml_counters.CounterPoller(counters, widths=(32, 64))
    poller.read_once()
    for _ in range(40):  # 40 reads 3 GiB apart: 120 GiB moved, the raw counter wrapped 30 times
        counters.true_rx += 3 * 2**30
        poller.read_once()
    assert poller.rx.total == 120 * 2**30 and not poller.rx.reset


def test_a_64_bit_counter_that_steps_back_is_a_reset_not_a_wrap():
    u = nvml_counters.Unwrapped(64)
    u.add(10**12)
    u.add(5)
    assert u.reset and u.total == 0


def test_the_counter_width_is_the_value_type_nvml_returns():
    fake = FakeNvml()
    assert nvml_counters.PcieCounters(fake, "h").widths() == (64, 64)
    fake.nvmlDeviceGetFieldValues = lambda handle, fields: [
        SimpleNamespace(fieldId=f, valueType=1, nvmlReturn=0, value=SimpleNamespace(uiVal=0)) for f in fields]
    assert nvml_counters.PcieCounters(fake, "h").widths() == (32, 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device with NVML")
def test_pcie_counters_count_real_host_to_device_copies():  # pragma: no cover - needs CUDA
    try:
        source = nvml_counters.open_source(torch.device("cuda", 0))
    except nvml_counters.NvmlUnavailable as err:
        pytest.skip(str(err))
    counters = nvml_counters.open_counters(source)
    if counters is None:
        nvml_counters.shutdown()
        pytest.skip("this GPU/driver has no NVML PCIe byte counters")
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    start = counters.read()
    for _ in range(8):
        host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    end = counters.read()
    nvml_counters.shutdown()
    ratio = (end[0] - start[0]) / (8 * host.numel())
    assert 0.9 <= ratio <= 1.3, f"NVML RX / bytes copied = {ratio:.3f}"
