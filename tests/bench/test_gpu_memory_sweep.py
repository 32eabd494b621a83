"""Sweeps take a card's memory as an axis (``gpu_memory``, ``budgets = ["device"]``), keyed as ``run`` keys them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specterbench.bench.device_memory import GIB
from specterbench.bench.grid import parse_grid
from specterbench.bench.runner import Runner
from specterbench.bench.sweep import expand
from specterbench.bench.sweep_jobs import record_shared, run_cell
from specterbench.engine.profiles import default_profile
from specterbench.errors import UsageError

MODEL = "tiny-random-mixtral"
SMALL = {"models": [MODEL], "strategies": ["lru"], "tokens": 2, "prompts": 1, "geometry": "mixtral"}


def test_gpu_memory_is_an_axis_beside_budgets_and_device_takes_each_profiles_memory(host):
    grid = parse_grid({**SMALL, "gpu_memory": ["24GiB", "48GiB"], "budgets": ["50%", "device"],
                       "profiles": ["a100-40g-pcie4", "h100-pcie5"], "gpu_reserve": "512MiB"})
    cells = expand(grid, host)
    cards = sorted({c.budget.card_bytes for c in cells if c.budget.card_bytes})
    h100 = host.profiles().get("h100-pcie5").device_memory_bytes
    assert cards == sorted({24 * GIB, 48 * GIB, default_profile().device_memory_bytes, h100})
    assert all(c.budget.card_reserve == 512 * 2**20 for c in cells if c.budget.card_bytes)
    assert len(cells) == 2 * 4
    config = dataclasses.replace(cells[0].config, budgets=grid.budgets)  # a sweep's keys are a run's
    single = [k for k, *_ in Runner(host, config, Path("unused"), env={}).cells(MODEL) if "card0B" not in k]
    assert set(single) <= {c.key for c in cells}


def test_a_cell_of_a_card_is_sized_at_its_context_and_a_small_card_is_its_rows_error(host, tmp_path):
    grid = parse_grid({**SMALL, "gpu_memory": ["2GiB", "32GiB"]})
    small, big = expand(grid, host)
    from specterbench.bench.grid import SharedJob, reference_key

    shared = record_shared(SharedJob(reference_key(big.config), big.config))
    row = run_cell(big, str(tmp_path), shared)
    assert row.status == "ok" and row.extra["device_plan"]["card_bytes"] == 32 * GIB
    plan = row.extra["device_plan"]
    assert row.budget_fraction == pytest.approx(plan["expert_bytes"] / row.priced_total_expert_bytes, abs=1e-5)
    refused = run_cell(small, str(tmp_path), shared)
    assert refused.status == "error" and "the smallest that fits is 5 GiB" in refused.error


@pytest.mark.parametrize("extra, message", [
    ({"gpu_memory": ["24"]}, "gpu_memory '24' needs a unit"),
    ({"gpu_memory": "24GiB", "gpu_reserve": 1}, "gpu_reserve takes one size with a unit"),
    ({"budgets": ["50%"], "gpu_reserve": "1"}, "gpu_reserve '1' needs a unit"),
])
def test_a_bad_card_in_a_grid_is_one_line(extra, message):
    with pytest.raises(UsageError, match=message) as err:
        parse_grid({**SMALL, **extra})
    assert "\n" not in str(err.value)
