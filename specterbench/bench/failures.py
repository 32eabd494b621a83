"""Where a strategy failed, for its error row: the plugin's own frame, the decision point the engine was in, the
MoE layer and the token position — a traceback alone usually ends deep inside transformers or torch."""

from __future__ import annotations

import inspect
import traceback
from pathlib import Path

from specterbench.strategy import Strategy

DECISION_POINTS = frozenset(n for n, v in vars(Strategy).items()
                            if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, classmethod)))


def _strategy_files(strategy) -> set[str]:
    """Source files of the strategy's classes below :class:`Strategy` (the plugin's code)."""
    files = set()
    for klass in type(strategy).__mro__:
        if klass is Strategy or klass is object:
            break
        try:
            files.add(str(Path(inspect.getfile(klass)).resolve()))
        except (TypeError, OSError):
            continue
    return files


def describe_failure(err: BaseException, strategy, engine) -> dict:
    """``{"strategy", "plugin_frame", "decision_point", "layer", "position", "traceback"}`` (None where unknown).

    ``plugin_frame``: the innermost frame in the strategy's own source files (``file:line in function``);
    ``decision_point``: the innermost decision point of the strategy on the stack (``before_layer``,
    ``choose_victim``, … or ``generate`` when the failure is in its own decoding loop); ``layer``: the MoE layer being
    computed; ``position``: absolute position of the last token of the forward that failed (the engine's
    ``context_len`` - 1)."""
    files = _strategy_files(strategy) if strategy is not None else set()
    plugin_frame = decision = layer = None
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        code = frame.f_code
        if strategy is not None and frame.f_locals.get("self") is strategy and code.co_name in DECISION_POINTS:
            decision = code.co_name  # the innermost: generate → engine → before_layer names before_layer
        if str(Path(code.co_filename).resolve()) in files:
            plugin_frame = f"{code.co_filename}:{lineno} in {code.co_name}"
        if code.co_name == "run_moe_layer" and isinstance(frame.f_locals.get("layer"), int):
            layer = frame.f_locals["layer"]
    position = getattr(engine, "context_len", None) if engine is not None else None
    return {"strategy": getattr(strategy, "name", None), "plugin_frame": plugin_frame, "decision_point": decision,
            "layer": layer,
            "position": None if position is None else int(position) - 1,
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-12))}


def where(info: dict) -> str:
    """`` (strategy 'x' in before_layer, layer 3, position 17; at <plugin frame>)`` for the row's one-line error;
    "" if unknown."""
    decision = f"in {info['decision_point']}" if info.get("decision_point") else None
    if info.get("strategy"):
        decision = f"strategy {info['strategy']!r}" + (f" {decision}" if decision else "")
    parts = [decision,
             f"layer {info['layer']}" if info.get("layer") is not None else None,
             f"position {info['position']}" if info.get("position") is not None else None]
    text = ", ".join(p for p in parts if p)
    if info.get("plugin_frame"):
        text = f"{text}; at {info['plugin_frame']}" if text else f"at {info['plugin_frame']}"
    return f" ({text})" if text else ""
