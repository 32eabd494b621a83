"""The transformers versions the engine runs under, and what differs between them."""

from __future__ import annotations

from torch import nn

from specterbench.errors import UsageError

MIN_TRANSFORMERS = "5.17"  # pyproject.toml's lower bound (a test keeps the two equal): the lowest tested


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def check_transformers() -> None:
    """The installed transformers is one pyproject.toml allows (its lowest is the lowest tested): one line
    otherwise."""
    lowest = MIN_TRANSFORMERS
    have = transformers_version()
    if _version_tuple(have) < _version_tuple(lowest):
        raise UsageError(f"transformers {have} is older than the lowest supported, {lowest}: "
                         f"pip install 'transformers>={lowest},<6'")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def cache_kwarg(model: nn.Module) -> str:
    """The keyword the model's forward takes its KV cache under: ``past_key_values`` (transformers up to 5.2x),
    ``cache`` (later); a name the forward does not list would be swallowed by ``**kwargs`` and decoding would run
    without its cache."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise UsageError(f"{type(model).__name__}.forward takes no KV cache argument (neither 'cache' nor "
                     f"'past_key_values') under transformers {transformers_version()}; install a supported "
                     f"transformers (see pyproject.toml)")
