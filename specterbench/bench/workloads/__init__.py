"""Packaged prompt sets (workloads), one JSON object per line: ``{"id", "text", "source"}``.

    from specterbench.bench.workloads import WORKLOADS, load_workload
    prompts = load_workload("shakespeare-heldout-v1")   # list of dicts, file order

* ``shakespeare-heldout-v1`` — 40 benchmark prompts from the embedded models' held-out works.
* ``calibration-v1`` — 37 prompts from training works (profiling, e.g. static placement); disjoint
  from the benchmark set by construction (different works).

A changed prompt set gets a new version suffix (see ``workloads/README.md``); files are generated
by ``specterbench make-workloads``.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

from specterbench.errors import UsageError

WORKLOADS: tuple[str, ...] = ("shakespeare-heldout-v1", "calibration-v1")


def workload_path(name: str) -> Path:
    """Path of a packaged workload file; unknown names raise :class:`UsageError`."""
    if name not in WORKLOADS:
        import difflib

        close = difflib.get_close_matches(name, WORKLOADS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown workload {name!r}{hint}: available workloads are {', '.join(WORKLOADS)}")
    return Path(str(importlib.resources.files(__name__) / f"{name}.jsonl"))


def load_workload(name: str) -> list[dict]:
    """The prompts of a packaged workload, in file order."""
    path = workload_path(name)
    if not path.is_file():
        raise UsageError(f"workload file {path} is missing: reinstall specterbench "
                         "or run `specterbench make-workloads`")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(f"{path}:{lineno} is not valid JSON ({err.msg}): reinstall specterbench") from None
            if not isinstance(row, dict) or not {"id", "text", "source"} <= row.keys():
                raise UsageError(f"{path}:{lineno} lacks id/text/source: reinstall specterbench")
            rows.append(row)
    return rows


__all__ = ["WORKLOADS", "load_workload", "workload_path"]
