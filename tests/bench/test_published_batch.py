"""The published record's batch rows (MoE-Gen Table 9): the record loads them with their batch, lengths and
settings, a batch row runs end to end through the batched decode and is compared as tokens/s over the batch, and a
bad batch field is one line."""

from __future__ import annotations

import json

import pytest
from cli_errors import one_line  # noqa: E402

from specterbench.bench import published as pub
from specterbench.bench import published_record
from specterbench.cli import main
from specterbench.errors import UsageError

ROW = """
[[measurement]]
id = "t-{name}"
source = "test"
system = "{system}"
strategy = "{strategy}"
model = "Mixtral-8x7B"
standin = "tiny-random-mixtral"
geometry = "mixtral"
precision = {{ expert_bits = 16, dense_bits = 16 }}
profile = "rtx-a5000-pcie4"
host_profile = "xeon-silver-4310"
budget = {{ device_memory = true, reserve_gib = 2.0 }}
setting = ["one card, B={batch}", "{system}: B=4 against B=1"]
batch = {batch}
prompt_tokens = 512
new_tokens = 32
kind = "tokens_per_s"
value = {value}
"""


def test_the_record_holds_moe_gen_table_9_at_batch_1_and_32(host):
    record = {m.id: m for m in published_record.load_record(host)}
    rows = [m for m in record.values() if m.id.startswith("moegen-t9-")]
    assert len(rows) == 16 and {m.batch for m in rows} == {1, 32}
    assert all(m.profile == "rtx-a5000-pcie4" and m.kv_context == 544 and len(m.settings) == 2 for m in rows)
    assert record["moegen-t9-mixtral-moegen-b32"].value == 33.6
    assert record["moegen-t9-dsv2l-llamacpp-b1"].strategy == "n-cpu-moe"
    assert {m.strategy for m in rows} == {"layer-stream", "n-cpu-moe"}
    pairs = pub.pairs_of([pub.Outcome(m, modeled=1.0) for m in rows])
    # per model: 6 pairs within each batch size, and each system's B = 32 against its B = 1
    assert len(pairs) == 2 * (6 + 6 + 4)
    scaling = [p for p in pairs if "against" in p.setting]
    assert all(p.fast.measurement.batch == 32 and p.slow.measurement.batch == 1 for p in scaling)


def test_a_batch_row_runs_batched_and_is_compared_per_gpu(tmp_path, capsys):
    path = tmp_path / "record.toml"
    path.write_text(ROW.format(name="b1", system="stream", strategy="layer-stream", batch=1, value=1.0)
                    + ROW.format(name="b4", system="stream", strategy="layer-stream", batch=4, value=8.0))
    out = tmp_path / "out"
    assert main(["published", "--record", str(path), "--prompts", "1", "--tokens", "3", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "B=4" in text and "against B=1" in text
    data = json.loads((out / "published.json").read_text())
    rows = {r["id"]: r for r in data["measurements"]}
    assert rows["t-b4"]["status"] == "ok" and rows["t-b4"]["batch"] == 4
    assert "KV 4 x 544 positions" in rows["t-b4"]["budget"]  # the published lengths' KV is charged
    assert rows["t-b4"]["prompt_tokens_run"] < 512 <= rows["t-b4"]["prompt_tokens_published"]  # the stand-in's
    cells = {json.loads(line)["cell"]: json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()}
    b4 = next(r for k, r in cells.items() if "t-b4" in k)
    assert b4["batch"] == 4 and b4["prompts"] == 4  # four requests, one batched decode
    assert rows["t-b4"]["modeled"] == pytest.approx(1000.0 / b4["tokens_per_s_total"])
    assert rows["t-b4"]["budget_fraction"] < rows["t-b1"]["budget_fraction"]  # four requests' KV, not one


@pytest.mark.parametrize("edit, message", [
    ("batch = 0", "batch must be a positive integer"),
    ("batch = 2.5", "batch must be a positive integer"),
    ('batch = "4"', "batch must be a positive integer"),
    ("batch = true", "batch must be a positive integer"),
    ("new_tokens = 0", "new_tokens must be a positive integer"),
])
def test_a_bad_batch_field_is_one_line_naming_the_row(host, tmp_path, edit, message):
    path = tmp_path / "record.toml"
    text = ROW.format(name="bad", system="s", strategy="layer-stream", batch=4, value=8.0)
    key = edit.split(" = ")[0]
    text = "\n".join(edit if line.startswith(f"{key} = ") else line for line in text.splitlines())
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        published_record.load_record(host, path)
    assert "\n" not in str(err.value) and "'t-bad'" in str(err.value)


def test_a_batch_row_of_another_kind_or_half_its_lengths_is_one_line(host, tmp_path, capsys):
    path = tmp_path / "record.toml"
    text = ROW.format(name="bad", system="s", strategy="layer-stream", batch=4, value=8.0)
    path.write_text(text.replace('kind = "tokens_per_s"', 'kind = "tpot_ms"'))
    with pytest.raises(UsageError, match="batch 4 needs kind"):
        published_record.load_record(host, path)
    path.write_text(text.replace("new_tokens = 32\n", ""))
    assert main(["published", "--record", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "prompt_tokens and new_tokens come together" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
