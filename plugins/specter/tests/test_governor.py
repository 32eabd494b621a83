import pytest

from specterbench_specter.governor import K_CHOICES, Governor, Shape


class FlatCosts:
    """Prices that do not depend on the engine: a copy, a draft step, and compute linear in tokens."""

    def __init__(self, copy_s=1e-3, draft_s=2e-4, token_s=1e-4, remaining=128):
        self.copy, self.draft, self.token, self.remaining = copy_s, draft_s, token_s, remaining

    def copy_s(self):
        return self.copy

    def draft_step_s(self, requests=1, union=None):
        return self.draft

    def verify_s(self, n_tokens, union, requests=1):
        return 1e-3 + n_tokens * self.token + union * 1e-5

    def prior_miss_s(self):
        return self.copy


def governor(**kw):
    return Governor(Shape(moe_layers=4, experts=16, top_k=2, slots=24), **kw)


def test_the_governor_takes_the_depth_its_own_forecast_ranks_cheapest():
    g = governor()
    best, forecasts = g.choose(128, FlatCosts())
    assert [f.k for f in forecasts] == list(K_CHOICES)
    assert all(best.per_token_s <= f.per_token_s for f in forecasts)


def test_no_acceptance_makes_plain_decoding_the_cheapest():
    g = governor(prior_acceptance=0.0)
    for _ in range(100):
        g.observe_acceptance(4, 0)
    best, _ = g.choose(128, FlatCosts())
    assert best.k == 0


def test_high_acceptance_and_expensive_misses_favour_deep_windows():
    g = governor(prior_acceptance=0.95)
    best, _ = g.choose(128, FlatCosts(copy_s=5e-2))
    assert best.k >= 8


def test_depths_never_overshoot_what_is_left_to_decode():
    _, forecasts = governor().choose(3, FlatCosts(remaining=3))
    assert max(f.k for f in forecasts) <= 3 and min(f.k for f in forecasts) == 0


def test_forecasts_follow_the_realised_windows():
    g, costs = governor(), FlatCosts()
    g.choose(128, costs)
    assert g.forecast(4, costs).window_s < 0.04
    for _ in range(8):  # every window at K=4 takes 50 ms, more than the model says
        f = g.forecast(4, costs)
        g.observe_window(f, 0.05, int(f.misses))
    assert g.forecast(4, costs).window_s == pytest.approx(0.05, rel=0.15)
    assert g.log[-1] == (4, pytest.approx(g.log[-1][1]), 0.05)


def test_union_grows_as_observed():
    g = governor(prior_gamma=0.5)
    for _ in range(50):
        g.observe_layer(9, 2 * 9, 0, 0)  # nine tokens, all different experts: γ = 1
    assert g.union(9) == pytest.approx(16, abs=1.0)  # capped at E
    assert g.gamma > 0.9


class PlainCosts(FlatCosts):
    def __init__(self, host_s, fetch_s, device_s=0.1, **kw):
        super().__init__(**kw)
        self.host, self.fetch, self.device = host_s, fetch_s, device_s

    def host_miss_s(self, n_tokens=1):
        return self.host

    def fetch_miss_s(self, n_tokens=1):
        return self.fetch

    def device_expert_s(self, n_tokens=1):
        return self.device


def test_plain_step_splits_a_layers_misses_between_host_and_link_beside_the_device():
    g = governor()  # top-2, 4 MoE layers
    costs = PlainCosts(host_s=1.0, fetch_s=3.0)
    base = costs.verify_s(1, 0.0)  # dense layers and head
    assert g.plain_step_s(costs, 0.0) == pytest.approx(base + 4 * 0.2)  # both experts cached: the device
    # every expert misses: both on the host (2 s) beats one each way (3 s)
    assert g.plain_step_s(costs, 1.0) == pytest.approx(base + 4 * 2.0)
    # half miss: P(0) = 0.25 -> 0.2 s, P(1) = 0.5 -> 1 s (the host, beside the device's 0.1 s), P(2) = 0.25 -> 2 s
    assert g.plain_step_s(costs, 0.5) == pytest.approx(base + 4 * (0.25 * 0.2 + 0.5 * 1.0 + 0.25 * 2.0))
    no_host = PlainCosts(host_s=float("inf"), fetch_s=3.0)
    assert g.plain_step_s(no_host, 1.0) == pytest.approx(base + 4 * 6.0)


def test_the_plan_covers_only_the_room_it_may_fill():
    """The plan copies into transients' room: with none (every slot a resident) it covers no miss, as without a plan;
    with the whole cache its room it covers some."""
    costs = FlatCosts(draft_s=5e-3)  # a draft slow enough for the link to move the plan
    without = governor(plan=False).forecast(8, costs).misses
    g = governor()
    assert g.forecast(8, costs).misses < without  # room from the whole cache (plan_slots unknown)
    g.plan_slots = 0
    assert g.forecast(8, costs).misses == without
    g.plan_slots = 24
    assert g.forecast(8, costs).misses < without


