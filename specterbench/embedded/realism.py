"""Does a stand-in route like the real model it stands for? Local routing consistency beside the published figures.

    specterbench realism --model tiny-qwen-moe [--json]
    python -m specterbench.embedded.realism --model tiny-qwen-moe [--path DIR] [--json]

Teacher-forced on held-out text (works never seen by tokenizer or model) and, where a decode function is given,
on the default decode of the benchmark prompts. Definitions: :mod:`specterbench.embedded.lrc`; published values
and their sources: ``published_routing.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
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


# ---- the report -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReportSize:
    """How much text the report reads: teacher-forced held-out windows (of the length the model was trained on)
    and sampled continuations of the benchmark prompts."""

    heldout_windows: int = 64
    decode_prompts: int = 16
    decode_new_tokens: int = 64
    prompt_tokens: int = 64
    draft_windows: int = 16


DEFAULT_SIZE = ReportSize()


#: (key, label, format) of the report's rows, in order
ROWS = (
    ("lru_rho1", "LRU ρ=1", ".3f"),
    ("lru_rho2", "LRU ρ=2", ".3f"),
    ("belady_rho1", "Belady ρ=1", ".3f"),
    ("belady_rho2", "Belady ρ=2", ".3f"),
    ("lfu_rho1", "LFU ρ=1", ".3f"),
    ("lfu_rho2", "LFU ρ=2", ".3f"),
    ("srp_m16", "SRP m=16 (points)", ".1f"),
    ("sch_rho2_m16", "SCH ρ=2 m=16", ".3f"),
    ("layer_lru_35pct", "per-layer LRU at 35% of expert bytes", ".3f"),
    ("layer_lru_50pct", "per-layer LRU at 50% of expert bytes", ".3f"),
    ("adjacent_reuse", "adjacent-token expert reuse", ".3f"),
    ("popular_half_share", "routed share of the more popular half of experts", ".3f"),
    ("draft_next_token", "nf4 draft: next-token agreement (argmax; decode: same-noise pick)", ".3f"),
    ("draft_expert_overlap", "nf4 draft: expert-set overlap (shared experts / k)", ".3f"),
    ("repeated_8gram_share", "repeated 8-grams among the tokens", ".3f"),
)


def default_decode():
    """The harness's default decode setting (the sampled one ``make bench`` uses)."""
    from specterbench.engine import sampling

    return getattr(sampling, "DEFAULT_DECODE", None) or sampling.DecodeSetting.sample(temperature=1.0)


def stands_for(name: str, directory: Path | None = None) -> str | None:
    """Key of ``published_routing.json`` for an embedded model (from training.json, else the model's spec)."""
    if directory is not None and (Path(directory) / "training.json").is_file():
        info = json.loads((Path(directory) / "training.json").read_text())
        if info.get("stands_for"):
            return info["stands_for"]
    from specterbench.embedded.specs import SPECS

    return SPECS[name].stands_for if name in SPECS else None


def heldout_windows(tokenizer, n_windows: int, seq_len: int) -> torch.Tensor:
    from specterbench.embedded.routing_stats import heldout_eval_windows

    return heldout_eval_windows(tokenizer, n_windows=n_windows, seq_len=seq_len)


def nf4_draft(model, spec=None):
    """A copy of ``model`` whose routed experts went through the engine's draft quantization (default nf4,
    blocksize 64), dequantized back: routers, attention, embeddings and shared experts unchanged, as in the
    self-draft."""
    import copy

    from specterbench.engine.draft import QuantSpec, roundtrip
    from specterbench.engine.seam import find_moe_blocks

    spec = spec or QuantSpec()
    draft = copy.deepcopy(model).float()
    with torch.no_grad():
        for block in find_moe_blocks(draft):
            for name in ("gate_up_proj", "down_proj"):
                w = getattr(block.experts, name)  # [E, out, in]
                for e in range(w.shape[0]):
                    w[e].copy_(roundtrip(w[e].detach().float().contiguous(), spec).to(w.dtype))
    return draft.eval()


