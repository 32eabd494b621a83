"""Errors users see as one line: each names the problem and the fix."""


class SpecterbenchError(Exception):
    """Base class: the CLI prints ``str(err)`` as one line and exits non-zero."""


class UsageError(SpecterbenchError):
    """Bad input from the command line or a config (unknown name, malformed value)."""


class ModelError(SpecterbenchError):
    """A model could not be found, loaded or adapted (missing checkpoint, no MoE block, corrupt file)."""


class BudgetError(SpecterbenchError):
    """A device byte budget that cannot work for this model or strategy."""


class EngineViolation(SpecterbenchError):
    """A strategy broke an engine rule (over budget, evicted an expert in use)."""


class PluginError(SpecterbenchError):
    """A plugin failed to import or register."""
