"""``run --gpu-memory`` / ``--budgets device``: budgets as what a card leaves for experts, end to end."""

from __future__ import annotations

import json

import pytest
from cli_errors import one_line

from specterbench.bench.device_memory import GIB, plan
from specterbench.cli import main
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.profiles import default_profile

FAST = ["--model", "tiny-random-mixtral", "--strategies", "lru,n-cpu-moe", "--prompts", "1", "--tokens", "2",
        "--quiet", "--geometry", "mixtral"]


def run(tmp_path, capsys, *args):
    code = main(["run", *FAST, "--out", str(tmp_path), "--run-id", "r", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_card_sets_each_cells_budget_and_the_table_shows_it_in_gb_and_layers(host, tmp_path, capsys):
    code, out, err = run(tmp_path, capsys, "--gpu-memory", "32GiB")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # --budgets' default does not run beside a card
    mixtral = geometry_preset("mixtral")
    for r in rows:
        p = r["extra"]["device_plan"]
        assert p["card_bytes"] == 32 * GIB and p["reserve_bytes"] == GIB and p["moe_layers"] == 32
        assert p["context_tokens"] >= 3 and p["dense_bytes"] == 3_210_739_712
        expected = plan(mixtral, 32 * GIB, context_tokens=p["context_tokens"],
                        forward_tokens=p["context_tokens"] - 2)
        assert p["expert_bytes"] == expected.expert_bytes
        assert r["budget_fraction"] == pytest.approx(expected.fraction, abs=1e-6)
    assert "32GiB card: 30.0" in out and "GB experts" in out
    split = next(r for r in rows if r["strategy"] == "n-cpu-moe")
    assert f"{32 - split['extra']['n_cpu_moe']}/32 layers" in out


def test_budgets_device_takes_the_profiles_memory_and_a_reserve(host, tmp_path, capsys):
    code, out, err = run(tmp_path, capsys, "--budgets", "device", "--gpu-reserve", "512MiB")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    p = rows[0]["extra"]["device_plan"]
    assert p["card_bytes"] == default_profile().device_memory_bytes and p["reserve_bytes"] == 512 * 2**20


def test_budgets_beside_a_card_both_run(host, tmp_path, capsys):
    code, _, err = run(tmp_path, capsys, "--gpu-memory", "48GiB", "--budgets", "50%", "--strategies", "lru")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert sorted(bool(r["extra"].get("device_plan")) for r in rows) == [False, True]


@pytest.mark.parametrize("args, message", [
    (["--gpu-memory", "24"], "--gpu-memory '24' needs a unit: write e.g. 24GiB"),
    (["--gpu-memory", "24GiB", "--gpu-reserve", "1"], "--gpu-reserve '1' needs a unit"),
    (["--gpu-reserve", "1GiB"], "no budget is a card; add --gpu-memory 24GiB"),
    (["--gpu-memory", "2GiB"], "a 2.00 GiB card does not hold mixtral's dense weights"),
])
def test_a_bad_card_is_one_line_exit_2_and_no_run_folder(host, tmp_path, capsys, args, message):
    code, _, err = run(tmp_path, capsys, *args)
    assert code == 2 and message in one_line(err), err
    assert not (tmp_path / "r").exists()


def test_a_too_small_card_names_the_smallest_that_fits(host, tmp_path, capsys):
    code, _, err = run(tmp_path, capsys, "--gpu-memory", "2GiB")
    assert code == 2 and "the smallest that fits is 5 GiB" in err


def test_make_bench_passes_gpu_memory_only_when_given():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def dry(*args):
        return subprocess.run(["make", "-n", "bench", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout

    assert "--gpu-memory '24GiB,48GiB'" in dry("GPU_MEMORY=24GiB,48GiB")
    assert "--gpu-memory" not in dry()


def test_a_batch_axis_puts_its_largest_batchs_kv_on_the_card_once(host, tmp_path, capsys):
    from specterbench.bench.device_memory import kv_bytes_per_token

    code, _, err = run(tmp_path, capsys, "--gpu-memory", "48GiB", "--batch", "1,2", "--strategies", "lru",
                       "--prompts", "2")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["batch"] for r in rows) == [1, 2]
    for r in rows:  # the card's plan holds batch 2's KV; nothing more is charged to the experts' share
        p = r["extra"]["device_plan"]
        assert p["batch"] == 2
        assert p["kv_bytes"] == kv_bytes_per_token(geometry_preset("mixtral")) * p["context_tokens"] * 2
        assert "kv_bytes" not in r["extra"]


def test_a_card_run_resumes_with_its_saved_card(host, tmp_path, capsys):
    code, _, err = run(tmp_path, capsys, "--gpu-memory", "48GiB", "--strategies", "lru")
    assert code == 0, err
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    rows = (tmp_path / "r" / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 1 and json.loads(rows[0])["extra"]["device_plan"]["card_bytes"] == 48 * GIB
