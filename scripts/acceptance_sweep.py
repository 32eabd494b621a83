"""Specter's speed-up over the strongest other lossless strategy against the draft's measured acceptance.

    .venv/bin/python scripts/acceptance_sweep.py [--models tiny-mixtral,tiny-qwen-moe] [--bits 4,3,2]
        [--scales off,model,2x] [--budgets 35%,50%] [--profile a100-40g-pcie4] [--prompts 4] [--tokens 64]
        [--out results/acceptance-sweep]

Each model is priced at the geometry it stands for (Mixtral-8x7B, Qwen1.5-MoE). The other lossless strategies run
once per model; Specter and its ablation ``spec-host`` (same draft, governor, residents and host path, no lookahead)
run once per (draft bits, error scale): the draft's acceptance moves with both, the other strategies do not; a budget
the draft does not fit is reported as refused. ``--scales``: ``off`` (no calibration), ``model`` (the model's own
draft-fidelity calibration: routed experts' and output head's error scales) and ``Nx`` (N times both). Prints one table
row per (geometry, budget, bits, scale) — the draft's per-token agreement with its target (sampled at the default
decode, teacher-forced on held-out text: the acceptance it offers), Specter's measured per-token acceptance where it
drafted, and its speed-up — and per geometry, budget and draft bit width the bracket of the break-even agreement: the
highest swept agreement at which Specter does not beat the strongest non-speculative strategy (and, per budget over
every draft, the strongest of all, ``spec-host`` with the same draft included) and the lowest above it at which it
does; a cell whose draft was released counts as no win. Cells below 0.97× ``cpu-experts`` (the floor) are listed with
the governor's K choices.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

OTHERS = "cpu-experts,lru,next-layer-gate,static,activation-aware,specmoeoff,spec-decode"


def run(args, model: str, strategies: str, out: Path, run_id: str, sets: list[str],
        budgets: str | None = None) -> list[dict]:
    """One ``specterbench run`` (skipped when its rows exist); its rows. A run the harness refuses (exit 2, e.g. a
    budget below what the draft needs) gives one row per budget with ``status`` "refused" and the refusal's line."""
    budgets = budgets or args.budgets
    rows = out / run_id / "rows.jsonl"
    refused = out / run_id / "refused.txt"
    if not rows.is_file() and not refused.is_file():
        cmd = [sys.executable, "-m", "specterbench.cli", "run", "--model", model, "--strategies", strategies,
               "--budgets", budgets, "--profile", args.profile, "--prompts", str(args.prompts), "--tokens",
               str(args.tokens), "--out", str(out), "--run-id", run_id, "--quiet"]
        for s in sets:
            cmd += ["--set", s]
        print("$", " ".join(cmd[2:]), flush=True)
        done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        if done.returncode == 2:  # the harness's UsageError: nothing ran
            refused.parent.mkdir(parents=True, exist_ok=True)
            refused.write_text(done.stderr.strip().splitlines()[-1] + "\n")
        elif done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"{' '.join(cmd[2:])} failed (exit {done.returncode})")
    if refused.is_file():
        line = refused.read_text().strip()
        return [{"strategy": name, "budget_fraction": float(b.rstrip("%")) / 100, "status": "refused", "error": line,
                 "tpot_ms": None} for name in strategies.split(",") for b in budgets.split(",")]
    return [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]


def run_per_budget(args, model: str, strategies: str, out: Path, run_id: str, sets: list[str]) -> list[dict]:
    """:func:`run` over every budget; where the harness refuses the whole grid (one budget too small for the draft),
    each budget on its own, so the budgets that fit are still measured."""
    rows = run(args, model, strategies, out, run_id, sets)
    if all(r.get("status") != "refused" for r in rows) or "," not in args.budgets:
        return rows
    return [r for b in args.budgets.split(",")
            for r in run(args, model, strategies, out, f"{run_id}-b{b.rstrip('%')}", sets, budgets=b)]


def model_scales(model: str) -> tuple[float, float]:
    """The model's draft-fidelity calibration: (routed experts' error scale, output head's)."""
    from specterbench.catalog import embedded
    from specterbench.catalog.embedded import load_calibration

    cal = load_calibration(embedded.model_dir(model))
    return (cal.error_scale, cal.head_error_scale) if cal is not None else (1.0, 1.0)


