"""The target's precision as a setting (``--expert-bits``/``--dense-bits``): the reference is the quantized model,
budgets are shares of the stored (packed) expert bytes, drafts must sit below the target, rows carry it."""

from __future__ import annotations

import json

import pytest
import torch
from cli_errors import one_line  # noqa: E402

from specterbench.cli import main
from specterbench.engine.draft import QuantSpec
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.precision import Precision, priced_geometry
from specterbench.errors import UsageError
from specterbench.runfiles.results import read_rows

MODEL = "tiny-random-mixtral"
FAST = ["--model", MODEL, "--prompts", "1", "--tokens", "4", "--quiet", "--geometry", "own"]


@pytest.mark.parametrize("args, message", [
    (("5", "16"), "unknown precision --expert-bits '5'"),
    (("four", "16"), "unknown precision --expert-bits 'four'"),
    (("4", "2"), "unknown precision --dense-bits '2'"),
])
def test_an_unknown_precision_is_one_line(args, message):
    with pytest.raises(UsageError, match=message) as err:
        Precision.parse(*args)
    assert "\n" not in str(err.value)


def test_bits_a_format_cannot_hold_are_refused():
    with pytest.raises(UsageError, match="unsupported draft bit width 3 for quantizer 'bnb'"):
        Precision.parse(3, 16, "bnb")
    with pytest.raises(UsageError, match="blocksize"):
        Precision.parse(4, 16, "int", 100)


def test_the_label_names_format_and_group():
    assert Precision().label() == "bf16"
    assert Precision.parse(4, 8).label() == "experts int4/g128 (4.16 bpw) + dense int8/g64"


def test_the_priced_geometry_holds_packed_expert_bytes():
    g = geometry_preset("mixtral")
    q = priced_geometry(g, Precision.parse(4))
    spec = QuantSpec(bits=4, blocksize=128, quantizer="int")
    n_gu, n_dn = 2 * g.hidden * g.expert_intermediate, g.hidden * g.expert_intermediate
    assert q.expert_bytes == spec.tensor_bytes(n_gu) + spec.tensor_bytes(n_dn)  # whole groups: the same count
    assert q.expert_bytes < g.expert_bytes / 3.8 and "int4/g128" in q.label()


def test_a_quantized_target_runs_losslessly_and_rows_carry_its_precision(tmp_path, capsys):
    code = main(["run", *FAST, "--strategies", "lru,on-demand", "--budgets", "50%", "--expert-bits", "4",
                 "--dense-bits", "8", "--out", str(tmp_path), "--run-id", "q"])
    assert code == 0, capsys.readouterr().err
    rows = read_rows(tmp_path / "q")
    assert {r.precision for r in rows} == {"experts int4/g128 (4.16 bpw) + dense int8/g64"}
    assert all(r.status == "ok" and r.lossless for r in rows)
    assert all(r.cell.endswith("experts int4/g128 (4.16 bpw) + dense int8/g64") for r in rows)
    # budgets are shares of the stored bytes: 4-bit experts hold about a quarter of the 16-bit bytes
    bf16 = tmp_path / "b"
    assert main(["run", *FAST, "--strategies", "lru", "--budgets", "50%", "--out", str(tmp_path),
                 "--run-id", "b"]) == 0
    full = read_rows(bf16)[0].total_expert_bytes
    assert 0.24 < rows[0].total_expert_bytes / full < 0.28
    assert rows[0].h2d_bytes <= rows[0].total_expert_bytes * 10  # the ledger moves packed bytes too


def test_a_draft_not_below_the_target_refuses_in_one_line(tmp_path, capsys):
    code = main(["run", *FAST, "--strategies", "specter-artifact", "--budgets", "90%", "--expert-bits", "4",
                 "--out", str(tmp_path)])
    assert code == 2
    assert "is not below the target's 4-bit experts" in one_line(capsys.readouterr().err)


