"""Fiddler's CPU path (``cpu-experts.torch_bf16=true``): the host's experts priced as PyTorch runs a bf16 expert on
the host CPU, at the host profile's ``torch_bf16_bytes_per_s`` where that is below the DRAM share; a host profile
that lacks the figure, or states a bad one, is one line; the option off changes nothing."""

from __future__ import annotations

import json

import pytest
import torch
from cli_errors import one_line  # noqa: E402
from support import bf16_kernels

from specterbench.cli import main
from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.geometry import Geometry, geometry_preset
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import PROFILE_FILES_DIR, HardwareProfile, HostProfile, load_profile_file
from specterbench.errors import UsageError

GEO = Geometry("g", hidden=8, expert_intermediate=8, num_experts=4, top_k=2, moe_layers=1, layers=1, heads=1,
               kv_heads=1, head_dim=8, vocab=16)
# a 1 MB/s link, 3 MB/s of host DRAM (2 MB/s while a copy runs), PyTorch's bf16 expert at 1.5 MB/s; no latencies
PROFILE = HardwareProfile("test", "test", flops_per_s=1e30, mem_bytes_per_s=1e6, link_bytes_per_s=1e6,
                          link_latency_us=0.0, launch_us=0.0, device_memory_bytes=1, sources=("test",))
HOST = HostProfile("host", "cpu", mem_bytes_per_s=3e6, flops_per_s=1e30, threads=1, launch_us=0.0, sources=("t",),
                   torch_bf16_bytes_per_s=1.5e6, expert_kernels=bf16_kernels(3e6, 1e30))
JOB = HostOp(flops=0.0, weight_bytes=6000.0, act_bytes=0.0)
FIDDLER_FILE = PROFILE_FILES_DIR / "fiddler-quadro-rtx6000.toml"


def test_the_kernel_rate_caps_the_dram_share_only_when_asked():
    costs = CostModel(PROFILE, GEO, HOST)
    assert costs.host_dram_share() == (3e6, 2e6)  # DRAM decides by default, the field unread
    assert costs.host_seconds(JOB, 1) == pytest.approx(0.002)
    costs.host_kernel_bytes_per_s = HOST.torch_bf16_bytes_per_s
    assert costs.host_dram_share() == (1.5e6, 1.5e6)
    assert costs.host_seconds(JOB, 1) == pytest.approx(0.004)
    costs.host_kernel_bytes_per_s = 2.5e6  # a kernel between the two shares: only the shared one is below it
    assert costs.host_dram_share() == (2.5e6, 2e6)


def test_the_modeled_clock_runs_a_host_job_at_the_kernels_rate_beside_a_copy():
    c = ModeledClock(PROFILE, GEO, HOST)
    c.costs.host_kernel_bytes_per_s = HOST.torch_bf16_bytes_per_s
    c.issue("a", 10_000, priority=0)  # the link copies for 10 ms: the DRAM share (2 MB/s) is above the kernel's rate
    job = c.run_on_host(lambda x: x, JOB, 1, torch.zeros(1))
    assert c.wait_host([job]) == pytest.approx(0.004)