class BatchCosts(FlatCosts):
    """FlatCosts that record the verifications priced; a batched draft step costs what a batch-1 one does (its
    weights read once)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.verified = []

    def draft_step_s(self, requests=1, union=None):
        return self.draft

    def verify_s(self, n_tokens, union, requests=1):
        self.verified.append((n_tokens, union, requests))
        return super().verify_s(n_tokens, union)


def batch_governor(batch, **kw):
    g = Governor(Shape(moe_layers=4, experts=8, top_k=2, slots=8), plan=False, **kw)
    g.batch = batch
    return g


def test_a_batched_window_verifies_every_requests_positions_over_the_union_of_their_experts():
    one, four = batch_governor(1), batch_governor(4)
    c1, c4 = BatchCosts(), BatchCosts()
    f1, f4 = one.forecast(4, c1), four.forecast(4, c4)
    assert c1.verified == [(5, one.union(5), 1)]
    assert c4.verified == [(20, four.union(20), 4)]  # B·(K + 1) positions of 4 requests
    assert four.union(20) > one.union(5)
    assert f4.misses > f1.misses  # the misses are priced on the larger union
    assert f4.misses == pytest.approx(4 * four.union(20) * 0.5)  # every layer's union, half of it cached (prior)


def test_the_lock_step_emits_fewer_tokens_per_request_than_batch_1_and_more_than_its_shortest_run():
    g = batch_governor(1, prior_acceptance=0.85)
    for run in [4, 4, 1, 3, 0, 4, 2, 4]:  # windows of K = 4: accepted runs observed
        g.observe_acceptance(4, run)
    alone = g.expected_tokens(4)
    last = alone
    for b in (2, 4, 16):
        lock, shortest = g.lockstep_tokens(4, b), g.shortest_run_tokens(4, b)
        assert 1.0 < shortest < lock < last  # more requests: a shorter shortest run, a slower lock step
        last = lock
        g.batch = b
        assert g.forecast(4, BatchCosts()).tokens == pytest.approx(b * lock)  # every request's tokens
    assert g.lockstep_tokens(4, 1) == pytest.approx(alone, rel=0.05)  # one request: the run itself (simulated)
    assert g.shortest_run_tokens(4, 16) == pytest.approx(1 + sum(s ** 16 for s in g.survival(4)))


def test_at_batch_16_the_governor_drafts_where_at_batch_1_plain_decoding_wins():
    """Eight experts a layer, top-2: a plain step of 16 tokens already misses most of the layer, so a window's
    verification costs little more than a plain step and serves several tokens a request. At batch 1 the draft's
    steps cost more than the misses they save."""
    costs = BatchCosts(copy_s=2e-3, draft_s=4e-3, token_s=1e-5)
    best1, _ = batch_governor(1, prior_acceptance=0.7).choose(128, costs)
    g = batch_governor(16, prior_acceptance=0.7)
    best16, forecasts = g.choose(128, costs)
    assert best1.k == 0 and best16.k > 0
    plain = next(f for f in forecasts if f.k == 0)
    assert best16.per_token_s < 0.9 * plain.per_token_s
    # priced at the shortest run alone (every request level each window), the same window would lose
    assert best16.window_s / (16 * g.shortest_run_tokens(best16.k, 16)) > plain.per_token_s


def test_what_one_batch_size_fitted_does_not_move_another_ones_forecast():
    g, costs = batch_governor(1), BatchCosts()
    before = g.forecast(4, costs)
    g.batch = 16
    unfitted = g.forecast(4, costs)
    for _ in range(8):  # batched windows take far longer than modelled
        f = g.forecast(4, costs)
        g.observe_window(f, 10 * f.window_s, int(f.misses))
        g.observe_draft_step(1.0)
    assert g.forecast(4, costs).window_s > 5 * unfitted.window_s
    g.batch = 1
    assert g.forecast(4, costs) == before


def test_a_short_batched_decode_counts_its_level_first_window_and_its_cut_last_one():
    g = batch_governor(8, prior_acceptance=0.85)
    unbounded = g.lockstep_tokens(16, 8)
    short = g.lockstep_tokens(16, 8, remaining=[15] * 8)
    assert 1.0 < short < unbounded  # fifteen tokens: the level start and the tail weigh
    assert g.lockstep_tokens(16, 8, remaining=[1] * 8) == 1.0  # one token left each: one window, one token each
    # a request already ahead proposes fewer: the batch gains less per window than from a level start
    assert g.lockstep_tokens(4, 8, leads=[4] + [0] * 7) < g.lockstep_tokens(4, 8)


def test_plain_steps_in_a_batchs_tail_gain_only_the_unfinished_requests_tokens():
    g = batch_governor(4)
    assert g.lockstep_tokens(0, 4) == 1.0
    assert g.lockstep_tokens(0, 4, remaining=[6, 0, 0, 3]) == pytest.approx(9 / 6 / 4)  # six windows, nine tokens
    g.leads, g.remaining, g.width = [0, 5, 5, 2], [6, 0, 0, 3], 6
    plain = g.forecast(0, BatchCosts())
    assert plain.tokens == pytest.approx(9 / 6)
    assert plain.per_token_s > g.forecast(4, BatchCosts()).per_token_s  # the window is as wide: draft into it
