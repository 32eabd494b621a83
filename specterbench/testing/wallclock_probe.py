"""pytest plugin for ``make bench-wallclock-compare``: how fast *this machine* is right now, measured beside the
benchmarks (``-p specterbench.testing.wallclock_probe``).

A shared machine's load changes between two runs of unchanged code by more than a real slowdown would (the
geometric mean of the benchmarks' fastest rounds moves with it). Before the first benchmark and after every one the
probe times a fixed workload shaped like the harness's hot paths (dict and list bookkeeping
in Python, small tensor ops) and keeps the fastest of each window; the JSON gets ``probe_s``, the geometric mean
of those window minima (the machine's speed while the benchmarks ran), so that
:mod:`specterbench.analysis.wallclock` compares benchmarks relative to the machine's speed in each run.
"""

from __future__ import annotations

import math
import time

from specterbench.analysis.wallclock import PROBE_KEY

_fastest: list[float] = []


def probe_once() -> float:
    """Seconds for one fixed unit of harness-like work (about a millisecond on a quiet core)."""
    import torch

    a = torch.ones(16, 64)
    w = torch.ones(64, 64)
    start = time.perf_counter()
    table: dict[tuple[int, int], int] = {}
    for i in range(400):
        key = (i % 32, i % 8)
        table[key] = table.get(key, 0) + 1
        if i % 40 == 0:
            a = torch.tanh(a @ w * 1e-3)
    sorted(table.items(), key=lambda kv: kv[1])
    return time.perf_counter() - start


def sample(rounds: int = 20) -> None:
    _fastest.append(min(probe_once() for _ in range(rounds)))


def pytest_sessionstart(session):
    sample(50)


def pytest_runtest_teardown(item, nextitem):
    sample()


def pytest_benchmark_update_json(config, benchmarks, output_json):
    if _fastest:


        output_json[PROBE_KEY] = math.exp(sum(math.log(x) for x in _fastest) / len(_fastest))
