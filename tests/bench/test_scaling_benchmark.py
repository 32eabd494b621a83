"""``benchmarks/scaling.py`` (the harness-scale table of docs/results.md, ``make bench-wallclock``) end to end at a
small geometry: every cell decodes every prompt to its reference's tokens and prints ``mean / median``; bad flags are
one line and exit 2."""

from __future__ import annotations

import re

import pytest
import torch


@pytest.fixture
def scaling(monkeypatch):
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import scaling as module

    monkeypatch.setitem(module.GEOMETRIES, "tiny", (32, 2, 2))  # 32 experts × 2 MoE layers, top-2
    monkeypatch.setattr(module, "ROUNDS", 1)
    monkeypatch.setattr(module, "PROMPTS", 2)
    monkeypatch.setattr(module, "NEW_TOKENS", 6)
    monkeypatch.setattr(module, "OPTIONS", {"specter": {"k": 4}})  # the table's (main() edits it)
    threads = torch.get_num_threads()  # main() runs on one thread, as the benchmark does
    yield module
    torch.set_num_threads(threads)


def test_every_cell_decodes_its_references_and_prints_mean_and_median(scaling, capsys):
    assert scaling.main(["--specter-k=2", "--specter-bits=3", "tiny"]) == 0
    out, err = capsys.readouterr()
    assert "{'k': 2, 'bits': 3}" in out  # the window and bits flags reached Specter's options
    row = next(line for line in out.splitlines() if line.startswith("| tiny"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert len(cells) == 2 + len(scaling.STRATEGIES) + 1  # stock, all resident, the strategies, Specter all resident
    for cell in cells:  # "mean / median", a ratio where one is read; never an error or differing tokens
        assert re.match(r"^\d+\.\d / \d+\.\d( \(.*×.*\))?$", cell), cell
    assert "per-round range" in err


def test_the_mean_is_the_cells_cpu_time_over_its_tokens(scaling):
    world = scaling.World.build("tiny")
    for name in ("lru", scaling.SPECTER_RESIDENT):  # one token per emit, and speculative windows
        cpu_s, n, per_token, tokens = world._decode(world.strategy(name), 1)
        assert tuple(tokens) == world.references[1][0]
        assert n == len(per_token) == scaling.NEW_TOKENS - 1  # every token after the first, once
        assert sum(per_token) == pytest.approx(cpu_s * 1e3)  # the per-token figures split the CPU time
    sample = world.measure("lru")
    assert sample.tokens_match and sample.mean_ms > 0 and sample.median_ms > 0


@pytest.mark.parametrize("argv, says", [(["--specter-k=0", "tiny"], "--specter-k=0: K must be"),
                                        (["--specter-bits=5", "tiny"], "--specter-bits=5: the draft's bits"),
                                        (["nowhere"], "unknown geometry 'nowhere'")])
def test_a_bad_argument_is_one_line_and_exit_2(scaling, capsys, argv, says):
    assert scaling.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1
