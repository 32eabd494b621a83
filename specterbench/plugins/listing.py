"""``specterbench plugins [--json]``: every plugin loaded, where it comes from, the hooks it implements and what it
registered; plugins that failed to import or register, with the error; what plugins registered that was refused
(a misspelled decision point, a name registered twice by one plugin), with every problem; names two plugins
registered, with both; installed entry points that were not
loaded, and why (blocked, autoload disabled, name taken)."""

from __future__ import annotations

import importlib.metadata
import os

from specterbench.plugins.host import DISABLE_ENV, PluginHost
from specterbench.plugins.registry import BLOCK_ENV

# (label, PluginHost method): the registries whose entries are attributed to plugins; absent methods are skipped
REGISTRIES = (("strategies", "strategies"), ("models", "models"), ("profiles", "profiles"),
              ("host profiles", "host_profiles"))


def autoload_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").lower() not in ("1", "true", "yes")


def blocked_plugins() -> list[str]:
    return sorted({b.strip() for b in os.environ.get(BLOCK_ENV, "").split(",") if b.strip()})


def describe(host: PluginHost) -> dict:
    """The plugin inventory as JSON-ready data."""
    registers: dict[str, dict[str, list[str]]] = {name: {} for name in host.plugins}
    for label, method in REGISTRIES:
        make = getattr(host, method, None)
        if make is None:
            continue
        registry = make()
        for name in registry.names():
            owner = registry.entry(name).plugin.name
            registers.setdefault(owner, {}).setdefault(label, []).append(name)
    plugins = [{"name": info.name, "module": info.module, "distribution": info.distribution, "version": info.version,
                "source": info.source, "hooks": host.hooks_of(info.name), "registers": registers.get(info.name, {})}
               for info in host.plugins.values()]
    blocked, autoload = blocked_plugins(), autoload_enabled()
    not_loaded = []
    failed = [{"name": f.info.name, "module": f.info.module, "distribution": f.info.distribution,
               "version": f.info.version, "error": f.error} for f in host.failed.values()]
    for ep in importlib.metadata.entry_points(group="specterbench"):
        loaded = host.plugins.get(ep.name)
        if (loaded is not None and loaded.module == ep.value) or ep.name in host.failed:
            continue
        if ep.name in blocked:
            reason = f"blocked by {BLOCK_ENV}"
        elif not autoload:
            reason = f"entry points not loaded: {DISABLE_ENV} is set"
        else:
            reason = f"the name {ep.name!r} is taken by {loaded.module if loaded else '?'}"
        not_loaded.append({"name": ep.name, "module": ep.value, "distribution": ep.dist.name if ep.dist else "?",
                           "version": ep.dist.version if ep.dist else "?", "reason": reason})
    refused = [{"plugin": r.plugin.name, "kind": r.kind, "name": r.name, "class": r.owner,
                "distribution": r.plugin.distribution, "problems": list(r.problems)} for r in host.refusals()]
    contested = []
    for _, method in REGISTRIES:
        registry = getattr(host, method)()
        for name in registry.contested():
            contested.append({"kind": registry.kind, "name": name, "owners": [
                {"plugin": c.plugin.name, "distribution": c.plugin.distribution, "version": c.plugin.version}
                for c in registry.claims[name]]})
    return {"autoload": autoload, "blocked": blocked, "plugins": plugins, "failed": failed, "refused": refused,
            "contested": contested, "not_loaded": not_loaded}
