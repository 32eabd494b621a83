"""llama-bench's vocabulary: tests named pp<prompt> / tg<new tokens> (@ d<depth>), one table line per test,
tokens/s as mean ± standard deviation over the requests of every repeat, ms/token beside it."""

from __future__ import annotations

import pytest

from specterbench.analysis.pp_tg import names_of_tests, render_tests_markdown, table_of_tests
from specterbench.runfiles.results import ResultRow


def row(repeat=0, tg=(10.0, 20.0), pp=(1000.0, 3000.0), lengths=(512, 512), **kw) -> ResultRow:
    fields = dict(run_id="r", cell=f"c{repeat}", model="m", geometry="m", geometry_label="m",
                  priced_total_expert_bytes=1,
                  strategy="lru", strategy_version="1", strategy_plugin="p", lossless_strategy=True, budget_bytes=1,
                  budget_fraction=0.5, total_expert_bytes=2, profile="a100-40g-pcie4", clock="modeled",
                  workload="w", prompts=len(lengths), new_tokens=128, seed=0, repeat=repeat, lossless=True,
                  ttft_ms=300.0, hit_rate=0.5, decode_h2d_bytes_per_token=2e3, stall_ms_per_token=1.0,
                  samples={"prompt_tokens": list(lengths), "pp_tokens_per_s": list(pp), "tg_tokens_per_s": list(tg)})
    fields.update(kw)
    return ResultRow(**fields)


def test_names_follow_llama_bench():
    assert names_of_tests(row(prompt_tokens=512)) == ("pp512", "tg128")
    assert names_of_tests(row(prompt_tokens=512, depth_tokens=4096)) == ("pp512 @ d4096", "tg128 @ d4096")
    assert names_of_tests(row(lengths=(12, 40)))[0] == "pp12-40"  # the workload's own prompt lengths


def test_one_line_per_test_with_mean_and_sd_over_every_repeat():
    df = table_of_tests([row(0, tg=(10.0, 20.0)), row(1, tg=(30.0,), pp=(2000.0,), lengths=(512,))])
    assert list(df["test"]) == ["pp512", "tg128"]
    tg = df[df["test"] == "tg128"].iloc[0]
    assert tg["t/s"] == pytest.approx(20.0) and tg["t/s sd"] == pytest.approx(10.0)  # stdev of 10, 20, 30
    assert tg["ms/tok"] == pytest.approx((100 + 50 + 1000 / 30) / 3)  # each request's ms per token, averaged
    pp = df[df["test"] == "pp512"].iloc[0]
    assert pp["t/s"] == pytest.approx(2000.0) and pp["TTFT ms"] == pytest.approx(300.0)


def test_markdown_prints_mean_plus_minus_sd():
    text = render_tests_markdown([row(0, prompt_tokens=512, depth_tokens=4096)])
    assert "| tg128 @ d4096 " in text and "| pp512 @ d4096 " in text
    assert "15.00 ± 7.07" in text and "nan" not in text


def test_batches_are_lines_of_their_own_with_per_user_and_per_gpu_rates():
    rows = [row(0, tg=(10.0, 10.0), tokens_per_s_total=10.0), row(0, tg=(8.0, 8.0), batch=2, tokens_per_s_total=16.0)]
    df = table_of_tests(rows)
    tg = df[df["test"] == "tg128"].set_index("batch")
    assert list(tg.index) == [1, 2]  # batch 2 is not pooled into batch 1's line
    assert tg.loc[2, "t/s"] == pytest.approx(8.0) and tg.loc[2, "t/s total"] == pytest.approx(16.0)
    assert "batch" in render_tests_markdown(rows) and "batch" not in render_tests_markdown(rows[:1])
