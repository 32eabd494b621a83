"""The plugin host: loads built-in and third-party plugins once, lazily, and fills the registries from them.

Built-ins are ordinary plugins, declared in specterbench's own ``specterbench`` entry-point group and listed
in ``DEFAULT_PLUGINS`` so they load by the same path when entry-point autoloading is disabled.

Environment:
- ``SPECTERBENCH_DISABLE_PLUGIN_AUTOLOAD=1``: load no entry points; only the built-ins.
- ``SPECTERBENCH_BLOCK_PLUGINS=a,b``: never load plugins named ``a`` or ``b`` (entry-point names); a name that
  matches no installed plugin is warned about.

A third-party plugin that fails to import or to register (a hook that matches no hook spec, a hook with the wrong
arguments) does not stop unrelated commands: it is left out with a one-line warning that names it and how to
block it, ``specterbench plugins`` lists it as failed, and asking for a name it might have provided says so.
Strategies are checked when they register (:func:`check_strategy`): a class with a method that looks like a
misspelled decision point, a decision point that cannot take the engine's arguments, no version, or a name another
plugin took first is left out with one warning line per problem (naming the plugin, the class, the fix and
``SPECTERBENCH_BLOCK_PLUGINS=<plugin>``); everything else still loads, ``specterbench plugins`` lists it as refused,
and asking to run it says why in one line. The registries themselves are :mod:`specterbench.plugins.registry`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import math
import os
from pathlib import Path

import pluggy

from specterbench.catalog.models import local_spec
from specterbench.engine.profiles import load_profile_file
from specterbench.errors import PluginError, UsageError
from specterbench.plugins import hookimpl, hookspecs
from specterbench.plugins.checks import strategy_problems
from specterbench.plugins.registry import BLOCK_ENV, PluginFailure, PluginInfo, Refusal, Registry, owner_name, warn
from specterbench.version import __version__

DISABLE_ENV = "SPECTERBENCH_DISABLE_PLUGIN_AUTOLOAD"
DEFAULT_PLUGINS = (("builtin", "specterbench.plugins.builtin"), ("baselines", "specterbench.baselines"),
                   ("nvml", "specterbench.bench.nvml"))


def hook_names() -> list[str]:
    """Every hook a plugin may implement (the hook specifications), for did-you-mean hints."""
    return sorted(n for n in vars(hookspecs) if n.startswith("specterbench_"))


class PluginHost:
    """The pluggy manager, what it loaded or left out, and the registries built from its plugins' hooks."""

    def __init__(self):
        self._pm: pluggy.PluginManager | None = None
        self._plugins: dict[str, PluginInfo] = {}
        self._failed: dict[str, PluginFailure] = {}
        self._registries: dict[str, Registry] = {}

    # ---- loading -----------------------------------------------------------------------------------
    @property
    def plugins(self) -> dict[str, PluginInfo]:
        """Loaded plugins by name (loading them on first use)."""
        self.pm
        return self._plugins

    @property
    def failed(self) -> dict[str, PluginFailure]:
        """Plugins left out because they failed to import or register, by name (loading on first use)."""
        self.pm
        return self._failed

    @property
    def pm(self) -> pluggy.PluginManager:
        if self._pm is None:
            self._load()
        return self._pm

    def _load(self) -> None:
        pm = pluggy.PluginManager("specterbench")
        pm.add_hookspecs(hookspecs)
        self._pm = pm
        blocked = {b.strip() for b in os.environ.get(BLOCK_ENV, "").split(",") if b.strip()}
        entry_points = list(importlib.metadata.entry_points(group="specterbench"))
        if os.environ.get(DISABLE_ENV, "").lower() not in ("1", "true", "yes"):
            for ep in entry_points:
                if ep.name in blocked or ep.name in self._plugins:
                    continue
                dist = ep.dist.name if ep.dist else "?"
                version = ep.dist.version if ep.dist else "?"
                info = PluginInfo(ep.name, ep.value, dist, version, "entry point")
                try:  # a broken third-party plugin is left out, loudly; the other commands go on
                    self._register(_import(ep.name, ep.value, ep.load), info)
                except PluginError as err:
                    self._fail(info, getattr(err, "problems", None) or [str(err)])
        for name, module in DEFAULT_PLUGINS:
            if name in blocked or name in self._plugins:
                continue
            mod = _import(name, module, lambda m=module: importlib.import_module(m))
            self._register(mod, PluginInfo(name, module, "specterbench", __version__, "default"))
        unknown = sorted(blocked - {ep.name for ep in entry_points} - {name for name, _ in DEFAULT_PLUGINS})
        if unknown:
            warn(f"{BLOCK_ENV} names {', '.join(map(repr, unknown))}, which no installed plugin is called; "
                 f"installed: {', '.join(sorted({ep.name for ep in entry_points} | {n for n, _ in DEFAULT_PLUGINS}))}")

    def _fail(self, info: PluginInfo, errors: list[str]) -> None:
        self._failed[info.name] = PluginFailure(info, "; ".join(errors))
        for error in errors:
            warn(f"{error}; it is left out (block it with {BLOCK_ENV}={info.name}, or fix or uninstall "
                 f"{info.distribution})")

    def _register(self, obj, info: PluginInfo) -> None:
        """Register one plugin and check its hooks; a bad plugin raises :class:`PluginError` and stays out."""
        try:
            self._pm.register(obj, name=info.name)
        except pluggy.PluginValidationError as err:
            raise PluginError(f"plugin {info.name!r} ({info.distribution}) is invalid: "
                              f"{str(err).splitlines()[0]}") from err
        unknown = [h.name for h in self._pm.get_hookcallers(obj) or [] if not h.has_spec()
                   and not any(i.optionalhook for i in h.get_hookimpls() if i.plugin is obj)]
        if unknown:
            self._pm.unregister(obj)
            problems = []
            for hook in unknown:
                near = difflib.get_close_matches(hook, hook_names(), n=1, cutoff=0.0)
                problems.append(f"plugin {info.name!r} implements unknown hook {hook!r}; did you mean {near[0]!r}? "
                                f"(hooks: specterbench/plugins/hookspecs.py)")
            err = PluginError(problems[0] if len(problems) == 1 else "; ".join(problems))
            err.problems = problems
            raise err
        self._plugins[info.name] = info
        self._registries.clear()

    def register(self, obj, name: str) -> PluginInfo:
        """Register an in-process plugin object (tests, notebooks); undo with :meth:`unregister`."""
        self.pm  # load the rest first
        info = PluginInfo(name, getattr(obj, "__name__", type(obj).__name__), "(in-process)", "-", "registered")
        self._register(obj, info)
        return info

    def add(self, name: str, *, models=(), profiles=(), host_profiles=()) -> None:
        """Register models and profiles made in this process (a checkpoint or profile file the command line names,
        a model cast to another dtype) as one in-process plugin called ``name``; a second call with a name already
        registered does nothing."""
        if name not in self.plugins:
            self.register(_Named(models, profiles, host_profiles), name)

    def register_local_model(self, path) -> str:
        """Register the checkpoint at ``path`` (``--model-path``) and return its model name (``local:<folder>``)."""
        spec = local_spec(path)
        if spec.name not in self.models().names():
            self.add(f"local-model:{spec.name}", models=[spec])
        return spec.name

    def register_profile_file(self, path) -> tuple[str, str | None]:
        """Register a profile file's profiles (``--profile PATH``); returns ``(profile name, host profile name or
        None)``. A name another plugin took with other figures is refused in one line."""
        profile, host_profile = load_profile_file(path)
        names = profile.name, host_profile.name if host_profile else None
        taken = self.host_profiles().items.get(host_profile.name) if host_profile else None
        if taken is not None and taken.obj != host_profile:
            raise UsageError(f"--profile {path}: its host profile name {host_profile.name!r} is already taken by "
                             f"{taken.plugin.name!r} with other figures; rename its [host_profile] (edit name)")
        known = self.profiles().items.get(profile.name)
        if known is not None:
            if known.obj != profile:
                raise UsageError(f"--profile {path}: its name {profile.name!r} is already taken by "
                                 f"{known.plugin.name!r} with other figures; rename it (calibrate --name, or edit "
                                 f"name)")
            return names
        self.add(f"profile-file:{Path(path).resolve()}", profiles=[profile],
                 host_profiles=[host_profile] if host_profile else [])
        return names

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._plugins.pop(name, None)
        self._registries.clear()

    # ---- registries --------------------------------------------------------------------------------
    def _registry(self, kind: str, hook_name: str, key, check=lambda obj, info: []) -> Registry:
        """The registry of one kind, built once: each plugin's registrations, built-ins first. A name two plugins
        register answers to neither until the user picks one (``plugin:name``). Whatever a plugin registers wrongly
        is left out with one warning line per problem; everything else it registers, and every other plugin, stays."""
        if kind not in self._registries:
            reg = Registry(kind, tuple(self.failed))

            def add(obj, info):
                try:
                    name = key(obj)
                except AttributeError:
                    name = None
                label = name if isinstance(name, str) and name.strip() else owner_name(obj)
                problems = list(check(obj, info))
                if not problems:
                    try:
                        reg.add(name, obj, info)
                    except PluginError as err:
                        problems.append(str(err))
                if problems:
                    reg.refuse(Refusal(kind, label, owner_name(obj), info, tuple(problems)))

            impls = getattr(self.pm.hook, hook_name).get_hookimpls()
            for impl in sorted(impls, key=lambda i: self.plugins[i.plugin_name].distribution != "specterbench"):
                info = self.plugins[impl.plugin_name]
                try:
                    impl.function(register=lambda obj, info=info: add(obj, info))
                except Exception as err:  # the plugin's hook itself broke: its registrations so far stay
                    reg.refuse(Refusal(kind, f"({info.name})", hook_name, info, (
                        f"plugin {info.name!r}: {hook_name} raised {type(err).__name__}: "
                        f"{(str(err).splitlines() or [''])[0]}; fix it or uninstall {info.distribution}",)))
            self._registries[kind] = reg
        return self._registries[kind]

    def refusals(self) -> list[Refusal]:
        """Everything left out at registration, over every registry (building them)."""
        out = []
        for make in (self.strategies, self.models, self.profiles, self.host_profiles):
            out += list(make().refused.values())
        return out

    def strategies(self) -> Registry:
        return self._registry("strategy", "specterbench_register_strategies", lambda cls: cls.name,
                              check_strategy)

    def models(self) -> Registry:
        return self._registry("model", "specterbench_register_models", lambda spec: spec.name)

    def profiles(self) -> Registry:
        return self._registry("profile", "specterbench_register_profiles", lambda p: p.name, check_figures)

    def host_profiles(self) -> Registry:
        return self._registry("host profile", "specterbench_register_host_profiles", lambda p: p.name, check_figures)

    def hooks_of(self, name: str) -> list[str]:
        plugin = self.pm.get_plugin(name)
        return sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])

    def environment(self) -> dict:
        merged: dict = {}
        conflicts = []
        for part in self.pm.hook.specterbench_environment():
            for k, v in (part or {}).items():
                if k in merged and merged[k] != v:
                    conflicts.append(k)
                    continue
                merged[k] = v
        if conflicts:
            merged["conflicts"] = sorted(set(conflicts))
        return merged


