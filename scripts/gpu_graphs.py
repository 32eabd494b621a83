"""Host time per decode token with and without ``--cuda-graphs`` on a GPU, for scripts/gpu_check.sh: the tiny-qwen-moe
stand-in with every expert resident (Qwen1.5-MoE's routing: 60 experts x 24 MoE layers, top-4 and a shared expert),
decoded greedily with graphs off and with graphs auto; prints a Markdown table of the median host ms per decode token
(synchronised wall time, what a launch-bound decode costs) beside the modeled resident TPOT at Qwen1.5-MoE's geometry
for each setting, the graph state and its reason, and whether the tokens agree. About half a minute.

    python scripts/gpu_graphs.py [--profile a100-40g-pcie4] [--tokens 48] [--prompts 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def decode(engine, strategy_cls, profile, prompts, tokens, setting):
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile
    from specterbench.strategy import Request

    engine.configure(strategy_cls(), engine.total_expert_bytes,
                     ModeledClock(profile, engine.geometry, default_host_profile()))
    engine.strategy.prepare(engine, None)
    state = engine.setup_graphs(setting)
    outputs, host_ms, modeled_ms = [], [], []
    for i, ids in enumerate([prompts[0]] + prompts):  # the first request warms up (and captures)
        request = Request(f"p{i}", ids, tokens)
        engine.begin_request(request)
        out = engine.decode(request)
        if i:
            outputs.append(out)
            host_ms += [s.wall_s * 1e3 for s in engine.samples[1:]]
            modeled_ms += [s.clock_s * 1e3 for s in engine.samples[1:]]
    state = engine.graphs.state  # a capture that failed during the decode says so here
    engine.end_cell()
    return outputs, statistics.median(host_ms), statistics.median(modeled_ms), state


def main(argv=None) -> int:
    from specterbench.bench.runner import encode_prompts, load_prompts
    from specterbench.engine.engine import Engine
    from specterbench.engine.geometry import project
    from specterbench.plugins.host import get_host

    p = argparse.ArgumentParser()
    p.add_argument("--profile", default="a100-40g-pcie4")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda; cpu only checks the script (graphs are unavailable there)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script measures CUDA graphs on a GPU (--device cpu checks the script)",
              file=sys.stderr)
        return 2
    host = get_host()
    model, tokenizer = host.models().get("tiny-qwen-moe").load()
    engine = Engine(model, name="tiny-qwen-moe", device=args.device, tokenizer=tokenizer)
    engine.geometry = project(engine.own_geometry, "qwen-moe")
    profile = host.profiles().get(args.profile)
    resident = host.strategies().get("resident")
    prompts = [ids for _, ids in encode_prompts(engine, load_prompts("shakespeare-heldout-v1", args.prompts), 64)]
    rows, tokens = [], {}
    for setting in ("off", "auto"):
        out, host_ms, modeled_ms, state = decode(engine, resident, profile, prompts, args.tokens, setting)
        tokens[setting] = out
        rows.append(f"| {setting} | {state.mode} | {state.reason} | {host_ms:.2f} | {modeled_ms:.3f} |")
    print(f"## CUDA graphs: tiny-qwen-moe, every expert resident, {args.prompts} prompts x {args.tokens} tokens "
          f"(modeled at Qwen1.5-MoE geometry, {profile.name}; kernels: {engine.kernels})\n")
    print("| --cuda-graphs | state | reason | host ms / decode token (median) | modeled resident TPOT ms |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    same = tokens["off"] == tokens["auto"]
    print(f"\ntokens with graphs equal tokens without: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
