import pytest

from specterbench.catalog.models import MODEL_PATH_ENV, resolve_checkpoint
from specterbench.catalog.tiny import tiny_random
from specterbench.errors import ModelError


def write_checkpoint(path):
    """A real transformers checkpoint: tiny Mixtral weights + a word-level tokenizer, as save_pretrained writes."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    model, _ = tiny_random("mixtral")
    model.save_pretrained(path)
    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(256)} | {"<unk>": 0}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    return model


def test_preset_resolves_from_the_hf_cache_layout_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    repo = tmp_path / "hub" / "models--mistralai--Mixtral-8x7B-v0.1"
    snapshot = repo / "snapshots" / "abc123"
    write_checkpoint(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    assert resolve_checkpoint("mixtral") == snapshot


def test_preset_loads_from_an_explicit_path_and_runs(host, small_prompts, tmp_path, monkeypatch):
    write_checkpoint(tmp_path / "ckpt")
    monkeypatch.setenv(MODEL_PATH_ENV, str(tmp_path / "ckpt"))
    model, tokenizer = host.models().get("mixtral").load()
    assert model.config.model_type == "mixtral" and tokenizer.encode("w1 w2") == [1, 2]


def test_missing_checkpoint_names_repo_place_and_what_to_run(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    with pytest.raises(ModelError) as err:
        resolve_checkpoint("qwen-moe")
    msg = str(err.value)
    assert "Qwen/Qwen1.5-MoE-A2.7B" in msg and str(tmp_path / "empty") in msg
    assert "make bench MODEL=tiny-qwen-moe GEOMETRY=qwen-moe" in msg and "\n" not in msg


def test_a_checkpoint_without_moe_names_the_supported_families(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "llama")
    monkeypatch.setenv(MODEL_PATH_ENV, str(tmp_path / "llama"))
    from specterbench.catalog.models import load_checkpoint

    with pytest.raises(ModelError, match="supported families: mixtral"):
        load_checkpoint(resolve_checkpoint("mixtral"))


def test_a_preset_without_a_local_checkpoint_runs_its_stand_in_at_the_presets_sizes_and_says_so(tmp_path, capsys,
                                                                                                 monkeypatch):
    import huggingface_hub.constants as constants

    from specterbench.cli import main
    from specterbench.runfiles.results import read_rows

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    assert main(["run", "--model", "mixtral", "--strategies", "lru", "--budgets", "50%", "--tokens", "3",
                 "--prompts", "1", "--out", str(tmp_path), "--run-id", "r", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "no local checkpoint of mistralai/Mixtral-8x7B-v0.1: running the shipped stand-in tiny-mixtral" in err
    (row,) = read_rows(tmp_path / "r")
    assert (row.model, row.geometry) == ("tiny-mixtral", "mixtral")
