"""The suite's folders mirror the package's layers (docs/architecture.md); helpers shared by several folders live
beside this file.

The suite tests this project's own distributions (specterbench and its two plugin packages): every other installed
plugin — an example installed with pip, a third-party package, well-behaved, clashing or broken — is blocked for the
whole session, subprocesses included, so what else is in the environment changes no test's outcome. A test that
installs a plugin itself unblocks it (``test_examples``); an outside plugin is tested by its own suite, or by the
conformance battery (``pytest --specterbench-strategy=NAME``), which loads it.
"""

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

from specterbench.plugins.registry import BLOCK_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cli_errors and support, for every folder's tests


SHIPPED = ("specterbench", "specterbench-specter", "specterbench-lfu")  # the distributions this repository installs


def outside_plugins() -> list[str]:
    """Entry-point names of installed plugins from any other distribution."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="specterbench")
                   if (ep.dist.name if ep.dist else "?") not in SHIPPED})


OUTSIDE = outside_plugins()
if OUTSIDE:
    os.environ[BLOCK_ENV] = ",".join(filter(None, [os.environ.get(BLOCK_ENV, ""), *OUTSIDE]))


@pytest.fixture
def engine():
    """The tiny random Mixtral in an engine (2 MoE layers, 8 experts, top-2); a test folder may define its own."""
    from support import tiny_engine

    return tiny_engine("mixtral")
