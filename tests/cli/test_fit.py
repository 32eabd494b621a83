"""``specterbench fit``: device memory swept over card sizes, the best strategy per size, a plot; bad input refused."""

from __future__ import annotations

import json

import pytest
from cli_errors import one_line

from specterbench.bench.fit import FitPoint, best, parse_sizes
from specterbench.cli import main
from specterbench.errors import UsageError

SMALL = ["fit", "--model", "tiny-random-mixtral", "--geometry", "mixtral", "--prompts", "1", "--tokens", "2",
         "--quiet"]


def test_fit_prints_the_best_strategy_per_card_and_plots_tokens_per_s(host, tmp_path, capsys):
    plot = tmp_path / "img" / "fit.png"
    code = main([*SMALL, "--strategies", "n-cpu-moe,lru", "--sizes", "4GB,24GB,48GB,400GB", "--out",
                 str(tmp_path), "--run-id", "f", "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "modeled decode throughput (modeled (a100-40g-pcie4))" in out and "mixtral geometry" in out
    lines = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert "nothing fits" in lines["4GB"] and "card too small" in out  # below the dense weights and the reserve
    assert "--n-cpu-moe" in out
    rows = [json.loads(x) for x in (tmp_path / "f" / "rows.jsonl").read_text().splitlines()]
    # 24 and 48 GB run both strategies; 400 GB holds every expert, once per strategy
    assert sorted((r["extra"]["device_plan"]["card_bytes"] // 10**9, r["strategy"]) for r in rows) == [
        (24, "lru"), (24, "n-cpu-moe"), (48, "lru"), (48, "n-cpu-moe"), (400, "lru"), (400, "n-cpu-moe")]
    assert all(r["budget_fraction"] == 1.0 for r in rows if r["extra"]["device_plan"]["card_bytes"] == 400 * 10**9)
    split = [r for r in rows if r["strategy"] == "n-cpu-moe"]
    assert [r["extra"]["n_cpu_moe"] for r in split] == sorted((r["extra"]["n_cpu_moe"] for r in split),
                                                              reverse=True)  # more card, fewer host layers
    assert plot.stat().st_size > 0 and (tmp_path / "f" / "plots").is_dir()


def test_the_best_point_is_the_most_tokens_per_s_and_a_size_where_nothing_ran_has_none():
    from specterbench.runfiles.results import ResultRow

    def row(tps):
        r = ResultRow(**{f: None for f in ("run_id", "cell", "model", "geometry", "geometry_label",
                                           "priced_total_expert_bytes", "strategy", "strategy_version",
                                           "strategy_plugin", "lossless_strategy", "budget_bytes", "budget_fraction",
                                           "total_expert_bytes", "profile", "clock", "workload", "prompts",
                                           "new_tokens", "seed", "repeat")})
        r.tokens_per_s = tps
        return r

    points = [FitPoint(8, "a", reason="too small"), FitPoint(16, "a", row(2.0)), FitPoint(16, "b", row(3.0))]
    top = best(points)
    assert top[8] is None and top[16].strategy == "b"
    released = row(3.0)
    released.extra["draft_released"] = True  # it ran as its ablation: a tie names the strategy that ran
    assert best([FitPoint(32, "specter", released), FitPoint(32, "cpu-experts", row(3.0))])[32].strategy == \
        "cpu-experts"


@pytest.mark.parametrize("args, message", [
    (["--strategies", "lur"], "unknown strategy 'lur'"),
    (["--sizes", "8,16"], "--sizes '8' needs a unit"),
    (["--sizes", ","], "--sizes is empty"),
    (["--model", "tiny-random-mixtral,tiny-random-qwen"], "fit sizes one model at a time"),
    (["--expert-bits", "q4_k_m"], "q4_k_m"),
    (["--gpu-reserve", "1"], "--gpu-reserve '1' needs a unit"),
])
def test_bad_input_is_one_line_exit_2_and_no_run_folder(host, tmp_path, capsys, args, message):
    code = main([*SMALL, "--out", str(tmp_path), *args])
    _, err = capsys.readouterr()
    assert code == 2 and message in one_line(err), err
    assert list(tmp_path.iterdir()) == []


def test_sizes_take_units_and_come_sorted_once():
    assert parse_sizes("24GB,8GB,24GB") == [8 * 10**9, 24 * 10**9]
    with pytest.raises(UsageError, match="needs a unit"):
        parse_sizes("24")
