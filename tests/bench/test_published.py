"""The published-record check: the shipped profiles and record load and validate, a quick subset runs end to end,
and every bad record or profile is one line. Timing figures are not asserted here (a benchmark is not a test);
the targets are reported by ``specterbench published``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_errors import one_line  # noqa: E402

from specterbench.bench import published as pub
from specterbench.bench import published_record
from specterbench.cli import main
from specterbench.engine.profiles import (
    PROFILE_FILES_DIR,
    HardwareProfile,
    HostProfile,
    load_profile_file,
    packaged_profiles,
)
from specterbench.errors import UsageError

SETUPS = ("a100-40g-pcie4-speq", "a100-80g-pcie4", "rtx3080m-16g-pcie4", "rtx3060-12g-pcie3", "t4-16g-pcie3",
          "quadro-rtx6000-24g-pcie3")
HOSTS = ("xeon-silver-4310", "xeon-skylake-48c", "threadripper-7960x")


# ---- profiles -----------------------------------------------------------------------------------------------------
def test_every_published_setup_is_a_builtin_profile_with_sources(host):
    for name in SETUPS:
        p = host.profiles().get(name)
        assert p.sources and all(s.strip() for s in p.sources)
    for name in HOSTS:
        assert host.host_profiles().get(name).sources


def test_the_shipped_profile_files_are_in_the_calibrate_format():
    hardware, hosts = packaged_profiles()
    assert {p.name for p in hardware} >= set(SETUPS) and {h.name for h in hosts} >= set(HOSTS)
    for path in PROFILE_FILES_DIR.glob("*.toml"):
        profile, host_profile = load_profile_file(path, require_profile=False)
        assert profile is not None or host_profile is not None


def _copy(tmp_path, name="moe-speq-a100-40g.toml") -> Path:
    dst = tmp_path / name
    dst.write_text((PROFILE_FILES_DIR / name).read_text(encoding="utf-8"), encoding="utf-8")
    return dst


def test_a_copied_profile_file_runs_as_profile_path(tmp_path):
    path = _copy(tmp_path)
    text = path.read_text().replace('name = "a100-40g-pcie4-speq"', 'name = "my-a100"')
    path.write_text(text)
    profile, host_profile = load_profile_file(path)
    assert profile.name == "my-a100" and host_profile.name == "xeon-silver-4310"


@pytest.mark.parametrize("value, message", [("inf", "must be finite"), ("nan", "must be finite"),
                                            ("0.0", "must be > 0"), ("-5.0", "must be > 0")])
def test_a_non_finite_or_non_positive_profile_field_is_one_line(tmp_path, value, message):
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("link_bytes_per_s = 25.0e9", f"link_bytes_per_s = {value}"))
    with pytest.raises(UsageError, match=message) as err:
        load_profile_file(path)
    assert "\n" not in str(err.value)


def test_a_missing_profile_field_is_one_line(tmp_path):
    path = _copy(tmp_path)
    path.write_text("\n".join(line for line in path.read_text().splitlines() if not line.startswith("threads")))
    with pytest.raises(UsageError, match="missing field"):
        load_profile_file(path)


def test_profiles_built_in_code_refuse_inf_and_nan_too():
    good = dict(name="x", accelerator="a", flops_per_s=1e12, mem_bytes_per_s=1e11, link_bytes_per_s=1e10,
                link_latency_us=1.0, launch_us=1.0, device_memory_bytes=2**30, sources=("s",))
    for bad in (math.inf, math.nan):
        with pytest.raises(UsageError, match="finite"):
            HardwareProfile(**{**good, "mem_bytes_per_s": bad})
    with pytest.raises(UsageError, match="finite"):
        HostProfile(name="h", cpu="c", mem_bytes_per_s=math.inf, flops_per_s=1e12, threads=4, launch_us=1.0,
                    sources=("s",))
    with pytest.raises(UsageError, match="sources"):
        HardwareProfile(**{**good, "sources": ()})


def test_the_profile_command_line_refuses_an_inf_field_in_one_line(tmp_path, capsys):
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace("flops_per_s = 187.2e12", "flops_per_s = inf"))
    code = main(["run", "--profile", str(path), "--model", "tiny-random-mixtral", "--strategies", "lru",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path), "--quiet"])
    assert code == 2
    assert "must be finite" in one_line(capsys.readouterr().err)


# ---- the record -------------------------------------------------------------------------------------------------
def test_the_record_has_twelve_measurements_from_four_sources_and_the_components(host):
    record = published_record.load_record(host)
    runs = [m for m in record if m.kind != "component_ms"]
    sources = {m.source.split(",")[0].split(" (")[0] for m in record}
    assert len(runs) >= 12 and len(sources) >= 4, sources
    values = {m.id: m.value for m in record}
    assert values["layerscope-expert-copy"] == 13.98 and values["hostexpert-layer-cpu"] == 7.34
    table3 = {m.id: m.value for m in record if m.id.startswith("speq-t3-")}
    assert len(table3) == 6  # LRU and speculative at 6, 16 and 32 slots per layer
    assert all(m.source and (m.kind == "component_ms" or m.strategy) for m in record)


def test_the_record_has_the_setups_users_run_from_three_sources(host):
    record = published_record.load_record(host)
    users = [m for m in record if m.strategy in ("n-cpu-moe", "kt-hybrid") and m.batch == 1
             and not m.id.startswith("moegen-t9-")]  # MoE-Gen's baselines: tests/bench/test_published_batch.py
    sources = {m.source.split(":")[0] for m in users}
    assert len(users) >= 10 and len(sources) >= 3, sources
    for m in users:
        assert m.geometry in ("qwen3-30b-a3b", "deepseek-v3", "deepseek-coder-v2-lite") and m.host_profile
        assert m.lengths and m.model and m.precision
        if "Q4_K_M" in m.model:  # its real bits per weight are stated beside the priced format
            assert "4.85 bpw" in m.model and m.precision.expert_bits == 4
    ids = {m.id for m in users}
    assert {"llamacpp-dsv3-2socket", "ktv02-dsv3-2socket"} <= ids
    outcomes = [pub.Outcome(m, modeled=1.0) for m in users]
    assert len(pub.pairs_of(outcomes)) >= 3  # KTransformers 1 and 2 sockets against llama.cpp, one hardware


def test_every_same_hardware_setting_yields_pairs(host):
    outcomes = [pub.Outcome(m, modeled=1.0) for m in published_record.load_record(host)]
    pairs = pub.pairs_of(outcomes)
    assert len(pairs) >= 6
    assert all(p.published >= 1 for p in pairs)


def test_components_are_priced_by_the_cost_model(host):
    record = {m.id: m for m in published_record.load_record(host)}
    one = pub.price_component(host, record["layerscope-expert-copy"])
    two = pub.price_component(host, record["hostexpert-layer-fetch"])
    assert two == pytest.approx(2 * one)
    # one FP16 Mixtral expert is 3 x 4096 x 14336 x 2 bytes; at 25 GB/s plus 10 us
    assert one == pytest.approx(1e3 * (3 * 4096 * 14336 * 2 / 25e9 + 10e-6))


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('standin = "tiny-mixtral"', 'standin = "tiny-mixtrol"', 1), "unknown model"),
    (lambda t: t.replace('profile = "a100-80g-pcie4"', 'profile = "a100-80g-pcie9"', 1), "unknown profile"),
    (lambda t: t.replace('geometry = "qwen3-30b-a3b"', 'geometry = "qwen3-30b"', 1), "unknown geometry"),
    (lambda t: t.replace('host_profile = "i9-10900x"', 'host_profile = "i9-10900k"', 1), "unknown host profile"),
    (lambda t: t.replace('host_profile = "epyc-9355"\nbudget', 'host_profile = "epyc-9355"\nbudget', 1)
     .replace('precision = { expert_bits = 16, dense_bits = 16 }\nprofile = "rtx5090-pcie5"',
              'precision = { expert_bits = 8, dense_bits = 16 }\nprofile = "rtx5090-pcie5"', 1),
     "'epyc-9355' states no expert_kernels.avx2.int8"),
    (lambda t: t.replace("value = 163.1", "value = -163.1", 1), "finite positive"),
    (lambda t: t.replace("value = 163.1", "value = inf", 1), "finite positive"),
    (lambda t: t.replace("expert_bits = 2,", "expert_bits = 5,", 1), "unknown precision"),
    (lambda t: t.replace('kind = "tpot_ms"', 'kind = "tpot"', 1), "kind 'tpot'"),
    (lambda t: t.replace('system = "MoE-SpeQ"\n', "", 1), "missing field"),
    (lambda t: t.replace('torch_bf16 = true }\nmodel = "Mixtral-8x7B"\nstandin = "tiny-mixtral"\ngeometry = "mixtral"\n'
                         'precision = { expert_bits = 16, dense_bits = 16 }\nprofile = "quadro-rtx6000-24g-pcie3"\n'
                         'host_profile = "xeon-skylake-48c"',
                         'torch_bf16 = true }\nmodel = "Mixtral-8x7B"\nstandin = "tiny-mixtral"\ngeometry = "mixtral"\n'
                         'precision = { expert_bits = 16, dense_bits = 16 }\nprofile = "quadro-rtx6000-24g-pcie3"\n'
                         'host_profile = "threadripper-7960x"', 1), "no torch_bf16_bytes_per_s"),
])
def test_a_bad_record_row_is_one_line_naming_the_row(host, tmp_path, edit, message):
    path = tmp_path / "record.toml"
    path.write_text(edit(published_record.RECORD.read_text(encoding="utf-8")))
    with pytest.raises(UsageError, match=message) as err:
        published_record.load_record(host, path)
    assert "\n" not in str(err.value) and "measurement" in str(err.value)


def test_the_command_refuses_a_bad_record_in_one_line(tmp_path, capsys):
    path = tmp_path / "record.toml"
    path.write_text(published_record.RECORD.read_text(encoding="utf-8").replace('standin = "tiny-deepseek"',
                                                                    'standin = "nope"', 1))
    assert main(["published", "--record", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "unknown model" in one_line(capsys.readouterr().err)


def test_the_quick_subset_prints_modeled_beside_published(tmp_path, capsys):
    out = tmp_path / "quick"
    assert main(["published", "--quick", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| mo-t2-a100-full |" in text and "pairwise speed-ups" in text and "geometric-mean ratio" in text
    data = json.loads((out / "published.json").read_text())
    rows = {r["id"]: r for r in data["measurements"]}
    assert set(rows) == set(published_record.QUICK_IDS)
    assert all(r["status"] == "ok" and r["ratio"] > 0 for r in rows.values())
    assert rows["mo-t2-a100-full"]["precision"] == "experts int2/g32 (2.56 bpw) + dense int4/g64"
    assert data["pairs"] and data["pairs"][0]["modeled"] is not None
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert {json.loads(line)["precision"] for line in lines} == {"experts int2/g32 (2.56 bpw) + dense int4/g64"}
