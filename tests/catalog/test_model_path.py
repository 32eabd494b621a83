"""``--model-path DIR``: any local checkpoint of a supported family, and one line for a directory that is not one."""

import json

import pytest
import torch

from specterbench.catalog.checkpoint import load_checkpoint, write_random_checkpoint
from specterbench.catalog.models import local_spec
from specterbench.catalog.tiny import tiny_config
from specterbench.errors import ModelError


@pytest.fixture
def checkpoint(tmp_path):
    return write_random_checkpoint(tmp_path / "my-moe", tiny_config("qwen2_moe"), shard_bytes=100_000)


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_the_family_and_geometry_come_from_config_json(checkpoint):
    spec = local_spec(checkpoint)
    assert (spec.name, spec.family, spec.kind) == ("local:my-moe", "qwen2_moe", "local")
    assert "2 layers, 16 experts, top-4" in spec.description
    model, tokenizer = spec.load()
    assert type(model).__name__ == "Qwen2MoeForCausalLM"
    assert tokenizer.encode("ab") == [97, 98]  # no tokenizer files: byte tokens


def test_a_registered_local_model_runs_a_benchmark_cell(checkpoint, tmp_path, small_prompts):
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner
    from specterbench.plugins.host import get_host, reset_host

    reset_host()
    host = get_host()
    try:
        name = host.register_local_model(checkpoint)
        assert host.register_local_model(checkpoint) == name  # registering twice is harmless
        config = BenchConfig(models=(name,), strategies=("lru",), budgets=(parse_budget("50%"),),
                             profile="a100-40g-pcie4", prompts=1, tokens=2, warmup=False)
        (row,) = Runner(host, config, tmp_path / "run").run()
        assert row.status == "ok", row.error
        assert row.model == name and row.lossless
    finally:
        reset_host()


def test_an_unsupported_family_names_the_family_and_the_supported_ones(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path / "llama")
    with pytest.raises(ModelError) as err:
        local_spec(tmp_path / "llama")
    text = one_line(err)
    assert "'llama'" in text and "supported families: mixtral, qwen2_moe" in text


def test_a_corrupt_config_json_is_one_line(checkpoint):
    (checkpoint / "config.json").write_text('{"model_type": "mixtral", ')
    with pytest.raises(ModelError, match="corrupt JSON") as err:
        local_spec(checkpoint)
    one_line(err)


def test_a_config_without_model_type_is_one_line(checkpoint):
    (checkpoint / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelError, match="no 'model_type'") as err:
        local_spec(checkpoint)
    one_line(err)


def test_a_directory_without_weights_is_one_line(checkpoint):
    for f in checkpoint.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(ModelError, match="no weights") as err:
        local_spec(checkpoint)
    one_line(err)


def test_a_missing_shard_is_named(checkpoint):
    shard = sorted(checkpoint.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelError, match=f"{shard.name}.*missing"):
        local_spec(checkpoint)


def test_a_truncated_shard_fails_at_load_with_one_line(checkpoint):
    shard = sorted(checkpoint.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelError, match="truncated") as err:
        load_checkpoint(checkpoint)
    one_line(err)


def test_a_checkpoint_that_does_not_match_its_config_is_one_line(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["hidden_size"] = 128  # the weights are 64 wide
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="does not match config.json") as err:
        load_checkpoint(checkpoint)
    one_line(err)


def test_no_such_directory_is_one_line(tmp_path):
    with pytest.raises(ModelError, match="no such directory"):
        local_spec(tmp_path / "nowhere")


def test_the_loaded_model_computes_what_transformers_computes(checkpoint):
    from transformers import AutoModelForCausalLM

    model, _ = load_checkpoint(checkpoint, torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, local_files_only=True)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(model(ids).logits, reference(ids).logits)


def test_the_command_line_runs_a_local_checkpoint_from_its_path_alone(checkpoint, tmp_path, small_prompts, capsys):
    from specterbench.cli import main
    from specterbench.plugins.host import reset_host

    reset_host()
    try:
        code = main(["run", "--model-path", str(checkpoint), "--strategies", "lru", "--budgets", "50%",
                     "--prompts", "1", "--tokens", "2", "--no-warmup", "--quiet", "--out", str(tmp_path / "r"),
                     "--run-id", "x"])
    finally:
        reset_host()
    assert code == 0, capsys.readouterr().err
    assert "local:my-moe" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["config", "weights", "family"])
def test_the_command_line_answers_a_bad_model_path_in_one_line_with_exit_2(checkpoint, tmp_path, damage, capsys):
    from specterbench.cli import main
    from specterbench.plugins.host import reset_host

    if damage == "config":
        (checkpoint / "config.json").write_text("{not json")
    elif damage == "weights":
        for f in checkpoint.glob("*.safetensors*"):
            f.unlink()
    else:
        cfg = json.loads((checkpoint / "config.json").read_text())
        (checkpoint / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    reset_host()
    try:
        code = main(["run", "--model-path", str(checkpoint), "--strategies", "lru", "--out", str(tmp_path / "r")])
    finally:
        reset_host()
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert {"config": "corrupt JSON", "weights": "no weights", "family": "'llama'"}[damage] in err


def test_a_random_checkpoint_of_any_size_is_one_command(tmp_path, capsys):
    from specterbench.cli import main

    assert main(["random-checkpoint", str(tmp_path / "big"), "--family", "mixtral", "--set", "num_hidden_layers=3",
                 "--set", "num_local_experts=4"]) == 0
    spec = local_spec(tmp_path / "big")
    assert "3 layers, 4 experts, top-2" in spec.description
    assert main(["random-checkpoint", str(tmp_path / "bad"), "--family", "mixtral", "--set", "no_such_field=1"]) == 2
