"""CUDA path: real copies on a dedicated stream from pinned memory, CUDA events, measured clock.

Skipped without a CUDA device; run on a GPU machine with ``scripts/gpu_check.sh``.
"""

import pytest
import torch

from specterbench.bench.runner import BenchConfig, Runner, parse_budget

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("strategy", ["lru", "on-demand", "oracle", "specter", "cpu-experts"])
def test_measured_clock_on_cuda_is_lossless_and_counts_copies(host, small_prompts, tmp_path, strategy):
    cfg = BenchConfig(models=("tiny-random-qwen2-moe",), strategies=(strategy,), budgets=(parse_budget("60%"),),
                      profile="a100-40g-pcie4", clock="measured", device="cuda", prompts=2, tokens=8)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok", row.error
    assert row.clock == "measured" and row.tpot_ms > 0
    assert row.lossless is True
    if strategy != "cpu-experts":
        assert row.h2d_bytes > 0


def test_store_is_pinned_and_cache_lives_on_the_device(host):
    from specterbench.engine.engine import Engine
    from specterbench.engine.models import tiny_random

    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="m", device="cuda", tokenizer=tok)
    assert all(w.is_pinned() for pair in engine.store.weights.values() for w in pair)
