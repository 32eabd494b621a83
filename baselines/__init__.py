"""Built-in baseline strategies, registered as an ordinary plugin through the ``specterbench`` entry point."""

from specterbench.plugins import hookimpl

from .activation_aware import ActivationAware
from .cpu_experts import CpuExperts
from .kt_hybrid import KtHybrid
from .layer_stream import LayerStream
from .lfru import LFRU
from .lru import LRU
from .mixed_precision import MixedPrecision
from .n_cpu_moe import NCpuMoe
from .next_layer_gate import NextLayerGate
from .on_demand import OnDemand
from .oracle import Oracle
from .oracle_spec import OracleSpec
from .resident import Resident
from .static import StaticPlacement

STRATEGIES = (OnDemand, LRU, LFRU, StaticPlacement, NextLayerGate, ActivationAware, CpuExperts, NCpuMoe, KtHybrid,
              MixedPrecision, Resident, Oracle, OracleSpec, LayerStream)


@hookimpl
def specterbench_register_strategies(register):
    for cls in STRATEGIES:
        register(cls)
