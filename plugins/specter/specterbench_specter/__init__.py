"""Specter and its ablation, registered with specterbench through the ``specterbench`` entry-point group."""

from specterbench import hookimpl

from .specter import SpecDecode, Specter

__version__ = "0.1.0"


@hookimpl
def specterbench_register_strategies(register):
    register(Specter)
    register(SpecDecode)
