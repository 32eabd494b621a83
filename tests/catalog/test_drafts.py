"""The shipped dense draft (spec-small's): offline loading, its tokenizer is the stand-ins', the recipe it was trained
with is theirs, errors in one line. Fast and CPU-only; never trains."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from specterbench.catalog import drafts, embedded
from specterbench.cli import main
from specterbench.errors import ModelError, UsageError


@pytest.fixture(scope="module")
def draft():
    return drafts.load("tiny-draft")


def test_loads_offline_as_a_small_dense_model_in_eval_mode(draft):
    model, tok = draft
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert sum(p.numel() for p in model.parameters()) == 2_361_024
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size) == (192, 4, 512, len(tok))
    weights = drafts.draft_dir("tiny-draft") / "model.safetensors"
    assert weights.stat().st_size < 5 * 1024 * 1024  # bf16, as the stand-ins ship theirs


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_its_tokenizer_is_every_stand_ins(draft, name):
    assert drafts.same_tokenizer(draft[1], embedded.load(name)[1])


def test_trained_with_the_stand_ins_recipe_and_better_than_uniform():
    info = json.loads((drafts.draft_dir("tiny-draft") / "training.json").read_text())
    ref = json.loads((embedded.model_dir("tiny-mixtral") / "training.json").read_text())
    for key in ("batch_size", "seq_len", "lr", "schedule", "grad_clip", "seed", "split", "train_tokens_corpus"):
        assert info[key] == ref[key], key
    assert info["threads"] == 1 and info["heldout_loss"]["float32"] < math.log(info["vocab"]) - 2


def test_a_held_out_line_is_predicted_better_than_chance(draft):
    model, tok = draft
    ids = torch.tensor([tok.encode("Is this a dagger which I see before me, the handle toward my hand?")])
    with torch.inference_mode():
        loss = model(input_ids=ids, labels=ids).loss
    assert float(loss) < math.log(len(tok)) - 1


def test_the_random_draft_reads_the_byte_tokenizer():
    model, tok = drafts.load(drafts.RANDOM_DRAFT)
    assert model.config.vocab_size == 256 and not drafts.same_tokenizer(tok, drafts.load("tiny-draft")[1])


def test_bad_names_and_broken_files_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="unknown trained draft 'nope'"):
        drafts.draft_dir("nope")
    d = tmp_path / "tiny-draft"
    shutil.copytree(drafts.draft_dir("tiny-draft"), d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="model.safetensors") as err:
        drafts.load("tiny-draft", path=d)
    assert "\n" not in str(err.value)


def test_train_refuses_minutes_for_the_draft(capsys):
    assert main(["train", "--model", "tiny-draft", "--minutes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--minutes is for the stand-ins" in err and "\n" not in err
