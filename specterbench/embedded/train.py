"""Train one embedded MoE model on the Shakespeare training works (CPU, one thread, fixed seed).

    python -m specterbench.embedded.train --model tiny-mixtral [--steps N | --minutes M] [--seed 0]

Writes ``specterbench/embedded/models/<NAME>/``: config.json, model.safetensors (bfloat16),
tokenizer files, training.json (the numbers behind the card) and CARD.md.

Without ``--minutes`` the step count is the model's fixed default (reproducible). With ``--minutes``
the script times a few steps first and picks the step count that fits the budget.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from specterbench.embedded import data  # noqa: E402
from specterbench.embedded import tokenizer as tok_mod  # noqa: E402
from specterbench.embedded.specs import CONTEXT, SPECS, Spec, build_config, with_overrides  # noqa: E402,F401

MODELS_DIR = Path(__file__).resolve().parent / "models"


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
        from specterbench.engine.seam import find_moe_blocks

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
    """The expert-reliance loss (issue 24): ``relu(floor − CE)`` of the batch decoded with the routed experts removed.

    A real MoE's next token collapses without its routed experts; a small model trained briefly leans on attention,
    shared experts and dense layers instead (86–92% of tokens survived removing the routed experts). The hinge trains
    the rest of the network to be useless on its own — up to ``floor`` nats of cross-entropy (about the uniform
    distribution's ln V), no further — so that the next token has to come through the routed experts. Returns the
    loss and the removed path's cross-entropy."""
    with routed_experts_removed(model):
        logits = model(input_ids=inputs, use_cache=False).logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    return torch.relu(floor - ce), float(ce.detach())


#: transformers' fused-expert kernel for training: same routing and outputs as the eager loop over experts, about
#: 2.3x fewer CPU seconds per step with 60-64 experts. config.json does not record it (the engine's seam
#: replaces the experts module anyway).
TRAIN_EXPERTS_IMPLEMENTATION = "grouped_mm"


def build_model(config):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                experts_implementation=TRAIN_EXPERTS_IMPLEMENTATION)
    except (ValueError, ImportError, TypeError):  # an older transformers without it: the eager loop
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def encode_works(tokenizer, works) -> torch.Tensor:
    """Concatenate works, each followed by EOS, into one long int64 tensor."""
    ids: list[int] = []
    for w in works:
        ids.extend(tokenizer(w.text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


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


def _set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def train(name: str, steps: int | None = None, minutes: float | None = None, seed: int = 0,
          out_dir: Path | None = None, log=print, overrides: dict[str, str] | None = None, card: bool = True) -> Path:
    if name not in SPECS:
        from specterbench.errors import UsageError

        raise UsageError(f"unknown embedded model {name!r}: choose one of {', '.join(SPECS)}")
    spec = with_overrides(SPECS[name], overrides or {})
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    _set_seed(seed)
    out_dir = Path(out_dir) if out_dir is not None else MODELS_DIR / name
    t_start = time.time()

    tokenizer = tok_mod.train_tokenizer()
    tokenizer.model_max_length = 10**9  # whole works are encoded at once; windows are cut below
    train_tokens = encode_works(tokenizer, data.train_works())
    held_tokens = encode_works(tokenizer, data.heldout_works())
    log(f"[{name}] tokenizer vocab={len(tokenizer)} train_tokens={len(train_tokens)} heldout_tokens={len(held_tokens)}")

    config = build_config(spec, tokenizer)
    _set_seed(seed)
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
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), b[:, 1:].reshape(-1))
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
                from specterbench.embedded import realism

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

    from specterbench import embedded

    loaded_eval, subset_eval = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        m, _ = embedded.load(name, dtype=dtype, path=out_dir)
        key = str(dtype).replace("torch.", "")
        if dtype == torch.float32:
            loaded_eval[key] = evaluate(m, full)
        subset_eval[key] = evaluate(m, subset)
        del m
    log(f"[{name}] reloaded bf16 weights: full held-out loss (fp32 compute) {loaded_eval}; 64-window subset {subset_eval}")

    info = {
        "model": name,
        "arch": spec.arch,
        "seed": seed,
        "steps": total_steps,
        "batch_size": spec.batch_size,
        "seq_len": spec.seq_len,
        "tokens_seen": total_steps * spec.batch_size * spec.seq_len,
        "lr": spec.lr,
        "schedule": f"AdamW(b1=0.9,b2=0.95,wd={spec.weight_decay}) linear warmup {spec.warmup_frac:.0%} then cosine to {spec.min_lr_ratio}x",
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
        "split": data.split_summary(),
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
    from specterbench.embedded import fidelity

    m, tokenizer = embedded.load(name, dtype=torch.float32, path=out_dir)
    calibration = fidelity.fit_calibration(m, tokenizer, spec.seq_len, log=log)
    (out_dir / fidelity.CALIBRATION_FILE).write_text(calibration.to_json())
    del m
    log(f"[{name}] draft-fidelity calibration: routed experts ×{calibration.error_scale}, head "
        f"×{calibration.head_error_scale} -> {out_dir / fidelity.CALIBRATION_FILE}")
    try:
        from specterbench.embedded import card

        card.write_card(name, out_dir)
    except Exception as err:  # routing stats / card are regenerated by `routing_stats --write-card`
        log(f"[{name}] card not written ({type(err).__name__}: {err}); run "
            f"`python -m specterbench.embedded.routing_stats --model {name} --write-card`")
    log(f"[{name}] done in {time.time() - t_start:.0f}s -> {out_dir}")
    return out_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specterbench.embedded.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, choices=sorted(SPECS))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the model's fixed count)")
    g.add_argument("--minutes", type=float, default=None, help="wall-time budget; calibrates the step count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output dir (default: the package's models/<NAME>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training setting (aux_seq=0.05) or config key (config.num_experts=32)")
    p.add_argument("--no-card", action="store_true",
                   help="skip the draft calibration, CARD.md and the realism report (an experiment)")
    args = p.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    train(args.model, steps=args.steps, minutes=args.minutes, seed=args.seed, out_dir=args.out,
          log=lambda s: print(s, flush=True), overrides=overrides, card=not args.no_card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