@torch.no_grad()
def draft_agreement(model, draft, windows: torch.Tensor, batch_size: int = 16) -> dict:
    """Teacher-forced next-token (argmax) agreement and per-(token, layer) top-k overlap of the draft."""
    same_tok = tok = 0
    overlap = slots = 0
    k = int(model.config.num_experts_per_tok)
    for s in range(0, len(windows), batch_size):
        chunk = windows[s : s + batch_size]  # [B, T]
        a = model(input_ids=chunk, output_router_logits=True, use_cache=False)
        b = draft(input_ids=chunk, output_router_logits=True, use_cache=False)
        same_tok += int((a.logits.argmax(-1) == b.logits.argmax(-1)).sum())
        tok += chunk.numel()
        overlap_, slots_ = _expert_overlap(a.router_logits, b.router_logits, k)
        overlap, slots = overlap + overlap_, slots + slots_
    return {"draft_next_token": same_tok / tok, "draft_expert_overlap": overlap / slots}


def _expert_overlap(router_a, router_b, k: int, first: int = 0) -> tuple[int, int]:
    """Summed |top-k(a) ∩ top-k(b)| and k·tokens over MoE layers, tokens from ``first`` on."""
    overlap = slots = 0
    for ra, rb in zip(router_a, router_b):  # each [tokens, E]
        ia, ib = ra[first:].topk(k, dim=-1).indices, rb[first:].topk(k, dim=-1).indices
        overlap += int((ia.unsqueeze(-1) == ib.unsqueeze(-2)).any(-1).sum())
        slots += ia.numel()
    return overlap, slots


@torch.no_grad()
def sampled_draft_agreement(model, draft, pairs, decode) -> dict:
    """On the decoded continuations: the share of positions where the draft's own pick under the request's
    sampler (same Gumbel noise) equals the target's token — what speculative verification accepts — and the
    draft's expert-set overlap on those tokens."""
    from specterbench.plugins.strategy import Request

    same = total = overlap = slots = 0
    k = int(model.config.num_experts_per_tok)
    for pid, ids, cont in pairs:
        sampler = Request(pid, tuple(ids), len(cont), decode=decode).sampler()
        full = torch.tensor([ids + cont])  # [1, P + N]
        a = model(input_ids=full, output_router_logits=True, use_cache=False)
        b = draft(input_ids=full, output_router_logits=True, use_cache=False)
        for i, token in enumerate(cont):
            position = len(ids) + i  # logits at position - 1 predict it
            same += sampler.pick(b.logits[0, position - 1], position) == sampler.pick(a.logits[0, position - 1],
                                                                                     position)
        total += len(cont)
        overlap_, slots_ = _expert_overlap(a.router_logits, b.router_logits, k, first=len(ids))
        overlap, slots = overlap + overlap_, slots + slots_
    return {"draft_next_token": same / max(1, total), "draft_expert_overlap": overlap / max(1, slots)}


def repeated_ngram_share(seqs, n: int = 8) -> float:
    """Share of n-grams (within each sequence) that already occurred earlier in the same sequence."""
    rep = total = 0
    for seq in seqs:
        seen = set()
        seq = list(seq)
        for i in range(len(seq) - n + 1):
            g = tuple(seq[i : i + n])
            rep += g in seen
            seen.add(g)
            total += 1
    return rep / total if total else 0.0


@torch.no_grad()
def sampled_continuations(model, tokenizer, decode, size: ReportSize = DEFAULT_SIZE, workload: str | None = None):
    """``(prompt id, prompt ids, continuation ids)`` of the benchmark prompts under ``decode``: one token per forward with a
    KV cache, each chosen by the prompt's :meth:`Request.sampler` (Gumbel-max noise tied to the seed, prompt id
    and absolute position, exactly as the harness's reference decode draws it)."""
    from transformers import DynamicCache

    from specterbench.bench.workloads import load_workload
    from specterbench.engine.engine import cache_kwarg
    from specterbench.plugins.strategy import Request

    out = []
    new_tokens = size.decode_new_tokens
    for item in load_workload(workload or default_workload())[: size.decode_prompts]:
        ids = tuple(tokenizer.encode(item["text"]))[: size.prompt_tokens]
        request = Request(str(item["id"]), ids, new_tokens, decode=decode)
        sampler, position = request.sampler(), len(ids)
        kv = {cache_kwarg(model): DynamicCache(config=model.config)}  # the name this transformers takes it under
        logits = model(input_ids=torch.tensor([ids]), **kv, use_cache=True, logits_to_keep=1).logits  # [1, 1, V]
        tokens = [sampler.pick(logits[0, -1], position)]
        while len(tokens) < new_tokens:
            logits = model(input_ids=torch.tensor([[tokens[-1]]]), **kv, use_cache=True).logits
            tokens.append(sampler.pick(logits[0, -1], position + len(tokens)))
        out.append((request.id, list(ids), tokens))
    return out


