"""``--output md|csv|json|jsonl``: the printed table in each format, read back by its reader; an unknown format is
refused in one line before anything runs."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from cli_errors import one_line

from specterbench.cli import main

RUN = ["--model", "tiny-random-mixtral", "--strategies", "lru,resident", "--budgets", "50%", "--prompts", "2",
       "--tokens", "3", "--quiet"]


def call(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def run_dir(host, small_prompts, capsys, tmp_path):
    code, _, err = call(capsys, "run", *RUN, "--out", tmp_path, "--run-id", "r")
    assert code == 0, err
    return tmp_path / "r"


READERS = {"csv": pd.read_csv, "json": pd.read_json, "jsonl": lambda f: pd.read_json(f, lines=True)}


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_report_output_reads_back_as_the_table(run_dir, capsys, fmt):
    from specterbench.analysis.formats import machine_frame
    from specterbench.runfiles.results import read_rows

    code, out, err = call(capsys, "report", run_dir, "--output", fmt)
    assert code == 0, err
    back = READERS[fmt](io.StringIO(out))
    want = machine_frame(read_rows(run_dir))
    assert list(back.columns) == list(want.columns)
    assert len(back) == len(want) == 2
    assert list(back["strategy"]) == list(want["strategy"])
    for col in ("TPOT ms", "TTFT ms"):
        assert back[col].tolist() == pytest.approx(want[col].tolist())
    assert "summary:" in err and "summary:" not in out  # stdout holds the table alone


def test_run_prints_csv_on_stdout(host, small_prompts, capsys, tmp_path):
    code, out, err = call(capsys, "run", *RUN, "--out", tmp_path, "--run-id", "r", "--output", "csv")
    assert code == 0, err
    back = pd.read_csv(io.StringIO(out))
    assert sorted(back["strategy"]) == ["lru", "resident"] and "rows:" in err


def test_md_is_the_markdown_table(run_dir, capsys):
    code, out, _ = call(capsys, "report", run_dir, "--output", "md")
    assert code == 0 and "| lru" in out and "summary:" in out


@pytest.mark.parametrize("command", ["run", "report"])
def test_unknown_output_is_one_line_and_leaves_no_folder(host, small_prompts, capsys, tmp_path, command):
    argv = (["run", *RUN, "--out", tmp_path, "--run-id", "x"] if command == "run" else ["report", tmp_path])
    code, _, err = call(capsys, *argv, "--output", "yaml")
    assert code == 2
    assert "unknown --output 'yaml'" in one_line(err) and "md, csv, json, jsonl" in err
    assert not (tmp_path / "x").exists()
