"""Which decode setting routes most like teacher-forced text? The measurement behind the default of ``make bench``.

    .venv/bin/python scripts/decode_closeness.py [--models tiny-mixtral,tiny-qwen-moe,tiny-deepseek]
        [--temperatures 0.7,1.0]

For each embedded model and each setting (greedy, then sampling at each temperature) it runs the realism report
(:mod:`specterbench.studies.realism`: routing of the held-out text teacher-forced, and of the sampled
continuations of the benchmark prompts) and prints, per setting, the mean absolute difference between decode and
teacher-forced routing over model-level LRU at rho = 1, 2, Belady at rho = 2, per-layer LRU at the bench budgets and
adjacent-token expert reuse, with the share of repeated 8-grams. The closest sampled setting is the default.
"""

from __future__ import annotations

import argparse
import sys

from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.studies.realism import report

KEYS = ("lru_rho1", "lru_rho2", "belady_rho2", "layer_lru_35pct", "layer_lru_50pct", "adjacent_reuse")


def closeness(rep: dict) -> float:
    tf, dec = rep["teacher_forced"], rep["decode"]
    return sum(abs(dec[k] - tf[k]) for k in KEYS) / len(KEYS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny-mixtral,tiny-qwen-moe,tiny-deepseek")
    p.add_argument("--temperatures", default="0.7,1.0")
    args = p.parse_args(argv)
    settings = [GREEDY] + [DecodeSetting.sample(temperature=float(t)) for t in args.temperatures.split(",")]
    print("| model | decode | mean abs diff vs teacher-forced | " + " | ".join(KEYS) + " | repeated 8-grams |")
    print("|---|---|---|" + "---|" * len(KEYS) + "---|")
    best: dict[str, tuple[float, str]] = {}
    for model in args.models.split(","):
        for setting in settings:
            rep = report(model, decode=setting, draft=False)
            tf, dec = rep["teacher_forced"], rep["decode"]
            d = closeness(rep)
            cells = " | ".join(f"{dec[k]:.3f} ({dec[k] - tf[k]:+.3f})" for k in KEYS)
            print(f"| {model} | {setting.label} | {d:.4f} | {cells} | {dec['repeated_8gram_share']:.3f} |", flush=True)
            if setting.mode == "sample" and (model not in best or d < best[model][0]):
                best[model] = (d, setting.label)
    for model, (d, label) in best.items():
        print(f"closest sampled setting for {model}: {label} (mean abs diff {d:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
