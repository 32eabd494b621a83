"""The package layout shows the architecture: every part of the system is a documented subpackage."""

import importlib

import pytest

PARTS = ["engine", "catalog", "plugins", "runfiles", "bench", "analysis", "quality", "studies", "testing", "cli"]


@pytest.mark.parametrize("package", PARTS)
def test_every_part_of_the_system_is_a_documented_subpackage(package):
    module = importlib.import_module(f"specterbench.{package}")
    assert module.__doc__ and len(module.__doc__.split()) >= 8
