import os
import subprocess
import sys
from pathlib import Path

import pytest

from specterbench import Strategy, hookimpl
from specterbench.errors import UsageError
from specterbench.plugins.host import DISABLE_ENV
from specterbench.plugins.registry import BLOCK_ENV
from specterbench.testing.pytest_plugin import install_dist

BIN = Path(sys.executable).parent


def make_dist(root: Path, dist: str, module: str, source: str, ep_name: str) -> Path:
    return install_dist(root, dist, module, source, ep_name, version="0.3")


LFU_PLUGIN = """
    from collections import Counter
    from specterbench import Strategy, hookimpl

    class LFU(Strategy):
        name = "thirdparty-lfu"
        version = "0.3"
        description = "least frequently used (third-party test plugin)"

        def on_request_start(self, request):
            self.freq = Counter()

        def before_layer(self, layer, experts, n):
            self.freq.update((layer, e) for e in experts)

        def choose_victim(self, candidates, needed):
            return min(candidates, key=lambda k: self.freq[k])

    @hookimpl
    def specterbench_register_strategies(register):
        register(LFU)
"""


@pytest.fixture
def thirdparty(tmp_path, monkeypatch):
    root = make_dist(tmp_path, "thirdparty-lfu", "thirdparty_lfu", LFU_PLUGIN, "lfu")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_builtins_come_through_the_real_entry_point_group(host):
    assert host.plugins["baselines"].source == "entry point"
    assert host.plugins["baselines"].distribution == "specterbench"
    assert set(host.strategies().names()) >= {"on-demand", "lru", "static", "resident", "oracle"}


def test_a_third_party_distribution_registers_through_its_entry_point(host, thirdparty):
    entry = host.strategies().entry("thirdparty-lfu")
    assert entry.plugin.distribution == "thirdparty-lfu" and entry.plugin.version == "0.3"


def test_third_party_strategy_shows_in_list_and_runs_from_the_command_line(thirdparty, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(thirdparty)}
    listing = subprocess.run([BIN / "specterbench", "list"], env=env, capture_output=True, text=True, check=True)
    assert "thirdparty-lfu" in listing.stdout and "thirdparty-lfu 0.3" in listing.stdout
    run = subprocess.run([BIN / "specterbench", "run", "--strategies", "thirdparty-lfu", "--prompts", "2",
                          "--tokens", "4", "--out", str(tmp_path / "out"), "--run-id", "x", "--quiet"],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "thirdparty-lfu" in run.stdout and "✓" in run.stdout


def test_disabling_autoload_keeps_builtins_and_drops_third_party(host, thirdparty, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert "thirdparty-lfu" not in host.strategies().names()
    assert "lru" in host.strategies().names()
    assert host.plugins["baselines"].source == "default"


def test_blocked_plugins_are_not_loaded(host, thirdparty, monkeypatch):
    monkeypatch.setenv(BLOCK_ENV, ",".join(filter(None, [os.environ.get(BLOCK_ENV), "lfu,baselines,specter"])))
    assert host.strategies().names() == []
    assert "lfu" not in host.plugins


def test_a_plugin_import_error_is_reported_with_its_name_and_left_out(host, tmp_path, monkeypatch, capsys):
    root = make_dist(tmp_path, "broken-plugin", "broken_plugin", "import does_not_exist\n", "broken")
    monkeypatch.syspath_prepend(str(root))
    assert "lru" in host.strategies().names()  # the other plugins still load
    err = capsys.readouterr().err
    assert "plugin 'broken'" in err and "does_not_exist" in err and f"{BLOCK_ENV}=broken" in err
    assert "does_not_exist" in host.failed["broken"].error
    with pytest.raises(UsageError, match="'broken' failed to load"):
        host.strategies().get("nosuch")


def test_a_misspelled_hook_fails_loudly(host):
    class Typo:
        @hookimpl
        def specterbench_register_strategy(self, register):  # missing 's'
            pass

    with pytest.raises(Exception, match="specterbench_register_strategy"):
        host.register(Typo(), "typo")


def test_unknown_names_suggest_the_closest(host):
    with pytest.raises(UsageError, match="did you mean 'lru'"):
        host.strategies().get("lur")
    with pytest.raises(UsageError, match="did you mean 'a100-40g-pcie4'"):
        host.profiles().get("a100-40g")


def test_register_then_unregister_restores_the_registry(host):
    class Extra(Strategy):
        name = "extra"
        version = "1"

    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Extra)

    host.register(P(), "extra-plugin")
    assert "extra" in host.strategies().names()
    host.unregister("extra-plugin")
    assert "extra" not in host.strategies().names()


def test_environment_merges_plugin_contributions(host):
    class P:
        @hookimpl
        def specterbench_environment(self):
            return {"my_gpu_counter": "fake"}

    host.register(P(), "env-plugin")
    env = host.environment()
    assert env["my_gpu_counter"] == "fake" and env["packages"]["pluggy"]
