"""``specterbench plugins``, the plugin environment variables, and the hooks a plugin hears during a run."""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from specterbench import hookimpl
from specterbench.catalog.models import ModelSpec
from specterbench.catalog.tiny import tiny_random
from specterbench.cli import build_parser, main
from specterbench.cli.listing import add_parser
from specterbench.engine.profiles import default_profile
from specterbench.plugins.host import DISABLE_ENV
from specterbench.plugins.listing import blocked_plugins
from specterbench.plugins.registry import BLOCK_ENV
from specterbench.runfiles.results import read_rows

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = """
    from specterbench import Strategy, hookimpl

    class Fifo(Strategy):
        name = "plugins-cli-fifo"
        version = "2"

    @hookimpl
    def specterbench_register_strategies(register):
        register(Fifo)

    @hookimpl
    def specterbench_environment():
        return {"plugins_cli_probe": True}
"""


@pytest.fixture
def thirdparty(tmp_path, monkeypatch):
    """An installed distribution ``plugins-cli-probe`` 0.7 with the entry point ``probe``."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "plugins_cli_probe.py").write_text(textwrap.dedent(THIRD_PARTY))
    info = root / "plugins_cli_probe-0.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugins-cli-probe\nVersion: 0.7\n")
    (info / "entry_points.txt").write_text("[specterbench]\nprobe = plugins_cli_probe\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def plugins(capsys, *args):
    parser = argparse.ArgumentParser(prog="specterbench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["plugins", *args])
    assert ns.func(ns) == 0
    out = capsys.readouterr().out
    return json.loads(out) if "--json" in args else out


def by_name(items):
    return {p["name"]: p for p in items}


# ---- specterbench plugins ----------------------------------------------------------------------------

def test_lists_each_plugin_with_distribution_version_source_and_hooks(host, capsys):
    data = by_name(plugins(capsys, "--json")["plugins"])
    baselines = data["baselines"]
    assert (baselines["distribution"], baselines["source"], baselines["module"]) == (
        "specterbench", "entry point", "specterbench.baselines")
    assert baselines["hooks"] == ["specterbench_register_strategies"]
    assert "lru" in baselines["registers"]["strategies"]
    assert {"specterbench_environment", "specterbench_register_models",
            "specterbench_register_profiles"} <= set(data["builtin"]["hooks"])
    assert "tiny-random-mixtral" in data["builtin"]["registers"]["models"]


def test_a_third_party_plugin_shows_its_own_distribution_and_hooks(host, thirdparty, capsys):
    probe = by_name(plugins(capsys, "--json")["plugins"])["probe"]
    assert (probe["distribution"], probe["version"], probe["source"]) == ("plugins-cli-probe", "0.7", "entry point")
    assert probe["hooks"] == ["specterbench_environment", "specterbench_register_strategies"]
    assert probe["registers"] == {"strategies": ["plugins-cli-fifo"]}


def test_text_output_names_distribution_source_and_hooks(host, thirdparty, capsys):
    out = plugins(capsys)
    assert f"entry-point autoload on; blocked: {', '.join(blocked_plugins()) or 'none'}" in out
    assert "probe" in out and "plugins-cli-probe 0.7  [entry point: plugins_cli_probe]" in out
    assert "hooks: specterbench_environment, specterbench_register_strategies" in out


def test_disabling_autoload_is_reported_and_loads_only_the_builtins(host, thirdparty, monkeypatch, capsys):
    monkeypatch.setenv(DISABLE_ENV, "1")
    data = plugins(capsys, "--json")
    assert data["autoload"] is False
    loaded = by_name(data["plugins"])
    assert "probe" not in loaded and loaded["baselines"]["source"] == "default"
    assert by_name(data["not_loaded"])["probe"]["reason"] == f"entry points not loaded: {DISABLE_ENV} is set"


def test_blocked_plugins_are_listed_as_not_loaded_with_the_reason(host, thirdparty, monkeypatch, capsys):
    monkeypatch.setenv(BLOCK_ENV, "probe, specter")
    data = plugins(capsys, "--json")
    assert data["blocked"] == ["probe", "specter"]
    assert "probe" not in by_name(data["plugins"]) and "plugins-cli-fifo" not in host.strategies().names()
    assert by_name(data["not_loaded"])["probe"]["reason"] == f"blocked by {BLOCK_ENV}"


def test_the_environment_variables_work_in_a_fresh_process(thirdparty):
    env = {**os.environ, "PYTHONPATH": str(thirdparty)}
    listing = [sys.executable, "-m", "specterbench", "list", "--json"]

    def strategies(**extra):
        proc = subprocess.run(listing, env={**env, **extra}, capture_output=True, text=True, check=True)
        return {s["name"] for s in json.loads(proc.stdout)["strategies"]}

    everything = strategies()
    assert "plugins-cli-fifo" in everything
    blocked = ",".join(filter(None, [os.environ.get(BLOCK_ENV), "probe"]))  # the suite's own blocks kept
    assert strategies(**{BLOCK_ENV: blocked}) == everything - {"plugins-cli-fifo"}
    assert "plugins-cli-fifo" not in strategies(**{DISABLE_ENV: "1"})


def cli_has_plugins() -> bool:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["plugins"])
    except SystemExit:
        return False
    return True


@pytest.mark.skipif(not cli_has_plugins(), reason="specterbench.cli does not register the `plugins` subcommand yet")
def test_plugins_is_a_subcommand_of_the_cli(host, capsys):
    assert main(["plugins", "--json"]) == 0
    assert "baselines" in by_name(json.loads(capsys.readouterr().out)["plugins"])


# ---- hooks a plugin hears ----------------------------------------------------------------------------

class Recorder:
    """Registers a model and profiles under new names and records every lifecycle hook call, in order."""

    def __init__(self):
        self.calls = []

    @hookimpl
    def specterbench_register_models(self, register):
        register(ModelSpec(name="recorded-tiny", family="mixtral", description="tiny mixtral under another name",
                           load=lambda: tiny_random("mixtral", seed=3)))

    @hookimpl
    def specterbench_register_profiles(self, register):
        register(dataclasses.replace(default_profile(), name="recorded-profile", link_bytes_per_s=1e9))

    @hookimpl
    def specterbench_register_host_profiles(self, register):
        from specterbench.engine.profiles import HostProfile

        register(HostProfile(name="recorded-host", cpu="test CPU", mem_bytes_per_s=50e9, flops_per_s=1e12,
                             threads=8, launch_us=5.0, sources=("made up for a test",),
                             expert_kernels={"avx2": {"bf16": {"flops_per_s": 1e12, "bytes_per_s": 50e9,
                                                               "source": "made up for a test"}}}))

    @hookimpl
    def specterbench_environment(self):
        return {"recorder": "on"}

    @hookimpl
    def specterbench_run_start(self, run_dir, config):
        self.calls.append(("run_start", Path(run_dir)))

    @hookimpl
    def specterbench_cell_start(self, cell, engine):
        self.calls.append(("cell_start", cell, engine.device.type))

    @hookimpl
    def specterbench_cell_end(self, cell, row):
        row.nvml_note = "set by cell_end"  # the row is still mutable here and is written afterwards
        self.calls.append(("cell_end", cell, row.status))

    @hookimpl
    def specterbench_row_written(self, row):
        self.calls.append(("row_written", row.cell))

    @hookimpl
    def specterbench_run_end(self, run_dir, rows):
        self.calls.append(("run_end", Path(run_dir), [r.cell for r in rows]))


@pytest.fixture
def recorded_run(host, small_prompts, tmp_path, capsys):
    recorder = Recorder()
    host.register(recorder, "recorder")
    code = main(["run", "--model", "recorded-tiny", "--profile", "recorded-profile", "--strategies", "lru,on-demand",
                 "--budgets", "50%", "--prompts", "1", "--tokens", "3", "--out", str(tmp_path), "--run-id", "r",
                 "--quiet"])
    capsys.readouterr()
    assert code == 0
    return recorder, tmp_path / "r", read_rows(tmp_path / "r" / "rows.jsonl")


def test_registered_model_and_profile_resolve_by_name_in_a_run(recorded_run, host):
    _, _, rows = recorded_run
    assert {(r.model, r.profile) for r in rows} == {("recorded-tiny", "recorded-profile")}
    assert host.models().entry("recorded-tiny").plugin.name == "recorder"
    assert host.profiles().entry("recorded-profile").plugin.name == "recorder"


def test_registered_host_profile_is_attributed_to_its_plugin(host):
    host.register(Recorder(), "recorder")
    assert host.host_profiles().entry("recorded-host").plugin.name == "recorder"


def test_run_start_comes_first_and_run_end_last_with_the_rows(recorded_run):
    recorder, run_dir, rows = recorded_run
    assert recorder.calls[0] == ("run_start", run_dir)
    assert recorder.calls[-1] == ("run_end", run_dir, [r.cell for r in rows])


def test_each_cell_is_bracketed_by_cell_start_and_cell_end_then_its_row_is_written(recorded_run):
    recorder, _, rows = recorded_run
    per_cell = [c for c in recorder.calls if c[0] not in ("run_start", "run_end")]
    expected = []
    for row in rows:
        expected += [("cell_start", row.cell, "cpu"), ("cell_end", row.cell, "ok"), ("row_written", row.cell)]
    assert per_cell == expected


def test_cell_end_can_fill_the_row_before_it_is_written(recorded_run):
    _, _, rows = recorded_run
    assert [r.nvml_note for r in rows] == ["set by cell_end"] * len(rows)


def test_environment_contributions_land_in_every_row(recorded_run):
    _, _, rows = recorded_run
    assert all(r.env["recorder"] == "on" and r.env["packages"]["torch"] for r in rows)


# ---- the example package, installed like a third party's -----------------------------------------------

@pytest.mark.slow  # fresh interpreters import torch: past the slow marker's 30 s on two busy cores
def test_installing_the_example_package_in_a_fresh_venv_makes_lfu_appear_and_run(tmp_path):
    """A new virtual environment sees this one's dependencies (symlinked, minus any installed specterbench-lfu);
    ``pip install`` of a copy of plugins/lfu, offline, is all it takes for ``lfu`` to be listed and to run."""
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "specterbench_lfu" not in entry.name:
            (deps / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    source = shutil.copytree(ROOT / "plugins" / "lfu", tmp_path / "lfu",
                             ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", DISABLE_ENV, BLOCK_ENV)}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def specterbench(*args):
        return subprocess.run([python, "-m", "specterbench", *args], env=env, capture_output=True, text=True)

    def strategies():
        listing = specterbench("list", "--json")
        assert listing.returncode == 0, listing.stderr
        return {s["name"]: s["distribution"] for s in json.loads(listing.stdout)["strategies"]}

    entry_points = [python, "-c", "import importlib.metadata as m; "
                                  "print(sorted(e.name for e in m.entry_points(group='specterbench')))"]
    before = subprocess.run(entry_points, env=env, capture_output=True, text=True, check=True).stdout
    assert "'specter'" in before and "'lfu'" not in before  # the dependencies are there, the plugin is not
    pip = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                          str(source)], env=env, capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert strategies()["lfu"] == "specterbench-lfu 0.1.0"
    run = specterbench("run", "--strategies", "lfu", "--budgets", "35%", "--prompts", "1", "--tokens", "4",
                       "--out", str(tmp_path / "results"), "--run-id", "fresh", "--quiet")
    assert run.returncode == 0, run.stderr
    (row,) = read_rows(tmp_path / "results" / "fresh" / "rows.jsonl")
    assert row.strategy == "lfu" and row.lossless and row.strategy_plugin.startswith("lfu (specterbench-lfu 0.1.0)")
