"""The printed table in the format a reader asks for (``--output``): markdown for people, csv / json / jsonl for
programs, as llama-bench offers them. The table has one line per test (:mod:`specterbench.analysis.pp_tg`); the
machine formats carry every column of it, tokens/s and its standard deviation as two numbers, one record per line,
and read back with pandas (``read_csv``, ``read_json``, ``read_json(lines=True)``). ``--wide`` markdown is the
per-cell table of summary.md, every metric."""

from __future__ import annotations

from specterbench.analysis.pp_tg import render_tests_markdown, table_of_tests
from specterbench.analysis.report import render_markdown
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
    """The table as a program reads it: every column of the test table, plain values, no markdown."""
    return table_of_tests(rows)


def render(rows: list[ResultRow], fmt: str, wide: bool = False) -> str:
    """The table of ``rows`` in ``fmt`` (:data:`FORMATS`); md: :func:`~specterbench.analysis.report.render_markdown`."""
    check_format(fmt)
    if fmt == "md":
        return render_markdown(rows, wide=True) if wide else render_tests_markdown(rows)
    df = machine_frame(rows)
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=1, double_precision=15) + "\n"
    return df.to_json(orient="records", lines=True, double_precision=15) if not df.empty else ""
