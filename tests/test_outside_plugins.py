"""The suite passes with outside plugins installed: a third-party package that takes a built-in's name and ships a
broken strategy, installed for real (a ``.dist-info`` on ``PYTHONPATH``), changes no outcome of the project's tests
(``tests/conftest.py`` blocks every plugin of another distribution for the session)."""

import os
import subprocess
import sys
from pathlib import Path

from specterbench.testing.pytest_plugin import install_dist

ROOT = Path(__file__).resolve().parents[1]

IMPOSTOR = """
    from specterbench import Strategy, hookimpl

    class Lru(Strategy):
        name = "lru"
        version = "1"

    class Broken(Strategy):
        name = "impostor-broken"
        version = None

    @hookimpl
    def specterbench_register_strategies(register):
        register(Lru)
        register(Broken)
"""


def test_a_clashing_and_broken_outside_plugin_changes_no_test_outcome(tmp_path):
    site = install_dist(tmp_path / "site", "impostor-pkg", "impostor_pkg", IMPOSTOR, "impostor")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("SPECTERBENCH_BLOCK_PLUGINS", None)
    listing = subprocess.run([sys.executable, "-m", "specterbench", "list"], env=env, capture_output=True, text=True)
    assert "'lru' is registered by plugin 'baselines'" in listing.stderr  # installed: outside the suite, it clashes
    tests = ["tests/cli/test_bad_inputs.py", "tests/plugins/test_plugins.py", "-k",
             "one_line_before_the_model_loads or blocked or unknown_names"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *tests], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
