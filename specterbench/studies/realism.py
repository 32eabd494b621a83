"""Does a stand-in route like the real model it stands for? Local routing consistency beside the published figures.

    specterbench realism --model tiny-qwen-moe [--json]
    specterbench realism --model tiny-qwen-moe [--path DIR] [--json]

Teacher-forced on held-out text (works never seen by tokenizer or model) and, where a decode function is given,
on the default decode of the benchmark prompts. Definitions: :mod:`specterbench.studies.lrc`; published values
and their sources: ``published_routing.json``. The report rendered as Markdown is
:mod:`specterbench.studies.realism_tables`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from specterbench.bench.config import BenchConfig
from specterbench.bench.workloads import load_workload
from specterbench.catalog import corpus, embedded
from specterbench.engine import sampling
from specterbench.engine.compat import cache_kwarg
from specterbench.engine.dense_copy import dense_spec, model_head_error_scale
from specterbench.engine.draft import QuantSpec
from specterbench.engine.quant_spec import model_error_scale
from specterbench.strategy import Request
from specterbench.studies import fidelity, lrc
from specterbench.studies.specs import SPECS

PUBLISHED_PATH = Path(__file__).resolve().parent / "published_routing.json"

#: metrics held to a tolerance of the published figure: model-level LRU at ρ=1, 2 and Belady ρ=2 ±0.08, SRP ±8 points
TOLERANCES = {"lru_rho1": 0.08, "lru_rho2": 0.08, "belady_rho2": 0.08, "srp_m16": 8.0, "lru_exec_rho2": 0.08}
#: a metric held to another's published figure: the execution-order LRU reading against the paper's LRU (the paper
#: publishes only its own, batched reading; the execution-order one is what an engine's model-level cache sees)
PUBLISHED_AS = {"lru_exec_rho1": "lru_rho1", "lru_exec_rho2": "lru_rho2"}


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

    traces = capture_traces(model, windows)
    E = num_experts(model)
    return {
        "lru_rho1": lrc.model_hit_rate(traces, E, 1, "lru"),
        "lru_rho2": lrc.model_hit_rate(traces, E, 2, "lru"),
        "belady_rho2": lrc.model_hit_rate(traces, E, 2, "belady"),
        "lru_exec_rho1": lrc.execution_order_hit_rate(traces, E, 1),
        "lru_exec_rho2": lrc.execution_order_hit_rate(traces, E, 2),
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
    ("lru_exec_rho1", "LRU ρ=1, execution order", ".3f"),
    ("lru_exec_rho2", "LRU ρ=2, execution order", ".3f"),
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
    ("repeated_8gram_share", "repeated 8-grams among the tokens", ".3f"),
)


def stands_for(name: str, directory: Path | None = None) -> str | None:
    """Key of ``published_routing.json`` for an embedded model (from training.json, else the model's spec)."""
    if directory is not None and (Path(directory) / "training.json").is_file():
        info = json.loads((Path(directory) / "training.json").read_text())
        if info.get("stands_for"):
            return info["stands_for"]

    return SPECS[name].stands_for if name in SPECS else None


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
    """``(prompt id, prompt ids, continuation ids)`` of the benchmark prompts under ``decode``: one token per forward
    with a KV cache, each chosen by the prompt's :meth:`Request.sampler` (Gumbel-max noise tied to the seed, prompt id
    and absolute position, exactly as the harness's reference decode draws it)."""
    from transformers import DynamicCache

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

    t0 = time.time()
    torch.manual_seed(0)
    E = num_experts(model)
    held = corpus.text_windows(tokenizer, size.heldout_windows, seq_len)  # [W, seq_len]
    traces = capture_traces(model, held)
    tf = lrc.summary(traces, E)
    tf["repeated_8gram_share"] = repeated_ngram_share([w.tolist() for w in held])
    fid = fidelity_rows(model, tokenizer, seq_len, size, draft=draft)
    dec = None
    setting = decode if decode is not None else sampling.DEFAULT_DECODE
    if decode_column:
        dtraces, rep, pairs = decode_traces(model, tokenizer, setting, size)
        dec = lrc.summary(dtraces, E)
        dec["repeated_8gram_share"] = rep
    published = load_published()["models"].get(stand_for, {}) if stand_for else {}
    checks = {}
    for key, tol in TOLERANCES.items():
        source = PUBLISHED_AS.get(key, key)
        if source in published and key in tf:
            diff = tf[key] - published[source]
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
        "published": {key: published[PUBLISHED_AS.get(key, key)] for key, _, _ in ROWS
                      if PUBLISHED_AS.get(key, key) in published},
        "checks": checks,
        "within_tolerance": bool(checks) and all(c["ok"] for c in checks.values()),
        "fidelity": fid,
    }


#: the drafts of the fidelity rows: routed experts at these specs, everything else in Specter's dense copy
FIDELITY_DRAFTS = (4, 3, 2)
FIDELITY_BLOCKSIZE = 128
FIDELITY_DENSE_BITS = 8