def test_the_engine_prices_its_host_experts_at_the_host_profiles_torch_bf16_rate(host):
    from baselines.cpu_experts import CpuExperts
    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine.engine import Engine

    hw, cpu = host.profiles().get("quadro-rtx6000-24g-pcie3"), host.host_profiles().get("xeon-skylake-48c")
    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    estimates = {}
    for on in (False, True):
        engine.configure(CpuExperts(rule="fiddler", torch_bf16=on), engine.total_expert_bytes // 4,
                         ModeledClock(hw, engine.geometry, cpu))
        estimates[on] = engine.costs.host_expert_s(1)
        assert engine.clock.costs.host_kernel_bytes_per_s == (cpu.torch_bf16_bytes_per_s if on else None)
    op = engine.clock.costs.host_expert(1)
    assert estimates[True] - estimates[False] == pytest.approx(
        op.weight_bytes / cpu.torch_bf16_bytes_per_s - op.weight_bytes / cpu.mem_bytes_per_s, rel=1e-6)
    engine.configure(CpuExperts(), engine.total_expert_bytes // 4, ModeledClock(hw, engine.geometry, cpu))
    assert engine.clock.costs.host_kernel_bytes_per_s is None  # a new cell starts at DRAM's rate again
    engine.use_torch_bf16_host()  # what attach does for cpu-experts with torch_bf16=true
    assert engine.costs.host_expert_s(1) == pytest.approx(estimates[True])


def _row(tmp_path, name, sets):
    out = tmp_path / name
    assert main(["run", "--profile", "quadro-rtx6000-24g-pcie3", "--host-profile", "xeon-skylake-48c", "--model",
                 "tiny-random-mixtral", "--geometry", "mixtral", "--strategies", "cpu-experts", "--set",
                 "cpu-experts.rule=fiddler", *sets,
                 "--budgets", "25%", "--prompts", "1", "--tokens", "6", "--out", str(out), "--quiet"]) == 0
    (row,) = [json.loads(line) for line in next(out.rglob("rows.jsonl")).read_text().splitlines()]
    assert row["status"] == "ok" and row["lossless"] is True
    return row


def test_the_runner_runs_the_host_experts_losslessly_and_the_option_off_changes_nothing(tmp_path):
    default = _row(tmp_path, "default", [])
    off = _row(tmp_path, "off", ["--set", "cpu-experts.torch_bf16=false"])
    on = _row(tmp_path, "on", ["--set", "cpu-experts.torch_bf16=true"])
    for field in ("tpot_ms", "tpot_mean_ms", "ttft_ms", "h2d_bytes", "hits", "host_experts", "stall_ms_per_token"):
        assert off[field] == default[field], field
    assert on["host_experts"] > 0 and on["hits"] == default["hits"]
    assert on["stall_ms_per_token"] > default["stall_ms_per_token"] and on["tpot_ms"] > default["tpot_ms"]


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_a_host_profile_without_the_figure_refuses_the_option_in_one_line(tmp_path, capsys):
    code = main(["run", "--profile", "quadro-rtx6000-24g-pcie3", "--host-profile", "threadripper-7960x", "--model",
                 "tiny-random-mixtral", "--strategies", "cpu-experts", "--set", "cpu-experts.torch_bf16=true",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "torch_bf16_bytes_per_s" in line and "threadripper-7960x" in line
    bare = HostProfile("h", "cpu", 1e9, 1e9, 1, 0.0, ("s",))
    with pytest.raises(UsageError, match="has no torch_bf16_bytes_per_s"):
        bare.torch_bf16_rate()
    from baselines.cpu_experts import CpuExperts

    CpuExperts.check_host_profile(bare, {"torch_bf16": "false"})  # the option off reads nothing
    CpuExperts.check_host_profile(HOST, {"torch_bf16": True})
    with pytest.raises(UsageError, match="torch_bf16_bytes_per_s"):
        CpuExperts.check_host_profile(bare, {"torch_bf16": True})


@pytest.mark.parametrize("value", ["inf", "nan", "0.0", "-3.0e9", '"fast"'])
def test_a_bad_torch_bf16_figure_in_a_profile_file_is_one_line(tmp_path, capsys, value):
    path = tmp_path / "fiddler.toml"
    text = FIDDLER_FILE.read_text(encoding="utf-8").replace('"xeon-skylake-48c"', '"my-xeon"')
    text = text.replace('"quadro-rtx6000-24g-pcie3"', '"my-quadro"')
    path.write_text(text.replace("torch_bf16_bytes_per_s = 50.3e9", f"torch_bf16_bytes_per_s = {value}"))
    with pytest.raises(UsageError, match="torch_bf16_bytes_per_s must be a finite number > 0") as err:
        load_profile_file(path)
    assert "\n" not in str(err.value)
    code = main(["run", "--profile", str(path), "--model", "tiny-random-mixtral", "--strategies", "cpu-experts",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2 and "torch_bf16_bytes_per_s" in one_line(capsys.readouterr().err)


def test_a_bad_torch_bf16_option_value_is_one_line(tmp_path, capsys):
    code = main(["run", "--profile", "quadro-rtx6000-24g-pcie3", "--host-profile", "xeon-skylake-48c", "--model",
                 "tiny-random-mixtral", "--strategies", "cpu-experts", "--set", "cpu-experts.torch_bf16=maybe",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2 and "use true or false" in one_line(capsys.readouterr().err)


def test_the_shipped_torch_bf16_figure_is_below_dram_and_cited(host):
    cpu = host.host_profiles().get("xeon-skylake-48c")
    assert 0 < cpu.torch_bf16_bytes_per_s < cpu.mem_bytes_per_s
    assert any("torch_bf16_bytes_per_s" in s and "latency_cpu" in s for s in cpu.sources)
    # the figure is the source's arithmetic: one Mixtral expert's bf16 bytes in 7 ms
    assert cpu.torch_bf16_bytes_per_s == pytest.approx(geometry_preset("mixtral").expert_bytes / 7e-3, rel=0.01)
