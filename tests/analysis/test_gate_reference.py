"""`make reference`: every moved metric and ratchet is printed; a worse one is refused unless allowed with a reason."""

import dataclasses
import datetime as dt
import io
import json

import pytest
from test_gate_injected import gate_grid, pick, summarise, windows_of

from specterbench.analysis.gate_reference import accept, metric_moves
from specterbench.errors import UsageError
from specterbench.runfiles.results import RowWriter, read_rows

NOW = dt.datetime(2026, 12, 1, 20, 0, tzinfo=dt.timezone.utc)


def write(run_dir, rows):
    w = RowWriter(run_dir / "rows.jsonl")
    for r in rows:
        w.append(r)
    (run_dir / "summary.md").write_text(f"# {run_dir.name}\n")
    return run_dir


@pytest.fixture
def reference(tmp_path):
    ref = write(tmp_path / "reference", gate_grid())
    (ref / "gate.toml").write_text(open("results/reference/gate.toml", encoding="utf-8").read())
    return ref


def record(tmp_path, reference, rows, **kw):
    out = io.StringIO()
    code = accept(write(tmp_path / "candidate", rows), reference, now=NOW, out=out, **kw)
    return code, out.getvalue()


def slower_h2d(rows, factor=1.05):
    i = pick(rows, "lru")
    rows[i] = dataclasses.replace(rows[i], h2d_bytes_per_token=rows[i].h2d_bytes_per_token * factor)
    return rows


def test_an_unchanged_candidate_moves_nothing_and_is_recorded(tmp_path, reference):
    code, text = record(tmp_path, reference, gate_grid())
    assert code == 0 and "0 change(s), 0 of them worse" in text
    assert not (reference / "CHANGELOG.md").exists()
    assert (reference / "summary.md").read_text().startswith("# specterbench run reference")  # rewritten


def test_a_better_metric_is_printed_and_accepted(tmp_path, reference):
    code, text = record(tmp_path, reference, slower_h2d(gate_grid(), 0.9))
    assert code == 0 and "1 change(s), 0 of them worse" in text
    assert "better  tiny-qwen-moe@qwen-moe · lru @ 35%" in text and "h2d_bytes_per_token: 1.9e+06 → 1.71e+06" in text
    assert read_rows(reference)[pick(gate_grid(), "lru")].h2d_bytes_per_token == pytest.approx(1.71e6)


def test_a_worse_metric_is_refused_and_the_reference_kept(tmp_path, reference):
    before = (reference / "rows.jsonl").read_bytes()
    code, text = record(tmp_path, reference, slower_h2d(gate_grid(), 1.0001))  # even within the gate's tolerance
    assert code == 1 and "WORSE   tiny-qwen-moe@qwen-moe · lru @ 35%" in text and "REFUSED — 1 regression(s)" in text
    assert 'ALLOW_REGRESSION=1 REASON="…"' in text
    assert (reference / "rows.jsonl").read_bytes() == before and not (reference / "CHANGELOG.md").exists()


def test_a_lower_ratchet_is_refused(tmp_path, reference):
    rows = gate_grid()
    i = pick(rows, "cpu-experts", "tiny-mixtral", 0.5)  # the strongest baseline gets faster: Specter's ratio drops
    rows[i] = summarise(rows[i], [(n, ms * 0.95) for n, ms in windows_of("cpu-experts", 11.0 * 0.7)])
    code, text = record(tmp_path, reference, rows)
    ratchets = [line for line in text.splitlines() if "ratchet [" in line]
    assert code == 1 and len(ratchets) == 2 and all(line.lstrip().startswith("WORSE") for line in ratchets)
    assert all("specter @ 50%" in line and "over cpu-experts" in line for line in ratchets)


def test_a_regression_with_a_reason_is_recorded_in_the_changelog(tmp_path, reference):
    code, text = record(tmp_path, reference, slower_h2d(gate_grid()), allow_regression=True,
                        reason="lru now pays for its copies' alignment")
    assert code == 0 and "accepted with 1 regression(s)" in text
    log = (reference / "CHANGELOG.md").read_text()
    assert log.startswith("# Changes to the committed gate reference\n\n"
                          "## 2026-12-01 20:00 UTC · code abc · 1 accepted")
    assert "Reason: lru now pays for its copies' alignment" in log
    assert "- WORSE   tiny-qwen-moe@qwen-moe · lru @ 35%" in log
    record(tmp_path / "again", reference, slower_h2d(slower_h2d(gate_grid())), allow_regression=True, reason="again")
    assert (reference / "CHANGELOG.md").read_text().count("## 2026-12-01") == 2  # appended, never rewritten


def test_allowing_a_regression_without_a_reason_is_refused(tmp_path, reference):
    with pytest.raises(UsageError, match='needs a reason: make reference ALLOW_REGRESSION=1 REASON='):
        record(tmp_path, reference, slower_h2d(gate_grid()), allow_regression=True, reason="  ")


def test_a_failed_row_or_a_vanished_cell_is_a_regression():
    ref = gate_grid()
    new = [r for r in gate_grid() if r.strategy != "static"][:-1]
    i = pick(new, "specter", "tiny-mixtral")
    new[i] = dataclasses.replace(new[i], status="diverged", error="tokens differ at p0 position 2")
    worse = [m.what for m in metric_moves(ref, new) if m.worse]
    assert "cell removed from the grid" in worse and "row diverged: tokens differ at p0 position 2" in worse


def test_the_first_reference_is_recorded_with_a_changelog_entry(tmp_path):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "gate.toml").write_text(open("results/reference/gate.toml", encoding="utf-8").read())
    code, text = record(tmp_path, tmp_path / "reference", gate_grid())
    assert code == 0 and "recording the first one" in text
    assert "Reason: first reference" in (tmp_path / "reference" / "CHANGELOG.md").read_text()


def test_one_candidate_folder_per_model_is_recorded_as_one_reference(tmp_path, reference):
    rows = gate_grid()
    parts = [write(tmp_path / f"candidate-{m}", [r for r in rows if r.model == m]) for m in ("tiny-mixtral",
                                                                                             "tiny-qwen-moe")]
    for p in parts:
        (p / "reference.jsonl").write_text(json.dumps({"model": p.name, "workload": "w", "decode_label": "sample T=1",
                                                       "tokens": [1, 2, 3], "adjacent_reuse": 0.5}) + "\n")
    (reference / "run.json").write_text("{}")
    assert accept(parts, reference, now=NOW, out=io.StringIO()) == 0
    assert len(read_rows(reference)) == len(rows)
    # the stale run.json is replaced by a merged one naming the parts' run ids, so the rows still belong to the folder
    assert json.loads((reference / "run.json").read_text())["kind"] == "merged"
    assert (reference / "reference.jsonl").read_text().count('"model"') == 2
    assert (reference / "summary.md").read_text().count("Workload: candidate-tiny-") == 2
