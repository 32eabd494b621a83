"""Train one embedded MoE model on the Shakespeare training works (CPU, one thread, fixed seed).

    specterbench train --model tiny-mixtral [--steps N | --minutes M] [--seed 0]

Writes ``specterbench/catalog/stand_ins/<NAME>/``: config.json, model.safetensors (bfloat16),
tokenizer files, training.json (the numbers behind the card) and CARD.md.

Without ``--minutes`` the step count is the model's fixed default (reproducible). With ``--minutes``
the script times a few steps first and picks the step count that fits the budget.
"""

from __future__ import annotations

import json
import math
import platform
import random
import shutil
import time
from pathlib import Path

import torch

from specterbench.catalog import corpus, embedded
from specterbench.engine.seam import find_moe_blocks
from specterbench.errors import UsageError
from specterbench.studies import card as model_card
from specterbench.studies import fidelity, realism
from specterbench.studies import tokenizer as tok_mod
from specterbench.studies.specs import CONTEXT, SPECS, Spec, build_config, with_overrides

MODELS_DIR = Path(__file__).resolve().parent.parent / "catalog" / "stand_ins"


def balance_losses(router_logits, k: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer Switch-style balance ``E·Σ f_i·P_i`` (1.0 when even) over the batch and within each sequence,
    averaged over MoE layers. ``f_i``: share of top-k selections; ``P_i``: mean router probability."""
    over_batch, within_seq = [], []
    for logits in router_logits:
        E = logits.shape[-1]
        probs = logits.float().softmax(-1).view(batch, -1, E)
        chosen = torch.zeros_like(probs).scatter_(-1, probs.topk(k, dim=-1).indices, 1.0)
        over_batch.append(E * (chosen.mean((0, 1)) / k * probs.mean((0, 1))).sum())
        within_seq.append(E * (chosen.mean(1) / k * probs.mean(1)).sum(-1).mean())
    return torch.stack(over_batch).mean(), torch.stack(within_seq).mean()


class routed_experts_removed:
    """``with routed_experts_removed(model):`` every MoE block's routed experts output zero (not computed); the
    routers, attention, shared experts and dense layers run as usual."""

    def __init__(self, model):

        self.experts = [block.experts for block in find_moe_blocks(model)]

    def __enter__(self):
        for experts in self.experts:
            experts.forward = lambda hidden_states, *args, **kwargs: torch.zeros_like(hidden_states)
        return self

    def __exit__(self, *exc):
        for experts in self.experts:
            del experts.forward  # the class's forward again
        return False


def reliance_loss(model, inputs: torch.Tensor, targets: torch.Tensor, floor: float) -> tuple[torch.Tensor, float]:
    """The expert-reliance loss: ``relu(floor − CE)`` of the batch decoded with the routed experts removed.

    A real MoE's next token collapses without its routed experts; a small model trained briefly leans on attention,
    shared experts and dense layers instead (without this loss, most tokens survive removing the routed experts).
    The hinge trains the rest of the network to be useless on its own — up to ``floor`` nats of cross-entropy (about
    the uniform distribution's ln V), no further — so that the next token has to come through the routed experts.
    Returns the loss and the removed path's cross-entropy."""
    with routed_experts_removed(model):
        logits = model(input_ids=inputs, use_cache=False).logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    return torch.relu(floor - ce), float(ce.detach())


#: transformers' fused-expert kernel for training: same routing and outputs as the eager loop over experts, in far
#: fewer CPU seconds per step with 60-64 experts. config.json does not record it (the engine's seam replaces the
#: experts module anyway).
TRAIN_EXPERTS_IMPLEMENTATION = "grouped_mm"


def build_model(config):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                experts_implementation=TRAIN_EXPERTS_IMPLEMENTATION)
    except (ValueError, ImportError, TypeError):  # an older transformers without it: the eager loop
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def heldout_windows(tokens: torch.Tensor, seq_len: int, limit: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of seq_len+1 tokens (input + shifted target), in order."""
    n = (len(tokens) - 1) // seq_len
    if limit is not None:
        # evenly spaced subset, deterministic
        idx = torch.linspace(0, n - 1, steps=min(limit, n)).round().long()
    else:
        idx = torch.arange(n)
    return torch.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in idx.tolist()])


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats/token) over the windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i : i + batch_size]
        logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += chunk[:, 1:].numel()
    if was_training:
        model.train()
    return total / count


def lr_at(step: int, total: int, spec: Spec) -> float:
    warm = max(1, int(spec.warmup_frac * total))
    if step < warm:
        return spec.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine)


def make_optimizer(model, spec: Spec):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name or name.endswith(".bias") else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def count_params(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return {"total": total, "routed_experts": experts, "non_expert": total - experts}


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def training_corpus(name: str, seed: int, log) -> tuple:
    """One thread, the seed set, the project's tokenizer and the encoded train / held-out works: what every
    model trained here (stand-ins and drafts) starts from."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    set_seed(seed)
    tokenizer = tok_mod.train_tokenizer()
    tokenizer.model_max_length = 10**9  # whole works are encoded at once; windows are cut below
    train_tokens = corpus.encode_works(tokenizer, corpus.train_works())
    held_tokens = corpus.encode_works(tokenizer, corpus.heldout_works())
    log(f"[{name}] tokenizer vocab={len(tokenizer)} train_tokens={len(train_tokens)} heldout_tokens={len(held_tokens)}")
    return tokenizer, train_tokens, held_tokens


def train(name: str, steps: int | None = None, minutes: float | None = None, seed: int = 0,
          out_dir: Path | None = None, log=print, overrides: dict[str, str] | None = None, card: bool = True) -> Path:
    if name not in SPECS:
        raise UsageError(f"unknown embedded model {name!r}: choose one of {', '.join(SPECS)}")
    spec = with_overrides(SPECS[name], overrides or {})
    out_dir = Path(out_dir) if out_dir is not None else MODELS_DIR / name
    t_start = time.time()
    tokenizer, train_tokens, held_tokens = training_corpus(name, seed, log)

    config = build_config(spec, tokenizer)
    set_seed(seed)
    model = build_model(config)
    model.train()
    params = count_params(model)
    log(f"[{name}] params={params}")
    opt = make_optimizer(model, spec)
    gen = torch.Generator().manual_seed(seed)
    eval_small = heldout_windows(held_tokens, spec.seq_len, limit=64)
    probe_windows = eval_small[: spec.probe_windows, :-1]
    k = int(config.num_experts_per_tok)

    def batch():
        starts = torch.randint(0, len(train_tokens) - spec.seq_len - 1, (spec.batch_size,), generator=gen)
        return torch.stack([train_tokens[s : s + spec.seq_len + 1] for s in starts.tolist()])

    def step_fn(step: int, total: int) -> tuple[float, float]:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, spec)
        b = batch()
        out = model(input_ids=b[:, :-1], output_router_logits=True, use_cache=False)
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(),
                                               b[:, 1:].reshape(-1))
        over_batch, within_seq = balance_losses(out.router_logits, k, len(b))
        loss = ce + spec.aux_batch * over_batch + spec.aux_seq * within_seq
        opt.zero_grad(set_to_none=True)
        loss.backward()
        removed_ce = None
        if spec.aux_removed:
            hinge, removed_ce = reliance_loss(model, b[:, :-1], b[:, 1:], spec.removed_ce_floor)
            (spec.aux_removed * hinge).backward()  # gradients add up; a second graph, so one graph lives at a time
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        return ce.item(), float(within_seq.detach()), removed_ce

    total_steps = steps or spec.steps
    history = []
    step = 0
    t_train = time.time()
    cpu_train = time.process_time()
    if minutes is not None and steps is None:
        # Calibrate: time a few steps at a provisional schedule, then fix the total.
        probe = 8
        t0 = time.time()
        for step in range(probe):
            ce, aux, removed_ce = step_fn(step, 10_000)
        per_step = (time.time() - t0) / probe
        remaining = minutes * 60 - (time.time() - t_start) - 45  # leave time for evaluation + save
        total_steps = max(probe + 10, probe + int(remaining / (per_step * 1.04)))
        step = probe
        log(f"[{name}] calibrated: {per_step:.3f}s/step -> {total_steps} steps for {minutes} min")
    while step < total_steps:
        ce, aux, removed_ce = step_fn(step, total_steps)
        step += 1
        if step % 10 == 0:
            history.append({"step": step, "train_ce": round(ce, 4), "aux": round(aux, 4),
                            **({"removed_ce": round(removed_ce, 4)} if removed_ce is not None else {})})
        if step % spec.eval_every == 0 or step == total_steps:
            held = evaluate(model, eval_small)
            el = time.time() - t_train
            tps = step * spec.batch_size * spec.seq_len / el
            removed = f" removed_ce={removed_ce:.3f}" if removed_ce is not None else ""
            log(f"[{name}] step {step}/{total_steps} ce={ce:.3f} aux={aux:.3f}{removed} heldout(64w)={held:.3f} "
                f"lr={lr_at(step - 1, total_steps, spec):.2e} {el:.0f}s {tps:.0f} tok/s")
            history.append({"step": step, "heldout_ce_subset": round(held, 4)})
            if spec.probe_windows:

                probe = realism.probe(model, probe_windows)
                history[-1]["routing_probe"] = probe
                log(f"[{name}] step {step} routing probe: " + " ".join(f"{key}={v:.3f}" for key, v in probe.items()))
                model.train()
    train_wall = time.time() - t_train
    train_cpu = time.process_time() - cpu_train

    # Save bf16; evaluate the shipped weights (reloaded in float32) on every held-out window, and the trained fp32
    # weights and bf16 compute on a 64-window subset (bf16 matmuls are very slow on CPUs without AVX512-BF16).
    full = heldout_windows(held_tokens, spec.seq_len)
    subset = heldout_windows(held_tokens, spec.seq_len, limit=64)
    held_fp32_trained = evaluate(model, subset)
    log(f"[{name}] held-out 64-window subset (trained fp32 weights) loss={held_fp32_trained:.4f}")

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.config.output_router_logits = False
    model.config.use_cache = True
    model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for f in out_dir.iterdir():
        f.chmod(0o644)
    tok_mod.save(tokenizer, out_dir, CONTEXT)

    loaded_eval, subset_eval = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        m, _ = embedded.load(name, dtype=dtype, path=out_dir)
        key = str(dtype).replace("torch.", "")
        if dtype == torch.float32:
            loaded_eval[key] = evaluate(m, full)
        subset_eval[key] = evaluate(m, subset)
        del m
    log(f"[{name}] reloaded bf16 weights: full held-out loss (fp32 compute) {loaded_eval}; "
        f"64-window subset {subset_eval}")

    info = {
        "model": name,
        "arch": spec.arch,
        "seed": seed,
        "steps": total_steps,
        "batch_size": spec.batch_size,
        "seq_len": spec.seq_len,
        "tokens_seen": total_steps * spec.batch_size * spec.seq_len,
        "lr": spec.lr,
        "schedule": f"AdamW(b1=0.9,b2=0.95,wd={spec.weight_decay}) linear warmup {spec.warmup_frac:.0%} "
                    f"then cosine to {spec.min_lr_ratio}x",
        "grad_clip": spec.grad_clip,
        "aux_batch": spec.aux_batch,
        "aux_seq": spec.aux_seq,
        "aux_removed": spec.aux_removed,
        "removed_ce_floor": spec.removed_ce_floor,
        "stands_for": spec.stands_for,
        "overrides": dict(overrides or {}),
        "train_wall_s": round(train_wall, 1),
        "train_cpu_s": round(train_cpu, 1),
        "total_wall_s": round(time.time() - t_start, 1),
        "threads": torch.get_num_threads(),
        "params": params,
        "train_tokens_corpus": len(train_tokens),
        "heldout_tokens_corpus": len(held_tokens),
        "heldout_eval_windows": len(full),
        "heldout_subset64_loss_fp32_trained": round(held_fp32_trained, 4),
        "heldout_loss": {k: round(v, 4) for k, v in loaded_eval.items()},
        "heldout_ppl": {k: round(math.exp(v), 2) for k, v in loaded_eval.items()},
        "heldout_subset64_loss": {k: round(v, 4) for k, v in subset_eval.items()},
        "split": corpus.split_summary(),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "cpu": platform.processor() or platform.machine(),
        },
        "history": history,
    }
    (out_dir / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    if not card:
        log(f"[{name}] done in {time.time() - t_start:.0f}s -> {out_dir} (no calibration, no card: --no-card)")
        return out_dir

    m, tokenizer = embedded.load(name, dtype=torch.float32, path=out_dir)
    calibration = fidelity.fit_calibration(m, tokenizer, spec.seq_len, log=log)
    (out_dir / embedded.CALIBRATION_FILE).write_text(calibration.to_json())
    del m
    log(f"[{name}] draft-fidelity calibration: routed experts ×{calibration.error_scale}, head "
        f"×{calibration.head_error_scale} -> {out_dir / embedded.CALIBRATION_FILE}")
    try:

        model_card.write_card(name, out_dir)
    except Exception as err:  # routing stats / card are regenerated by `routing_stats --write-card`
        log(f"[{name}] card not written ({type(err).__name__}: {err}); run "
            f"`specterbench routing-stats --model {name} --write-card`")
    log(f"[{name}] done in {time.time() - t_start:.0f}s -> {out_dir}")
    return out_dir
