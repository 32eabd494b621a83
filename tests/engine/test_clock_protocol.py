"""Every clock implements the whole :class:`Clock` protocol: no missing method, none inherited as a stub."""

import inspect

import pytest

from specterbench.engine.clocks import Clock
from specterbench.engine.costs import CostModel
from specterbench.engine.cuda_clock import CudaClock
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_profile

MEMBERS = [n for n, v in vars(Clock).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]


@pytest.mark.parametrize("cls", [ModeledClock, HostWallClock, CudaClock], ids=lambda c: c.__name__)
def test_every_protocol_method_is_implemented_by_the_clock_itself(cls):
    missing = [n for n in MEMBERS if not any(n in vars(k) for k in cls.__mro__ if k is not object)]
    assert not missing, f"{cls.__name__} lacks {missing}"
    for name in MEMBERS:
        impl = inspect.getattr_static(cls, name)
        assert impl is not vars(Clock).get(name), f"{cls.__name__}.{name} is the protocol's stub"


def test_the_protocol_is_checkable_at_run_time():
    costs = CostModel(default_profile(), geometry_preset("mixtral"))
    assert isinstance(ModeledClock(default_profile(), geometry_preset("mixtral")), Clock)
    assert isinstance(HostWallClock(costs), Clock)


def test_the_host_clock_lands_copies_at_once_and_reports_them():
    clock = HostWallClock(CostModel(default_profile(), geometry_preset("mixtral")))
    ran = []
    t = clock.issue("a", 1000, 0.0, lambda: ran.append(1))
    assert ran == [1] and clock.ready(t) and clock.started(t) and not clock.cancel(t)
    assert [x.key for x in clock.drain_landed()] == ["a"] and clock.drain_landed() == []
    assert clock.totals.link_bytes == 1000 and clock.link_bytes_per_s() > 0
    job = clock.run_on_host(lambda x: x + 1, clock.costs.host_expert(1), 1, __import__("torch").ones(2))
    assert job.result.tolist() == [2.0, 2.0] and clock.wait_host([job]) == 0.0
