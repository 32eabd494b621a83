"""``specterbench validate --profile PATH``: run the same cells measured and modeled, and print the model's error.

Both runs decode the same model, prompts and budgets with each strategy; one on the measured clock (CUDA events
and wall time with synchronisation on a GPU — host wall time on a CPU-only machine), one on the modeled clock
priced by the profile file (normally written by ``specterbench calibrate`` on this machine) at the model's own
geometry. Per (strategy, budget) it prints the mean time per output token of each and the relative error
``modeled / measured - 1`` (negative: the model is optimistic). Means, not medians: a speculative window's
tokens share one time, so the median hides the slow windows.

The model runs in ``--dtype`` (bf16 by default: what the modeled clock prices). Results: ``validate.json`` and
``validate.md`` under ``--out``, beside the two run folders (``measured/``, ``modeled/``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.models import ModelSpec
from specterbench.engine.sampling import DecodeSetting
from specterbench.errors import UsageError

DEFAULT_STRATEGIES = ("lru", "specter", "oracle", "cpu-experts")


@dataclass(frozen=True, slots=True)
class Comparison:
    strategy: str
    budget_fraction: float
    measured_tpot_ms: float | None  # mean per decode token; host wall time on a CPU-only machine
    modeled_tpot_ms: float | None
    error: float | None  # modeled / measured - 1
    measured_clock: str  # measured (CUDA) | host
    status: str  # ok, or the failing run's status and error
    measured_hit_rate: float | None = None
    modeled_hit_rate: float | None = None


def model_in_dtype(host, name: str, dtype: torch.dtype) -> str:
    """Register ``<model>@<dtype>``, the model ``name`` cast to ``dtype``, and return its name."""
    spec = host.models().get(name)

    def load():
        model, tokenizer = spec.load()
        return model.to(dtype), tokenizer

    tag = str(dtype).replace("torch.", "")
    cast = ModelSpec(name=f"{spec.name}@{tag}", family=spec.family, kind=spec.kind, load=load,
                     description=f"{spec.name} cast to {tag}", geometry=spec.geometry)
    host.add(f"dtype-model:{cast.name}", models=[cast])
    return cast.name


def mean_tpot_ms(row, key: str) -> float | None:
    xs = (row.samples or {}).get(key) or []
    return statistics.fmean(xs) if xs else None


def compare(measured_rows, modeled_rows) -> list[Comparison]:
    modeled = {(r.strategy, round(r.budget_fraction, 6)): r for r in modeled_rows}
    out = []
    for m in measured_rows:
        key = (m.strategy, round(m.budget_fraction, 6))
        d = modeled.get(key)
        measured_key = "tpot_ms" if m.clock == "measured" else "host_ms"
        got = mean_tpot_ms(m, measured_key) if m.status == "ok" else None
        want = mean_tpot_ms(d, "tpot_ms") if d is not None and d.status == "ok" else None
        status = "ok"
        for r, label in ((m, "measured"), (d, "modeled")):
            if r is None:
                status = f"{label}: no row"
            elif r.status != "ok":
                status = f"{label} {r.status}: {r.error}"
        error = want / got - 1 if got and want is not None else None
        out.append(Comparison(m.strategy, m.budget_fraction, got, want, error, m.clock, status,
                              m.hit_rate, d.hit_rate if d is not None else None))
    return out


def render(comparisons, profile: str, model: str) -> str:
    lines = [f"Modeled vs measured TPOT — model {model}, profile {profile} (mean ms per decode token; "
             f"error = modeled / measured - 1)", "",
             "| strategy | budget | measured ms | modeled ms | error | measured clock | hit rate meas./mod. | status |",
             "|---|---|---|---|---|---|---|---|"]

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    for c in comparisons:
        lines.append(f"| {c.strategy} | {c.budget_fraction:.0%} | {f(c.measured_tpot_ms, '.3f')} | "
                     f"{f(c.modeled_tpot_ms, '.3f')} | {f(c.error, '+.1%')} | {c.measured_clock} | "
                     f"{f(c.measured_hit_rate, '.3f')}/{f(c.modeled_hit_rate, '.3f')} | {c.status} |")
    errors = [abs(c.error) for c in comparisons if c.error is not None]
    if errors:
        lines += ["", f"mean |error| {statistics.fmean(errors):.1%}, max |error| {max(errors):.1%} over "
                      f"{len(errors)} cell(s)"]
    if any(c.measured_clock == "host" for c in comparisons):
        lines += ["", "measured = host wall time on a CPU-only machine (no GPU): this checks the model of the host, "
                      "not a GPU's TPOT"]
    return "\n".join(lines) + "\n"


def validate(host, *, profile_path, model: str, strategies, budgets, prompts: int, tokens: int, device: str,
             out: Path, threads: int | None = None, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
             strategy_options: dict | None = None, progress=None) -> tuple[list[Comparison], str]:

    for clock in ("measured", "modeled"):
        if (Path(out) / clock / "rows.jsonl").exists():
            raise UsageError(f"--out {out} already holds a validation ({clock}/rows.jsonl); pass another --out or "
                             f"remove it")
    profile, host_profile = host.register_profile_file(profile_path)
    name = model_in_dtype(host, model, dtype)
    if threads is None:
        threads = host.host_profiles().get(host_profile).threads if host_profile else 1
    base = BenchConfig(models=(name,), strategies=tuple(strategies), budgets=tuple(budgets), profile=profile,
                       host_profile=host_profile or "desktop-ddr5", geometry="own", clock="measured",
                       prompts=prompts, tokens=tokens, device=device, threads=threads, seed=seed,
                       decode=DecodeSetting(mode="greedy"), strategy_options=dict(strategy_options or {}))
    base.validate(host)
    rows = {}
    for clock in ("measured", "modeled"):
        if progress:
            progress(f"validate · {clock} clock")
        rows[clock] = Runner(host, replace(base, clock=clock), Path(out) / clock, progress=progress).run()
    comparisons = compare(rows["measured"], rows["modeled"])
    text = render(comparisons, profile, name)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "validate.md").write_text(text, encoding="utf-8")
    (Path(out) / "validate.json").write_text(json.dumps(
        {"profile": profile, "profile_file": str(profile_path), "model": name, "device": device,
         "threads": threads, "comparisons": [asdict(c) for c in comparisons]}, indent=2), encoding="utf-8")
    return comparisons, text
