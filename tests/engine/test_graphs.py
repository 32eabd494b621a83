"""``--cuda-graphs``: the capture path exercised on the CPU (specterbench.engine.graphs). Real CUDA capture is not
exercised here (no GPU); a fake capture stands in for ``torch.cuda.graph`` — it records the static buffers and
recomputes the piece into them on replay — so that the wrapping, the static-buffer copies, the pricing and the
failure path run as they would on CUDA."""

import json

import pytest
import torch

from specterbench.baselines import LRU
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.costs import CostModel
from specterbench.engine.engine import Engine
from specterbench.engine.graphs import MAX_WIDTH, Replay, capturable_pieces
from specterbench.engine.kernels import KernelCounts
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow
from specterbench.strategy import Request

PROMPT = tuple(range(3, 15))


class FakeGraph:
    """Stands in for a captured ``torch.cuda.CUDAGraph``: replay recomputes the piece from the static input into
    the static outputs, in place, as a graph's kernels would."""

    def __init__(self, piece, static_in, static_out):
        self.piece, self.static_in, self.static_out = piece, static_in, static_out
        self.replays = 0

    def replay(self):
        self.replays += 1
        fresh = self.piece(self.static_in)
        for dst, src in zip(*(t if isinstance(t, tuple) else (t,) for t in (self.static_out, fresh))):
            dst.copy_(src)


def fake_capture(captured):
    def capture(piece, example):
        static_in = example.clone()
        static_out = piece(static_in)
        replay = Replay(FakeGraph(piece, static_in, static_out), static_in, static_out)
        captured.append((piece, tuple(example.shape), replay))
        return replay
    return capture


def make_engine(family="qwen2_moe"):
    torch.manual_seed(0)
    model, tokenizer = tiny_random(family)
    return Engine(model, name=f"tiny-random-{family}", tokenizer=tokenizer)


def decode(engine, tokens=6):
    engine.configure(LRU(), engine.total_expert_bytes // 2,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    return engine


def run(engine, setting="auto", cuda=None, tokens=6):
    decode(engine)
    engine.graphs.setup(setting, cuda=cuda)
    request = Request("p", PROMPT, tokens)
    engine.begin_request(request)
    out = engine.decode(request)
    return out, engine.clock.now(), engine.clock.totals.launches


def test_on_cpu_auto_is_unavailable_nothing_is_wrapped_and_decoding_is_unchanged():
    eager = make_engine()
    before = run(eager, "off")
    engine = make_engine()
    state = engine.setup_graphs("auto")
    assert (state.mode, state.reason) == ("unavailable", "no CUDA (device cpu)")
    after = run(engine, "auto")
    assert engine.graphs.state.mode == "unavailable"
    assert after == before  # tokens, modeled clock and launches charged: the same eager path
    for block in engine.moe_blocks:
        assert all(type(piece).__name__ != "CapturedPiece" for _, piece in capturable_pieces(block))


def test_off_says_so():
    engine = make_engine()
    assert engine.setup_graphs("off").mode == "off"
    assert engine.graphs.state.reason == "--cuda-graphs off"


def test_an_unknown_setting_is_one_line():
    with pytest.raises(UsageError, match="--cuda-graphs 'always'"):
        make_engine().setup_graphs("always")


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral", "deepseek_v2"])
def test_captured_pieces_replay_in_decode_with_the_same_tokens_and_cheaper_launches(family):
    eager_tokens, eager_s, eager_launches = run(make_engine(family), "off")
    engine = make_engine(family)
    captured = []
    engine.graphs._capture = fake_capture(captured)
    tokens, clock_s, launches = run(engine, "auto", cuda=True)
    assert engine.graphs.state.mode == "used"
    assert tokens == eager_tokens
    n_pieces = sum(len(capturable_pieces(b)) for b in engine.moe_blocks)
    assert len(captured) == n_pieces  # one graph per piece at T = 1; the prefill (T = 12) ran eagerly
    assert all(shape[-2 if len(shape) == 3 else 0] == 1 for _, shape, _ in captured)
    assert all(r.graph.replays == len(tokens) - 1 for _, _, r in captured)  # every decode step after the prefill
    k = engine.kernels
    assert k.moe_layer_captured > 0 and k.moe_layer_pieces > 0
    assert launches < eager_launches  # the pieces' kernels moved to the graph rate
    assert clock_s != eager_s


def test_a_capture_failure_says_why_and_decoding_continues_eagerly(capsys):
    eager = run(make_engine(), "off")
    engine = make_engine()

    def broken(piece, example):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    engine.graphs._capture = broken
    assert run(engine, "auto", cuda=True) == eager  # identical tokens, and priced eager throughout
    state = engine.graphs.state
    assert state.mode == "unavailable"
    assert state.reason == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert "CUDA graphs off, capture failed: RuntimeError" in capsys.readouterr().err
    for block in engine.moe_blocks:  # every original piece is back
        assert all(type(piece).__name__ != "CapturedPiece" for _, piece in capturable_pieces(block))


def test_verification_widths_replay_and_wider_forwards_run_eagerly():
    engine = make_engine()
    captured = []
    engine.graphs._capture = fake_capture(captured)
    decode(engine)
    engine.graphs.setup("auto", cuda=True)
    engine.begin_request(Request("p", PROMPT, 4))
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([PROMPT]), kv)  # prefill: eager
    assert captured == []
    engine.forward(torch.tensor([[5] * 5]), kv)  # a verification of 4 drafted tokens
    assert {shape for _, shape, _ in captured} >= {(5, engine.model.config.hidden_size)}
    n = len(captured)
    engine.forward(torch.tensor([[5] * (MAX_WIDTH + 1)]), kv)  # over MAX_WIDTH: eager
    assert len(captured) == n


