"""Built-in baseline strategies, registered as an ordinary plugin through the ``specterbench`` entry point."""

from specterbench import hookimpl

from .lru import LRU
from .next_layer_gate import NextLayerGate
from .on_demand import OnDemand
from .oracle import Oracle
from .resident import Resident
from .static import StaticPlacement

STRATEGIES = (OnDemand, LRU, StaticPlacement, NextLayerGate, Resident, Oracle)


@hookimpl
def specterbench_register_strategies(register):
    for cls in STRATEGIES:
        register(cls)
