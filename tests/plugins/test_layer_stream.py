"""layer-stream: every expert of a streamed layer copied in once per step for the whole batch, lossless."""

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner


def test_streams_whole_layers_shared_by_the_batch(host, small_prompts, tmp_path):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("layer-stream",),
                         budgets=(parse_budget("65%"),), profile="a100-40g-pcie4", prompts=2, tokens=8,
                         geometry="mixtral", batches=(1, 2))
    rows = {r.batch: r for r in Runner(host, config, tmp_path).run()}
    for row in rows.values():
        assert (row.status, row.lossless) == ("ok", True), row.error
    one, two = rows[1], rows[2]
    assert one.link_bytes_per_step > 0 and two.link_bytes_per_step > 0  # it streams at every batch size
    # every streamed layer's experts, routed or not, once per step: the same bytes whatever the batch
    engine_layer = one.extra.get("streamed_layer_bytes")
    assert engine_layer and one.link_bytes_per_step == two.link_bytes_per_step == engine_layer
    assert two.tokens_per_s_total > one.tokens_per_s_total  # a step's copies serve both requests
