"""The package layout shows the architecture, and code written against the flat layout keeps importing."""

import importlib

import pytest

import specterbench


@pytest.mark.parametrize("old, new", sorted(specterbench.MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_moved_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert importlib.import_module(new).__spec__.name == new


def test_pre_layout_names_of_the_engine_and_plugin_host_still_resolve():
    from specterbench.engine import Engine
    from specterbench.engine.engine import Engine as Moved
    from specterbench.plugins import get_host
    from specterbench.plugins.host import get_host as moved_host

    assert Engine is Moved and get_host is moved_host


@pytest.mark.parametrize("package", ["engine", "bench", "analysis", "quality", "plugins", "embedded"])
def test_every_part_of_the_system_is_a_documented_subpackage(package):
    module = importlib.import_module(f"specterbench.{package}")
    assert module.__doc__ and len(module.__doc__.split()) >= 8
