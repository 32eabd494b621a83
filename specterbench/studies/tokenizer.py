"""Byte-level BPE tokenizer for the embedded models, trained on the training works only."""

from __future__ import annotations

from pathlib import Path

from specterbench.catalog import corpus as data

VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2


def train_tokenizer(vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE on the training works (deterministic) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((w.text for w in data.train_works()), trainer=trainer)
    return wrap(tok)


def wrap(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )


def save(tokenizer, directory: Path, model_max_length: int) -> None:
    tokenizer.model_max_length = model_max_length
    tokenizer.save_pretrained(str(directory))
