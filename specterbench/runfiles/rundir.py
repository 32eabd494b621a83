"""A run folder: its saved options (``run.json``), one writer at a time (a lock), and repair before a resume.

``specterbench run`` writes ``run.json`` (every option that shapes the cells) before the first row, so that
``--resume DIR`` alone continues the run exactly as it was started; an option given with ``--resume`` that
differs from the saved one is refused, and so is a folder of another kind (a sweep's, or one without ``run.json``)
or a ``--run-id`` that names another folder. ``.lock`` is held (``flock``) while a process writes the folder: a second
writer is refused instead of interleaving rows; the file is removed when the writer lets go. A run killed mid-write
can leave a partial last line in ``rows.jsonl``; :func:`repair_rows` sets it aside before the resume appends, so every
complete row survives.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from specterbench.errors import UsageError
from specterbench.plugins.registry import warn
from specterbench.version import __version__

RUN_JSON = "run.json"
ROWS = "rows.jsonl"
LOCK = ".lock"
PARTIAL = "rows.jsonl.partial"
RUN_JSON_VERSION = 1
# parsed options that do not shape the cells: never saved, never a conflict on resume
NOT_SAVED = frozenset({"func", "command", "debug", "out", "run_id", "resume", "quiet", "wide", "output", "argv",
                       "profile_name", "run_folder", "claimed_folder"})
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


GRID_COPY = "grid.toml"  # a sweep's folder: the grid it runs (what ``sweep --resume`` compares with)


def check_resume_target(run_dir: Path, kind: str, options: dict, grid: str | None = None) -> None:
    """Refuse, in one line, to resume into ``run_dir`` unless it is a folder of the same ``kind`` ("run" or
    "sweep") that ``--run-id``/``--out`` (when given) also name."""
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run folder; give the folder a {kind} was written to "
                         f"(results/<run-id>)")
    run_id, out = options.get("run_id"), options.get("out_explicit")
    if run_id is not None and run_id != run_dir.name:
        raise UsageError(f"--resume {run_dir} continues the folder {run_dir.name!r}, but --run-id names {run_id!r}; "
                         f"drop --run-id (or give --run-id {run_dir.name})")
    if out is not None and Path(out).resolve() != run_dir.resolve().parent:
        raise UsageError(f"--resume {run_dir} continues a folder in {run_dir.parent}, but --out names {out}; drop "
                         f"--out")
    has_run, has_grid = (run_dir / RUN_JSON).exists(), (run_dir / GRID_COPY).exists()
    if kind == "run" and not has_run:
        if has_grid:
            raise UsageError(f"--resume {run_dir}: a sweep's folder, not a run's; continue it with specterbench "
                             f"sweep {run_dir / GRID_COPY} --resume {run_dir}")
        raise UsageError(f"--resume {run_dir}: not a folder `specterbench run` wrote (no {RUN_JSON}); resume only a "
                         f"run's own folder, or start a new run with another --run-id")
    if kind == "sweep" and not has_grid:
        if has_run:
            raise UsageError(f"--resume {run_dir}: a `specterbench run` folder, not a sweep's; continue it with "
                             f"specterbench run --resume {run_dir}")
        raise UsageError(f"--resume {run_dir}: not a folder `specterbench sweep` wrote (no {GRID_COPY}); resume "
                         f"only a sweep's own folder, or start a new sweep")


def check_same_grid(run_dir: Path, grid_path: str) -> None:
    """Refuse to resume a sweep with a grid other than the one it was started with, naming the first key that
    differs."""
    import tomllib

    saved_path = run_dir / GRID_COPY
    try:
        saved = tomllib.loads(saved_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"{saved_path} is unreadable ({err}); restore it, or start a new sweep") from None
    given = tomllib.loads(Path(grid_path).read_text(encoding="utf-8"))
    for key in sorted(set(saved) | set(given)):
        if saved.get(key) != given.get(key):
            raise UsageError(f"sweep --resume {run_dir}: {grid_path} sets {key} = {_show(given.get(key))}, the sweep "
                             f"was started with {_show(saved.get(key))} ({saved_path}); resume with that grid, or "
                             f"start a new sweep")


def write_run_json(run_dir: Path, options: dict) -> Path:
    """Save the run's options, and its identity: the run id its rows carry, fixed when the folder is made (so a
    copied or renamed folder, resumed, goes on writing rows of the same run)."""
    path = run_dir / RUN_JSON
    identity = _saved(run_dir).get("run_id") or run_dir.name
    data = {"run_json_version": RUN_JSON_VERSION, "kind": "run", "specterbench": __version__, "run_id": identity,
            "options": saved_options(options)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_merged_run_json(run_dir: Path, run_ids) -> Path:
    """Mark a folder that holds the rows of several runs on purpose (the gate's reference: one run per model)."""
    path = run_dir / RUN_JSON
    data = {"run_json_version": RUN_JSON_VERSION, "kind": "merged", "specterbench": __version__,
            "run_ids": sorted(set(run_ids))}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def _saved(run_dir: Path) -> dict:
    try:
        data = json.loads((Path(run_dir) / RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def run_identity(run_dir: Path) -> str:
    """The run id rows written into ``run_dir`` carry: the one saved when the folder was made, else its name."""
    return str(_saved(run_dir).get("run_id") or Path(run_dir).name)


def run_ids(run_dir: Path) -> set[str] | None:
    """The run ids whose rows belong in ``run_dir`` (its own, or the parts of a merged folder); None when the folder
    does not say (made before run.json recorded it)."""
    data = _saved(run_dir)
    if data.get("kind") == "merged":
        return {str(r) for r in data.get("run_ids") or ()}
    return {str(data["run_id"])} if data.get("run_id") else None


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
        raise UsageError(f"--resume {run_dir}: not a folder `specterbench run` wrote (no {RUN_JSON}); resume only a "
                         f"run's own folder, or start a new run with another --run-id")
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
        while True:
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
            try:  # the holder before us removes the file as it lets go: lock the file that is there now
                if os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        """Let go and remove the lock file: a finished run leaves no lock behind."""
        if self._file is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def repair_rows(run_dir: Path) -> int:
    """Before a resume: set aside what is not a row of ``rows.jsonl`` — a partial last line (a write cut off by a kill
    or a full disk) and any corrupt line — so that the run's own rows read back and the next row starts on a line of
    its own. The cells of lines set aside run again. Returns the lines set aside."""
    path = Path(run_dir) / ROWS
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    keep, aside = [], []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or "cell" not in data:
                raise ValueError("not a row")
            keep.append(raw)
        except (UnicodeDecodeError, ValueError):
            aside.append((number, raw))
    if not aside:
        return 0
    corrupt = path.with_name(PARTIAL)
    with open(corrupt, "ab") as f:
        for _, raw in aside:
            f.write(raw + b"\n")
    tmp = path.with_name(ROWS + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(raw + b"\n" for raw in keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    where = ", ".join(str(n) for n, _ in aside[:5]) + (" ..." if len(aside) > 5 else "")
    warn(f"{path}: line(s) {where} were not rows (cut off or corrupt); set aside in {corrupt.name}, every complete "
         f"row is kept and those cells run again")
    return len(aside)
