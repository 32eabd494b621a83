"""Does a stand-in route like the real model it stands for? Local routing consistency beside the published figures.

    specterbench realism --model tiny-qwen-moe [--json]
    python -m specterbench.embedded.realism --model tiny-qwen-moe [--path DIR] [--json]

Teacher-forced on held-out text (works never seen by tokenizer or model) and, where a decode function is given,
on the default decode of the benchmark prompts. Definitions: :mod:`specterbench.embedded.lrc`; published values
and their sources: ``published_routing.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

PUBLISHED_PATH = Path(__file__).resolve().parent / "published_routing.json"

#: metrics held to a tolerance (issue 14): model-level LRU at ρ=1, 2 and Belady at ρ=2 within ±0.08, SRP ±8 points
TOLERANCES = {"lru_rho1": 0.08, "lru_rho2": 0.08, "belady_rho2": 0.08, "srp_m16": 8.0}


def load_published() -> dict:
    """The published routing table: ``{"sources": {...}, "models": {key: {...}}}``."""
    return json.loads(PUBLISHED_PATH.read_text())


def num_experts(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None) or cfg.num_experts)


@torch.no_grad()
def capture_traces(model, windows: torch.Tensor, batch_size: int = 16) -> list[np.ndarray]:
    """Teacher-forced routing of each window: a list of ``(T, L, k)`` int arrays (top-k of each MoE layer's router)."""
    was_training = model.training
    model.eval()
    k = int(model.config.num_experts_per_tok)
    traces: list[np.ndarray] = []
    try:
        for s in range(0, len(windows), batch_size):
            chunk = windows[s : s + batch_size]
            out = model(input_ids=chunk, output_router_logits=True, use_cache=False)
            B, T = chunk.shape
            layers = [rl.float().reshape(B, T, -1).topk(k, dim=-1).indices for rl in out.router_logits]
            stacked = torch.stack(layers, dim=2).numpy()  # (B, T, L, k)
            traces.extend(stacked[i] for i in range(B))
    finally:
        if was_training:
            model.train()
    return traces


def probe(model, windows: torch.Tensor) -> dict:
    """The toleranced metrics on a few held-out windows (logged while training)."""
    from specterbench.embedded import lrc

    traces = capture_traces(model, windows)
    E = num_experts(model)
    return {
        "lru_rho1": lrc.model_hit_rate(traces, E, 1, "lru"),
        "lru_rho2": lrc.model_hit_rate(traces, E, 2, "lru"),
        "belady_rho2": lrc.model_hit_rate(traces, E, 2, "belady"),
        "srp_m16": lrc.srp(traces, E),
        "reuse": lrc.adjacent_reuse(traces),
        "pop_half": lrc.popular_half_share(traces, E),
    }
