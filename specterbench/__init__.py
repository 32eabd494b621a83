"""specterbench: benchmark harness and reference engine for MoE expert offloading.

Plugin authors need ``from specterbench import Strategy, Request, hookimpl``; the whole strategy contract is
:mod:`specterbench.strategy`. The package's layers, bottom to top, are described in ``docs/architecture.md``.
"""

import logging

from specterbench.plugins import hookimpl
from specterbench.strategy import Request, Strategy
from specterbench.version import __version__

# bitsandbytes' CPU backend looks for the optional `kernels` package (which fetches from a hub: never installed here)
# and logs "Failed to load CPU gemm_4bit_forward ... No module named 'kernels'" on import; its own kernels serve.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__all__ = ["Request", "Strategy", "__version__", "hookimpl"]
