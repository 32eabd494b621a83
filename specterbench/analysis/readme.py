"""The front page's generated example (``./README.md``): a real run's table and the command that made it, between two
markers, so that the snippet and its command cannot drift apart (``make readme`` writes it, ``make readme-check``
fails when it is stale).

The run is the committed gate reference (``results/reference``): ``make reference`` records it with the Makefile's
``GATE_RUN_ARGS`` and ``make gate`` holds every later run to it, so the example is what the submitted code measures.
"""

from __future__ import annotations

from pathlib import Path

from specterbench.analysis.gate_metrics import best_other_speedups
from specterbench.analysis.report import render_markdown
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow

BEGIN, END = "<!-- example-table:begin -->", "<!-- example-table:end -->"


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


def splice(text: str, section: str, path: Path) -> str:
    """``text`` with the part between the markers replaced by ``section``."""
    if BEGIN not in text or END not in text:
        raise UsageError(f"{path} has no {BEGIN} … {END} markers; put them where the example goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{section}{END}{tail}"