def parse_scales(text: str, own: tuple[float, float]) -> list[tuple[str, float, float]]:
    """``off`` (no calibration), ``model`` (the model's), ``Nx`` (N times the model's scales): a list of
    ``(label, experts' scale, head's scale)``."""
    out = []
    for item in (i.strip() for i in text.split(",")):
        if item == "off":
            out.append(("uncalibrated", 1.0, 1.0))
        elif item == "model":
            out.append((f"calibrated ×{own[0]:g} / head ×{own[1]:g}", *own))
        elif item.endswith("x"):
            f = float(item[:-1])
            e, h = max(1.0, f * own[0]), max(1.0, f * own[1])
            out.append((f"{item} the calibration ×{e:.3g} / head ×{h:.3g}", e, h))
        else:
            raise SystemExit(f"--scales: {item!r} is not off, model or Nx (e.g. 2x)")
    return out


def draft_agreement(model_name: str, bits: int, scale: float, head: float, windows: int = 4) -> float:
    """The draft's per-token agreement with its target, sampled at the default decode and teacher-forced on
    held-out windows (:mod:`specterbench.studies.fidelity`): the acceptance the draft offers, whatever K the
    governor then takes (none, when it predicts plain decoding cheaper)."""
    import torch

    from specterbench.catalog import corpus, embedded
    from specterbench.engine.dense_copy import dense_spec
    from specterbench.engine.draft import QuantSpec
    from specterbench.studies import fidelity

    torch.set_num_threads(1)
    if model_name not in _LOADED:
        model, tok = embedded.load(model_name)
        _LOADED[model_name] = (model, corpus.text_windows(tok, windows, 256))
    model, held = _LOADED[model_name]
    spec = QuantSpec(bits=bits, blocksize=128, quantizer="int", error_scale=scale)
    return fidelity.agreement(model, fidelity.draft_copy(model, spec, dense_spec(8, head_error_scale=head)),
                              held).sampled


_LOADED: dict = {}


def break_even(points: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """Where Specter stops winning (points: (draft agreement, speed-up)): the highest agreement at which it does not
    win (speed-up ≤ 1.0) and the lowest agreement above that at which it does; None where the sweep has no such
    point. (Not an interpolation: below its break-even the governor drafts less or not at all, so the speed-up
    flattens at ≈1.0× or drops, it does not fall along a line.)"""
    losing = [a for a, s in points if s <= 1.0]
    below = max(losing) if losing else None
    winning = [a for a, s in points if s > 1.0 and (below is None or a > below)]
    return below, (min(winning) if winning else None)


def k_histogram(extra: dict) -> str:
    """The governor's K choices of a row, ``K:windows`` from the most used, e.g. ``0:120 8:4``."""
    hist = {int(k): n for k, n in (extra.get("k_hist") or {}).items()}
    return " ".join(f"{k}:{n}" for k, n in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))) or "–"


