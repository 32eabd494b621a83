"""The printed table in the format a reader asks for (``--output``): markdown for people, csv / json / jsonl for
programs, as llama-bench offers them. The machine formats carry every column of the table, one record per row, and
read back with pandas (``read_csv``, ``read_json``, ``read_json(lines=True)``)."""

from __future__ import annotations

from specterbench.analysis.report import render_markdown, summary_table
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow

#: the formats of ``--output``; md is the table people read, the rest are for programs
FORMATS = ("md", "csv", "json", "jsonl")


def check_format(name: str) -> str:
    """``name`` if it is one of :data:`FORMATS`, else one UsageError line naming them."""
    if name not in FORMATS:
        import difflib

        close = difflib.get_close_matches(name, FORMATS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown --output {name!r}{hint}; use one of {', '.join(FORMATS)}")
    return name


def machine_frame(rows: list[ResultRow]):
    """The table as a program reads it: every column of the wide table, plain values, no markdown."""
    return summary_table(rows)


def render(rows: list[ResultRow], fmt: str, wide: bool = False) -> str:
    """The table of ``rows`` in ``fmt`` (:data:`FORMATS`); md: :func:`~specterbench.analysis.report.render_markdown`."""
    check_format(fmt)
    if fmt == "md":
        return render_markdown(rows, wide=wide)
    df = machine_frame(rows)
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=1) + "\n"
    return df.to_json(orient="records", lines=True) if not df.empty else ""
