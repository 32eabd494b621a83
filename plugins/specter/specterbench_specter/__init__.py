"""Specter, its reproduction and its baselines, registered with specterbench through the ``specterbench``
entry-point group: ``specter`` (full strength), ``specter-artifact`` (the published artifact), ``specmoeoff``
(the artifact's second baseline), ``spec-decode`` (an ablation: no plan, LRU cache, no host path) and ``spec-host``
(the ablation that isolates the lookahead: Specter without its prefetch plan), ``spec-ngram`` (draft-free
speculation by prompt / n-gram lookup) and ``spec-small`` (speculation with a separate small dense draft)."""

from specterbench import hookimpl

from .acceptance import accepted_prefix
from .lookup import SpecNgram
from .small import SpecSmall
from .specter import SpecHost, Specter
from .strategies import SpecDecode, SpecMoEOff, SpecterArtifact

__version__ = "0.1.0"
__all__ = ["Specter", "SpecHost", "SpecNgram", "SpecSmall", "SpecterArtifact", "SpecMoEOff", "SpecDecode",
           "accepted_prefix"]


@hookimpl
def specterbench_register_strategies(register):
    register(Specter)
    register(SpecterArtifact)
    register(SpecMoEOff)
    register(SpecDecode)
    register(SpecHost)
    register(SpecNgram)
    register(SpecSmall)
