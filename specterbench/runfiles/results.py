"""Result rows: one JSON line per benchmark cell, with raw samples, versions and the environment.

Schema (version ``SCHEMA_VERSION``) — every field of :class:`ResultRow`; units live in field names. Load a run
into pandas with ``specterbench.analysis.report.load_frame(run_dir)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from specterbench.engine.sampling import DecodeSetting
from specterbench.errors import UsageError

SCHEMA_VERSION = 1

# Direction of every headline metric, so that no comparison assumes lower is better.
DIRECTIONS = {
    "tpot_ms": "lower", "tpot_mean_ms": "lower", "tpot_p90_ms": "lower", "ttft_ms": "lower", "tokens_per_s": "higher",
    "tokens_per_s_total": "higher", "tokens_per_s_per_user": "higher", "tpot_p99_ms": "lower",
    "host_ms_per_token": "lower", "hit_rate": "higher", "h2d_bytes_per_token": "lower",
    "stall_ms_per_token": "lower", "prefetch_used": "higher", "prefetch_wasted": "lower",
    "token_agreement": "higher",
}



def strategy_label(name: str, options: dict | None) -> str:
    """The strategy as a cell key names it: ``specter`` or, with options, ``specter[bits=4,k=8]`` (sorted)."""
    if not options:
        return name
    parts = (f"{k}={v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for k, v in sorted(options.items()))
    return f"{name}[{','.join(parts)}]"


@dataclass(slots=True)
class ResultRow:
    run_id: str
    cell: str
    model: str
    geometry: str  # whose sizes the modeled clock prices: the model's own, or a preset (a projection)
    geometry_label: str
    priced_total_expert_bytes: int  # all expert bytes at the priced geometry
    strategy: str
    strategy_version: str
    strategy_plugin: str
    lossless_strategy: bool
    budget_bytes: int
    budget_fraction: float
    total_expert_bytes: int
    profile: str
    clock: str  # "modeled" (priced by profile) | "measured" (CUDA events) | "host" (CPU wall time only)
    workload: str
    prompts: int
    new_tokens: int
    seed: int
    repeat: int
    prompt_tokens: int | None = None  # every prompt's length when asked for (--prompt-tokens); None: the workload's
    depth_tokens: int = 0  # context prefilled before each prompt, outside the timed part (--depth)
    precision: str = "bf16"  # the target's stored weights: bf16, or e.g. "experts int4/g128" (--expert-bits)
    decode: dict = field(default_factory=lambda: {"mode": "greedy"})  # DecodeSetting.to_dict(): how tokens were chosen
    status: str = "ok"  # ok | diverged | error | unsupported (a batch past the strategy's max_batch: not run)
    error: str | None = None
    lossless: bool | None = None
    first_divergence: dict | None = None  # {"prompt": id, "position": i} of the first differing token
    token_agreement: float | None = None
    tpot_ms: float | None = None  # median over decode tokens (after the first); None on the host clock
    tpot_p90_ms: float | None = None
    decode_h2d_bytes_per_token: float | None = None  # host->device bytes per token after the first (prefill apart)
    tpot_mean_ms: float | None = None  # mean over decode tokens (decode time / tokens: what the gate ratchets)
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    host_ms_per_token: float | None = None  # host wall time, median; never a GPU's TPOT
    hit_rate: float | None = None
    hits: int = 0
    misses: int = 0
    h2d_bytes: int = 0
    h2d_bytes_per_token: float | None = None
    d2h_bytes: int = 0  # experts copied device->host (lru.swap: each eviction written back to the host)
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    host_experts: int = 0  # expert computations done on the host CPU (cpu-experts)
    activation_bytes: int = 0  # activations crossing the link for host-computed experts, both directions
    substituted: int = 0  # misses computed with a lower-precision substitute (lossy strategies)
    stall_ms_per_token: float | None = None
    peak_cache_bytes: int = 0
    strategy_device_bytes: int = 0  # charged to the strategy's budget besides its cache
    strategy_device_bytes_allocated: int | None = None  # storage of the tensors it really held there (drafts, scratch)
    nvml_h2d_bytes: int | None = None  # PCIe RX of the GPU integrated over the measured requests (NVML)
    nvml_d2h_bytes: int | None = None
    nvml_note: str | None = None  # why the NVML columns are empty, e.g. "no NVML: library not found"
    peak_host_rss_bytes: int | None = None
    peak_device_bytes: int | None = None  # torch.cuda.max_memory_allocated on CUDA
    cuda_graphs: str | None = None  # used | off | unavailable (--cuda-graphs; None: a row written before the setting)
    cuda_graphs_reason: str | None = None  # why, e.g. "no CUDA (device cpu)", "capture failed: <error>"
    batch: int = 1  # requests decoding together in the cell (--batch)
    distinct_experts_per_step: float | None = None  # distinct experts per MoE layer per decode step, mean
    tokens_per_expert: float | None = None  # routed tokens per activated expert per decode step, mean
    link_bytes_per_step: float | None = None  # host->device bytes per decode step (all requests of the batch)
    link_bytes_per_token: float | None = None  # the same per token delivered (per request and step)
    host_expert_tokens: int = 0  # tokens computed by experts on the host (each token of each host expert)
    tpot_p99_ms: float | None = None  # per-request TPOT, 99th percentile
    tokens_per_s_total: float | None = None  # tokens of every request per second of decode (per GPU: one device)
    tokens_per_s_per_user: float | None = None  # each request's own tokens per second of decode
    extra: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)  # raw per-token samples: tpot_ms, host_ms, ttft_ms
    warmup: dict = field(default_factory=dict)  # the warm-up request's samples, kept apart
    env: dict = field(default_factory=dict)
    duration_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    @property
    def strategy_label(self) -> str:
        """The strategy with its options, as cell keys name it: ``specter`` or ``specter[k=4]``."""

        return strategy_label(self.strategy, self.extra.get("strategy_options"))

    @property
    def note(self) -> str | None:
        """What a reader of the table must know about this row that its numbers do not say, or None: a speculative
        strategy that dropped its draft (then it is its own ablation from that point on)."""
        if not self.extra.get("draft_released"):
            return None
        if not self.extra.get("tokens_per_window"):
            return "draft released before its first window: it never speculated (the speculative ablation's row)"
        return "draft released part-way: the windows before it speculated, the tokens after it did not"

    @property
    def display_label(self) -> str:
        """The strategy as tables and plots show it: :attr:`strategy_label`, marked when the row has a note."""
        return self.strategy_label + (" (draft released)" if self.extra.get("draft_released") else "")

    @property
    def graphs_label(self) -> str:
        """``CUDA graphs`` when the decode replayed them, else ``eager`` (off, unavailable, or a row written before
        ``--cuda-graphs``: all of those ran every kernel eagerly)."""
        return "CUDA graphs" if self.cuda_graphs == "used" else "eager"

    @property
    def decode_label(self) -> str:
        """How tokens were chosen, e.g. ``greedy`` or ``sample T=1 seed=0``."""

        return DecodeSetting.from_dict(self.decode).label

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "ResultRow":
        if data.get("schema_version") != SCHEMA_VERSION:
            raise UsageError(f"row has schema version {data.get('schema_version')!r}; this specterbench reads "
                             f"version {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class RowWriter:
    """Appends rows to ``rows.jsonl`` and fsyncs each one, so an interrupted run loses nothing finished."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, row: ResultRow) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(row.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())