def test_a_captured_dense_layer_prices_its_pieces_kernels_at_the_graph_rate_and_the_rest_at_launch_us():
    profile = default_profile()
    kernels = KernelCounts(moe_layer_dense=40, moe_layer_captured=12, moe_layer_pieces=11)
    engine_geometry = make_engine().own_geometry
    costs = CostModel(profile, engine_geometry, kernels=kernels)
    eager = costs.dense_layer(1, 16, moe=True)
    captured = costs.dense_layer(1, 16, moe=True, captured=True)
    s = engine_geometry.layer_scale
    assert (eager.launches, eager.graph_nodes) == (round(40 * s), 0)
    assert (captured.launches, captured.graph_nodes) == (round((40 - 12 + 11) * s), round(12 * s))
    assert captured._replace(launches=0, graph_nodes=0) == eager._replace(launches=0)  # same FLOPs and bytes
    saved = costs.op_seconds(*eager) - costs.op_seconds(*captured)
    expect = (eager.launches - captured.launches) * profile.launch_us - captured.graph_nodes * profile.graph_node_us
    assert saved == pytest.approx(expect * 1e-6)
    assert costs.dense_layer(1, 16, moe=False, captured=True) == costs.dense_layer(1, 16, moe=False)


def test_graph_nodes_cost_graph_node_us_each():
    costs = CostModel(default_profile(), make_engine().own_geometry)
    p = default_profile()
    assert costs.op_seconds(0, 0, 3, graph_nodes=10) == pytest.approx((3 * p.launch_us + 10 * p.graph_node_us) * 1e-6)
    assert any("CUDA Graphs" in s for s in p.sources)


def test_rows_record_cuda_graphs_and_older_rows_still_load(host, small_prompts, tmp_path):
    cfg = BenchConfig(models=("tiny-random-qwen2-moe",), strategies=("lru",), budgets=(parse_budget("35%"),),
                      profile="a100-40g-pcie4", prompts=1, tokens=4)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert (row.cuda_graphs, row.cuda_graphs_reason) == ("unavailable", "no CUDA (device cpu)")
    data = json.loads(row.to_json())
    assert data["cuda_graphs"] == "unavailable"
    del data["cuda_graphs"], data["cuda_graphs_reason"]  # a row written before the setting
    assert ResultRow.from_dict(data).cuda_graphs is None


def test_compare_refuses_eager_against_graphs_and_takes_older_rows_as_eager(host, small_prompts, tmp_path):
    from specterbench.analysis.compare import check_compatible
    from specterbench.analysis.report import summary_table

    cfg = BenchConfig(models=("tiny-random-qwen2-moe",), strategies=("lru",), budgets=(parse_budget("35%"),),
                      profile="a100-40g-pcie4", prompts=1, tokens=4)
    row = Runner(host, cfg, tmp_path).run()[0]
    data = json.loads(row.to_json())
    del data["cuda_graphs"], data["cuda_graphs_reason"]
    older = ResultRow.from_dict(data)
    check_compatible([older], [row])  # both eager: comparable
    graphed = ResultRow.from_dict({**data, "cuda_graphs": "used", "cuda_graphs_reason": "router"})
    with pytest.raises(UsageError, match="kernel launch mode .*eager.*CUDA graphs"):
        check_compatible([row], [graphed])
    clocks = list(summary_table([row, graphed])["clock"])
    assert "modeled · a100-40g-pcie4" in clocks and "modeled · a100-40g-pcie4 · CUDA graphs" in clocks
