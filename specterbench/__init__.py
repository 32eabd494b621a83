"""specterbench: benchmark harness and reference engine for MoE expert offloading."""

import pluggy

from .strategy import Request, Strategy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("specterbench")

__all__ = ["Request", "Strategy", "__version__", "hookimpl"]
