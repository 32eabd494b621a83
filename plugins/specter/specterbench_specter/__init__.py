"""Specter, its reproduction and its baselines, registered with specterbench through the ``specterbench``
entry-point group: ``specter`` (full strength), ``specter-artifact`` (the published artifact), ``specmoeoff``
(the artifact's second baseline) and ``spec-decode`` (an ablation: no plan)."""

from specterbench import hookimpl

from .decoding import accepted_prefix
from .specter import Specter
from .strategies import SpecDecode, SpecMoEOff, SpecterArtifact

__version__ = "0.1.0"
__all__ = ["Specter", "SpecterArtifact", "SpecMoEOff", "SpecDecode", "accepted_prefix"]


@hookimpl
def specterbench_register_strategies(register):
    register(Specter)
    register(SpecterArtifact)
    register(SpecMoEOff)
    register(SpecDecode)
