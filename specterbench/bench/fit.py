"""What to run on my card: device memory swept over the sizes users own, every chosen strategy at each size.

Each size is a card budget (:mod:`specterbench.bench.device_memory`): what the card leaves for experts after the
priced model's dense weights, the KV cache at the cell's context, activations and the runtime reserve. The model is
loaded, its reference recorded and its routing calibrated once; every (size, strategy) is then one cell of the
runner, written to ``rows.jsonl`` as ``specterbench run`` writes it. A size too small for the dense weights, or below
what a strategy needs, is a point that did not run, with the reason. Two sizes that leave a strategy the same bytes
(every expert fits) run once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specterbench.bench.budget import Budget
from specterbench.bench.checks import check_context, check_workload_size
from specterbench.bench.config import BenchConfig
from specterbench.bench.device_memory import parse_memory, resolve_cards, size_text
from specterbench.bench.runner import Runner, encode_prompts, load_prompts
from specterbench.errors import BudgetError, UsageError
from specterbench.runfiles.reference import write_reference
from specterbench.runfiles.results import ResultRow

#: card sizes users own, in GB as vendors sell them (8 GB consumer cards to 80 GB data-centre ones)
DEFAULT_SIZES = "8GB,12GB,16GB,24GB,32GB,40GB,48GB,80GB"
#: llama.cpp's layer split at --fit, Specter, the KTransformers-style hybrid, an LRU cache, Fiddler's host experts
DEFAULT_STRATEGIES = ("n-cpu-moe", "specter", "kt-hybrid", "lru", "cpu-experts")


def parse_sizes(text: str) -> list[int]:
    """``8GB,24GiB`` → bytes, ascending, each once; a size without a unit is one line."""
    sizes = [part.strip() for part in str(text).split(",") if part.strip()]
    if not sizes:
        raise UsageError(f"--sizes is empty; give card sizes with a unit, e.g. --sizes {DEFAULT_SIZES}")
    return sorted({parse_memory(s, "--sizes") for s in sizes})


@dataclass(slots=True)
class FitPoint:
    """One strategy on one card: its row, or why it did not run."""

    card_bytes: int
    strategy: str
    row: ResultRow | None = None
    reason: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        if self.row is None or self.row.status != "ok":
            return None
        return self.row.tokens_per_s

    def setting(self) -> str:
        """What to set to get this point: the layer split's ``--n-cpu-moe N``, or the experts' bytes on the card."""
        r = self.row
        if r is None:
            return "-"
        if "n_cpu_moe" in r.extra:
            return f"--n-cpu-moe {r.extra['n_cpu_moe']} ({r.extra['moe_layers'] - r.extra['n_cpu_moe']}/" \
                   f"{r.extra['moe_layers']} MoE layers on the card)"
        plan = r.extra.get("device_plan") or {}
        return f"{plan.get('expert_bytes', 0) / 1e9:.1f} GB of experts cached ({r.budget_fraction:.0%})"


def _rank(p: FitPoint) -> float:
    """Tokens/s, a speculative point that released its draft a hair lower: it ran as its non-speculative ablation,
    so where it ties that ablation's own strategy, the table names the strategy that ran."""
    return p.tokens_per_s * (0.999 if p.row.extra.get("draft_released") else 1.0)


def best(points: list[FitPoint]) -> dict[int, FitPoint | None]:
    """Per card size, the point of most tokens/s (None when nothing ran there)."""
    out: dict[int, FitPoint | None] = {}
    for p in points:
        cur = out.get(p.card_bytes)
        if p.tokens_per_s is not None and (cur is None or _rank(p) > _rank(cur)):
            out[p.card_bytes] = p
        else:
            out.setdefault(p.card_bytes, None)
    return out


class Fit:
    """Run ``config``'s strategies (its budgets are ignored) at each of ``sizes`` on ``config``'s one model."""

    def __init__(self, host, config: BenchConfig, sizes: list[int], run_dir: Path, *,
                 progress: Callable[[str], None] | None = None, reserve: int | None = None):
        if len(config.models) != 1:
            raise UsageError("fit sizes one model at a time; give one --model")
        self.host, self.config, self.sizes, self.reserve = host, config, sizes, reserve
        self.progress = progress or (lambda msg: None)
        self.runner = Runner(host, config, run_dir, progress=self.progress)

    def run(self) -> list[FitPoint]:
        cfg, host, runner = self.config, self.host, self.runner
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads)  # as a run: one host thread unless told
        texts = load_prompts(cfg.workload, cfg.prompts)
        check_workload_size(cfg.workload, cfg.prompts, texts)
        engine = runner.load_engine(cfg.models[0])
        prompts = encode_prompts(engine, texts, cfg.max_prompt_tokens)
        check_context(engine, prompts, cfg.tokens)
        longest = max(len(ids) for _, ids in prompts)
        self.progress(f"{engine.name}: recording the reference")
        reference = runner.record_reference(engine, prompts)
        write_reference(runner.run_dir, model=engine.name, workload=cfg.workload, decode=cfg.decode,
                        prompts=prompts, reference=reference, tokenizer=engine.tokenizer, top_k=engine.top_k)
        calibration, ran, points = None, {}, []
        total = engine.total_expert_bytes
        for size in self.sizes:
            try:
                card = Budget(size_text(size), card_bytes=size, card_reserve=self.reserve)
                (budget,) = resolve_cards((card,), engine, longest, cfg.tokens, cfg)
            except BudgetError as err:
                points += [FitPoint(size, s, reason=f"card too small: {err}") for s in cfg.strategies]
                continue
            nbytes = budget.resolve(total)
            for name in cfg.strategies:
                cls, options = host.strategies().get(name), dict(cfg.strategy_options.get(name, {}))
                reason = self._refusal(cls, engine, nbytes, options)
                if reason is not None:
                    points.append(FitPoint(size, name, reason=reason))
                    continue
                if (name, nbytes) in ran:  # every expert fits on both cards: the same cell
                    points.append(FitPoint(size, name, ran[(name, nbytes)].row))
                    continue
                if cls.uses_calibration and calibration is None:
                    self.progress(f"{engine.name}: calibrating routing")
                    calibration = runner.calibrate(engine)
                one = dataclasses.replace(cfg, strategies=(name,), budgets=(budget,))
                key = next(iter(Runner(host, one, runner.run_dir, env={}).cells(cfg.models[0])))[0]
                self.progress(f"{size_text(size)} card · {name}")
                row = runner.run_cell(engine, key, name, cls, budget, 0, prompts, reference, calibration)
                runner.writer.append(row)
                runner.rows.append(row)
                ran[(name, nbytes)] = point = FitPoint(size, name, row)
                points.append(point)
        return points

    @staticmethod
    def _refusal(cls, engine, nbytes: int, options: dict) -> str | None:
        """Why ``cls`` cannot run on ``nbytes`` of experts (its floor, its own check), or None."""
        floor = cls.min_budget(engine, options)
        if nbytes < floor:
            return f"needs {floor / engine.total_expert_bytes:.1%} of expert bytes, the card leaves " \
                   f"{nbytes / engine.total_expert_bytes:.1%}"
        try:
            cls.check_budget(engine, nbytes, options)
        except (BudgetError, UsageError) as err:
            return str(err)
        return None
