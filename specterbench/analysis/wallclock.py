"""Compare two pytest-benchmark runs of the harness's hot paths (``make bench-wallclock-compare``).

On a shared machine one benchmark's host time moves by up to 2× between two runs of unchanged code, so no
per-benchmark threshold both passes unchanged code and fails a real 2× slowdown. Noise on different benchmarks is
partly independent, a slowdown of a hot path is not: the verdict is the **geometric mean over all benchmarks of the
ratio of the fastest round** (``min``: the least disturbed by other processes). The machine's own load still moves
that mean, so it is divided by the ratio of a machine-speed probe timed beside the benchmarks
(:mod:`specterbench.testing.wallclock_probe`), and fails above ``--max-slowdown`` (default 1.3: above what runs of
unchanged code gave, below an emulated 2× slowdown; the figures are linked from docs/results.md). Per-benchmark
ratios are printed for reading, not judged.

``specterbench wallclock-compare results/benchmarks`` compares the newest saved run with the one before
(``--benchmark-autosave`` files); ``specterbench wallclock-compare BASE.json NEW.json`` compares two files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from specterbench.errors import UsageError

#: the machine-speed probe's seconds in a pytest-benchmark JSON file (written by the testing layer's probe)
PROBE_KEY = "probe_s"
STATS = ("min", "median", "mean")
DEFAULT_STAT = "min"
DEFAULT_MAX_SLOWDOWN = 1.3


def load(path: Path) -> tuple[dict[str, dict], float | None]:
    """``({benchmark full name: stats}, machine probe seconds or None)`` of one pytest-benchmark JSON file."""

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {b["fullname"]: b["stats"] for b in data["benchmarks"]}, data.get(PROBE_KEY)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise UsageError(f"{path} is not a pytest-benchmark JSON file ({type(err).__name__}: {err}); run "
                         f"`make bench-wallclock` to write one") from None


def saved_runs(storage: Path) -> list[Path]:
    """The runs saved by ``--benchmark-autosave`` under ``storage`` (one folder per machine), oldest first."""
    return sorted(Path(storage).glob("*/[0-9][0-9][0-9][0-9]_*.json"), key=lambda p: (p.name, str(p)))


def ratios(base: dict, new: dict, stat: str) -> dict[str, float]:
    return {name: new[name][stat] / base[name][stat] for name in base
            if name in new and base[name][stat] > 0 and new[name][stat] > 0}


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def check_max_slowdown(max_slowdown: float) -> None:
    """A threshold above 1 (``1.3``: fail when 30% slower), checked before anything is measured."""
    if not max_slowdown > 1:
        raise UsageError(f"--max-slowdown {max_slowdown} must be above 1 (1.3 = fail when 30% slower)")


def compare(base_path: Path, new_path: Path, stat: str = DEFAULT_STAT,
            max_slowdown: float = DEFAULT_MAX_SLOWDOWN) -> tuple[bool, str]:
    """``(passed, report)``: per-benchmark ratios new/base of ``stat`` and their geometric mean against
    ``max_slowdown``."""
    if stat not in STATS:
        raise UsageError(f"unknown statistic {stat!r}; use one of {', '.join(STATS)}")
    check_max_slowdown(max_slowdown)
    (base, base_probe), (new, new_probe) = load(base_path), load(new_path)
    r = ratios(base, new, stat)
    if not r:
        raise UsageError(f"{base_path} and {new_path} share no benchmark; nothing to compare")
    width = max(len(n.split("::")[-1]) for n in r)
    lines = [f"host wall time, new/base ratio of each benchmark's {stat} round ({new_path.name} vs "
             f"{base_path.name}):"]
    lines += [f"  {name.split('::')[-1]:<{width}}  {ratio:6.2f}" for name, ratio in sorted(r.items())]
    only = sorted(set(base) ^ set(new))
    if only:
        lines.append(f"  not in both runs (not compared): {', '.join(n.split('::')[-1] for n in only)}")
    raw = geometric_mean(r.values())
    g, how = raw, "not corrected for machine load (a run without the probe)"
    if base_probe and new_probe:
        g = raw / (new_probe / base_probe)
        how = (f"raw {raw:.3f}, divided by the machine probe's ratio {new_probe / base_probe:.3f} "
               f"({new_probe * 1e6:.0f} vs {base_probe * 1e6:.0f} µs)")
    passed = g <= max_slowdown
    lines.append(f"geometric mean over {len(r)} benchmarks: {g:.3f} ({how}); {'pass' if passed else 'FAIL'}: at "
                 f"most {max_slowdown:g} allowed")
    return passed, "\n".join(lines)
