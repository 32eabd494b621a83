"""Mixtral-Offloading's swap (``lru.swap=true``): every miss copies the evicted expert device→host back into its host
copy and the needed one host→device, both on the compute stream, serial with compute; the write-back is a real copy
counted as device→host bytes, and outputs stay lossless."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from cli_errors import one_line  # noqa: E402
from support import tiny_engine
from test_clock_cuda_fake import clock as cuda_clock  # noqa: E402,F401  (a CudaClock over a fake torch.cuda)

from specterbench import Request
from specterbench.baselines import LRU
from specterbench.catalog.tiny import tiny_random
from specterbench.cli import main
from specterbench.engine.costs import CostModel
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.errors import UsageError


@pytest.fixture
def t4(host):
    return host.profiles().get("t4-16g-pcie3")


def _route(engine, layer, tokens):
    idx = torch.tensor(tokens)
    hidden = torch.randn(len(tokens), engine.own_geometry.hidden, generator=torch.Generator().manual_seed(0))
    weights = torch.full(idx.shape, 1.0 / idx.shape[1])
    return engine.run_moe_layer(layer, F.silu, hidden, idx, weights)


def test_copies_on_the_compute_stream_run_one_after_the_other_and_before_the_compute_after_them(t4):
    g = geometry_preset("mixtral")
    clock = ModeledClock(t4, g)
    costs = clock.costs
    n, op = costs.expert_copy_bytes, costs.expert(1)
    back = clock.copy_on_compute("victim", n, None, to_host=True)
    load = clock.copy_on_compute("needed", n, None)
    clock.compute(*op)
    d2h, h2d = costs.d2h_copy_seconds(n), costs.copy_seconds(n)
    assert load.start_s == pytest.approx(back.end_s) == pytest.approx(d2h)  # one stream: serial, not full duplex
    assert clock.now() == pytest.approx(d2h + h2d + costs.op_seconds(*op))
    assert clock.totals.stall_s == pytest.approx(d2h + h2d) and clock.totals.stalls == 2
    assert (clock.totals.d2h_bytes, clock.totals.link_bytes) == (n, n)
    assert [t.key for t in clock.drain_landed()] == ["needed"]  # a write-back never lands as a cached expert


def test_a_device_to_host_copy_does_not_wait_for_the_host_to_device_link(t4):
    """PCIe is full duplex: a write-back on the compute stream starts while a queued copy holds the link."""
    clock = ModeledClock(t4, geometry_preset("mixtral"))
    n = clock.costs.expert_copy_bytes
    queued = clock.issue("prefetch", n, 0.0)
    back = clock.copy_on_compute("victim", n, None, to_host=True)
    assert back.start_s == 0.0 and clock.now() == pytest.approx(clock.costs.d2h_copy_seconds(n))
    assert queued.end_s == pytest.approx(clock.costs.copy_seconds(n))


def test_the_cuda_clock_runs_swap_copies_on_the_compute_stream_and_counts_each_direction(cuda_clock):  # noqa: F811
    ran = []
    back = cuda_clock.copy_on_compute("victim", 1000, lambda: ran.append("d2h"), to_host=True)
    load = cuda_clock.copy_on_compute("needed", 1000, lambda: ran.append("h2d"))
    assert ran == ["d2h", "h2d"] and back.event.stream is load.event.stream is not cuda_clock.stream
    assert cuda_clock.ready(back) and cuda_clock.ready(load)
    t = cuda_clock.totals
    assert (t.d2h_bytes, t.link_bytes, t.stalls) == (1000, 1000, 2) and t.d2h_busy_s > 0
    assert [x.key for x in cuda_clock.drain_landed()] == ["needed"]


def test_the_device_to_host_price_is_the_profiles_link_rate(t4):
    costs = CostModel(t4, geometry_preset("mixtral"))
    n = costs.expert_copy_bytes
    assert costs.d2h_copy_seconds(n) == pytest.approx(t4.link_latency_us * 1e-6 + n / t4.link_bytes_per_s)


def test_a_swap_writes_the_evicted_expert_back_and_adds_exactly_its_copy_to_the_layer(t4):
    """The same routing with and without swap: the first evictions cost the swap engine one device→host copy each
    on top (its host→device copies take what the copy stream's took, which compute waited for too), and the
    evicted expert's host copy is rewritten from its slot — shown by spoiling the host copy while the expert is on
    the device: only the write-back restores it."""
    engines = {}
    for swap in (False, True):
        engine = tiny_engine()
        engine.configure(LRU(swap=swap), 4 * engine.expert_bytes, ModeledClock(t4, engine.geometry))
        assert engine.swap_copies is swap
        _route(engine, 1, [[5, 6]])
        _route(engine, 0, [[0, 1]])  # the cache fills: nothing evicted, nothing copied back
        assert engine.stats.d2h_bytes == 0
        engines[swap] = engine
    plain, swap = engines[False], engines[True]
    kept = [t.clone() for t in swap.store.tensors((0, 0))]
    for t in swap.store.tensors((0, 0)):  # (0, 0) is on the device: spoil its host copy
        t.zero_()
    start = {k: e.clock.now() for k, e in engines.items()}
    for e in engines.values():
        _route(e, 0, [[1, 2]])  # hit 1; miss 2 evicts 0 (least recently used)
    assert all(torch.equal(a, b) for a, b in zip(swap.store.tensors((0, 0)), kept))  # written back from the slot
    assert swap.stats.d2h_bytes == swap.store.expert_bytes and plain.stats.d2h_bytes == 0
    assert swap.clock.totals.d2h_bytes == swap.priced_expert_bytes
    assert swap.stats.h2d_bytes == plain.stats.h2d_bytes
    d2h = swap.clock.costs.d2h_copy_seconds(swap.priced_expert_bytes)
    took = {k: e.clock.now() - start[k] for k, e in engines.items()}
    assert took[True] == pytest.approx(took[False] + d2h)
    assert sorted(swap.cache.keys()) == sorted(plain.cache.keys()) == [(0, 1), (0, 2), (1, 5), (1, 6)]


def test_a_decode_with_swap_copies_equals_stock_generate():
    """Every write-back goes into the host copy the next fetch of that expert reads: the tokens stay the model's."""
    model, tok = tiny_random("mixtral")
    prompt = tok.encode("Shall I compare thee to a summer's day?")
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    engine = Engine(model, name="mixtral", tokenizer=tok)
    engine.configure(LRU(swap=True), engine.top_k * engine.num_layers * engine.expert_bytes,
                     ModeledClock(engine.clock.costs.profile, engine.geometry))
    request = Request("p", tuple(prompt), 12)
    engine.begin_request(request)
    assert engine.greedy_decode(request) == stock[0, len(prompt):].tolist()
    assert engine.stats.d2h_bytes > 0 and engine.clock.totals.d2h_bytes > 0


def _row(tmp_path, name, sets):
    out = tmp_path / name
    assert main(["run", "--profile", "t4-16g-pcie3", "--model", "tiny-random-mixtral", "--strategies", "lru", *sets,
                 "--budgets", "50%", "--prompts", "1", "--tokens", "6", "--out", str(out), "--quiet"]) == 0
    (row,) = [json.loads(line) for line in next(out.rglob("rows.jsonl")).read_text().splitlines()]
    assert row["status"] == "ok" and row["lossless"] is True
    return row


def test_the_runner_runs_swap_copies_losslessly_and_the_option_off_changes_nothing(tmp_path):
    default, off = _row(tmp_path, "default", []), _row(tmp_path, "off", ["--set", "lru.swap=false"])
    swap = _row(tmp_path, "swap", ["--set", "lru.swap=true"])
    for field in ("tpot_ms", "tpot_mean_ms", "ttft_ms", "h2d_bytes", "hits", "misses", "stall_ms_per_token"):
        assert off[field] == default[field], field
    assert default["d2h_bytes"] == off["d2h_bytes"] == 0
    assert swap["h2d_bytes"] == default["h2d_bytes"] and swap["hits"] == default["hits"]
    assert 0 < swap["d2h_bytes"] <= swap["h2d_bytes"]
    assert swap["tpot_ms"] > default["tpot_ms"] and swap["stall_ms_per_token"] > default["stall_ms_per_token"]


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_a_bad_swap_value_is_one_line(tmp_path, capsys):
    code = main(["run", "--profile", "t4-16g-pcie3", "--model", "tiny-random-mixtral", "--strategies", "lru",
                 "--set", "lru.swap=maybe", "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"),
                 "--quiet"])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "lru option swap='maybe' is invalid: use true or false" in line
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("rows.jsonl"))


def test_swap_copies_refuse_slots_that_cannot_hold_the_stores_values_exactly():
    model, tok = tiny_random("mixtral")
    engine = Engine(model.to(torch.float16), name="mixtral", tokenizer=tok)  # bf16 store, fp16 slots
    with pytest.raises(UsageError, match="write each evicted expert back") as err:
        engine.use_swap_copies()
    assert "\n" not in str(err.value) and not engine.swap_copies
