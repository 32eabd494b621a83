"""``specterbench calibrate``: measures this machine, writes a profile file that ``--profile PATH`` accepts."""

import pytest
import torch

from specterbench.bench import calibrate as cal
from specterbench.engine import profiles
from specterbench.engine.profiles import HardwareProfile
from specterbench.errors import UsageError


@pytest.fixture(scope="module")
def measured():
    return cal.calibrate("cpu", quick=True, threads=1, hidden=256, inter=512)


@pytest.fixture
def profile_file(measured, tmp_path):
    return measured.write(tmp_path / "host.toml")


def test_the_link_fit_recovers_latency_and_bandwidth():
    sizes = [2**k for k in range(16, 27, 2)]
    latency, bandwidth = cal.fit_link(sizes, [10e-6 + n / 20e9 for n in sizes])
    assert latency == pytest.approx(10e-6, rel=1e-6)
    assert bandwidth == pytest.approx(20e9, rel=1e-6)


def test_calibrating_the_host_gives_positive_figures_and_keeps_the_curve(measured):
    p, h, m = measured.profile, measured.host, measured.measured
    assert p.link_bytes_per_s > 0 and p.flops_per_s > 0 and p.mem_bytes_per_s > 0 and p.launch_us > 0
    assert h.mem_bytes_per_s > 0 and h.threads == 1
    assert len(m["copy_bytes"]) == len(m["copy_seconds"]) == len(cal.QUICK_COPY_SIZES)
    assert "no device on this machine" in " ".join(p.sources)


def test_the_file_reads_back_as_the_same_profiles(measured, profile_file):
    profile, host = profiles.load_profile_file(profile_file)
    assert profile == measured.profile and host == measured.host


def test_a_profile_file_is_accepted_wherever_a_profile_name_is(profile_file, tmp_path, small_prompts):
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner
    from specterbench.plugins.host import get_host, reset_host

    reset_host()
    host = get_host()
    try:
        name, host_name = host.register_profile_file(profile_file)
        assert host.register_profile_file(profile_file) == (name, host_name)  # twice is harmless
        config = BenchConfig(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("50%"),),
                             profile=name, host_profile=host_name, prompts=1, tokens=3, warmup=False)
        (row,) = Runner(host, config, tmp_path / "run").run()
        assert row.status == "ok", row.error
        assert row.profile == name and row.tpot_ms > 0
    finally:
        reset_host()


def test_profile_paths_are_told_from_names():
    assert profiles.is_profile_path("results/profile.toml") and profiles.is_profile_path("my.json")
    assert not profiles.is_profile_path("a100-40g-pcie4")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("[profile]", "[profil]"), "no \\[profile\\] table"),
    (lambda t: t.replace("[profile]\n", "[profile\n"), "malformed"),
    (lambda t: "\n".join(l for l in t.splitlines() if not l.startswith("link_bytes_per_s = ") or "measured" in l),
     "missing field"),
    (lambda t: t.replace("launch_us = ", "launch_us = -", 1), "launch_us must be > 0"),
    (lambda t: t.replace("flops_per_s = ", 'flops_per_s = "fast" #', 1), "flops_per_s must be a number"),
])
def test_a_bad_profile_file_is_one_line(profile_file, edit, message):
    profile_file.write_text(edit(profile_file.read_text()))
    with pytest.raises(UsageError, match=message) as err:
        profiles.load_profile_file(profile_file)
    assert "\n" not in str(err.value)


def test_a_missing_profile_file_says_how_to_write_one(tmp_path):
    with pytest.raises(UsageError, match="no such file; write one with `specterbench calibrate --out"):
        profiles.load_profile_file(tmp_path / "none.toml")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_a_cuda_device_on_a_machine_without_one_is_one_line(device):
    with pytest.raises(UsageError, match="no CUDA device; use --device cpu"):
        cal.check_device(device)


def test_an_unknown_device_is_one_line():
    with pytest.raises(UsageError, match="not a device"):
        cal.check_device("gpu0")


def test_the_command_prints_the_curve_and_writes_the_file(tmp_path, capsys, monkeypatch):
    from specterbench.cli import main

    monkeypatch.setattr(cal, "COPY_SIZES", cal.QUICK_COPY_SIZES)
    assert main(["calibrate", "--device", "cpu", "--quick", "--threads", "1", "--out", str(tmp_path / "p.toml")]) == 0
    out = capsys.readouterr().out
    assert "GB/s" in out and "launch:" in out and "host experts:" in out
    assert isinstance(profiles.load_profile_file(tmp_path / "p.toml")[0], HardwareProfile)


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--device", "cuda:7"], "--device cuda:7"),
    (["validate", "--profile", "nowhere.toml", "--device", "cpu"], "no such file"),
    (["run", "--profile", "nowhere.toml", "--model", "tiny-random-mixtral"], "no such file"),
])
def test_the_command_line_answers_bad_devices_and_profile_files_in_one_line(argv, message, capsys, tmp_path,
                                                                            monkeypatch):
    from specterbench.cli import main

    if argv[0] == "calibrate" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_malformed_shape_is_one_line(capsys):
    from specterbench.cli import main

    assert main(["calibrate", "--device", "cpu", "--shape", "4096x14336"]) == 2
    assert "write HIDDEN,INTER" in capsys.readouterr().err


def test_a_second_file_with_the_same_name_and_other_figures_is_refused(measured, tmp_path):
    import dataclasses

    from specterbench.plugins.host import get_host, reset_host

    first = measured.write(tmp_path / "a.toml")
    other = dataclasses.replace(measured, profile=dataclasses.replace(measured.profile, launch_us=123.0))
    second = other.write(tmp_path / "b.toml")
    reset_host()
    try:
        host = get_host()
        host.register_profile_file(first)
        with pytest.raises(UsageError, match="already taken"):
            host.register_profile_file(second)
        with pytest.raises(UsageError, match="already taken"):  # a built-in name cannot be shadowed either
            builtin = dataclasses.replace(measured, profile=dataclasses.replace(measured.profile,
                                                                                 name="a100-40g-pcie4"))
            host.register_profile_file(builtin.write(tmp_path / "c.toml"))
    finally:
        reset_host()