def check_strategy(cls, plugin: PluginInfo) -> list[str]:
    """Every reason to refuse a strategy class, one line each (see :mod:`specterbench.plugins.checks`: not a
    Strategy, a misspelled decision point or attribute, a decision point that cannot take the engine's arguments, a
    decision point whose contract changed, no version)."""
    return strategy_problems(cls, plugin.name)


def check_figures(profile, plugin: PluginInfo) -> list[str]:
    """A profile's numbers must be finite and not negative (``inf`` FLOP/s would price every kernel at zero)."""
    if not dataclasses.is_dataclass(profile):
        return []
    return [f"plugin {plugin.name!r}: {owner_name(profile)} {getattr(profile, 'name', '?')!r} has {f.name} = "
            f"{getattr(profile, f.name)!r}; give a finite number >= 0"
            for f in dataclasses.fields(profile)
            if isinstance(getattr(profile, f.name), float) and not (math.isfinite(getattr(profile, f.name))
                                                                    and getattr(profile, f.name) >= 0)]


def _import(name: str, target: str, load):
    try:
        return load()
    except Exception as err:
        raise PluginError(f"plugin {name!r} ({target}) failed to import: {type(err).__name__}: {err}") from err


class _Named:
    """An in-process plugin that registers what the command line names: a local checkpoint, a profile file."""

    def __init__(self, models=(), profiles=(), host_profiles=()):
        self.models, self.profiles, self.host_profiles = list(models), list(profiles), list(host_profiles)

    @hookimpl
    def specterbench_register_models(self, register):
        for spec in self.models:
            register(spec)

    @hookimpl
    def specterbench_register_profiles(self, register):
        for profile in self.profiles:
            register(profile)

    @hookimpl
    def specterbench_register_host_profiles(self, register):
        for profile in self.host_profiles:
            register(profile)


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST


def reset_host() -> None:
    """Forget loaded plugins (tests; after installing a plugin in-process)."""
    global _HOST
    _HOST = None
