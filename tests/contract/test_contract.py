"""Contract v2 keeps v1 packages working: a strategy written against the first contract (flat module paths, a bool
from ``prefetch``, ``evictable()``, ``greedy_decode``, ``clock.now()``) still registers, runs lossless and keeps the
rules; one whose decision point changed meaning fails when it registers, in one line that says what changed."""

import textwrap

import pytest

from specterbench.errors import PluginError
from specterbench.testing import conformance
from specterbench.testing.lab import Lab
from specterbench.testing.pytest_plugin import install_dist

V1_PACKAGE = """
    from specterbench.strategy import ExpertKey
    from specterbench.strategy import Strategy
    from specterbench import hookimpl


    class NextLayerV1(Strategy):
        name = "v1-next-layer"
        version = "1"

        def attach(self, engine):
            super().attach(engine)
            self.last = {}
            self.queued = 0

        def on_request_start(self, request):
            self.last.clear()

        def before_layer(self, layer, experts, tokens_per_expert):
            engine = self.engine
            nxt = (layer + 1) % engine.num_layers
            protect = {(layer, e) for e in experts}
            for e in self.last.get(nxt, ()):
                key: ExpertKey = (nxt, e)
                if key in engine.cache or engine.expected_arrival(key) is not None:
                    continue
                if engine.cache.free_bytes < engine.expert_bytes and not engine.make_room(
                        engine.expert_bytes, protect=protect | {key}):
                    return
                if engine.prefetch(key, 1.0):  # v1: True when queued
                    self.queued += 1

        def choose_victim(self, candidates, needed):  # the least recently used one outside needed's layer
            evictable = self.engine.evictable()  # v1: a list, least recently used first
            layer = needed[0] if needed is not None else None
            return next((k for k in evictable if k in candidates and k[0] != layer), candidates[0])

        def after_layer(self, layer, experts):
            self.last[layer] = list(experts)

        def on_step_end(self, new_tokens):
            self.now = self.engine.clock.now()  # v1: seconds on the cell's clock

        def generate(self, engine, request):
            return engine.greedy_decode(request)  # v1's name of engine.decode

        def metrics(self):
            return {"v1_queued": self.queued}


    @hookimpl
    def specterbench_register_strategies(register):
        register(NextLayerV1)
"""

V1_CALIBRATION = """
    from specterbench import Strategy, hookimpl


    class StaticV1(Strategy):
        name = "v1-static"
        version = "1"
        uses_calibration = True

        def prepare(self, engine, calibration_counts=None):  # v1 handed the [layers, experts] counts
            self.hot = calibration_counts.sum(0).argsort()


    @hookimpl
    def specterbench_register_strategies(register):
        register(StaticV1)
"""


@pytest.fixture
def v1(tmp_path, monkeypatch, host):
    def install(source, dist, module):
        monkeypatch.syspath_prepend(str(install_dist(tmp_path / dist, dist, module, textwrap.dedent(source),
                                                     module)))
        return host
    return install


def test_a_v1_package_registers_through_its_entry_point(v1):
    host = v1(V1_PACKAGE, "specterbench-v1", "specterbench_v1")
    assert host.strategies().entry("v1-next-layer").plugin.source == "entry point"


def test_a_v1_package_keeps_the_rules_and_is_lossless(v1, tmp_path):
    host = v1(V1_PACKAGE, "specterbench-v1", "specterbench_v1")
    lab = Lab(host, tmp_path / "runs")
    conformance.test_budget_is_never_exceeded("v1-next-layer", lab)
    conformance.test_no_expert_in_use_is_evicted("v1-next-layer", lab)
    conformance.test_tokens_are_lossless_on_every_family("v1-next-layer", "mixtral", lab)
    rows = lab.run("v1-next-layer").rows
    assert rows[0].status == "ok" and rows[0].extra["v1_queued"] >= 0


def test_a_v1_prepare_taking_calibration_counts_fails_at_registration_saying_what_changed(v1, capsys):
    host = v1(V1_CALIBRATION, "specterbench-v1-static", "specterbench_v1_static")
    try:
        names = host.strategies().names()
    except PluginError as err:  # refused at registration, or the plugin left out with a warning
        message = str(err)
    else:
        assert "v1-static" not in names
        message = capsys.readouterr().err
    line = next(line for line in message.splitlines() if "v1-static" in line or "StaticV1" in line)
    assert "StaticV1.prepare(self, engine, calibration_counts=None) is written against an older contract" in line
    assert "calibration.counts" in line


def test_v1_list_idioms_on_choose_victims_candidates_still_work():
    from specterbench.engine.cache import Candidates, DeviceCache, Slot

    cache = DeviceCache(4)
    for e in range(4):
        cache.insert(Slot((0, e), 1, None, None, False))
    candidates = Candidates(cache, {(0, 1)})  # what choose_victim receives: a live view, v1 passed a list
    assert candidates[0] == (0, 0) and candidates[-1] == (0, 3) and candidates[:2] == [(0, 0), (0, 2)]
    assert candidates.index((0, 2)) == 1 and len(candidates) == 3 and (0, 1) not in candidates
    assert min(candidates, key=lambda k: -k[1]) == (0, 3) and list(reversed(candidates))[0] == (0, 3)
    assert candidates == [(0, 0), (0, 2), (0, 3)]
    assert candidates + [(1, 0)] == [(0, 0), (0, 2), (0, 3), (1, 0)] and [(1, 0)] + candidates == [(1, 0), *candidates]
