"""The modeled clock's work per copy does not grow with the copy queue or with how many copies have landed.

``ModeledClock.steps`` counts its internal steps (copies started and landed, scheduler heap and FIFO moves).
The same per-copy workload — issue a prefetch, demand another, compute, check readiness and arrival — is run
behind queues of very different lengths and after very different numbers of landed copies (a full cache).
"""

import pytest

from specterbench.engine.geometry import geometry_preset
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_profile
from specterbench.engine.scheduler import CopyScheduler

GEO = geometry_preset("mixtral")
NBYTES = GEO.expert_bytes
OPS = 200


def per_copy_steps(queued: int, landed: int) -> float:
    clock = ModeledClock(default_profile(), GEO)
    for i in range(landed):  # a cache full of experts that have arrived
        clock.wait(clock.issue(("landed", i), NBYTES, 0.0))
    clock.drain_landed()
    for i in range(queued):  # a long queue of low-priority prefetches behind them
        clock.issue(("queued", i), NBYTES, -1.0 - i)
    before, copies = clock.steps, 0
    for i in range(OPS):
        ahead = clock.issue(("ahead", i), NBYTES, 1.0)
        demand = clock.issue(("demand", i), NBYTES, 0.0)
        CopyScheduler.order_key(ahead)
        clock.ready(ahead)
        clock.started(demand)
        clock.wait(demand)  # a demand fetch jumps the queue
        clock.compute(2 * GEO.expert_params, NBYTES, launches=3)
        clock.link_backlog_s()
        clock.expected_arrival(demand)
        clock.drain_landed()
        copies += 2
    return (clock.steps - before) / copies


@pytest.mark.parametrize("queued, landed", [(10, 10), (10_000, 10), (10, 10_000)])
def test_steps_per_copy_do_not_grow_with_queue_or_cache(queued, landed):
    small = per_copy_steps(10, 10)
    steps = per_copy_steps(queued, landed)
    assert steps <= 8, f"{steps:.2f} internal steps per copy"
    assert steps <= 1.2 * small, f"{steps:.2f} steps per copy vs {small:.2f} with a short queue and cache"


def test_the_step_counter_counts():
    clock = ModeledClock(default_profile(), GEO)
    t = clock.issue("a", NBYTES, 0.0)
    clock.wait(t)
    assert clock.steps >= 2  # submitted, started (and landed once time passes)
