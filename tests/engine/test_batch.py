"""Several requests at once: the batched forward is lossless per request, the strategy sees the union of the
requests' experts, KV is charged to the budget, and the per-user / per-GPU figures are what the steps say."""

import pytest
import torch
from support import configure

from specterbench.bench.batching import kv_bytes, parse_batches
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.device_memory import kv_bytes_per_token
from specterbench.bench.runner import Runner
from specterbench.engine.batch import begin_batch, decode_batch
from specterbench.engine.sampling import DecodeSetting
from specterbench.errors import BudgetError, UsageError
from specterbench.strategy import Request, Strategy

SAMPLED = DecodeSetting.sample(temperature=1.0)


@pytest.fixture
def small_prompts(monkeypatch):
    """Sixteen short prompts (the shared fixture has three; a batch of 16 needs more)."""
    from specterbench.bench import runner
    from specterbench.testing.pytest_plugin import SMALL_PROMPTS

    texts = [(f"q{j}", f"{text} {j}") for j, text in enumerate(t for _ in range(6) for _, t in SMALL_PROMPTS)][:16]
    monkeypatch.setattr(runner, "load_prompts", lambda name, n: texts[:n])
    return texts


def config(**kw):
    base = dict(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("50%"),),
                profile="a100-40g-pcie4", prompts=4, tokens=6, batches=(4,))
    base.update(kw)
    return BenchConfig(**base)


def lossless_strategies(host, batch):
    """Every built-in lossless strategy that decodes ``batch`` requests together (the others declare max_batch);
    the speculative plugin's are checked at a budget that holds their drafts (plugins/specter/tests/test_batched.py)."""
    names = []
    for name in host.strategies().names():
        cls = host.strategies().get(name)
        if not cls.__module__.startswith("specterbench."):
            continue
        if cls.lossless and (cls.max_batch is None or cls.max_batch >= batch):
            names.append(name)
    return tuple(names)


@pytest.mark.parametrize("decode", [DecodeSetting(), SAMPLED], ids=["greedy", "sampled"])
def test_every_lossless_strategy_is_lossless_at_batch_4(host, small_prompts, tmp_path, decode):
    names = lossless_strategies(host, 4)
    assert {"lru", "on-demand", "cpu-experts", "n-cpu-moe", "kt-hybrid", "static", "resident"} <= set(names)
    # 65%: room for one whole layer of experts beside four requests' KV (layer-stream computes a layer only then)
    rows = Runner(host, config(strategies=names, decode=decode, budgets=(parse_budget("65%"),)), tmp_path).run()
    assert len(rows) == len(names)
    for row in rows:
        assert row.batch == 4
        assert (row.status, row.lossless) == ("ok", True), (row.strategy, row.error)
        assert row.extra["numerics"] == "bit-identical", row.strategy


def test_batched_tokens_equal_each_requests_own(engine):
    strategy = Strategy()
    configure(engine, strategy, slots=4)
    prompts = [tuple(torch.randint(0, 200, (5,), generator=torch.Generator().manual_seed(i)).tolist())
               for i in range(4)]
    for decode in (DecodeSetting(), SAMPLED):
        requests = [Request(f"p{i}", ids, 6, decode=decode) for i, ids in enumerate(prompts)]
        alone = []
        for r in requests:
            engine.begin_request(r)
            alone.append(engine.decode(r))
        begin_batch(engine, requests)
        assert strategy.generate_batch(engine, requests) == alone  # the contract's default: decode_batch
        assert len(engine.samples) == 6  # one sample per step, every request served in it


class Recording(Strategy):
    def __init__(self):
        super().__init__()
        self.layers, self.steps = [], []

    def before_layer(self, layer, experts, tokens_per_expert):
        self.layers.append((layer, self.engine.batch, list(experts), list(tokens_per_expert)))

    def on_step_start(self, n_tokens):
        self.steps.append(n_tokens)