def iter_rows(path: Path, on_error: str = "stop") -> Iterator[ResultRow]:
    """Rows of a ``rows.jsonl``; a corrupt line stops with its line number, or is skipped with ``on_error='skip'``."""
    path = Path(path)
    if path.is_dir():
        path = path / "rows.jsonl"
    if not path.exists():
        raise UsageError(f"no results at {path}; run `specterbench run` first or pass a run folder")
    with open(path, "rb") as f:  # bytes: a line of binary garbage is one bad row, not a UnicodeDecodeError
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw.decode("utf-8"))
                if not isinstance(data, dict):
                    raise TypeError(f"a row is a JSON object, this line holds a {type(data).__name__}")
                yield ResultRow.from_dict(data)
            except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, ValueError, UsageError) as err:
                if on_error == "skip":
                    continue
                reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
                raise UsageError(f"{path}:{lineno}: corrupt or partial row ({reason}); pass --on-error skip to "
                                 f"skip bad lines") from None


def read_rows(path: Path, on_error: str = "stop", allow_empty: bool = False) -> list[ResultRow]:
    """Every row of a ``rows.jsonl`` (or of a run folder's); a file without a row is an error like a missing one
    (``allow_empty``: a run resuming its own folder, stopped before its first row)."""
    rows = list(iter_rows(path, on_error))
    if not rows and not allow_empty:
        path = Path(path)
        path = path / "rows.jsonl" if path.is_dir() else path
        raise UsageError(f"no rows in {path} (the run stopped before its first cell finished, or the file was "
                         f"emptied); run it again with specterbench run --resume {path.parent}, or pass another "
                         f"run folder")
    return rows


def integrity_problems(rows: list[ResultRow], source, run_ids: set[str] | None = None) -> list[str]:
    """What makes ``rows`` of one run folder unsafe to report as one run, one line each (empty when sound): a
    cell with more than one finished row (its numbers would count twice) and rows of another run (a foreign run's
    rows appended to this one). ``run_ids``: the runs the folder says it holds (:func:`~specterbench.runfiles.
    rundir.run_ids`); without it, the run id most rows carry. An error row followed by a row of the same cell is a
    resumed cell, not a duplicate."""
    problems = []
    finished = Counter(r.cell for r in rows if r.status != "error")
    twice = {cell: n for cell, n in finished.items() if n > 1}
    if twice:
        cell, n = next(iter(twice.items()))
        more = f" and {len(twice) - 1} more cell(s)" if len(twice) > 1 else ""
        problems.append(f"{source}: cell {cell!r} has {n} finished rows{more}; a cell is measured once — keep one "
                        f"row per cell (rows are counted once each here, so its numbers weigh {n} times)")
    ids = Counter(r.run_id for r in rows)
    own = run_ids if run_ids else {ids.most_common(1)[0][0]} if ids else set()
    foreign = {rid: n for rid, n in ids.items() if rid not in own}
    if foreign:
        listed = ", ".join(f"{rid!r} ({n} rows)" for rid, n in foreign.items())
        problems.append(f"{source}: rows of another run among run {', '.join(sorted(own))}'s: {listed}; rows of "
                        f"another run were appended here — move them to their own folder")
    return problems
