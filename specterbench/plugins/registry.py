"""The registries of the plugin host: named strategies, models and profiles, each with the plugin it came from.

Something refused at registration (:class:`Refusal`) stays out with one warning line per problem while everything
else loads, and a lookup that misses says why in one line — the name was refused, a plugin failed to load, or a
close spelling exists (:func:`closest`) — so a broken third-party plugin never stops an unrelated command.

One owner per name: when two plugins register one name, neither answers to it (not even a built-in) until the user
picks one as ``plugin:name`` (the plugin's entry-point or distribution name) or blocks the other; the warning and the
refusal both name the two distributions. The host that fills the registries is :mod:`specterbench.plugins.host`.
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
        self.items: dict[str, Registered] = {}  # names with one owner
        self.claims: dict[str, list[Registered]] = {}  # every plugin's registration, by name (two or more: contested)
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
        claims = self.claims.setdefault(name, [])
        if any(c.plugin.name == plugin.name for c in claims):
            raise PluginError(f"plugin {plugin.name!r}: {owner_name(obj)} registers {self.kind} {name!r} a second "
                              f"time; give it another name")
        claims.append(Registered(name, obj, plugin))
        if len(claims) == 1:
            self.items[name] = claims[0]
            return
        self.items.pop(name, None)
        warn(f"{self.contested_line(name)}; neither runs as {name!r} until you pick one: "
             f"{' or '.join(repr(q) for q in self.qualified(name))}, or block one "
             f"({' or '.join(f'{BLOCK_ENV}={c.plugin.name}' for c in claims)})")

    def qualified(self, name: str) -> list[str]:
        """``plugin:name`` of every claimant of ``name``."""
        return [f"{c.plugin.name}:{name}" for c in self.claims.get(name, [])]

    def contested_line(self, name: str) -> str:
        owners = " and ".join(f"plugin {c.plugin.name!r} ({origin(c.plugin)})" for c in self.claims[name])
        return f"{self.kind} {name!r} is registered by {owners}"

    def contested(self) -> list[str]:
        """Names two or more plugins registered."""
        return sorted(n for n, c in self.claims.items() if len(c) > 1)

    def names(self) -> list[str]:
        """Every name that runs as it is: one owner's names, and ``plugin:name`` for each claimant of a contested
        one."""
        return sorted([*self.items, *(q for n in self.contested() for q in self.qualified(n))])

    def get(self, name: str) -> Any:
        return self.entry(name).obj

    def entry(self, name: str) -> Registered:
        if name in self.items:
            return self.items[name]
        if len(self.claims.get(name, ())) > 1:
            raise UsageError(f"{self.contested_line(name)}; pick one: "
                             f"{' or '.join(repr(q) for q in self.qualified(name))} (or block the other with "
                             f"{' or '.join(f'{BLOCK_ENV}={c.plugin.name}' for c in self.claims[name])})")
        if ":" in name:
            return self._qualified_entry(name)
        refused = self.refused.get(name)
        if refused is not None:
            raise UsageError(f"{self.kind} {name!r} ({refused.owner}, plugin {refused.plugin.name!r}) was refused "
                             f"at registration: {refused.problems[0]}; fix the plugin, or choose another "
                             f"{self.kind} (see `specterbench plugins`)")
        close = closest(name, self.names())
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        failed = (f"; plugin(s) {', '.join(map(repr, self.failed))} failed to load (see `specterbench plugins`)"
                  if self.failed else "")
        raise UsageError(f"unknown {self.kind} {name!r}; {hint}available: {', '.join(self.names())}{failed}")

    def _qualified_entry(self, qualified: str) -> Registered:
        """``plugin:name``: the registration of ``name`` by the plugin whose entry-point or distribution name is
        ``plugin``."""
        plugin, name = qualified.split(":", 1)
        def norm(text: str) -> str:
            return text.replace("_", "-").lower()

        for claim in self.claims.get(name, []):
            if norm(plugin) in (norm(claim.plugin.name), norm(claim.plugin.distribution)):
                return claim
        owners = ", ".join(f"{c.plugin.name!r} ({c.plugin.distribution})" for c in self.claims.get(name, []))
        if owners:
            raise UsageError(f"{qualified!r}: plugin {plugin!r} does not register {self.kind} {name!r}; "
                             f"registered by {owners}")
        raise UsageError(f"{qualified!r}: no plugin registers {self.kind} {name!r}; "
                         f"available: {', '.join(self.names())}")


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


def origin(info: PluginInfo) -> str:
    """Where a plugin comes from, for messages: its distribution and version, or how it was registered in-process."""
    if info.version in ("", "-"):
        return info.distribution.strip("()")
    return f"{info.distribution} {info.version}"


def owner_name(obj) -> str:
    """What a plugin registered, for messages: a class's name, or the type of an object."""
    return obj.__name__ if isinstance(obj, type) else type(obj).__name__
