"""The host's routed-expert kernel rates (``expert_kernels``, by instruction set and precision): every shipped host
profile states them with a source, bf16 at its existing host expert figures; a host expert is priced at the rate of
its stored precision; a missing or non-positive rate, or a user host profile reusing a built-in name, is one line."""

from __future__ import annotations

import dataclasses

import pytest
from cli_errors import one_line  # noqa: E402
from support import bf16_kernels

from specterbench.bench.calibrate import calibrate, host_isa
from specterbench.cli import main
from specterbench.engine.costs import CostModel
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.host_kernels import kernel_precision, precision_of_bits
from specterbench.engine.precision import Precision, priced_geometry
from specterbench.engine.profiles import (
    HostProfile,
    default_profile,
    load_profile_file,
    packaged_profiles,
    write_profile_file,
)
from specterbench.errors import UsageError

GEO = geometry_preset("mixtral")


def _host(**kernels) -> HostProfile:
    return HostProfile("h", "cpu", mem_bytes_per_s=100e9, flops_per_s=1e12, threads=8, launch_us=1.0,
                       sources=("t",), expert_kernels={"avx512": kernels})


def _rate(flops, nbytes):
    return {"flops_per_s": flops, "bytes_per_s": nbytes, "source": "test"}


def test_every_shipped_host_states_its_kernels_with_bf16_at_its_existing_figures():
    hosts = packaged_profiles()[1]
    assert len(hosts) >= 5
    for h in hosts:
        for isa, table in h.expert_kernels.items():
            for precision, rate in table.items():
                assert rate["source"].strip() and rate["bytes_per_s"] <= h.mem_bytes_per_s, (h.name, isa, precision)
        if h.name != "epyc-9355":  # its row's AVX2 backend states bf16 only
            assert {"int8", "int4"} <= set(h.expert_kernels[h.kernel_rate("bf16").isa])
        bf16 = h.kernel_rate("bf16")
        assert (bf16.flops_per_s, bf16.bytes_per_s) == (h.flops_per_s, h.mem_bytes_per_s), h.name


def test_precisions_map_to_kernels():
    assert [precision_of_bits(b) for b in (16, 8, 4, 3, 2)] == ["bf16", "int8", "int4", "int4", "int4"]
    for bits in (16, 8, 4, 2):
        geo = priced_geometry(GEO, Precision(expert_bits=bits))
        assert kernel_precision(geo.expert_bits_per_weight) == precision_of_bits(bits)


def test_a_host_expert_is_priced_at_its_precisions_kernel():
    host = _host(bf16=_rate(1e12, 100e9), int4=_rate(4e12, 25e9))
    g4 = priced_geometry(GEO, Precision(expert_bits=4))
    m16, m4 = CostModel(default_profile(), GEO, host), CostModel(default_profile(), g4, host)
    # a prefill block is bound by the kernel's FLOP/s: the int4 kernel's four times the bf16 one's
    big16, big4 = m16.host_expert(4096), m4.host_expert(4096)
    assert big16.flops == big4.flops
    assert m16.host_compute_seconds(big16, 8) == pytest.approx(big16.flops / 1e12)
    assert m4.host_compute_seconds(big4, 8) == pytest.approx(big4.flops / 4e12)
    # one decode token is bound by weight bytes: the int4 kernel streams at its 25 GB/s, below DRAM's 100
    assert m4.host_dram_share() == (25e9, 25e9)
    one = m4.host_expert(1)
    assert m4.host_seconds(one, 8) == pytest.approx(1e-6 + one.weight_bytes / 25e9)  # launch_us + bytes
    assert m16.host_dram_share()[0] == 100e9


def test_a_missing_rate_names_the_key_and_the_fix():
    host = _host(bf16=_rate(1e12, 100e9))
    m = CostModel(default_profile(), priced_geometry(GEO, Precision(expert_bits=8)), host)
    with pytest.raises(UsageError, match=r"'h' states no expert_kernels\.avx512\.int8 .*add it to the host profile"):
        m.host_expert_seconds(1, 8)


