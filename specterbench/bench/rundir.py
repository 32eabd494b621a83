"""A run folder: its saved options (``run.json``), one writer at a time (a lock), and repair before a resume.

``specterbench run`` writes ``run.json`` (every option that shapes the cells) before the first row, so that
``--resume DIR`` alone continues the run exactly as it was started; an option given with ``--resume`` that
differs from the saved one is refused. ``.lock`` is held (``flock``) while a process writes the folder: a second
writer is refused instead of interleaving rows. A run killed mid-write can leave a partial last line in
``rows.jsonl``; :func:`repair_rows` sets it aside before the resume appends, so every complete row survives.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from specterbench.errors import UsageError
from specterbench.plugins.host import warn

RUN_JSON = "run.json"
ROWS = "rows.jsonl"
LOCK = ".lock"
PARTIAL = "rows.jsonl.partial"
RUN_JSON_VERSION = 1
# parsed options that do not shape the cells: never saved, never a conflict on resume
NOT_SAVED = frozenset({"func", "command", "debug", "out", "run_id", "resume", "quiet", "argv", "profile_name"})
FLAG_ALIASES = {"--strategy": "strategies"}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def explicit_dests(argv: list[str], dests) -> set[str]:
    """The options of ``dests`` that ``argv`` gives explicitly (``--tokens 4``, ``--tokens=4``, ``--tok 4``)."""
    flags = {flag(d): d for d in dests} | {a: d for a, d in FLAG_ALIASES.items() if d in dests}
    given = set()
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        name = token.split("=", 1)[0]
        if name in flags:
            given.add(flags[name])
            continue
        prefixed = {d for f, d in flags.items() if f.startswith(name)}  # argparse accepts unique prefixes
        if len(prefixed) == 1:
            given |= prefixed
    return given


def saved_options(options: dict) -> dict:
    return {k: v for k, v in sorted(options.items()) if k not in NOT_SAVED}


def check_new(run_dir: Path) -> None:
    """Refuse to start a run in a folder that already holds rows (they would mix with the new ones). A folder
    whose run stopped before its first row (a bad input found after loading) may be started again."""
    rows = run_dir / ROWS
    if rows.exists() and rows.stat().st_size > 0:
        raise UsageError(f"run folder {run_dir} already holds a run; continue it with --resume {run_dir}, or pick "
                         f"another --run-id")


def write_run_json(run_dir: Path, options: dict) -> Path:
    from specterbench import __version__

    path = run_dir / RUN_JSON
    data = {"run_json_version": RUN_JSON_VERSION, "specterbench": __version__, "options": saved_options(options)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_run_json(run_dir: Path) -> dict | None:
    """The saved options of a run folder; None for a folder made before run.json existed."""
    path = run_dir / RUN_JSON
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        options = data["options"]
        if not isinstance(options, dict):
            raise TypeError("options is not a table")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise UsageError(f"{path} is unreadable ({type(err).__name__}: {err}); restore it, or start a new run "
                         f"with the original options and another --run-id") from None
    return options


def resume_options(run_dir: Path, options: dict, explicit: set[str]) -> dict:
    """``options`` with the saved run's restored; an explicit option that differs from the saved one is refused."""
    saved = read_run_json(run_dir)
    if saved is None:
        warn(f"{run_dir} has no {RUN_JSON} (a run from before it existed); resuming with the options given "
             f"on this command line")
        return options
    conflicts = [d for d in sorted(explicit) if d in saved and d not in NOT_SAVED and saved[d] != options.get(d)]
    if conflicts:
        d = conflicts[0]
        more = f" (and {', '.join(flag(c) for c in conflicts[1:])})" if conflicts[1:] else ""
        raise UsageError(f"--resume {run_dir}: {flag(d)} {_show(options.get(d))} conflicts with the run's "
                         f"{_show(saved[d])} ({RUN_JSON}){more}; drop it to continue the run as it was started, "
                         f"or start a new run")
    return {**options, **{k: v for k, v in saved.items() if k in options}}


def _show(value) -> str:
    return "(not set)" if value is None else json.dumps(value) if not isinstance(value, str) else repr(value)


class RunLock:
    """Exclusive ``flock`` on ``<run_dir>/.lock`` for as long as one process writes the folder."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._file = None

    def acquire(self) -> "RunLock":
        f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise UsageError(f"run folder {self.path.parent} is being written by another specterbench process "
                             f"(pid {holder}); wait for it to finish, or pick another --run-id") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def repair_rows(run_dir: Path) -> int:
    """Set aside a partial last line of ``rows.jsonl`` (a write cut off by a kill or a full disk) so that the next
    row starts on a line of its own; returns the bytes set aside (0 when the file ends cleanly)."""
    path = Path(run_dir) / ROWS
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1
    partial = data[cut:]
    if not partial:
        return 0
    aside = path.with_name(PARTIAL)
    with open(aside, "ab") as f:
        f.write(partial + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    warn(f"{path}: the last line was cut off ({len(partial)} bytes of an interrupted write); set aside in "
         f"{aside.name}, every complete row is kept")
    return len(partial)
