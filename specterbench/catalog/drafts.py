"""Small dense drafts for ``spec-small``: one trained by the project and shipped beside the stand-ins, one seeded
random for the random-init test models.

    from specterbench.catalog import drafts
    model, tokenizer = drafts.load("tiny-draft")   # a LlamaForCausalLM, float32, eval mode, offline
    drafts.draft_for(engine.tokenizer)             # the draft that reads the target's token ids, or None

``tiny-draft`` is trained on the stand-ins' corpus with their tokenizer and recipe (``make models``; ``specterbench
train --model tiny-draft``), so it proposes tokens for any stand-in. ``tiny-random-draft`` is a seeded random-init
dense model over the byte tokenizer of the ``tiny-random-*`` models (:mod:`specterbench.catalog.tiny`): its proposals
carry no knowledge, so it exercises the draft path on those models, nothing more. A draft's proposals are token ids,
so it drafts only for a target whose tokenizer is its own (:func:`same_tokenizer`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specterbench.catalog import embedded
from specterbench.catalog.tiny import ByteTokenizer
from specterbench.errors import UsageError

TRAINED_DRAFTS: tuple[str, ...] = ("tiny-draft",)
RANDOM_DRAFT = "tiny-random-draft"
DRAFT_MODELS: tuple[str, ...] = (*TRAINED_DRAFTS, RANDOM_DRAFT)
PROBE_TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer"


def draft_dir(name: str) -> Path:
    """Directory of a shipped draft inside the installed package (may not exist if not built)."""
    if name not in TRAINED_DRAFTS:
        raise UsageError(f"unknown trained draft {name!r}: choose one of {', '.join(TRAINED_DRAFTS)}")
    return embedded.model_dir(embedded.EMBEDDED_MODELS[0]).parent / name


def random_draft(seed: int = 0):
    """A seeded random-init dense model over the byte tokenizer (1 layer, hidden 32), weights exact in bf16."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval(), ByteTokenizer()


def load(name: str, dtype: torch.dtype = torch.float32, path: str | os.PathLike | None = None):
    """Load a draft and its tokenizer offline, in eval mode (one-line ModelError naming the file and the fix when
    a shipped draft's files are missing or broken)."""
    if name == RANDOM_DRAFT:
        model, tokenizer = random_draft()
        return model.to(dtype), tokenizer
    return embedded.load(name, dtype=dtype, path=path if path is not None else draft_dir(name))


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids: both the byte tokenizer, or the same vocabulary, special
    tokens and encoding of a probe text."""
    if a is None or b is None:
        return False
    if isinstance(a, ByteTokenizer) or isinstance(b, ByteTokenizer):
        return type(a) is type(b)
    return (a.get_vocab() == b.get_vocab() and
            (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id) and
            a.encode(PROBE_TEXT) == b.encode(PROBE_TEXT))


__all__ = ["DRAFT_MODELS", "RANDOM_DRAFT", "TRAINED_DRAFTS", "draft_dir", "load", "random_draft", "same_tokenizer"]
