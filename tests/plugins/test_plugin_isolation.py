"""One broken plugin never stops the others: whatever a plugin registers wrongly is left out with one warning line per
problem (naming the plugin, the class, the fix and how to block the plugin); everything else still loads, `list` and
`plugins` work, runs of other strategies work, and asking for the refused strategy fails in one line saying why."""

from __future__ import annotations

import json

import pytest

from specterbench import Strategy, hookimpl
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.cli import main
from specterbench.errors import UsageError
from specterbench.plugins.registry import BLOCK_ENV
from specterbench.runfiles.results import read_rows
from specterbench.testing.pytest_plugin import install_dist

FAST = ["--model", "tiny-random-mixtral", "--budgets", "50%", "--prompts", "1", "--tokens", "2", "--quiet"]


class Broken(Strategy):
    """Three problems at once: no version, a misspelled decision point, a decision point the engine cannot call."""

    name = "broken"
    version = None

    def choose_victm(self, candidates, needed):
        return candidates[0]

    def before_layer(self, layer):
        pass


class TakesLru(Strategy):
    name = "lru"  # a built-in's name
    version = "1"


class Fine(Strategy):
    name = "fine"
    version = "1"


class Plugin:
    @hookimpl
    def specterbench_register_strategies(self, register):
        register(Broken)
        register(TakesLru)
        register(Fine)


@pytest.fixture
def broken(host):
    host.register(Plugin(), "broken-plugin")
    return host


def warnings_of(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("specterbench: warning:")]


def test_every_problem_of_a_refused_class_is_one_warning_line_naming_plugin_class_fix_and_block(broken, capsys):
    broken.strategies()
    lines = [line for line in warnings_of(capsys.readouterr().err) if "Broken" in line]
    assert len(lines) == 3, lines
    assert any("Broken.version = None" in line and "set version = '1'" in line for line in lines)
    assert any("Broken.choose_victm" in line and "did you mean choose_victim" in line for line in lines)
    assert any("Broken.before_layer(self, layer)" in line and "the engine calls before_layer" in line
               for line in lines)
    assert all("plugin 'broken-plugin'" in line and f"{BLOCK_ENV}=broken-plugin" in line for line in lines)


def test_a_refused_class_leaves_the_rest_of_its_plugin_and_every_other_plugin_registered(broken):
    names = broken.strategies().names()
    assert "fine" in names and "broken" not in names and "specter" in names


def test_a_name_two_plugins_register_runs_neither_until_the_user_picks_one(broken, capsys):
    registry = broken.strategies()
    (line,) = [line for line in warnings_of(capsys.readouterr().err) if "'lru' is registered by" in line]
    assert "plugin 'baselines' (specterbench " in line and "plugin 'broken-plugin' (" in line
    assert "'baselines:lru' or 'broken-plugin:lru'" in line and BLOCK_ENV in line
    with pytest.raises(UsageError) as info:
        registry.entry("lru")
    message = str(info.value)
    assert "\n" not in message and "plugin 'baselines'" in message and "plugin 'broken-plugin'" in message
    assert "pick one: 'baselines:lru' or 'broken-plugin:lru'" in message
    assert registry.get("baselines:lru").__name__ == "LRU"
    assert registry.get("broken-plugin:lru") is TakesLru
    assert registry.get("specterbench:lru").__name__ == "LRU"  # the distribution's name picks it too
    assert "lru" not in registry.names() and {"baselines:lru", "broken-plugin:lru"} <= set(registry.names())
    with pytest.raises(UsageError, match=r"plugin 'nobody' does not register strategy 'lru'; registered by"):
        registry.entry("nobody:lru")


def test_a_picked_strategy_runs_under_its_qualified_name_and_the_row_names_its_plugin(broken, small_prompts,
                                                                                     tmp_path):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("baselines:lru",), budgets=(parse_budget("50%"),),
                         profile="a100-40g-pcie4", tokens=3, prompts=1)
    Runner(broken, config, tmp_path / "run").run()
    (row,) = read_rows(tmp_path / "run")
    assert row.strategy == "baselines:lru" and row.strategy_plugin.startswith("baselines (specterbench ")


