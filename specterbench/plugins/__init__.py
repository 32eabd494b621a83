"""The plugin system: hook specifications, the pluggy host (loading, registration, name resolution), the
Strategy contract, the built-in registrations, the conformance battery and its pytest plugin, and the
`specterbench plugins` listing."""

from __future__ import annotations


def __getattr__(name):  # the pre-layout module's names (`from specterbench.plugins import ...`) keep working
    import importlib
    import pkgutil

    if name.startswith("__") or name in {m.name for m in pkgutil.iter_modules(__path__)}:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module("specterbench.plugins.host")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