def default_workload() -> str:
    """The benchmark workload the runner uses by default."""
    from specterbench.bench.runner import BenchConfig

    return BenchConfig.__dataclass_fields__["workload"].default


def decode_traces(model, tokenizer, decode, size: ReportSize = DEFAULT_SIZE):
    """Routing of the sampled continuation tokens (one ``(T, L, k)`` trace per prompt, the prompt's tokens left
    out), the share of repeated 8-grams among them, and the ``(prompt id, prompt ids, continuation)`` triples."""
    pairs = sampled_continuations(model, tokenizer, decode, size)
    traces = []
    for _, ids, cont in pairs:
        full = torch.tensor([ids + cont])  # [1, P + N]
        traces.append(capture_traces(model, full)[0][len(ids):])
    return traces, repeated_ngram_share([c for _, _, c in pairs]), pairs


def measure(model, tokenizer, name: str, stand_for: str | None, seq_len: int, decode=None,
            size: ReportSize = DEFAULT_SIZE, draft: bool = True, decode_column: bool = True) -> dict:
    """The realism report of a loaded model (see :func:`report`)."""
    import time

    from specterbench.embedded import lrc

    t0 = time.time()
    torch.manual_seed(0)
    E = num_experts(model)
    held = heldout_windows(tokenizer, size.heldout_windows, seq_len)  # [W, seq_len]
    traces = capture_traces(model, held)
    tf = lrc.summary(traces, E)
    tf["repeated_8gram_share"] = repeated_ngram_share([w.tolist() for w in held])
    drafted = nf4_draft(model) if draft else None
    if draft:
        tf.update(draft_agreement(model, drafted, held[: max(1, size.draft_windows)]))
    dec = None
    setting = decode if decode is not None else default_decode()
    if decode_column:
        dtraces, rep, pairs = decode_traces(model, tokenizer, setting, size)
        dec = lrc.summary(dtraces, E)
        dec["repeated_8gram_share"] = rep
        if draft:
            dec.update(sampled_draft_agreement(model, drafted, pairs, setting))
    published = load_published()["models"].get(stand_for, {}) if stand_for else {}
    checks = {}
    for key, tol in TOLERANCES.items():
        if key in published:
            diff = tf[key] - published[key]
            checks[key] = {"diff": diff, "tolerance": tol, "ok": bool(abs(diff) <= tol)}
    return {
        "model": name,
        "stands_for": stand_for,
        "published_title": published.get("title"),
        "setup": {"heldout_windows": int(held.shape[0]), "seq_len": int(held.shape[1]), "num_experts": E,
                  "top_k": int(model.config.num_experts_per_tok), "moe_layers": int(traces[0].shape[1]),
                  "decode": setting.label if decode_column else None, **asdict(size),
                  "seconds": round(time.time() - t0, 1)},
        "teacher_forced": tf,
        "decode": dec,
        "published": {key: published[key] for key, _, _ in ROWS if key in published},
        "checks": checks,
        "within_tolerance": bool(checks) and all(c["ok"] for c in checks.values()),
    }


def report(name: str, path: str | Path | None = None, decode=None, size: ReportSize = DEFAULT_SIZE,
           draft: bool = True, decode_column: bool = True) -> dict:
    """Load an embedded model (float32) and measure it: teacher-forced on held-out windows of the length it was
    trained on, and on ``decode`` (default: the harness's default decode) of the benchmark prompts."""
    from specterbench import embedded

    torch.set_num_threads(1)
    directory = Path(path) if path is not None else embedded.model_dir(name)
    model, tokenizer = embedded.load(name, dtype=torch.float32, path=directory)
    seq_len = 128
    if (directory / "training.json").is_file():
        seq_len = int(json.loads((directory / "training.json").read_text()).get("seq_len", 128))
    return measure(model, tokenizer, name, stands_for(name, directory), seq_len, decode=decode, size=size,
                   draft=draft, decode_column=decode_column)


def _fmt(value, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and value != value) else format(value, fmt)