def test_compare_refuses_runs_of_different_precisions(tmp_path, capsys):
    for run_id, bits in (("a", "16"), ("c", "8")):
        assert main(["run", *FAST, "--strategies", "lru", "--budgets", "50%", "--expert-bits", bits,
                     "--out", str(tmp_path), "--run-id", run_id]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "different target precision" in one_line(capsys.readouterr().err)


def test_old_rows_without_precision_read_as_bf16(tmp_path):
    assert main(["run", *FAST, "--strategies", "lru", "--budgets", "50%", "--out", str(tmp_path),
                 "--run-id", "o"]) == 0
    path = tmp_path / "o" / "rows.jsonl"
    data = [json.loads(line) for line in path.read_text().splitlines()]
    for d in data:
        del d["precision"]
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    assert {r.precision for r in read_rows(tmp_path / "o")} == {"bf16"}


def test_set_precision_bills_stored_bytes_and_prices_the_geometry():
    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine.engine import Engine
    from specterbench.engine.precision import quantize_model

    model, tok = tiny_random("mixtral")
    experts_before = model.model.layers[0].mlp.experts.gate_up_proj.detach().clone()
    dense_before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    precision = Precision.parse(4, 8)
    quantize_model(model, precision)
    dense_after = model.model.layers[0].self_attn.q_proj.weight.detach()
    assert not torch.equal(dense_before, dense_after)  # the dense part is quantized in place
    assert torch.equal(model.model.layers[0].mlp.experts.gate_up_proj, experts_before)  # experts: the store packs
    engine = Engine(model, name="tiny-random-mixtral", tokenizer=tok)
    sixteen = engine.expert_bytes
    engine.set_precision(precision)  # an engine built at 16 bits packs its store here, a layer at a time
    gu, dn = engine.store.shapes
    spec = precision.expert_spec
    assert engine.expert_bytes == spec.weight_bytes(gu) + spec.weight_bytes(dn) < sixteen / 3
    assert engine.precision is precision and engine.dense_ratio == precision.dense_ratio < 0.6
    assert engine.geometry.expert_bits_per_weight == pytest.approx(precision.expert_bits_per_weight(
        engine.geometry.hidden, engine.geometry.expert_intermediate))


def test_the_engines_own_clock_prices_the_new_precision_before_any_cell():
    """An engine's default (host wall) clock was bound at 16 bits; set_precision moves its prices too, so estimates
    asked before ``configure`` (e.g. a strategy's ``min_cache_bytes``) see the stored bytes, not bf16's."""
    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine.engine import Engine

    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="tiny-random-mixtral", tokenizer=tok)
    sixteen = engine.clock.costs.expert_copy_bytes
    engine.set_precision(Precision.parse(4, 16))
    assert engine.clock.costs.geometry is engine.geometry
    assert engine.clock.costs.expert_copy_bytes < sixteen / 3


def test_a_sweep_grid_takes_the_precision_for_every_cell_and_its_own_reference(host):
    from specterbench.bench.grid import expand, parse_grid, reference_key

    grid = parse_grid({"models": [MODEL], "strategies": ["lru"], "budgets": ["50%"], "tokens": 4, "prompts": 1,
                       "expert_bits": 4, "dense_bits": 8})
    cells = expand(grid, host)
    assert {c.config.precision.label() for c in cells} == {"experts int4/g128 (4.16 bpw) + dense int8/g64"}
    assert all(c.key.endswith("experts int4/g128 (4.16 bpw) + dense int8/g64") for c in cells)
    assert reference_key(cells[0].config)[-1] == "experts int4/g128 (4.16 bpw) + dense int8/g64"
    with pytest.raises(UsageError, match="unknown precision --expert-bits"):
        parse_grid({"models": [MODEL], "strategies": ["lru"], "budgets": ["50%"], "expert_bits": 5})


@pytest.mark.parametrize("name, bits", [("q4", 4), ("Q8", 8), ("bf16", 16), ("int3", 3), ("q2", 2)])
def test_precision_names_users_know_map_onto_a_bit_width(name, bits):
    assert Precision.parse(name).expert_bits == bits


@pytest.mark.parametrize("name, nearest", [("q4_k_m", "--expert-bits 4 with --expert-group 32 (4.62 bits per weight"),
                                           ("Q8_0", "--expert-bits 8 with --expert-group 32"),
                                           ("q6_k", "6 bits is not a width here")])
def test_a_name_without_a_clean_mapping_is_one_line_naming_the_nearest(name, nearest):
    with pytest.raises(UsageError, match="has no clean mapping") as info:
        Precision.parse(name)
    assert nearest in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_precision_lists_the_widths_and_the_names():
    with pytest.raises(UsageError, match=r"use one of 16, 8, 4, 3, 2 \(16: unquantized\) or a name: bf16, q8, int8"):
        Precision.parse("q5")
