"""A card's memory as an expert budget, checked against a hand-computed Mixtral-8x7B example."""

import pytest

from specterbench.bench.device_memory import GIB, dense_bytes, kv_bytes_per_token, parse_memory, plan
from specterbench.engine.geometry import geometry_preset
from specterbench.errors import BudgetError, UsageError

MIXTRAL = geometry_preset("mixtral")


def test_the_budget_arithmetic_of_a_24_gib_card_for_mixtral_by_hand():
    # experts: 3 x 4096 x 14336 weights x 2 bytes x 8 experts x 32 layers
    assert MIXTRAL.all_expert_bytes == 3 * 4096 * 14336 * 2 * 8 * 32 == 90_194_313_216
    # dense: 32 layers of attention (q, o: 4096 x 4096; k, v: 4096 x 1024) + embedding and head (32000 x 4096),
    # 2 bytes each, plus 32 routers (4096 x 8) at 2 bytes
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert dense_bytes(MIXTRAL) == (32 * attention + 2 * 32000 * 4096) * 2 + 32 * 4096 * 8 * 2 == 3_210_739_712
    assert kv_bytes_per_token(MIXTRAL) == 32 * 2 * 8 * 128 * 2 == 131_072  # 128 KiB a token
    p = plan(MIXTRAL, 24 * GIB, context_tokens=512 + 128, forward_tokens=512)
    assert p.kv_bytes == 640 * 131_072
    assert p.activation_bytes == 512 * (12 * 4096 * 2 + 4 * 32000)
    assert p.expert_bytes == 24 * GIB - 3_210_739_712 - 640 * 131_072 - 512 * (12 * 4096 * 2 + 4 * 32000) - GIB
    assert p.expert_bytes == 21_285_568_512 and p.fraction == pytest.approx(0.236, abs=5e-4)
    assert p.layers_resident(MIXTRAL) == 7  # of Mixtral's 32 MoE layers, 2.8 GB each


def test_several_requests_and_a_longer_context_take_their_kv_out_of_the_experts():
    one = plan(MIXTRAL, 24 * GIB, context_tokens=640)
    eight = plan(MIXTRAL, 24 * GIB, context_tokens=4096 + 640, batch=8)
    assert one.expert_bytes - eight.expert_bytes == kv_bytes_per_token(MIXTRAL) * ((4096 + 640) * 8 - 640) \
        + 7 * (12 * 4096 * 2 + 4 * 32000)


def test_a_card_too_small_for_the_dense_weights_names_the_smallest_that_fits():
    with pytest.raises(BudgetError, match=r"a 2.00 GiB card does not hold mixtral's dense weights .* the smallest "
                                          r"that fits is 5 GiB"):
        plan(MIXTRAL, 2 * GIB, context_tokens=640)


@pytest.mark.parametrize("text, nbytes", [("24GiB", 24 * GIB), ("80GB", 80 * 10**9), ("16384MiB", 16 * GIB)])
def test_memory_sizes_take_their_unit(text, nbytes):
    assert parse_memory(text) == nbytes


@pytest.mark.parametrize("text", ["24", "-3GiB", "lots", "0GiB"])
def test_a_memory_size_without_a_unit_or_not_positive_is_one_line(text):
    with pytest.raises(UsageError, match="--gpu-memory"):
        parse_memory(text)


def test_a_card_budget_is_the_planned_share_of_the_priced_experts_applied_to_the_stand_in():
    from support import tiny_engine

    from specterbench.bench.budget import Budget
    from specterbench.bench.device_memory import card_budgets, resolve_cards
    from specterbench.engine.geometry import project

    engine = tiny_engine("mixtral")
    engine.geometry = project(engine.own_geometry, "mixtral")
    (card,) = card_budgets("24GiB")
    (resolved, share) = resolve_cards((card, Budget("35%", fraction=0.35)), engine, 60, 4)
    expected = plan(engine.geometry, 24 * GIB, context_tokens=64, forward_tokens=60)
    assert resolved.plan == expected and resolved.key() == card.key() == f"card{24 * GIB}B"
    assert resolved.fraction == pytest.approx(expected.expert_bytes / MIXTRAL.all_expert_bytes)
    assert resolved.resolve(engine.total_expert_bytes) == int(resolved.fraction * engine.total_expert_bytes)
    assert share.fraction == 0.35 and share.plan is None
    big = resolve_cards(card_budgets("400GB"), engine, 60, 4)[0]  # more than every expert: all of them
    assert big.fraction == 1.0 and big.plan.as_dict(engine.geometry)["layers_resident"] == 32


def test_the_context_depth_and_batch_of_a_run_take_their_kv_out_of_the_card():
    from types import SimpleNamespace

    from support import tiny_engine

    from specterbench.bench.device_memory import card_budgets, resolve_cards
    from specterbench.engine.geometry import project

    engine = tiny_engine("mixtral")
    engine.geometry = project(engine.own_geometry, "mixtral")
    cards = card_budgets("24GiB")
    plain = resolve_cards(cards, engine, 60, 4)[0].plan
    deep = resolve_cards(cards, engine, 60, 4, SimpleNamespace(depth=(0, 4096), batch=2))[0].plan
    assert (deep.context_tokens, deep.batch) == (60 + 4096 + 4, 2)
    assert plain.expert_bytes - deep.expert_bytes == (kv_bytes_per_token(MIXTRAL) * ((60 + 4096 + 4) * 2 - 64)
                                                      + 60 * (12 * 4096 * 2 + 4 * 32000))


def test_a_card_budget_outside_a_run_is_one_line():
    from specterbench.bench.device_memory import card_budgets

    with pytest.raises(UsageError, match="a card's memory"):
        card_budgets("24GiB")[0].resolve(10**9)
