"""``validate`` at real expert sizes, for scripts/gpu_check.sh: random-init checkpoints with a few layers of Mixtral
(8 experts of 352 MB, top-2) or of Qwen1.5-MoE (60 experts of 17 MB, top-4, a shared expert), decoded measured and
modeled with the calibrated profile; prints validate's Markdown table (measured TPOT, modeled TPOT, error per
strategy, lossless or not).

    python scripts/gpu_validate.py mixtral|qwen-moe PROFILE.toml WORKDIR [--strategies ...] [--budgets 50%]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def config(geometry: str):
    if geometry == "mixtral":
        from transformers import MixtralConfig

        return MixtralConfig(vocab_size=512, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                             num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                             num_experts_per_tok=2, max_position_embeddings=512)
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(vocab_size=512, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                          shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                          num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                          max_position_embeddings=512, decoder_sparse_step=1, mlp_only_layers=[])


def main(argv=None) -> int:
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.validate import validate
    from specterbench.catalog.checkpoint import write_random_checkpoint
    from specterbench.plugins.host import get_host

    p = argparse.ArgumentParser()
    p.add_argument("geometry", choices=("mixtral", "qwen-moe"))
    p.add_argument("profile")
    p.add_argument("workdir")
    p.add_argument("--strategies", default="lru,cpu-experts,specter,oracle")
    p.add_argument("--budgets", default="50%")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args(argv)
    work = Path(args.workdir)
    ckpt = work / f"random-{args.geometry}"
    if not (ckpt / "config.json").exists():
        write_random_checkpoint(ckpt, config(args.geometry))
    host = get_host()
    name = host.register_local_model(str(ckpt))
    _, text = validate(host, profile_path=args.profile, model=name,
                       strategies=tuple(args.strategies.split(",")),
                       budgets=tuple(parse_budget(b) for b in args.budgets.split(",")), prompts=args.prompts,
                       tokens=args.tokens, device="cuda", out=work / f"validate-{args.geometry}", threads=None,
                       dtype=torch.bfloat16, strategy_options={"specter": {"k": 4}},  # no K profiling: time
                       progress=lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    print(f"### validate at {args.geometry} expert sizes ({ckpt.name})\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
