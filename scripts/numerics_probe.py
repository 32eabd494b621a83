"""Why a host expert's output differs in the last bits from the device path's on a CPU-only machine.

On a machine without CUDA the engine's "device" and the host are the same processor, yet ``cpu-experts``,
``spec-host`` and ``specter`` give log-likelihoods that differ from the reference's in the last bits. This probe takes
one MoE layer of a model (its real expert weights, hidden states from a real forward) and computes the layer's
output the two ways the engine does:

- device: the routings' slot weights gathered, one batched matmul per projection, the k outputs combined by one
  more matmul (``moe_layer.grouped_experts``, the CPU's ``gathered`` mode);
- host: each expert alone through ``F.linear`` (``moe_layer.expert_forward``), scaled, the k outputs summed.

and varies one thing at a time — torch's thread count, the dtype, and whether both sides use the same kernel — to
say which one changes the bits. Prints a Markdown table; ``docs/measurements/`` keeps a run of it.

    .venv/bin/python scripts/numerics_probe.py --model tiny-mixtral
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from specterbench.engine.engine import Engine
from specterbench.engine.seam import router_of
from specterbench.plugins.host import get_host


def hidden_states(engine: Engine, layer: int, tokens: int) -> torch.Tensor:
    """The input of MoE ``layer``'s experts for the first ``tokens`` positions of a fixed text (a real forward)."""
    class Seen(Exception):
        pass

    def stop(_module, args):
        raise Seen(args[0].detach())  # the layers above it are not needed

    handle = engine.moe_blocks[layer].register_forward_pre_hook(stop)
    ids = engine.tokenizer("To be, or not to be, that is the question: whether 'tis nobler in the mind",
                           return_tensors="pt").input_ids[:, :tokens]
    try:
        with torch.no_grad():
            engine.model(ids)
    except Seen as seen:
        x = seen.args[0]
    finally:
        handle.remove()
    return x.reshape(-1, x.shape[-1])


def device_path(gate_up, down, act_fn, x, idx, w):
    """``moe_layer.grouped_experts`` in gathered mode: each routing's expert weights gathered, one batched
    matrix-vector product per projection; the rows combined by ``moe_layer.combine``'s batched matmul."""
    h = torch.matmul(gate_up[idx], x[:, None, :, None]).squeeze(-1)  # [T, k, 2I]
    g, u = h.chunk(2, dim=-1)
    rows = torch.matmul(down[idx], (act_fn(g) * u).unsqueeze(-1)).squeeze(-1)  # [T, k, H]
    return torch.bmm(w.unsqueeze(1).to(rows.dtype), rows)


def host_path(gate_up, down, act_fn, x, idx, w, per_token=False):
    """``moe_layer.expert_forward`` on the host: each expert once over all its tokens (one GEMM of n rows), or one
    token at a time (``per_token``: n = 1, as in one-token decoding); the rows combined as the device's are."""
    T, k = idx.shape
    rows = x.new_empty(T, k, x.shape[1])
    for e in idx.unique().tolist():
        t, j = (idx == e).nonzero(as_tuple=True)
        chunks = [slice(i, i + 1) for i in range(len(t))] if per_token else [slice(0, len(t))]
        for c in chunks:
            g, u = F.linear(x[t[c]], gate_up[e]).chunk(2, dim=-1)
            rows[t[c], j[c]] = F.linear(act_fn(g) * u, down[e])
    return torch.bmm(w.unsqueeze(1).to(rows.dtype), rows)


def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[str, float]:
    diff = (a.double() - b.double()).abs()
    rel = float(diff.max() / b.double().abs().max())
    return ("identical" if torch.equal(a, b) else f"{int((a != b).sum())}/{a.numel()} differ"), rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-mixtral")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    net, tok = get_host().models().get(args.model).load()
    engine = Engine(net, name=args.model, tokenizer=tok)
    layer = args.layer
    x32 = hidden_states(engine, layer, args.tokens).float()
    experts = range(engine.num_experts)
    gate_up = torch.stack([engine.store.values((layer, e))[0].float() for e in experts])
    down = torch.stack([engine.store.values((layer, e))[1].float() for e in experts])
    block = engine.moe_blocks[layer]
    probs = torch.softmax(F.linear(x32, router_of(block).weight.float()), -1)
    w, idx = probs.topk(engine.top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    act = block.experts.act_fn
    print(f"model {args.model}, MoE layer {layer}, {x32.shape[0]} tokens, top-{engine.top_k}, hidden "
          f"{x32.shape[1]}, torch {torch.__version__}\n")
    print("| case | tokens | threads | dtype | result | max relative difference |")
    print("|---|---|---|---|---|---|")

    def row(case, tokens, threads, dtype, a, b):
        same, rel = compare(a, b)
        print(f"| {case} | {tokens} | {threads} | {str(dtype)[6:]} | {same} | {rel:.2e} |")

    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            x, gu, dn = x32.to(dtype), gate_up.to(dtype), down.to(dtype)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                T = x.shape[0]
                row("device path vs host path (an expert's tokens in one GEMM)", T, threads, dtype,
                    device_path(gu, dn, act, x, idx, w), host_path(gu, dn, act, x, idx, w))
                row("device path vs host path, one token per GEMM", T, threads, dtype,
                    device_path(gu, dn, act, x, idx, w), host_path(gu, dn, act, x, idx, w, per_token=True))
                row("device path vs host path, one-token decode", 1, threads, dtype,
                    device_path(gu, dn, act, x[:1], idx[:1], w[:1]), host_path(gu, dn, act, x[:1], idx[:1], w[:1]))
        for path in (device_path, host_path):
            torch.set_num_threads(1)
            one = path(gate_up, down, act, x32, idx, w)
            torch.set_num_threads(2)
            row(f"{path.__name__.replace('_', ' ')}, 2 threads vs 1", x32.shape[0], "1 vs 2", torch.float32,
                path(gate_up, down, act, x32, idx, w), one)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
