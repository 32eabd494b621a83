"""The registries of the plugin host: named strategies, models and profiles, each with the plugin it came from.

A name registered twice, or refused at registration (:class:`Refusal`), stays out with one warning line per problem
while everything else loads, and a lookup that misses says why in one line — the name was refused, a plugin failed
to load, or a close spelling exists (:func:`closest`) — so a broken third-party plugin never stops an unrelated
command. The host that fills the registries is :mod:`specterbench.plugins.host`.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from typing import Any

from specterbench.errors import PluginError, UsageError

BLOCK_ENV = "SPECTERBENCH_BLOCK_PLUGINS"  # the host never loads the plugins it names; a refusal's warning cites it


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """A loaded plugin: its entry-point name, module, distribution and version, and how it came to be loaded."""

    name: str
    module: str
    distribution: str
    version: str
    source: str  # "entry point" | "default" | "registered"


@dataclass(frozen=True, slots=True)
class PluginFailure:
    """A plugin left out because it failed to import or to register, and why (one line)."""

    info: PluginInfo
    error: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Something a plugin registered that the host left out (a misspelled decision point, a taken name, ...)."""

    kind: str  # "strategy", "model", ...
    name: str  # the name it asked for (the class's name when it has none)
    owner: str  # the class or object registered, e.g. "MyStrategy"
    plugin: PluginInfo
    problems: tuple[str, ...]  # one line each: what is wrong and the fix


@dataclass(frozen=True, slots=True)
class Registered:
    """One name in a registry: the object registered under it and the plugin that registered it."""

    name: str
    obj: Any
    plugin: PluginInfo


class Registry:
    """Named things of one kind (strategies, models, profiles) and the plugin each came from."""

    def __init__(self, kind: str, failed: tuple[str, ...] = ()):
        self.kind = kind
        self.items: dict[str, Registered] = {}
        self.failed = failed  # plugins left out (failed to import or register): named when a lookup misses
        self.refused: dict[str, Refusal] = {}  # left out at registration, by the name asked for

    def refuse(self, refusal: Refusal) -> None:
        """Leave ``refusal`` out, with one warning line per problem; asking for its name later says why."""
        self.refused.setdefault(refusal.name, refusal)
        for problem in refusal.problems:
            warn(f"{problem}; {refusal.owner} is left out (or block the plugin: "
                 f"{BLOCK_ENV}={refusal.plugin.name})")

    def add(self, name: str, obj: Any, plugin: PluginInfo) -> None:
        if not name:
            raise PluginError(f"plugin {plugin.name!r} registered a {self.kind} without a name")
        if name in self.items:
            first = self.items[name].plugin.name
            raise PluginError(f"plugin {plugin.name!r}: {owner_name(obj)} registers {self.kind} {name!r}, which plugin "
                              f"{first!r} registered first (a name registered twice); give it another name")
        self.items[name] = Registered(name, obj, plugin)

    def names(self) -> list[str]:
        return sorted(self.items)

    def get(self, name: str) -> Any:
        return self.entry(name).obj

    def entry(self, name: str) -> Registered:
        try:
            return self.items[name]
        except KeyError:
            refused = self.refused.get(name)
            if refused is not None:
                raise UsageError(f"{self.kind} {name!r} ({refused.owner}, plugin {refused.plugin.name!r}) was refused "
                                 f"at registration: {refused.problems[0]}; fix the plugin, or choose another "
                                 f"{self.kind} (see `specterbench plugins`)") from None
            close = closest(name, self.names())
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            failed = (f"; plugin(s) {', '.join(map(repr, self.failed))} failed to load (see `specterbench plugins`)"
                      if self.failed else "")
            raise UsageError(f"unknown {self.kind} {name!r}; {hint}available: {', '.join(self.names())}"
                             f"{failed}") from None


def closest(name: str, choices, n: int = 3) -> list[str]:
    """The names nearest to ``name``: close spellings first, then names that start with or contain it."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    low = name.lower()
    if low:
        close += [c for c in choices if c.lower().startswith(low) and c not in close]
        close += [c for c in choices if low in c.lower() and c not in close]
    return close[:n]


def note(message: str) -> None:
    """A one-line note on stderr: something the user should know that is not a problem."""
    print(f"specterbench: note: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """A one-line warning on stderr (not :mod:`warnings`: users should see it once, without a source line)."""
    print(f"specterbench: warning: {message}", file=sys.stderr, flush=True)


def owner_name(obj) -> str:
    """What a plugin registered, for messages: a class's name, or the type of an object."""
    return obj.__name__ if isinstance(obj, type) else type(obj).__name__