def fidelity_dense():
    """The dense copy the fidelity rows are measured with: Specter's default at :data:`FIDELITY_DENSE_BITS`."""

    return dense_spec(FIDELITY_DENSE_BITS)


def fidelity_setup(error_scale: float, head_error_scale: float) -> dict:
    """What the fidelity rows were measured with, as the report records it: the dense copy's format and each draft's
    label at the model's calibration (``error_scale`` on the routed experts, ``head_error_scale`` on the head). A
    shipped ``realism.json`` whose record differs from the code's was measured with another draft: regenerate it."""

    dense = fidelity_dense()
    head = f" (head calibrated ×{head_error_scale:g})" if head_error_scale != 1.0 else ""
    labels = {f"int{bits}/g{FIDELITY_BLOCKSIZE}":
              f"{QuantSpec(bits=bits, blocksize=FIDELITY_BLOCKSIZE, quantizer='int', error_scale=error_scale).label()}"
              f" + dense {dense.label()}{head}" for bits in FIDELITY_DRAFTS}
    return {"dense": {"bits": dense.bits, "quantizer": dense.quantizer, "blocksize": dense.blocksize},
            "labels": labels}


def fidelity_rows(model, tokenizer, seq_len: int, size: ReportSize = DEFAULT_SIZE, draft: bool = True) -> dict:
    """The rows that decide whether speculative offloading is measured fairly here, teacher-forced on
    ``size.draft_windows`` held-out windows: agreement with the routed experts removed, and of int4/int3/int2 g128
    drafts with Specter's int8 dense copy at the model's draft-fidelity calibration; each with its checks
    (:data:`fidelity.INT4_BANDS`, :data:`fidelity.REMOVED_MAX`, int2 < int3 < int4)."""

    windows = corpus.text_windows(tokenizer, max(1, size.draft_windows), seq_len)
    removed = fidelity.agreement(model, fidelity.without_routed_experts(model), windows)
    scale, head = model_error_scale(model), model_head_error_scale(model)
    setup = fidelity_setup(scale, head)
    out = {"windows": int(windows.shape[0]), "seq_len": int(windows.shape[1]), "error_scale": scale,
           "head_error_scale": head, "dense": setup["dense"], "experts_removed": asdict(removed), "drafts": {},
           "checks": {}}
    checks = out["checks"]
    for key in ("greedy", "sampled"):
        value = getattr(removed, key)
        checks[f"removed_{key}"] = {"value": value, "band": [0.0, fidelity.REMOVED_MAX],
                                    "ok": bool(value <= fidelity.REMOVED_MAX)}
    if not draft:
        return out
    dense = fidelity_dense()
    for bits in FIDELITY_DRAFTS:
        spec = QuantSpec(bits=bits, blocksize=FIDELITY_BLOCKSIZE, quantizer="int", error_scale=scale)
        row = fidelity.agreement(model, fidelity.draft_copy(model, spec, dense), windows)
        key = f"int{bits}/g{FIDELITY_BLOCKSIZE}"
        out["drafts"][key] = {"label": setup["labels"][key], **asdict(row)}
    out["checks"] = {**checks, **draft_checks(out["drafts"])}
    return out


def draft_checks(drafts: dict) -> dict:
    """The int4/g128 draft within the bands of :data:`fidelity.INT4_BANDS`, and fewer bits worse by the model's own
    behaviour: int3 and int2 below int4 (exact expert set and greedy agreement lower or equal, KL higher) and int2
    below int3 in what quantizing the experts decides (exact expert set, KL) — their greedy agreement can tie within
    a few tokens where the calibrated head sets it."""

    four, three, two = drafts["int4/g128"], drafts["int3/g128"], drafts["int2/g128"]
    checks = {}
    for key, (lo, hi) in fidelity.INT4_BANDS.items():
        checks[f"int4_{key}"] = {"value": four[key], "band": [lo, hi], "ok": bool(lo <= four[key] <= hi)}

    def worse(a, b, greedy=True):
        return a["exact_set"] < b["exact_set"] and a["kl_nats"] > b["kl_nats"] and (
            not greedy or a["greedy"] <= b["greedy"])

    checks["lower_bits_worse"] = {"ok": bool(worse(three, four) and worse(two, four)
                                             and worse(two, three, greedy=False))}
    return checks


def report(name: str, path: str | Path | None = None, decode=None, size: ReportSize = DEFAULT_SIZE,
           draft: bool = True, decode_column: bool = True) -> dict:
    """Load an embedded model (float32) and measure it: teacher-forced on held-out windows of the length it was
    trained on, and on ``decode`` (default: the harness's default decode) of the benchmark prompts."""

    torch.set_num_threads(1)
    directory = Path(path) if path is not None else embedded.model_dir(name)
    model, tokenizer = embedded.load(name, dtype=torch.float32, path=directory)
    seq_len = 128
    if (directory / "training.json").is_file():
        seq_len = int(json.loads((directory / "training.json").read_text()).get("seq_len", 128))
    return measure(model, tokenizer, name, stands_for(name, directory), seq_len, decode=decode, size=size,
                   draft=draft, decode_column=decode_column)
