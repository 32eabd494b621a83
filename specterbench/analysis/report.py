"""Tables from result rows: pandas at the edge, markdown out."""

from __future__ import annotations

from pathlib import Path

from specterbench.bench.device_memory import size_text
from specterbench.bench.nvml import nvml_columns
from specterbench.runfiles.reference import workload_lines
from specterbench.runfiles.results import ResultRow, integrity_problems, read_rows
from specterbench.runfiles.rundir import run_ids


def load_frame(run_dir, on_error: str = "stop"):
    """One documented line to get a run into pandas: ``specterbench.analysis.report.load_frame("results/<run-id>")``."""
    import dataclasses

    import pandas as pd

    rows = read_rows(Path(run_dir), on_error=on_error)
    return pd.DataFrame([{k: v for k, v in dataclasses.asdict(r).items() if k not in ("env", "samples", "warmup")}
                         for r in rows])


def _mb(n) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def lossless_text(r: ResultRow) -> str:
    """The lossless column: ✓ / ✗ / - for a lossless strategy, the token agreement of a lossy one."""
    if r.lossless_strategy:
        return {True: "✓", False: "✗", None: "-"}[r.lossless]
    return f"lossy ({r.token_agreement:.0%} agree)" if r.token_agreement is not None else "lossy"


def status_text(r: ResultRow) -> str:
    return r.status if r.status == "ok" else f"{r.status}: {r.error}"


def budget_text(r: ResultRow) -> str:
    """A row's budget: its share of expert bytes (and bytes); on a card (``--gpu-memory``) the card, the experts'
    bytes it leaves at the priced geometry, and for a layer split the MoE layers it keeps on the device."""
    plan = r.extra.get("device_plan")
    if not plan:
        return (f"{r.budget_fraction:.0%} ({_mb(r.budget_bytes)})" if r.geometry == r.model else
                f"{r.budget_fraction:.0%} ({_mb(r.budget_fraction * r.priced_total_expert_bytes)} priced)")
    text = f"{size_text(plan['card_bytes'])} card: {_mb(plan['expert_bytes'])} experts"
    if "n_cpu_moe" in r.extra and "moe_layers" in r.extra:
        text += f", {r.extra['moe_layers'] - r.extra['n_cpu_moe']}/{r.extra['moe_layers']} layers"
    return text


def summary_table(rows: list[ResultRow]):
    """The bench table: one line per (model, strategy, budget), medians over repeats."""
    import pandas as pd

    records = []
    for r in rows:
        clock = {"modeled": f"modeled · {r.profile}", "measured": "measured (CUDA events)",
                 "host": "host wall only"}[r.clock] + (" · CUDA graphs" if r.cuda_graphs == "used" else "")
        records.append({
            "model": (r.model if r.geometry == r.model else f"{r.model} @ {r.geometry} geometry (projection)")
            + ("" if r.precision == "bf16" else f", {r.precision}"),
            "strategy": r.display_label,
            "budget": budget_text(r),
            "_frac": r.budget_fraction,
            "batch": r.batch,
            "clock": clock,
            "workload": r.workload,
            "tokens": r.new_tokens,
            "TPOT ms": r.tpot_ms,
            "TPOT mean ms": r.tpot_mean_ms if r.tpot_mean_ms is not None else
            (1e3 / r.tokens_per_s if r.tokens_per_s and r.clock != "host" else None),  # rows from before the field
            "TPOT p90 ms": r.tpot_p90_ms,
            "host ms/tok": r.host_ms_per_token,
            "TTFT ms": r.ttft_ms,
            "hit rate": r.hit_rate,
            "H2D KB/tok": None if r.h2d_bytes_per_token is None else r.h2d_bytes_per_token / 1e3,
            "stall ms/tok": r.stall_ms_per_token,
            "TPOT p99 ms": r.tpot_p99_ms,
            "tok/s/user": r.tokens_per_s_per_user,
            "tok/s total": r.tokens_per_s_total,
            "experts/step": r.distinct_experts_per_step,
            "tok/expert": r.tokens_per_expert,
            "link KB/step": None if r.link_bytes_per_step is None else r.link_bytes_per_step / 1e3,
            "host expert tok": r.host_expert_tokens,
            "lossless": lossless_text(r),
            "status": status_text(r),
        })
    df = pd.DataFrame(records)
    if df.empty:
        return df
    keys = ["model", "strategy", "budget", "_frac", "batch", "clock", "workload", "tokens", "lossless", "status"]
    for col in df.columns.difference(keys):  # float even when every value is None (an all-error or host-clock run)
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df = df.groupby(keys, sort=False, dropna=False).median(numeric_only=True).reset_index()
    df = df.sort_values(["model", "_frac", "batch", "TPOT ms"], na_position="last").drop(columns="_frac")
    if (df["batch"] == 1).all():  # no batch axis: the batch figures say nothing a batch-1 table does not
        df = df.drop(columns=[c for c in BATCH_COLUMNS if c in df.columns])
    return df[[c for c in df.columns if c not in ("lossless", "status")] + ["lossless", "status"]]


