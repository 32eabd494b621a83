"""The engine's own cost: all experts resident through the engine vs stock ``model.generate``, one process.

Both decode the same prompts greedily for the same number of tokens, alternating prompt by prompt so that
machine noise hits both alike; the result is the median of per-prompt wall-time ratios (engine / stock).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specterbench.bench.resident import ReferenceStrategy
from specterbench.bench.runner import encode_prompts, load_prompts
from specterbench.engine.engine import Engine
from specterbench.engine.host_clock import HostWallClock
from specterbench.strategy import Request


@dataclass(frozen=True, slots=True)
class OverheadResult:
    model: str
    prompts: int
    tokens: int
    stock_ms_per_token: float  # median over prompts
    engine_ms_per_token: float
    ratio_median: float  # engine / stock, median of per-prompt ratios
    ratios: tuple[float, ...]
    tokens_equal: bool


def measure_overhead(host, model_name: str, prompts: int = 8, tokens: int = 32, workload="shakespeare-heldout-v1",
                     threads: int = 1) -> OverheadResult:
    torch.set_num_threads(threads)
    spec = host.models().get(model_name)
    stock_model, tokenizer = spec.load()
    engine_model, _ = spec.load()
    engine = Engine(engine_model, name=model_name, tokenizer=tokenizer)
    strategy = ReferenceStrategy()
    engine.configure(strategy, engine.total_expert_bytes, HostWallClock())
    strategy.prepare(engine)
    encoded = encode_prompts(engine, load_prompts(workload, prompts), 64)
    stock_ms, engine_ms, ratios, equal = [], [], [], True

    def stock(ids):
        with torch.inference_mode():
            out = stock_model.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens,
                                       do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    def ours(ids):
        request = Request("overhead", ids, tokens)
        engine.begin_request(request)
        return engine.greedy_decode(request)

    stock(encoded[0][1]), ours(encoded[0][1])  # warm-up, discarded
    for _, ids in encoded:
        t0 = time.perf_counter()
        a = stock(ids)
        t1 = time.perf_counter()
        b = ours(ids)
        t2 = time.perf_counter()
        equal &= a == b
        stock_ms.append((t1 - t0) * 1e3 / tokens)
        engine_ms.append((t2 - t1) * 1e3 / tokens)
        ratios.append((t2 - t1) / (t1 - t0))
    return OverheadResult(model_name, len(encoded), tokens, statistics.median(stock_ms), statistics.median(engine_ms),
                          statistics.median(ratios), tuple(ratios), equal)
