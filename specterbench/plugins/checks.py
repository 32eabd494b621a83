"""Registration checks: what the plugin host refuses when a strategy class registers, each in one line.

A strategy is plain methods the engine calls by name, so a typo is not an error Python would raise: a method
``choose_victm`` is simply never called and the strategy runs with the default eviction. These checks run once per
class, when its plugin calls ``register(cls)``, and raise :class:`~specterbench.errors.PluginError` for

- a class that is not a :class:`~specterbench.Strategy` subclass, or whose ``name`` is not a non-empty string, or
  whose ``version`` is empty or not a string;
- a method whose name is a near miss of a decision point (``choose_victm``: did you mean
  ``choose_victim(self, candidates, needed)``?) — found with :func:`difflib.get_close_matches`;
- a class attribute that is a near miss of a contract attribute (``losless = False``: did you mean ``lossless``?),
  or a contract flag of the wrong type (``lossless = "no"``);
- a decision point the engine cannot call with its arguments (``before_layer(self, layer)``), with the signature
  it is called with;
- a method written against a contract that has changed since (:data:`CHANGED`), with what changed.

Each message names the plugin, the class, the method or attribute and the fix; :func:`strategy_problems` gives
every problem of a class (the host warns about each and leaves the class out), :func:`check_strategy` the first.
Helpers whose names merely resemble a decision point are refused too: give them a name unlike one (``_pick`` rather
than ``choose_victims``).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Callable

from specterbench.errors import PluginError
from specterbench.strategy import Strategy

CUTOFF = 0.85  # difflib ratio from which a name counts as a near miss ("choose_victm" ~ "choose_victim": 0.96)

# Flags whose type the runner relies on (a string "False" is truthy).
BOOL_ATTRIBUTES = ("lossless", "uses_calibration", "uses_reference_trace")


def _calibration_counts(params: list[inspect.Parameter]) -> bool:
    return len(params) > 2 and params[2].name == "calibration_counts"


#: Decision points whose contract changed: (method, test on its parameters [self, ...], what changed). A class
#: written against the old contract fails at registration with the message instead of misbehaving at run time.
CHANGED: tuple[tuple[str, Callable[[list[inspect.Parameter]], bool], str], ...] = (
    ("prepare", _calibration_counts,
     "prepare(engine, calibration_counts) became prepare(engine, calibration): it receives a "
     "specterbench.strategy.RoutingCalibration (the [layers, experts] counts are calibration.counts) and only when "
     "the class sets uses_calibration = True"),
)


def _function(value):
    """The plain function of a method, classmethod or staticmethod in a class ``__dict__``; None otherwise."""
    if isinstance(value, (classmethod, staticmethod)):
        return value.__func__
    return value if inspect.isfunction(value) else None


def _plain(sig: inspect.Signature) -> str:
    return f"({', '.join(str(p.replace(annotation=p.empty)) for p in sig.parameters.values())})"


def decision_points() -> dict[str, inspect.Signature]:
    """Every method of :class:`~specterbench.Strategy` a subclass may override, with its signature (``self``/``cls``
    included): the names the misspelling check compares with."""

    out = {}
    for name, value in vars(Strategy).items():
        func = _function(value)
        if not name.startswith("_") and func is not None:
            out[name] = inspect.signature(func)
    return out


def contract_attributes() -> dict[str, object]:
    """The class attributes of the contract (``name``, ``version``, ``lossless``, ...) with their defaults."""

    return {name: value for name, value in vars(Strategy).items()
            if not name.startswith("_") and _function(value) is None and not isinstance(value, property)}


def check_strategy(cls, plugin: str) -> None:
    """Refuse ``cls``, registered by ``plugin``, in one line if the engine would call it wrongly or not at all (the
    first of :func:`strategy_problems`)."""
    problems = strategy_problems(cls, plugin)
    if problems:
        raise PluginError(problems[0])


def strategy_problems(cls, plugin: str) -> list[str]:
    """Every reason to refuse ``cls``, registered by ``plugin``, one line each (empty when it is fine): the plugin
    host warns about each, so a plugin author fixes them all in one round."""

    where = f"plugin {plugin!r}"
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        return [f"{where} registered {cls!r}, which is not a specterbench.Strategy subclass; register a subclass "
                f"of specterbench.Strategy"]
    problems = []
    if not isinstance(cls.name, str) or not cls.name.strip():
        problems.append(f"{where}: {cls.__qualname__} has no name; set the class attribute name = '...' (what "
                        f"--strategies selects)")
    own = cls.__mro__[: cls.__mro__.index(Strategy)]  # the plugin's own classes, not the base
    points, attributes = decision_points(), contract_attributes()
    for klass in own:
        for attr, value in vars(klass).items():
            if attr.startswith("_"):
                continue
            label = f"{where}: {klass.__qualname__}.{attr}"
            func = _function(value)
            try:
                if func is None:
                    _check_attribute(label, attr, value, attributes, points)
                elif attr in points:
                    _check_signature(label, attr, func, points[attr])
                else:
                    near = difflib.get_close_matches(attr, list(points), n=1, cutoff=CUTOFF)
                    if near:
                        raise PluginError(f"{label} is not a decision point and would never be called; did you "
                                          f"mean {near[0]}{_plain(points[near[0]])}? (rename it, or give a helper "
                                          f"a name unlike a decision point)")
            except PluginError as err:
                problems.append(str(err))
    if not any("version" in vars(klass) for klass in own):
        problems.append(f"{where}: {cls.__qualname__} sets no version; set version = '1' (rows record it, and the "
                        f"gate compares only rows of one strategy version)")
    return problems


def _check_signature(label: str, attr: str, func, base: inspect.Signature) -> None:
    try:
        sig = inspect.signature(func)
    except ValueError:  # no signature (a builtin): nothing to check
        return
    params = list(sig.parameters.values())
    for name, changed, what in CHANGED:
        if name == attr and changed(params):
            raise PluginError(f"{label}{_plain(sig)} is written against an older contract: {what}")
    try:
        sig.bind(*base.parameters)  # self (or cls) and each argument, positionally, as the engine calls it
    except TypeError:
        raise PluginError(f"{label}{_plain(sig)} cannot take the decision point's arguments; the engine calls "
                          f"{attr}{_plain(base)}") from None


def _check_attribute(label: str, attr: str, value, attributes: dict, points: dict) -> None:
    if attr in points:
        raise PluginError(f"{label} is {type(value).__name__}, not a method; the engine calls "
                          f"{attr}{_plain(points[attr])}")
    if attr == "version" and (isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip()):
        raise PluginError(f"{label} = {value!r} is no version; set version = '1' (rows record it, and the gate "
                          f"compares only rows of one strategy version)")
    if attr in BOOL_ATTRIBUTES and not isinstance(value, bool):
        raise PluginError(f"{label} = {value!r} must be True or False")
    if attr == "fixed_budget_fraction" and value is not None and not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1):
        raise PluginError(f"{label} = {value!r} must be None or a fraction of expert bytes in (0, 1]")
    if attr in attributes:
        return
    near = [n for n in difflib.get_close_matches(attr, list(attributes), n=1, cutoff=CUTOFF)
            if not (attr.startswith(n) or n.startswith(attr))]  # "names" is a plural of its own, not a typo
    if near:
        raise PluginError(f"{label} is not a Strategy attribute and would be ignored; did you mean {near[0]} "
                          f"(default {attributes[near[0]]!r})?")
