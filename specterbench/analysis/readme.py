"""The front page's generated example (``./README.md``): a real run's table and the command that made it, between two
markers, so that the snippet and its command cannot drift apart (``make readme`` writes it, ``make readme-check``
fails when it is stale).

The run is the committed gate reference (``results/reference``): ``make reference`` records it with the Makefile's
``GATE_RUN_ARGS`` and ``make gate`` holds every later run to it, so the example is what the submitted code measures.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specterbench.analysis.gate_metrics import best_other_speedups
from specterbench.analysis.report import render_markdown
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow

BEGIN, END = "<!-- example-table:begin -->", "<!-- example-table:end -->"
#: the markers of each generated section (``--section``)
MARKERS = {"example": (BEGIN, END), "batch": ("<!-- batch-table:begin -->", "<!-- batch-table:end -->")}


def example(rows: list[ResultRow], model: str, strategies: tuple[str, ...], command: str) -> str:
    """The generated section: the command, the table of ``model``'s rows of ``strategies`` (in that order), and
    Specter's speed-up over the strongest other lossless strategy per budget."""
    chosen = [r for r in rows if r.model == model and r.strategy in strategies]
    if not chosen:
        ran = sorted({r.model for r in rows})
        raise UsageError(f"no rows of model {model!r} among {', '.join(strategies)} (the run has {', '.join(ran)}); "
                         f"give --model and --strategies of the run")
    order = {s: i for i, s in enumerate(strategies)}
    chosen.sort(key=lambda r: (r.budget_fraction, order[r.strategy]))
    lines = ["```sh", command, "```", "", render_markdown(chosen).rstrip("\n"), ""]
    for (_, geometry, _, budget, *_), s in sorted(best_other_speedups(chosen, "specter", "tpot_mean_ms").items(),
                                                  key=lambda kv: str(kv[0])):
        if s.ratio is not None:
            lines.append(f"- specter @ {budget:.0%}: {s.ratio:.3f}× the mean TPOT of the strongest other lossless "
                         f"strategy here ({s.other})")
    return "\n".join(lines).rstrip() + "\n"


def batch_example(rows: list[ResultRow], model: str, strategies: tuple[str, ...], command: str) -> str:
    """The generated batch sweep: for each strategy (in ``strategies``' order) and batch size, decode tokens/s per
    user and in total (per GPU), from ``model``'s rows of a run with a batch axis; a row that did not run says why."""
    chosen = [r for r in rows if r.model == model and r.strategy in strategies]
    if not chosen:
        raise UsageError(f"no rows of model {model!r} among {', '.join(strategies)} in the batch run; give --model "
                         f"and --strategies of the run")
    batches = sorted({r.batch or 1 for r in chosen})
    cell = {(r.strategy, r.batch or 1): r for r in chosen}
    frame = pd.DataFrame(
        [[s] + [_batch_cell(cell.get((s, b))) for b in batches] for s in strategies if any(k[0] == s for k in cell)],
        columns=["strategy"] + [f"B = {b}" for b in batches])
    first = chosen[0]
    label = (f"modeled · {first.profile} · {first.geometry_label} · budget {first.budget_fraction:.0%} of expert "
             f"bytes · {first.workload}, {first.new_tokens} new tokens per request, {first.precision}")
    return "\n".join(["```sh", command, "```", "", f"Decode tokens/s per user / in total ({label}):", "",
                      frame.to_markdown(index=False), ""]) + "\n"


def _batch_cell(row: ResultRow | None) -> str:
    if row is None:
        return "—"
    if row.status != "ok":
        return row.status
    if row.tokens_per_s_per_user is None or row.tokens_per_s_total is None:
        return "—"
    return f"{row.tokens_per_s_per_user:.2f} / {row.tokens_per_s_total:.2f}"


def splice(text: str, section: str, path: Path, which: str = "example") -> str:
    """``text`` with the part between ``which``'s markers replaced by ``section``."""
    begin, end = MARKERS[which]
    if begin not in text or end not in text:
        raise UsageError(f"{path} has no {begin} … {end} markers; put them where the {which} table goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{section}{end}{tail}"
