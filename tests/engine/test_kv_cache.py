"""The KV cache is used on every transformers pyproject.toml allows: passed under the name the installed forward
takes, and checked after every forward to have grown by the tokens just run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specterbench.catalog.tiny import tiny_random
from specterbench.engine.compat import cache_kwarg
from specterbench.engine.engine import Engine
from specterbench.errors import EngineViolation, UsageError
from specterbench.strategy import Strategy

ROOT = Path(__file__).resolve().parents[2]
MIN_DIR_ENV = "SPECTERBENCH_MIN_TRANSFORMERS"  # a --target folder holding the lowest allowed transformers


def _lowest_allowed() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"transformers>=([0-9.]+),', text).group(1)


def _engine(family="mixtral"):
    model, tok = tiny_random(family)
    engine = Engine(model, name=family, tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes, engine.clock)
    return engine, tok


def test_the_cache_keyword_is_the_one_the_forward_lists():
    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    class Neither(torch.nn.Module):
        def forward(self, input_ids=None, **kwargs): ...

    assert cache_kwarg(Old()) == "past_key_values" and cache_kwarg(New()) == "cache"
    with pytest.raises(UsageError, match="takes no KV cache argument") as err:
        cache_kwarg(Neither())
    assert "\n" not in str(err.value)


def test_the_engine_checks_that_the_cache_grew_by_the_tokens_run():
    engine, _ = _engine()
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([[1, 2, 3]]), kv)
    engine.forward(torch.tensor([[4]]), kv)
    assert kv.get_seq_length() == 4
    engine.cache_kwarg = "kv_that_the_forward_swallows"  # what passing it under an old name did
    with pytest.raises(EngineViolation, match="did not use it"):
        engine.forward(torch.tensor([[5]]), kv)


SCRIPT = """
import json, sys, torch, transformers
from specterbench.engine.engine import Engine
from specterbench.catalog.tiny import tiny_random
from specterbench.strategy import Request, Strategy
out = {"version": transformers.__version__, "file": transformers.__file__, "families": {}}
for family in ("mixtral", "qwen2_moe"):
    model, tok = tiny_random(family)
    prompt = tok.encode("Shall I compare thee to a summer's day?")
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    engine = Engine(model, name=family, tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes, engine.clock)
    request = Request("p", tuple(prompt), 12)
    engine.begin_request(request)
    out["families"][family] = [engine.decode(request), stock[0, len(prompt):].tolist(), engine.cache_kwarg]
print(json.dumps(out))
"""


def _min_dir() -> Path | None:
    for candidate in (os.environ.get(MIN_DIR_ENV), ROOT / ".tf-min"):
        if candidate and (Path(candidate) / "transformers").is_dir():
            return Path(candidate)
    return None


@pytest.mark.skipif(_min_dir() is None, reason=f"the lowest allowed transformers is not installed beside the venv: "
                    f"run scripts/min_transformers.sh (or set {MIN_DIR_ENV} to a --target folder holding it)")
def test_decode_under_the_lowest_allowed_transformers_equals_its_stock_generate():
    import json

    target = _min_dir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["version"].startswith(_lowest_allowed()) and str(target) in out["file"]
    for family, (engine_tokens, stock_tokens, name) in out["families"].items():
        assert engine_tokens == stock_tokens, family
        assert name == "past_key_values"  # 5.17's forward name for it (later versions say ``cache``)


def test_a_transformers_below_the_supported_one_is_one_line(monkeypatch):
    from specterbench.engine import compat

    assert compat.MIN_TRANSFORMERS == _lowest_allowed()  # the check and pyproject.toml name one version
    monkeypatch.setattr(compat, "transformers_version", lambda: "5.2.0")
    with pytest.raises(UsageError, match=r"transformers 5.2.0 is older than the lowest supported, 5.17: pip install") \
            as err:
        compat.check_transformers()
    assert "\n" not in str(err.value)