def format_table(rep: dict) -> str:
    """Markdown table: stand-in teacher-forced and on the default decode, the published value, the difference
    (teacher-forced − published) and whether it is within tolerance."""
    title = rep.get("published_title") or "published"
    tf, dec, pub, checks = rep["teacher_forced"], rep.get("decode") or {}, rep["published"], rep["checks"]
    lines = [f"| metric | {rep['model']} teacher-forced | {rep['model']} default decode | {title} | difference | "
             f"tolerance |", "|---|---:|---:|---:|---:|---|"]
    for key, label, fmt in ROWS:
        if key not in tf and key not in dec:
            continue
        diff = tf[key] - pub[key] if key in pub and key in tf else None
        tol = checks.get(key)
        mark = "–" if tol is None else (f"±{tol['tolerance']:g} " + ("met" if tol["ok"] else "**missed**"))
        dfmt = "+.1f" if fmt == ".1f" else "+.3f"
        lines.append(f"| {label} | {_fmt(tf.get(key), fmt)} | {_fmt(dec.get(key), fmt)} | {_fmt(pub.get(key), fmt)} "
                     f"| {_fmt(diff, dfmt)} | {mark} |")
    st = rep["setup"]
    verdict = "all within tolerance" if rep["within_tolerance"] else "NOT all within tolerance"
    lines += ["", f"Teacher-forced: {st['heldout_windows']} held-out windows × {st['seq_len']} tokens; default decode: "
              f"{st['decode'] or 'not measured'}, {st['decode_prompts']} benchmark prompts × {st['decode_new_tokens']} "
              f"new tokens (routing of the generated tokens). E={st['num_experts']}, top-{st['top_k']}, "
              f"{st['moe_layers']} MoE layers. Toleranced metrics: {verdict}."]
    return "\n".join(lines)


def card_section(rep: dict) -> str:
    """The model card's realism section."""
    src = load_published()["sources"]
    return "\n".join([
        "## Realism: routing beside the real model",
        "",
        f"`specterbench realism --model {rep['model']}`. Published values of {rep.get('published_title')}: "
        f"{src['paper']}; LRU/Belady {src['lru_rho1']}, SRP {src['srp_m16']}, SCH {src['sch_rho2_m16']}. "
        "Definitions (model-level cache of ρ·L·k (layer, expert) entries reset per sequence, SRP, SCH v3) follow "
        f"{src['code']}; tolerances: ±0.08 on LRU ρ=1, ρ=2 and Belady ρ=2, ±8 points on SRP.",
        "",
        format_table(rep),
        "",
    ])


def add_realism_parser(subparsers) -> None:
    """Register ``specterbench realism`` on the CLI's subparsers."""
    from specterbench.cli import add_decode_arguments
    from specterbench.embedded import EMBEDDED_MODELS

    s = subparsers.add_parser("realism", help="does a stand-in route like its real model? local routing "
                                             "consistency beside the published figures (arXiv 2505.16056)")
    s.add_argument("--model", required=True, choices=EMBEDDED_MODELS)
    s.add_argument("--path", type=Path, default=None, help="model directory (default: the package's)")
    s.add_argument("--windows", type=int, default=DEFAULT_SIZE.heldout_windows, help="held-out windows, teacher-forced")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--no-decode", action="store_true", help="teacher-forced only (skip the sampled decode)")
    s.add_argument("--no-draft", action="store_true", help="skip the 4-bit draft's agreement")
    s.add_argument("--seed", type=int, default=0, help="noise stream of the sampled decode")
    add_decode_arguments(s)
    s.set_defaults(func=cmd_realism)


def cmd_realism(args) -> int:
    """Print the realism report; exit 0 (a miss of the tolerances is reported, not an error)."""
    from specterbench.cli import decode_setting
    from specterbench.errors import UsageError

    if args.windows < 1:
        raise UsageError(f"--windows must be a positive number of held-out windows, got {args.windows}")
    setting = decode_setting(args)  # validated before any model loads
    rep = report(args.model, path=args.path, decode=setting, size=ReportSize(heldout_windows=args.windows),
                 draft=not args.no_draft, decode_column=not args.no_decode)
    print(json.dumps(rep, indent=1) if args.json else format_table(rep))
    return 0


def main(argv=None) -> int:
    """``python -m specterbench.embedded.realism …`` (the same as ``specterbench realism …``)."""
    from specterbench.cli import subcommand_main

    return subcommand_main("realism", add_realism_parser, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
