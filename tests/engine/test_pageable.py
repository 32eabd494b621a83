"""Accelerate's copy path (``on-demand.pageable=true``): each expert a synchronous copy from pageable host memory on
the compute stream, priced at the profile's ``pageable_link_bytes_per_s``; a profile that lacks the figure, or
states a bad one, is one line."""

from __future__ import annotations

import json
import math

import pytest
from cli_errors import one_line  # noqa: E402

from specterbench.cli import main
from specterbench.engine.costs import CostModel
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import PROFILE_FILES_DIR, default_profile, load_profile_file
from specterbench.errors import UsageError


@pytest.fixture
def t4(host):
    return host.profiles().get("t4-16g-pcie3")


def test_a_pageable_copy_is_slower_than_a_pinned_one_by_the_profiles_ratio(t4):
    costs = CostModel(t4, geometry_preset("mixtral"))
    n = costs.expert_copy_bytes
    latency = t4.link_latency_us * 1e-6
    ratio = (costs.pageable_copy_seconds(n) - latency) / (costs.copy_seconds(n) - latency)
    assert ratio == pytest.approx(t4.link_bytes_per_s / t4.pageable_link_bytes_per_s)
    assert ratio > 1


def test_a_pageable_copy_holds_the_compute_stream_while_a_pinned_one_overlaps_it(t4):
    g = geometry_preset("mixtral")
    op = CostModel(t4, g).expert(1)
    pinned, pageable = ModeledClock(t4, g), ModeledClock(t4, g)
    n = pinned.costs.expert_copy_bytes

    pinned.issue("e", n, 0.0)
    pinned.compute(*op)  # runs while the copy is on the link
    compute_s = pinned.costs.op_seconds(*op)
    assert pinned.now() == pytest.approx(compute_s)

    t = pageable.copy_sync("e", n, None)
    assert pageable.ready(t) and pageable.now() == pytest.approx(pageable.costs.pageable_copy_seconds(n))
    pageable.compute(*op)  # only after the copy: serial
    assert pageable.now() == pytest.approx(pageable.costs.pageable_copy_seconds(n) + compute_s)
    assert pageable.totals.stalls == 1 and pageable.totals.link_bytes == n
    assert [x.key for x in pageable.drain_landed()] == ["e"]


def test_a_pageable_copy_waits_for_the_copy_already_on_the_link(t4):
    g = geometry_preset("mixtral")
    clock = ModeledClock(t4, g)
    n = clock.costs.expert_copy_bytes
    clock.issue("a", n, 0.0)
    t = clock.copy_sync("b", n, None)
    assert t.start_s == pytest.approx(clock.costs.copy_seconds(n))  # the link is one resource
    assert clock.now() == pytest.approx(t.start_s + clock.costs.pageable_copy_seconds(n))


def test_the_engine_runs_pageable_copies_and_the_clock_prices_them(tmp_path):
    """The same decode, the same bytes over the link: the pageable path is slower, by no more than every copy
    priced at the pageable rate on top of the pinned run (the pinned run overlaps nothing for on-demand either)."""
    rows = {}
    for name, sets in (("pinned", []), ("pageable", ["--set", "on-demand.pageable=true"])):
        out = tmp_path / name
        assert main(["run", "--profile", "t4-16g-pcie3", "--model", "tiny-random-mixtral", "--strategies",
                     "on-demand", *sets, "--budgets", "50%", "--prompts", "1", "--tokens", "4", "--out", str(out),
                     "--quiet"]) == 0
        (row,) = [json.loads(line) for line in next(out.rglob("rows.jsonl")).read_text().splitlines()]
        assert row["status"] == "ok" and row["lossless"] is True
        rows[name] = row
    assert rows["pageable"]["h2d_bytes"] == rows["pinned"]["h2d_bytes"] > 0
    assert rows["pageable"]["tpot_ms"] > rows["pinned"]["tpot_ms"]