def test_a_layer_sees_the_union_of_the_requests_experts(engine):
    strategy = Recording()
    configure(engine, strategy, slots=4)
    requests = [Request(f"p{i}", (3 + i, 7, 11), 2) for i in range(3)]
    rec = engine.start_recording()
    begin_batch(engine, requests)
    decode_batch(engine, requests)
    engine.stop_recording()
    assert strategy.steps == [9, 3]  # prefill: 3 requests × 3 tokens; decode: one token each
    k = engine.top_k
    for (layer, batch, experts, counts), (traced_layer, traced) in zip(strategy.layers, rec.trace):
        assert layer == traced_layer and batch == 3
        assert experts == sorted(set(traced)) and sum(counts) % k == 0
    decode_layers = strategy.layers[len(strategy.layers) // 2:]
    assert [sum(c) for _, _, _, c in decode_layers] == [3 * k] * len(decode_layers)  # 3 tokens × top-k routings
    assert engine.stats.decode_layer_calls == len(decode_layers)
    assert engine.stats.decode_distinct_experts == sum(len(e) for _, _, e, _ in decode_layers)


def test_union_count_against_a_hand_computed_routing(engine):
    from support import route

    configure(engine, Strategy(), slots=8)
    engine.batch = 3  # a decode step of three requests: one token each
    try:
        route(engine, 0, [[0, 1], [1, 2], [0, 5]])  # experts {0, 1, 2, 5}
        route(engine, 1, [[3, 4], [3, 4], [3, 4]])  # experts {3, 4}, three tokens each
    finally:
        engine.batch = 1
    st = engine.stats
    assert (st.decode_layer_calls, st.decode_distinct_experts, st.decode_routings) == (2, 6, 12)
    assert st.decode_distinct_experts / st.decode_layer_calls == 3.0  # distinct experts per layer per step
    assert st.decode_routings / st.decode_distinct_experts == 2.0  # tokens per activated expert


def test_kv_of_every_request_is_charged_to_the_budget(host, small_prompts, tmp_path, engine):
    rows = {r.batch: r for r in Runner(host, config(batches=(1, 4)), tmp_path).run()}
    per_request = rows[1].extra["kv_bytes_priced"]
    context, rest = divmod(per_request, kv_bytes_per_token(engine.geometry))  # the priced KV of every layer
    assert rest == 0 and context > 6  # prompt + the 6 new tokens, per request
    assert rows[4].extra["kv_bytes_priced"] == 4 * per_request
    for row in rows.values():
        assert row.extra["kv_bytes"] > 0
        assert row.peak_cache_bytes <= row.budget_bytes - row.extra["kv_bytes"]  # the cache got the rest


def test_a_batch_whose_kv_cannot_fit_names_the_largest_that_fits(host, small_prompts, tmp_path, engine):
    per_request = kv_bytes(engine, 1, 1)[1]
    assert kv_bytes(engine, 4, 1)[1] == pytest.approx(4 * per_request, abs=4)
    room = kv_bytes(engine, 1, 200)[1]  # one request of up to 200 positions fits; 16 of 64 new tokens do not
    budget = parse_budget(f"{engine.min_budget_bytes() + room}B")
    with pytest.raises(BudgetError, match=r"--batch 16 does not fit .* the largest that fits is --batch \d+"):
        Runner(host, config(budgets=(budget,), batches=(1, 16), prompts=16, tokens=64), tmp_path).run()
    assert not (tmp_path / "rows.jsonl").exists()


def test_per_user_and_per_gpu_speed_on_a_small_run(host, small_prompts, tmp_path):
    rows = {r.batch: r for r in Runner(host, config(strategies=("resident",), batches=(1, 4)), tmp_path).run()}
    one, four = rows[1], rows[4]
    for row in (one, four):
        assert row.tokens_per_s_total == pytest.approx(row.batch * row.tokens_per_s_per_user)
        assert row.tokens_per_s_per_user == pytest.approx(row.tokens_per_s)
        assert row.tpot_p99_ms >= row.tpot_p90_ms >= row.tpot_ms > 0
    assert one.tokens_per_s_total == pytest.approx(one.tokens_per_s_per_user)
    assert four.tokens_per_s_total > one.tokens_per_s_total  # four users share each step's weight reads
    assert four.tokens_per_s_per_user < one.tokens_per_s_per_user  # each waits for the whole batch's step
    assert four.distinct_experts_per_step > one.distinct_experts_per_step
    from specterbench.analysis.plots import write_plots

    paths = write_plots(tmp_path, list(rows.values()))
    assert [p.name for p in paths if p.name.startswith("per_user_vs_per_gpu__")] == [
        "per_user_vs_per_gpu__tiny-random-mixtral__a100-40g-pcie4.png"]


def test_a_strategy_past_its_max_batch_is_a_row_that_says_why(host, small_prompts, tmp_path):
    rows = {(r.strategy, r.batch): r for r in Runner(host, config(strategies=("oracle", "lru"), batches=(1, 2)),
                                                   tmp_path).run()}
    row = rows[("oracle", 2)]
    assert row.status == "unsupported" and "at most 1 request" in row.error and "batch 2" in row.error
    assert rows[("oracle", 1)].status == rows[("lru", 2)].status == "ok"


@pytest.mark.parametrize("text", ["0", "1,-2", "x", ","])
def test_a_bad_batch_is_one_line(text):
    with pytest.raises(UsageError, match="--batch"):
        parse_batches(text)


def test_a_step_of_ragged_counts_gives_each_request_its_own_samples():
    """A batched speculative window gives requests different numbers of tokens (``engine.emit(n, per_request=…)``):
    each request's samples carry its own count, a request given none (it had all its tokens) has no sample there,
    and the batch's tokens are every request's."""
    from specterbench.engine.batch import per_request_samples, step_tokens
    from specterbench.engine.stats import StepSample

    steps = [StepSample(1, 0.5, 0.0, per_request=(1, 1)), StepSample(3, 1.0, 0.0, 0.0, 8, per_request=(3, 1)),
             StepSample(2, 1.0, 0.0, per_request=(0, 2))]
    mine = per_request_samples(steps, 2)
    assert [s.tokens for s in mine[0]] == [1, 3] and [s.tokens for s in mine[1]] == [1, 1, 2]
    assert mine[0][1].h2d_bytes == 4 and mine[0][1].clock_s == 1.0
    assert [step_tokens(s, 2) for s in steps] == [2, 4, 2]
    assert step_tokens(StepSample(1, 1.0, 0.0), 4) == 4  # a plain step: one token for each request
