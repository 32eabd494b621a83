"""specterbench: benchmark harness and reference engine for MoE expert offloading.

Layout: ``engine/`` (the offloaded engine and its parts), ``bench/`` (running benchmarks), ``analysis/``
(tables, plots, compare, gate), ``quality/`` (lm-eval), ``plugins/`` (the plugin system), ``embedded/``
(the shipped stand-in models). Plugin authors need only ``from specterbench import Strategy, hookimpl``.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import sys

import pluggy

from specterbench.plugins.strategy import Request, Strategy

__version__ = "0.1.0"

# bitsandbytes' CPU backend looks for the optional `kernels` package (which fetches from a hub: never installed here)
# and logs "Failed to load CPU gemm_4bit_forward ... No module named 'kernels'" on import; its own kernels serve.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

hookimpl = pluggy.HookimplMarker("specterbench")

#: Module paths of the flat pre-0.2 layout and where they live now. Importing an old path still works (it
#: returns the new module), so code written against the old layout keeps running.
MOVED_MODULES = {
    "specterbench.cache": "specterbench.engine.cache",
    "specterbench.seam": "specterbench.engine.seam",
    "specterbench.timeline": "specterbench.engine.clocks",
    "specterbench.geometry": "specterbench.engine.geometry",
    "specterbench.profiles": "specterbench.engine.profiles",
    "specterbench.draft": "specterbench.engine.draft",
    "specterbench.models": "specterbench.engine.models",
    "specterbench.runner": "specterbench.bench.runner",
    "specterbench.results": "specterbench.bench.results",
    "specterbench.sweep": "specterbench.bench.sweep",
    "specterbench.grid": "specterbench.bench.grid",
    "specterbench.workloads": "specterbench.bench.workloads",
    "specterbench.overhead": "specterbench.bench.overhead",
    "specterbench.progress": "specterbench.bench.progress",
    "specterbench.nvml": "specterbench.bench.nvml",
    "specterbench.report": "specterbench.analysis.report",
    "specterbench.plots": "specterbench.analysis.plots",
    "specterbench.compare": "specterbench.analysis.compare",
    "specterbench.gate": "specterbench.analysis.gate",
    "specterbench.lmeval": "specterbench.quality.lmeval",
    "specterbench.evaluate": "specterbench.quality.evaluate",
    "specterbench.tasks": "specterbench.quality.tasks",
    "specterbench.hookspecs": "specterbench.plugins.hookspecs",
    "specterbench.builtin": "specterbench.plugins.builtin",
    "specterbench.conformance": "specterbench.plugins.conformance",
    "specterbench.testing": "specterbench.plugins.testing",
    "specterbench.strategy": "specterbench.plugins.strategy",
    "specterbench.plugins_cli": "specterbench.plugins.listing",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to its new module (the same module object, not a copy)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self._own_spec = module.__spec__  # the import system overwrites __spec__ after this returns
        return module

    def exec_module(self, module):
        module.__spec__ = self._own_spec


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())

__all__ = ["MOVED_MODULES", "Request", "Strategy", "__version__", "hookimpl"]