def test_a_strategy_asks_for_pageable_copies_and_reads_their_price(t4):
    """``engine.use_pageable_copies()`` from ``attach`` switches the cell's fetches to the pageable path, and
    ``engine.costs.pageable_copy_s()`` prices one at the profile's pageable rate; ``check_profile`` refuses a profile
    without the figure before anything runs."""
    from baselines.on_demand import OnDemand
    from specterbench.catalog.tiny import tiny_random
    from specterbench.engine.engine import Engine

    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    strategy = OnDemand(pageable=True)
    OnDemand.check_profile(t4, {"pageable": True})
    with pytest.raises(UsageError, match="pageable_link_bytes_per_s"):
        OnDemand.check_profile(default_profile(), {"pageable": True})
    engine.configure(strategy, engine.total_expert_bytes // 2, ModeledClock(t4, engine.geometry))
    strategy.prepare(engine)
    assert engine.pageable_copies
    costs = engine.costs
    assert costs.pageable_copy_s() > costs.copy_s()
    assert costs.pageable_copy_s() == pytest.approx(
        t4.link_latency_us * 1e-6 + engine.priced_expert_bytes / t4.pageable_link_bytes_per_s, rel=1e-6)
    other, _ = tiny_random("mixtral")
    plain = Engine(other, name="mixtral")
    plain.use_pageable_copies()  # what attach does for on-demand with pageable=true
    assert plain.pageable_copies


def test_the_store_hands_out_pageable_sources():
    import torch

    from specterbench.engine.store import ExpertStore

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.randn(2, 8, 4))
            self.down_proj = torch.nn.Parameter(torch.randn(2, 4, 4))

    block = torch.nn.Module()
    block.experts = Experts()
    store = ExpertStore([block], torch.float32, pin=False)
    assert store.pageable((0, 1)) is store.weights[(0, 1)]  # an unpinned store's own tensors: nothing copied
    store.pinned = True  # a pinned store (CUDA) copies an expert into ordinary memory once, on first use
    copy = store.pageable((0, 1))
    assert copy is store.pageable((0, 1)) and all(torch.equal(a, b) for a, b in zip(copy, store.weights[(0, 1)]))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(copy, store.weights[(0, 1)]))


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_a_profile_without_the_pageable_figure_refuses_the_option_in_one_line(tmp_path, capsys):
    assert default_profile().pageable_link_bytes_per_s is None
    code = main(["run", "--profile", default_profile().name, "--model", "tiny-random-mixtral", "--strategies",
                 "on-demand", "--set", "on-demand.pageable=true", "--prompts", "1", "--tokens", "2", "--out",
                 str(tmp_path / "o"), "--quiet"])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "pageable_link_bytes_per_s" in line and default_profile().name in line
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("rows.jsonl"))


def test_a_profile_file_missing_the_pageable_figure_loads_and_refuses_only_the_option(tmp_path, capsys):
    path = tmp_path / "t4.toml"
    text = (PROFILE_FILES_DIR / "t4.toml").read_text(encoding="utf-8").replace('"t4-16g-pcie3"', '"my-t4"')
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("pageable_link")))
    profile, _ = load_profile_file(path)
    assert profile.pageable_link_bytes_per_s is None
    with pytest.raises(UsageError, match="has no pageable_link_bytes_per_s"):
        profile.pageable_bytes_per_s()
    code = main(["run", "--profile", str(path), "--model", "tiny-random-mixtral", "--strategies", "on-demand",
                 "--set", "on-demand.pageable=true", "--prompts", "1", "--tokens", "2", "--out",
                 str(tmp_path / "o"), "--quiet"])
    assert code == 2 and "pageable_link_bytes_per_s" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("value", ["inf", "nan", "0.0", "-3.0e9", '"fast"'])
def test_a_bad_pageable_figure_in_a_profile_file_is_one_line(tmp_path, capsys, value):
    path = tmp_path / "t4.toml"
    text = (PROFILE_FILES_DIR / "t4.toml").read_text(encoding="utf-8").replace('"t4-16g-pcie3"', '"my-t4"')
    path.write_text(text.replace("pageable_link_bytes_per_s = 3.75e9", f"pageable_link_bytes_per_s = {value}"))
    with pytest.raises(UsageError, match="pageable_link_bytes_per_s must be a finite number > 0") as err:
        load_profile_file(path)
    assert "\n" not in str(err.value)
    code = main(["run", "--profile", str(path), "--model", "tiny-random-mixtral", "--strategies", "on-demand",
                 "--prompts", "1", "--tokens", "2", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2 and "pageable_link_bytes_per_s" in one_line(capsys.readouterr().err)


def test_a_bad_pageable_option_value_is_one_line(tmp_path, capsys):
    code = main(["run", "--profile", "t4-16g-pcie3", "--model", "tiny-random-mixtral", "--strategies", "on-demand",
                 "--set", "on-demand.pageable=maybe", "--prompts", "1", "--tokens", "2", "--out",
                 str(tmp_path / "o"), "--quiet"])
    assert code == 2 and "use true or false" in one_line(capsys.readouterr().err)


def test_every_shipped_pageable_figure_is_below_its_pinned_one_and_cited(host):
    for profile in map(host.profiles().get, host.profiles().names()):
        v = profile.pageable_link_bytes_per_s
        if v is None:
            continue
        assert math.isfinite(v) and 0 < v < profile.link_bytes_per_s
        assert any("pageable" in s for s in profile.sources), profile.name
