"""Routing statistics of an embedded MoE model on held-out text.

    specterbench routing-stats --model tiny-mixtral [--json] [--write-card]

Measured on a fixed, deterministic set of held-out windows (works never seen in training), in float32:

* **popularity entropy** per layer: entropy (bits) of the share of top-k selections each expert gets,
  and the same divided by log2(E) (1.0 = perfectly even use).
* **consecutive-token reuse** per layer: the fraction of a token's top-k experts that were also in the
  previous token's top-k (same layer, same sequence) — compared with the same measure after shuffling
  token order across the eval set (keeps popularity, destroys sequence structure) and with the
  uniform-random expectation k/E. Also the probability that at least one expert is reused
  (uniform expectation 1 - C(E-k, k)/C(E, k)).
* **next-layer gate predictability**: layer L+1's gate applied to the *input of layer L's MoE block*
  (the hidden state available one layer early), top-k recall against layer L+1's actual top-k.
  A variant applies L+1's post-attention norm + gate to layer L's residual stream. Baselines: uniform
  k/E and a static guess (the k most popular experts of layer L+1).
"""

from __future__ import annotations

import os

from specterbench.baselines import LRU
from specterbench.bench.runner import encode_prompts, load_prompts
from specterbench.catalog import corpus, embedded
from specterbench.engine.engine import Engine
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.sampling import DEFAULT_DECODE
from specterbench.strategy import Request

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import math  # noqa: E402

import torch  # noqa: E402

EVAL_WINDOWS = 128
EVAL_SEQ_LEN = 128
SHUFFLE_SEED = 1234


def _moe_layers(model):
    layers = model.model.layers
    out = []
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if hasattr(mlp, "gate") and hasattr(mlp, "experts"):
            out.append((i, layer))
    return out


def _top_k(model) -> int:
    return int(model.config.num_experts_per_tok)


