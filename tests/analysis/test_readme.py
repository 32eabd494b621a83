"""The README's generated sections: the batch sweep's table holds each cell's own figures, a cell that did not run says
why, and each section is spliced between its own markers."""

import pytest

from specterbench.analysis.readme import MARKERS, batch_example, splice
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.errors import UsageError


def test_batch_table_shows_each_cells_per_user_and_total_rate(host, small_prompts, tmp_path):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("lru", "oracle"),
                         budgets=(parse_budget("65%"),), profile="a100-40g-pcie4", prompts=2, tokens=6,
                         geometry="mixtral", batches=(1, 2))
    rows = Runner(host, config, tmp_path).run()
    text = batch_example(rows, "tiny-random-mixtral", ("oracle", "lru"), "specterbench run …")
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["strategy", "B = 1", "B = 2"]
    by = {r.strategy: {} for r in rows}
    for r in rows:
        by[r.strategy][r.batch] = r
    lru = next(line for line in lines if line.startswith("| lru"))
    for b in (1, 2):
        r = by["lru"][b]
        assert f"{r.tokens_per_s_per_user:.2f} / {r.tokens_per_s_total:.2f}" in lru
    spec = next(line for line in lines if line.startswith("| oracle"))
    assert by["oracle"][2].status in spec  # the row that did not run says so, in the strategy's order
    assert lines.index(spec) < lines.index(lru)
    assert "modeled · a100-40g-pcie4" in text and "mixtral geometry" in text
    with pytest.raises(UsageError, match="no rows of model 'nope'"):
        batch_example(rows, "nope", ("lru",), "x")


def test_each_section_goes_between_its_own_markers(tmp_path):
    (b1, e1), (b2, e2) = MARKERS["example"], MARKERS["batch"]
    text = f"head\n{b1}\nold one\n{e1}\nmiddle\n{b2}\nold two\n{e2}\ntail\n"
    out = splice(splice(text, "new one\n", tmp_path, "example"), "new two\n", tmp_path, "batch")
    assert out == f"head\n{b1}\nnew one\n{e1}\nmiddle\n{b2}\nnew two\n{e2}\ntail\n"
    with pytest.raises(UsageError, match="batch-table:begin"):
        splice("no markers\n", "x", tmp_path, "batch")