def test_a_third_party_claiming_a_built_in_name_blocks_both_even_when_it_loads_first(host, tmp_path, monkeypatch,
                                                                                    capsys):
    source = """
        from specterbench import Strategy, hookimpl

        class MyLru(Strategy):
            name = "lru"
            version = "1"

        @hookimpl
        def specterbench_register_strategies(register):
            register(MyLru)
    """
    monkeypatch.syspath_prepend(str(install_dist(tmp_path, "my-lru", "my_lru", source, "mylru")))
    host.__init__()  # load again, with the new distribution's entry point
    with pytest.raises(UsageError, match=r"'lru' is registered by plugin 'baselines' .* and plugin 'mylru' \(my-lru"):
        host.strategies().entry("lru")
    assert host.strategies().get("mylru:lru").__name__ == "MyLru"
    assert host.strategies().get("my-lru:lru").__name__ == "MyLru"


def test_one_plugin_registering_a_name_twice_is_refused(host, capsys):
    class Twice:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Fine)
            register(Fine)

    host.register(Twice(), "twice")
    assert host.strategies().get("fine") is Fine
    assert any("registers strategy 'fine' a second time" in line for line in warnings_of(capsys.readouterr().err))


def test_asking_for_the_refused_strategy_is_one_error_saying_why(broken):
    with pytest.raises(UsageError) as info:
        broken.strategies().entry("broken")
    message = str(info.value)
    assert "\n" not in message
    assert "strategy 'broken' (Broken, plugin 'broken-plugin') was refused at registration" in message


def test_list_works_beside_a_refused_plugin(broken, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fine" in out and "lru" in out


def test_plugins_shows_what_was_refused_and_why(broken, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "refused at registration" in out and "strategy broken  [broken-plugin: Broken]" in out
    assert "Broken.choose_victm is not a decision point" in out
    assert main(["plugins", "--json"]) == 0
    refused = json.loads(capsys.readouterr().out)["refused"]
    assert {(r["name"], r["class"]) for r in refused} == {("broken", "Broken")}
    assert main(["plugins"]) == 0
    assert "strategy lru: baselines (specterbench " in capsys.readouterr().out
    assert all(r["plugin"] == "broken-plugin" for r in refused)


def test_a_run_of_another_strategy_works_beside_a_refused_plugin(broken, tmp_path, capsys):
    assert main(["run", *FAST, "--strategies", "on-demand,fine", "--out", str(tmp_path), "--run-id", "r"]) == 0, \
        capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert {r["strategy"] for r in rows} == {"on-demand", "fine"} and all(r["status"] == "ok" for r in rows)


def test_running_the_refused_strategy_fails_in_one_error_line_and_leaves_no_run_folder(broken, tmp_path, capsys):
    assert main(["run", *FAST, "--strategies", "broken", "--out", str(tmp_path), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("specterbench: error:")]
    assert len(errors) == 1 and "was refused at registration" in errors[0]
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_a_registration_hook_that_raises_keeps_the_other_plugins(host, capsys):
    class Raises:
        @hookimpl
        def specterbench_register_strategies(self, register):
            raise RuntimeError("boom")

    host.register(Raises(), "raising-plugin")
    assert "lru" in host.strategies().names()
    (line,) = [line for line in warnings_of(capsys.readouterr().err) if "raising-plugin" in line]
    assert "specterbench_register_strategies raised RuntimeError: boom" in line


def test_every_unknown_hook_of_a_plugin_is_its_own_warning_line(host, tmp_path, monkeypatch, capsys):
    source = """
        from specterbench import hookimpl

        @hookimpl
        def specterbench_register_strategy(register):
            pass

        @hookimpl
        def specterbench_row_writen(row):
            pass
    """
    monkeypatch.syspath_prepend(str(install_dist(tmp_path, "typos", "typos", source, "typos")))
    host.__init__()
    assert "lru" in host.strategies().names()
    lines = [line for line in warnings_of(capsys.readouterr().err) if "plugin 'typos'" in line]
    assert len(lines) == 2 and all(f"{BLOCK_ENV}=typos" in line for line in lines)