def _num_experts(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None) or cfg.num_experts)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row |a ∩ b| for index tensors (N, k)."""
    return (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)


@torch.no_grad()
def compute(model, windows: torch.Tensor, batch_size: int = 32) -> dict:
    """Routing statistics of ``model`` (any dtype; computed in its dtype) on ``windows`` (B, T) token ids."""
    model.eval()
    moe = _moe_layers(model)
    k, E = _top_k(model), _num_experts(model)
    captured: dict[str, list] = {}
    hooks = []
    for i, layer in moe:
        captured[f"moe_in{i}"] = []
        captured[f"resid{i}"] = []
        hooks.append(layer.mlp.register_forward_pre_hook(
            lambda mod, args, i=i: captured[f"moe_in{i}"].append(args[0].detach().reshape(-1, args[0].shape[-1]))))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda mod, args, i=i: captured[f"resid{i}"].append(args[0].detach().reshape(-1, args[0].shape[-1]))))
    logits_per_layer: list[list[torch.Tensor]] = [[] for _ in moe]
    try:
        for s in range(0, len(windows), batch_size):
            out = model(input_ids=windows[s : s + batch_size], output_router_logits=True, use_cache=False)
            for j, rl in enumerate(out.router_logits):
                logits_per_layer[j].append(rl.detach().float().reshape(-1, E))
    finally:
        for h in hooks:
            h.remove()

    B, T = windows.shape
    N = B * T
    topk = [torch.cat(ls).topk(k, dim=-1).indices for ls in logits_per_layer]  # each (N, k)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(SHUFFLE_SEED))
    same_seq = (torch.arange(N) % T) != 0  # token t has a predecessor in its own window

    uniform_overlap = k / E
    uniform_any = 1.0 - (math.comb(E - k, k) / math.comb(E, k) if E - k >= k else 0.0)

    layers = []
    for j, (li, layer) in enumerate(moe):
        idx = topk[j]
        counts = torch.bincount(idx.reshape(-1), minlength=E).double()
        share = counts / counts.sum()
        nz = share[share > 0]
        entropy = float(-(nz * nz.log2()).sum())
        prev, cur = idx[:-1][same_seq[1:]], idx[1:][same_seq[1:]]
        ov = _overlap(cur, prev).double()
        sh = idx[perm]
        ov_sh = _overlap(sh[1:], sh[:-1]).double()
        row = {
            "layer": li,
            "popularity_entropy_bits": round(entropy, 4),
            "popularity_entropy_norm": round(entropy / math.log2(E), 4),
            "max_share": round(float(share.max()), 4),
            "min_share": round(float(share.min()), 4),
            "reuse_overlap": round(float(ov.mean() / k), 4),
            "reuse_overlap_shuffled": round(float(ov_sh.mean() / k), 4),
            "reuse_any": round(float((ov > 0).double().mean()), 4),
            "reuse_any_shuffled": round(float((ov_sh > 0).double().mean()), 4),
        }
        if j + 1 < len(moe):
            nli, nlayer = moe[j + 1]
            actual = topk[j + 1]
            gate_w = nlayer.mlp.gate.weight
            x = torch.cat(captured[f"moe_in{li}"]).to(gate_w.dtype)
            pred = (x @ gate_w.T).float().topk(k, dim=-1).indices
            r = torch.cat(captured[f"resid{li}"])
            pred_r = (nlayer.post_attention_layernorm(r) @ gate_w.T).float().topk(k, dim=-1).indices
            next_counts = torch.bincount(actual.reshape(-1), minlength=E)
            static = next_counts.topk(k).indices.unsqueeze(0).expand_as(actual)
            row["next_gate_recall"] = round(float(_overlap(pred, actual).double().mean() / k), 4)
            row["next_gate_recall_resid"] = round(float(_overlap(pred_r, actual).double().mean() / k), 4)
            row["next_static_topk_recall"] = round(float(_overlap(static, actual).double().mean() / k), 4)
        layers.append(row)

    def mean(key):
        vals = [r[key] for r in layers if key in r]
        return round(sum(vals) / len(vals), 4) if vals else None

    keys: list[str] = []
    for r in layers:
        keys.extend(key for key in r if key != "layer" and key not in keys)
    return {
        "tokens": N,
        "windows": B,
        "seq_len": T,
        "num_experts": E,
        "top_k": k,
        "moe_layers": len(moe),
        "uniform_reuse_overlap": round(uniform_overlap, 4),
        "uniform_reuse_any": round(uniform_any, 4),
        "uniform_entropy_bits": round(math.log2(E), 4),
        "mean": {key: mean(key) for key in keys},
        "layers": layers,
    }


def lru_hit_rates(model, tokenizer, name: str, budgets=(0.35, 0.5), prompts: int = 8, tokens: int = 32,
                  decode=None) -> dict:
    """Hit rate of the engine's per-layer LRU baseline at each budget (fraction of all expert bytes) over the
    held-out benchmark prompts decoded with ``decode`` (default: the harness's default decode): a warm-up
    prompt, then ``prompts`` prompts × ``tokens``."""

    decode = decode or DEFAULT_DECODE
    engine = Engine(model, name=name, tokenizer=tokenizer)
    encoded = encode_prompts(engine, load_prompts("shakespeare-heldout-v1", prompts), 64)
    out = {}
    for budget in budgets:
        engine.configure(LRU(), int(budget * engine.total_expert_bytes), HostWallClock())
        for i, (pid, ids) in enumerate([encoded[0], *encoded]):
            if i == 1:
                engine.stats = type(engine.stats)()  # the first pass over prompt 0 only warms the cache
            request = Request(pid, ids, tokens, decode=decode)
            engine.begin_request(request)
            engine.decode(request)
        st = engine.stats
        out[f"{budget:.0%}"] = round(st.hits / (st.hits + st.misses), 3)
    out["decode"] = decode.label
    return out


def for_model(name: str, path: str | os.PathLike | None = None, n_windows: int = EVAL_WINDOWS) -> dict:

    torch.set_num_threads(1)
    model, tokenizer = embedded.load(name, dtype=torch.float32, path=path)
    windows = corpus.text_windows(tokenizer, n_windows, EVAL_SEQ_LEN)
    stats = compute(model, windows)
    stats["model"] = name
    stats["lru_hit_rate"] = lru_hit_rates(model, tokenizer, name)  # last: the engine takes the experts over
    return stats


def format_table(stats: dict) -> str:
    cols = [
        ("layer", "layer"),
        ("popularity_entropy_bits", "H bits"),
        ("popularity_entropy_norm", "H/log2E"),
        ("reuse_overlap", "reuse"),
        ("reuse_overlap_shuffled", "reuse shuf"),
        ("reuse_any", "any-reuse"),
        ("reuse_any_shuffled", "any shuf"),
        ("next_gate_recall", "next-gate recall"),
        ("next_gate_recall_resid", "next-gate (resid)"),
        ("next_static_topk_recall", "static top-k"),
    ]
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---:" for _ in cols) + "|"
    rows = [head, sep]
    for r in stats["layers"]:
        rows.append("| " + " | ".join("–" if r.get(key) is None else str(r.get(key)) for key, _ in cols) + " |")
    m = stats["mean"]
    rows.append("| mean | " + " | ".join("–" if m.get(key) is None else str(m[key]) for key, _ in cols[1:]) + " |")
    rows.append("")
    rows.append(
        f"E={stats['num_experts']}, top-k={stats['top_k']}, {stats['tokens']} held-out tokens "
        f"({stats['windows']} windows × {stats['seq_len']}). Uniform random: reuse = k/E = "
        f"{stats['uniform_reuse_overlap']}, any-reuse = 1 − C(E−k,k)/C(E,k) = {stats['uniform_reuse_any']}, "
        f"next-gate recall = k/E = {stats['uniform_reuse_overlap']}, "
        f"entropy = log2 E = {stats['uniform_entropy_bits']} bits."
    )
    if stats.get("lru_hit_rate"):
        rows.append("")
        lru = dict(stats["lru_hit_rate"])
        how = lru.pop("decode", "greedy")
        rows.append(f"LRU hit rate (the engine's per-layer LRU, held-out benchmark prompts decoded {how}, after one "
                    "warm-up prompt): " + ", ".join(f"{v:.3f} at {k} of expert bytes" for k, v in lru.items()) + ".")
    return "\n".join(rows)