def speedup(other: dict | None, row: dict) -> float | None:
    """``other``'s TPOT over ``row``'s (above 1: ``row`` is faster); None where either has no TPOT."""
    if other is None or other.get("tpot_ms") is None or row.get("tpot_ms") is None:
        return None
    return other["tpot_ms"] / row["tpot_ms"]


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def crossing(where: str, points: list[tuple[float, float]]) -> str:
    """One line: the break-even bracket of ``points`` (draft agreement, speed-up)."""
    below, above = break_even([(a, x) for a, x in points if a is not None])
    return (f"- {where}: Specter " + (f"does not win at draft agreement ≤ {below:.3f}" if below is not None
                                       else "wins at every swept agreement")
            + (f", wins from {above:.3f}" if above is not None else ", at none above it")
            + (" (break-even between)" if below is not None and above is not None else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny-mixtral,tiny-qwen-moe")
    p.add_argument("--bits", default="4,3,2")
    p.add_argument("--scales", default="off,model,2x")
    p.add_argument("--budgets", default="35%,50%")
    p.add_argument("--profile", default="a100-40g-pcie4")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--others", default=OTHERS, help="the other non-speculative lossless strategies to beat")
    p.add_argument("--out", type=Path, default=Path("results/acceptance-sweep"))
    args = p.parse_args(argv)
    table = ["| geometry | budget | draft | draft agreement | Specter acceptance | mean accepted "
             "| K chosen (K:windows) | Specter ms | cpu-experts ms | ÷ cpu-experts | spec-host ms | ÷ spec-host "
             "| strongest other | ÷ it |",
             "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    crossings, floor = [], []
    for model in args.models.split(","):
        own = model_scales(model)
        tag = f"{model}-{args.profile}-{args.prompts}x{args.tokens}"
        others = run(args, model, args.others, args.out, f"{tag}-others", [])
        best: dict[float, dict] = {}  # the strongest non-speculative lossless strategy per budget
        cpu: dict[float, dict] = {}
        for r in others:
            b = round(r["budget_fraction"], 3)
            if r.get("strategy") == "cpu-experts":
                cpu[b] = r
            if r.get("lossless_strategy") and r.get("tpot_ms") is not None:
                if b not in best or r["tpot_ms"] < best[b]["tpot_ms"]:
                    best[b] = r
        points: dict[float, list] = {}  # (draft agreement, speed-up over the strongest other, spec-host included)
        # per (budget, draft bits): (draft agreement, speed-up over the strongest non-speculative strategy) — each
        # format has its own price per draft step (int4 has a kernel, int3/int2 are dequantized), so its own break-even
        plain_points: dict[tuple, list] = {}
        geometry = next((r["geometry"] for r in others if r.get("geometry")), model)
        for bits in (int(b) for b in args.bits.split(",")):
            for label, scale, head in parse_scales(args.scales, own):
                draft = [f"bits={bits}", f"error_scale={scale}", f"head_error_scale={head}"]
                # Specter and its ablation spec-host (same draft, governor, residents and host path; no lookahead)
                rows = run_per_budget(args, model, "specter,spec-host", args.out,
                                      f"{tag}-specter-int{bits}-x{scale:g}-h{head:g}",
                                      [f"{s}.{o}" for s in ("specter", "spec-host") for o in draft])
                agree = draft_agreement(model, bits, scale, head)
                ablation = {round(r["budget_fraction"], 3): r for r in rows if r["strategy"] == "spec-host"}
                for r in (r for r in rows if r["strategy"] == "specter"):
                    b = round(r["budget_fraction"], 3)
                    geometry = r.get("geometry") or geometry
                    name = f"int{bits}/g128 {label}"
                    if r.get("tpot_ms") is None:
                        reason = (r.get("error") or r.get("status") or "no TPOT").split("\n")[0]
                        needs = re.search(r"smallest budget that works is ([0-9.]+%)", reason)
                        reason = f"refused: the draft needs {needs.group(1)}" if needs else reason
                        table.append(f"| {geometry} | {b:.0%} | {name} | {agree:.3f} | {reason} |||||||||")
                        continue
                    extra = r.get("extra") or {}
                    alpha = extra.get("per_token_acceptance")
                    mean_len = extra.get("mean_accepted_tokens")
                    host = ablation.get(b)
                    rivals = [x for x in (best.get(b), host) if x is not None and x.get("tpot_ms") is not None]
                    strongest = min(rivals, key=lambda x: x["tpot_ms"]) if rivals else None
                    over_cpu, over_host, over_best = speedup(cpu.get(b), r), speedup(host, r), speedup(strongest, r)
                    # a released draft is not speculation winning: whatever the cell gains over the others then
                    # comes from Specter's cache over plain decoding, so for the break-even it counts as no win
                    cap = 1.0 if extra.get("draft_released") else float("inf")
                    if over_best is not None:
                        points.setdefault(b, []).append((agree, min(cap, over_best)))
                    if speedup(best.get(b), r) is not None:
                        plain_points.setdefault((b, bits), []).append((agree, min(cap, speedup(best.get(b), r))))
                    if over_cpu is not None and over_cpu < 0.97:
                        floor.append(f"- {geometry} {b:.0%} {name} (agreement {agree:.3f}): {over_cpu:.3f}× "
                                     f"cpu-experts, K chosen {k_histogram(extra)}")
                    released = " (draft released)" if extra.get("draft_released") else ""
                    table.append(
                        f"| {geometry} | {b:.0%} | {name} | {agree:.3f} | "
                        f"{'–' if alpha is None else format(alpha, '.3f')} | "
                        f"{'–' if mean_len is None else format(mean_len, '.2f')} | {k_histogram(extra)}{released} | "
                        f"{r['tpot_ms']:.1f} | {'–' if b not in cpu else format(cpu[b]['tpot_ms'], '.1f')} | "
                        f"{_x(over_cpu)} | "
                        f"{'–' if host is None or host.get('tpot_ms') is None else format(host['tpot_ms'], '.1f')} | "
                        f"{_x(over_host)} | {'–' if strongest is None else strongest['strategy']} | {_x(over_best)} |")
        for (b, bits), pts in sorted(plain_points.items()):
            crossings.append(crossing(f"{geometry} at {b:.0%}, int{bits} drafts, against the strongest "
                                      f"non-speculative strategy", pts))
        for b, pts in sorted(points.items()):
            crossings.append(crossing(f"{geometry} at {b:.0%}, every draft, against the strongest other "
                                      f"(spec-host included)", pts))
    print("\n".join(table))
    print()
    print("\n".join(crossings))
    print()
    print("Floor (≥ 0.97× cpu-experts): " + ("held in every cell" if not floor else "broken in:\n" + "\n".join(floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
