"""``run --batch``: several requests at once end to end, and each bad batch refused in one line, exit 2, no folder."""

from __future__ import annotations

import json

import pytest
from cli_errors import one_line

from specterbench.cli import main

FAST = ["--model", "tiny-random-mixtral", "--strategies", "lru,oracle", "--prompts", "2", "--tokens", "3",
        "--budgets", "50%", "--quiet"]


def run(tmp_path, capsys, *args):
    code = main(["run", *FAST, "--out", str(tmp_path), "--run-id", "r", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_batch_sweep_runs_and_a_strategy_past_its_max_batch_is_a_row_not_a_failure(host, tmp_path, capsys):
    code, out, err = run(tmp_path, capsys, "--batch", "1,2")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    got = {(r["strategy"], r["batch"]): r["status"] for r in rows}
    assert got == {("lru", 1): "ok", ("lru", 2): "ok", ("oracle", 1): "ok", ("oracle", 2): "unsupported"}
    assert all(r["cell"].endswith(f"|b{r['batch']}") for r in rows)
    assert "t/s total" in out and "unsupported" in out  # the table of tests: per-user t/s beside per-GPU


@pytest.mark.parametrize("batch, says", [
    ("0", "--batch '0' is not a batch size"),
    ("2,x", "--batch 'x' is not a batch size"),
    ("41", "--batch 41 is more than workload 'shakespeare-heldout-v1' holds (40 prompts); use --batch 40 or less"),
])
def test_a_bad_batch_is_one_line_exit_2_and_no_folder(host, tmp_path, capsys, batch, says):
    code, _, err = run(tmp_path, capsys, "--batch", batch)
    assert code == 2 and says in one_line(err)
    assert not (tmp_path / "r").exists()


def test_a_batch_whose_kv_cannot_fit_names_the_largest_that_fits(host, tmp_path, capsys):
    code, _, err = run(tmp_path, capsys, "--batch", "1,32", "--budgets", "260000B", "--tokens", "60",
                       "--strategies", "lru")
    line = one_line(err)
    assert code == 2 and "--batch 32 does not fit budget 260000B for lru" in line
    assert "the largest that fits is --batch" in line
    assert not (tmp_path / "r").exists()


def test_a_batch_whose_kv_leaves_no_room_for_a_draft_names_the_largest_that_fits(host, tmp_path, capsys):
    code, _, err = run(tmp_path, capsys, "--batch", "1,8", "--budgets", "60%", "--tokens", "8",
                       "--strategies", "spec-decode", "--prompts", "8")
    line = one_line(err)
    assert code == 2 and "--batch 8 does not fit budget 60% for spec-decode" in line, line
    assert "the largest that fits is --batch" in line
    assert not (tmp_path / "r").exists()
