"""Train a small dense draft (``tiny-draft``) on the stand-ins' corpus, tokenizer and recipe (CPU, one thread,
fixed seed).

    specterbench train --model tiny-draft [--steps N] [--seed 0]

The stand-ins' recipe without what only a router needs (no balance or expert-reliance loss): the same byte-level BPE
(so the draft's ids are the stand-ins' ids), the same training works, batches, AdamW schedule and clipping. Writes
``specterbench/catalog/stand_ins/<NAME>/``: config.json, model.safetensors (bfloat16, as the stand-ins ship
theirs), tokenizer files, training.json and CARD.md.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specterbench.catalog import corpus, drafts
from specterbench.errors import UsageError
from specterbench.studies import tokenizer as tok_mod
from specterbench.studies.specs import CONTEXT, DRAFT_SPECS, build_config, with_overrides
from specterbench.studies.train import (
    MODELS_DIR,
    count_params,
    evaluate,
    heldout_windows,
    lr_at,
    make_optimizer,
    set_seed,
    training_corpus,
)


def train_draft(name: str, steps: int | None = None, seed: int = 0, out_dir: Path | None = None, log=print,
                overrides: dict[str, str] | None = None) -> Path:
    if name not in DRAFT_SPECS:
        raise UsageError(f"unknown draft model {name!r}: choose one of {', '.join(DRAFT_SPECS)}")
    spec = with_overrides(DRAFT_SPECS[name], overrides or {})
    out_dir = Path(out_dir) if out_dir is not None else MODELS_DIR / name
    t_start = time.time()
    tokenizer, train_tokens, held_tokens = training_corpus(name, seed, log)

    config = build_config(spec, tokenizer)
    set_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    params = count_params(model)
    log(f"[{name}] params={params}")
    opt = make_optimizer(model, spec)
    gen = torch.Generator().manual_seed(seed)
    eval_small = heldout_windows(held_tokens, spec.seq_len, limit=64)
    total_steps = steps or spec.steps
    history = []
    t_train, cpu_train = time.time(), time.process_time()
    for step in range(total_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, spec)
        starts = torch.randint(0, len(train_tokens) - spec.seq_len - 1, (spec.batch_size,), generator=gen)
        b = torch.stack([train_tokens[s: s + spec.seq_len + 1] for s in starts.tolist()])
        logits = model(input_ids=b[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        done = step + 1
        if done % 10 == 0:
            history.append({"step": done, "train_ce": round(loss.item(), 4)})
        if done % spec.eval_every == 0 or done == total_steps:
            held = evaluate(model, eval_small)
            el = time.time() - t_train
            log(f"[{name}] step {done}/{total_steps} ce={loss.item():.3f} heldout(64w)={held:.3f} {el:.0f}s")
            history.append({"step": done, "heldout_ce_subset": round(held, 4)})
    train_wall, train_cpu = time.time() - t_train, time.process_time() - cpu_train

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.config.use_cache = True
    model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for f in out_dir.iterdir():
        f.chmod(0o644)
    tok_mod.save(tokenizer, out_dir, CONTEXT)
    full = heldout_windows(held_tokens, spec.seq_len)
    shipped, _ = drafts.load(name, dtype=torch.float32, path=out_dir)
    held_loss = evaluate(shipped, full)
    log(f"[{name}] reloaded bf16 weights: full held-out loss (fp32 compute) {held_loss:.4f}")
    info = {
        "model": name, "arch": spec.arch, "seed": seed, "steps": total_steps, "batch_size": spec.batch_size,
        "seq_len": spec.seq_len, "vocab": len(tokenizer),
        "tokens_seen": total_steps * spec.batch_size * spec.seq_len, "lr": spec.lr,
        "schedule": f"AdamW(b1=0.9,b2=0.95,wd={spec.weight_decay}) linear warmup {spec.warmup_frac:.0%} "
                    f"then cosine to {spec.min_lr_ratio}x",
        "grad_clip": spec.grad_clip, "stands_for": spec.stands_for, "overrides": dict(overrides or {}),
        "train_wall_s": round(train_wall, 1), "train_cpu_s": round(train_cpu, 1),
        "total_wall_s": round(time.time() - t_start, 1), "threads": torch.get_num_threads(), "params": params,
        "train_tokens_corpus": len(train_tokens), "heldout_tokens_corpus": len(held_tokens),
        "heldout_eval_windows": len(full), "heldout_loss": {"float32": round(held_loss, 4)},
        "heldout_ppl": {"float32": round(math.exp(held_loss), 2)}, "split": corpus.split_summary(),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__,
                        "tokenizers": __import__("tokenizers").__version__},
        "history": history,
    }
    (out_dir / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    (out_dir / "CARD.md").write_text(card(name, info))
    log(f"[{name}] done in {time.time() - t_start:.0f}s -> {out_dir}")
    return out_dir


def card(name: str, info: dict) -> str:
    """The draft's model card, from its training numbers."""
    p = info["params"]["total"]
    return (f"# {name}\n\nA dense draft (LlamaForCausalLM, {p / 1e6:.2f}M parameters, bfloat16) for `spec-small`: "
            f"speculative decoding with a separate small draft, as llama.cpp's `-md` and vLLM's draft-model "
            f"speculation run it.\n\nTrained by the project on the stand-ins' training works with their tokenizer "
            f"(byte-level BPE, {info['vocab']} ids) and recipe: {info['steps']} steps of "
            f"{info['batch_size']} x {info['seq_len']} tokens, {info['schedule']}, seed {info['seed']}, one CPU "
            f"thread ({info['train_cpu_s']:.0f} CPU s). No balance or expert-reliance loss: it has no router.\n\n"
            f"Held-out loss (the five held-out works, {info['heldout_eval_windows']} windows, shipped bf16 weights "
            f"in fp32): {info['heldout_loss']['float32']:.4f} nats/token (perplexity "
            f"{info['heldout_ppl']['float32']:.1f}).\n\nRebuild: `make models` or "
            f"`OMP_NUM_THREADS=1 specterbench train --model {name} --seed {info['seed']}`.\n")
