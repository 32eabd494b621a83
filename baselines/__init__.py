"""Built-in baseline strategies, registered as an ordinary plugin through the ``specterbench`` entry point."""

from specterbench import hookimpl

from .lru import LRU
from .on_demand import OnDemand
from .oracle import Oracle
from .resident import Resident
from .static import StaticPlacement

STRATEGIES = (OnDemand, LRU, StaticPlacement, Resident, Oracle)


@hookimpl
def specterbench_register_strategies(register):
    for cls in STRATEGIES:
        register(cls)
