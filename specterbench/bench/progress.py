"""Progress bars for long runs (per cell, per prompt): tqdm on a terminal, silent in CI and in logs.

Quiet when the environment variable ``CI`` is set to anything but ``""``, ``0``, ``false`` or ``no`` (GitHub
Actions, GitLab and most CI systems set ``CI=true``), or when stderr is not a terminal (redirected to a file or a
pipe), or when the caller passes ``quiet=True`` (e.g. ``--quiet``). :func:`quiet_library_bars` silences the
libraries' own bars (transformers' "Loading weights", lm-eval's and datasets' tqdm bars) in the same cases; the CLI
and the lm-eval wrapper call it first.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable


def is_quiet(stream=None) -> bool:
    """True when progress bars should not be drawn on ``stream`` (default: the current ``sys.stderr``)."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return True
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return not (isatty is not None and isatty())
    except (ValueError, OSError):  # a closed stream
        return True


def progress(iterable_or_total: Iterable | int, desc: str = "", *, unit: str = "it", leave: bool = True,
             quiet: bool = False):
    """A tqdm bar over an iterable, or a manual bar of ``total`` steps (call ``.update(n)``, then ``.close()``).

    Disabled (still iterates, draws nothing) when ``quiet`` is True or :func:`is_quiet` says so. Use
    ``leave=False`` for inner bars (per prompt) so that only the outer bar (per cell) stays on screen.
    """
    from tqdm import tqdm

    stream = sys.stderr
    disable = quiet or is_quiet(stream)
    common = dict(desc=desc, unit=unit, leave=leave, disable=disable, file=stream, dynamic_ncols=True)
    if isinstance(iterable_or_total, int):
        return tqdm(total=iterable_or_total, **common)
    return tqdm(iterable_or_total, **common)


def quiet_library_bars(stream=None) -> None:
    """When :func:`is_quiet`, stop the libraries' own bars too (transformers' "Loading weights", lm-eval's): they go
    through huggingface_hub's tqdm, which reads ``HF_HUB_DISABLE_PROGRESS_BARS`` when first imported."""
    if not is_quiet(stream):
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm >= 4.66 reads it when first imported: child processes
    _tqdm_off_by_default()
    if "huggingface_hub" in sys.modules:  # imported already (a second command in one process): switch them off
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:  # transformers copied huggingface_hub's setting when it was imported
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _tqdm_off_by_default() -> None:
    """Bars that do not say whether to draw (lm-eval's "Building contexts", the datasets' loaders) stay off; a bar
    that passes ``disable`` itself (ours, from :func:`progress`) still decides for itself."""
    from tqdm import tqdm

    if getattr(tqdm.__init__, "_specterbench_quiet", False):
        return
    original = tqdm.__init__

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("disable", True)
        original(self, *args, **kwargs)

    __init__._specterbench_quiet = True
    tqdm.__init__ = __init__
class CellProgress:
    """``cell 3/16 · tiny-qwen-moe · specter @ 35% · eta 2m10s``: one line per cell as it starts (on a terminal and
    in a log alike), the ETA from the mean time of the cells finished so far in this process."""

    def __init__(self, total: int, say: Callable[[str], None]):
        self.total, self.say, self.n = total, say, 0
        self.first: float | None = None

    def start(self, what: str) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        eta = ""
        if self.n:
            left = (now - self.first) / self.n * (self.total - self.n)
            eta = f" · eta {format_seconds(left)}"
        self.n += 1
        self.say(f"cell {self.n}/{self.total} · {what}{eta}")


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
