"""pytest plugin shipped with specterbench (``pytest11`` entry point): fixtures for strategy authors' tests.

- ``host``: a fresh plugin host for the test (registrations made with ``host.register`` vanish afterwards).
- ``small_prompts``: three short fixed prompts in place of the shipped workloads, for fast engine tests.
- the ``slow`` marker: tests over 30 s on two CPU cores (``-m 'not slow'`` skips them).

It also loads the strategy conformance battery (:mod:`specterbench.testing.conformance`): ``pytest
--specterbench-strategy=NAME`` runs it against any installed strategy.
"""

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import specterbench.bench.runner as runner
from specterbench.plugins.host import get_host, reset_host


def _unshadow() -> None:
    """Run from the parent folder of a clone named ``specterbench``, ``python -m pytest`` puts that folder on
    ``sys.path`` and it shadows the installed package as an empty namespace package (``cannot import name
    '__version__'``). Put the package this plugin belongs to back in its place, and say so in one line."""
    pkg = sys.modules.get("specterbench")
    if pkg is None or getattr(pkg, "__file__", None) is not None:
        return
    real = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("specterbench", real / "__init__.py",
                                                  submodule_search_locations=[str(real)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["specterbench"] = module
    spec.loader.exec_module(module)
    shadow = ", ".join(str(p) for p in getattr(pkg, "__path__", [])) or "?"
    print(f"specterbench: note: the folder {shadow} shadows the installed package; using {real} (run pytest "
          f"from inside the clone to avoid this)", file=sys.stderr)


_unshadow()

# Load the battery through this plugin unless it has a pytest11 entry point of its own (registering the module
# twice, under two names, would stop pytest).
CONFORMANCE = "specterbench.testing.conformance"
pytest_plugins = [] if any(ep.value == CONFORMANCE for ep in entry_points(group="pytest11")) else [CONFORMANCE]

SMALL_PROMPTS = [
    ("p0", "Shall I compare thee to a summer's day? Thou art more lovely and more temperate."),
    ("p1", "To be, or not to be, that is the question: whether 'tis nobler in the mind"),
    ("p2", "Now is the winter of our discontent made glorious summer by this sun of York"),
]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: over 30 s on two CPU cores; deselect with -m 'not slow'")


@pytest.fixture
def host():

    reset_host()
    yield get_host()
    reset_host()


@pytest.fixture
def small_prompts(monkeypatch):

    monkeypatch.setattr(runner, "load_prompts", lambda name, n: SMALL_PROMPTS[:n])
    return SMALL_PROMPTS


def install_dist(root, dist: str, module: str, source: str, ep_name: str, version: str = "1.0"):
    """Make ``root`` hold a real installed distribution — ``module.py`` plus a ``.dist-info`` whose
    ``entry_points.txt`` registers it in the ``specterbench`` group — so a test that puts ``root`` on
    ``sys.path`` (or ``PYTHONPATH``) exercises plugin discovery exactly as ``pip install`` would."""
    import textwrap
    from pathlib import Path

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[specterbench]\n{ep_name} = {module}\n")
    return root