@pytest.mark.parametrize("edit, message", [
    ({"bytes_per_s": 0.0}, r"expert_kernels\.avx512\.int4\.bytes_per_s must be a finite number > 0"),
    ({"flops_per_s": -1.0}, r"expert_kernels\.avx512\.int4\.flops_per_s must be a finite number > 0"),
    ({"source": ""}, r"expert_kernels\.avx512\.int4\.source must say where"),
])
def test_a_bad_rate_in_a_file_is_one_line(tmp_path, edit, message):
    host = _host(bf16=_rate(1e12, 100e9))
    path = write_profile_file(tmp_path / "p.toml", default_profile(), host)
    text = path.read_text().replace("expert_kernels = {avx512 = {bf16 = ",
                                    "expert_kernels = {avx512 = {int4 = " + _inline({**_rate(1e12, 1e9), **edit})
                                    + ", bf16 = ")
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        load_profile_file(path)
    assert "\n" not in str(err.value)


def _inline(d: dict) -> str:
    return "{" + ", ".join(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}" for k, v in d.items()) + "}"


def test_an_unknown_isa_or_precision_is_one_line():
    with pytest.raises(UsageError, match="expert_kernels.sse4 names no instruction set"):
        HostProfile("h", "c", 1e9, 1e9, 1, 0.0, ("s",), expert_kernels={"sse4": {}})
    with pytest.raises(UsageError, match="expert_kernels.avx2.fp8 names no precision"):
        HostProfile("h", "c", 1e9, 1e9, 1, 0.0, ("s",), expert_kernels={"avx2": {"fp8": _rate(1, 1)}})
    with pytest.raises(UsageError, match="isa 'amx' has no expert_kernels.amx table"):
        HostProfile("h", "c", 1e9, 1e9, 1, 0.0, ("s",), isa="amx", expert_kernels=bf16_kernels(1e9, 1e9))


def _user_host_file(tmp_path, host: HostProfile):
    profile = dataclasses.replace(default_profile(), name="user-card")
    return write_profile_file(tmp_path / "user.toml", profile, host)


def test_a_run_whose_host_lacks_the_precision_is_refused_before_it_starts(tmp_path, capsys):
    path = _user_host_file(tmp_path, dataclasses.replace(_host(bf16=_rate(1e12, 100e9)), name="user-host"))
    out = tmp_path / "o"
    code = main(["run", "--profile", str(path), "--host-profile", "user-host", "--model", "tiny-random-mixtral",
                 "--strategies", "cpu-experts", "--expert-bits", "4", "--prompts", "1", "--tokens", "2",
                 "--out", str(out), "--quiet"])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "'user-host' states no expert_kernels.avx512.int4" in line and "--host-profile" in line
    assert not any(out.rglob("*"))  # no run folder


def test_a_user_host_profile_reusing_a_built_in_name_is_refused(tmp_path, capsys):
    path = _user_host_file(tmp_path, dataclasses.replace(_host(bf16=_rate(1e12, 100e9)), name="desktop-ddr5"))
    code = main(["run", "--profile", str(path), "--model", "tiny-random-mixtral", "--strategies", "cpu-experts",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "host profile name 'desktop-ddr5' is already taken" in line and "rename" in line


def test_calibrate_writes_the_bf16_rates_it_measures(tmp_path):
    cal = calibrate("cpu", quick=True, hidden=256, inter=512)
    h = cal.host
    if h.isa is None:
        pytest.skip("this CPU names no amx / avx512 / avx2 flag")
    rate = h.kernel_rate("bf16")
    assert (rate.flops_per_s, rate.bytes_per_s) == (h.flops_per_s, h.mem_bytes_per_s) and "measured" in rate.source
    _, back = load_profile_file(cal.write(tmp_path / "c.toml"))
    assert back.kernel_rate("bf16") == rate
    with pytest.raises(UsageError, match=f"expert_kernels.{h.isa}.int4"):
        back.kernel_rate("int4")


def test_the_isa_is_read_from_the_cpu_flags():
    assert host_isa("flags\t: fpu avx2 avx512f amx_bf16 amx_tile\n") == "amx"
    assert host_isa("flags\t: fpu avx2 avx512f\n") == "avx512"
    assert host_isa("flags\t: fpu avx2\n") == "avx2"
    assert host_isa("Features\t: fp asimd\n") is None