#: columns of a run with a batch axis (``--batch``), shown only then
BATCH_COLUMNS = ("batch", "TPOT p99 ms", "tok/s/user", "tok/s total", "experts/step", "tok/expert", "link KB/step",
                 "host expert tok")


#: the columns of the compact table (``render_markdown(rows)``; ``wide=True`` shows every column)
COMPACT = ("model", "strategy", "budget", "batch", "tok/s/user", "tok/s total", "TPOT ms", "TPOT mean ms",
           "TTFT ms", "hit rate", "H2D KB/tok",
           "stall ms/tok", "lossless", "status")
#: columns shown once, in a header line above the compact table, when every row has the same value
SHARED = ("model", "clock", "workload", "tokens")
STATUS_WIDTH = 24  # a failed row's reason, cut to fit a 160-column terminal (summary.md has it whole)


def render_markdown(rows: list[ResultRow], wide: bool = False) -> str:
    """The bench table. Compact by default (fits a 160-column terminal): short model names, what every row shares
    (model, geometry, clock, workload, tokens) said once above the table, mean TPOT beside the median; ``wide``:
    every column, each row whole."""
    df = summary_table(rows)
    if df.empty:
        return "(no rows)\n"
    if wide:
        return df.to_markdown(index=False, floatfmt=".3f") + "\n" + "".join(f"{n}\n" for n in note_lines(rows))
    header = []
    geometries = sorted({r.geometry_label for r in rows if r.geometry != r.model})
    df = df.copy()
    df["model"] = [r.split(" @ ", 1)[0] for r in df["model"]]  # "tiny-x @ mixtral geometry (projection)" -> "tiny-x"
    for col in SHARED:
        values = df[col].unique()
        if len(values) == 1:
            header.append(f"{col}: {values[0]}")
    header += [f"geometry: {g}" for g in geometries]
    compact = COMPACT
    if all(r.clock == "host" for r in rows):  # no device clock: this machine's wall time instead of empty TPOT
        header.append("TPOT: not measured (no CUDA device); host ms/tok is this machine's wall time per token")
        compact = tuple("host ms/tok" if c == "TPOT ms" else c for c in COMPACT
                        if c not in ("TPOT mean ms", "stall ms/tok"))
    keep = [c for c in compact
            if c in df.columns and not (c == "model" and any(h.startswith("model:") for h in header))]
    keep += [c for c in SHARED if c in df.columns and c not in keep and not any(h.startswith(c + ":") for h in header)]
    df = df[[c for c in df.columns if c in keep]]
    df["budget"] = [b.split(" (", 1)[0] for b in df["budget"]]  # the fraction; bytes are in summary.md
    df["status"] = [s if len(s) <= STATUS_WIDTH else s[: STATUS_WIDTH - 1] + "…" for s in df["status"]]
    table = df.to_markdown(index=False, floatfmt=".3f") + "\n"
    return "".join(f"{line}\n" for line in header) + table + "".join(f"{line}\n" for line in note_lines(rows))


def note_lines(rows: list[ResultRow]) -> list[str]:
    """One line per row with a note (:attr:`ResultRow.note`), naming its cell."""
    return [f"note: {r.display_label} @ {r.budget_fraction:.0%} ({r.model}): {r.note}" for r in rows if r.note]


def write_summary(run_dir: Path, rows: list[ResultRow] | None = None) -> Path:
    run_dir = Path(run_dir)
    rows = rows if rows is not None else read_rows(run_dir)
    lines = [f"# specterbench run {run_dir.name}", ""]
    for label in sorted({r.geometry_label for r in rows if r.geometry != r.model}):
        lines.append(f"Geometry: {label}.")
    clocks = sorted({(r.clock, r.profile) for r in rows})
    for clock, profile in clocks:
        if clock == "modeled":
            lines.append(f"TPOT is **modeled** on hardware profile `{profile}` from the engine's real routing and "
                         f"transfers; host ms/tok is this machine's wall time, not a GPU's.")
        elif clock == "host":
            lines.append("Clock: host wall time only (no CUDA device); TPOT of a GPU is not reported.")
        else:
            lines.append("TPOT is **measured** with CUDA events and synchronisation.")

    lines += [f"{line}." for line in workload_lines(run_dir)]

    lines += [f"{line[0].upper()}{line[1:]}." for line in note_lines(rows)]
    problems = integrity_problems(rows, run_dir / "rows.jsonl", run_ids(run_dir))
    if problems:
        lines += ["", "**Integrity:** " + " ".join(f"{p}." for p in problems)]
    lines += ["", render_markdown(rows, wide=True), "", "## Link bytes: engine ledger vs NVML PCIe counters", ""]
    notes = {r.nvml_note for r in rows if r.nvml_h2d_bytes is None and r.status == "ok"}
    counted = [r for r in rows if r.nvml_h2d_bytes is not None]
    if counted:
        import pandas as pd

        table = pd.DataFrame([{"strategy": r.strategy_label, "budget": f"{r.budget_fraction:.0%}", **nvml_columns(r)}
                              for r in counted])
        lines.append(table.to_markdown(index=False))
    for note in sorted(n for n in notes if n):
        lines.append(f"NVML columns empty: {note}.")
    lines.append("")
    path = run_dir / "summary.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
