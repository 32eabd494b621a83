"""The engine an lm-eval run scores through: a registered model loaded into an :class:`Engine`, the routing
calibration ``specterbench run`` would give its profiling strategies, and the reference strategy that notes router
near-ties (so a lossless strategy's difference there is counted apart from a real one).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from specterbench.bench.calibrate import check_device
from specterbench.bench.config import BenchConfig
from specterbench.bench.resident import ReferenceStrategy
from specterbench.bench.runner import Runner
from specterbench.engine.engine import Engine
from specterbench.engine.numerics import router_margin
from specterbench.errors import UsageError
from specterbench.plugins.host import get_host
from specterbench.strategy import RoutingCalibration

DEFAULT_PROFILE = "a100-40g-pcie4"


def load_engine(model: str, device: str = "cpu", host=None) -> Engine:
    """Load a registered model into an :class:`Engine` (experts moved to the host store); a device this machine
    lacks is one line before anything loads."""

    check_device(device)
    host = host or get_host()
    spec = host.models().get(model)
    net, tokenizer = spec.load()
    if tokenizer is None:
        raise UsageError(f"model {model!r} has no tokenizer, which lm-eval needs to turn text into tokens")
    return Engine(net, name=model, device=device, tokenizer=tokenizer)


def calibrate(engine: Engine, host=None) -> RoutingCalibration:
    """The calibration ``specterbench run`` gives profiling strategies (same workload, same resident passes).

    Borrowed from :meth:`specterbench.bench.runner.Runner.calibrate` through a throw-away runner, so both stay one
    definition.
    """
    config = BenchConfig(models=(engine.name,), strategies=(), budgets=(), profile=DEFAULT_PROFILE)
    with tempfile.TemporaryDirectory(prefix="specterbench-calibrate-") as tmp:
        return Runner(host or get_host(), config, Path(tmp) / "run", env={}).calibrate(engine)


class RouterMarginProbe(ReferenceStrategy):
    """The reference, noting the smallest router top-k margin of every MoE layer it runs (``margin``, reset per
    request by the caller): where it is a near-tie, a lossless strategy may route differently after any rounding."""

    name = "reference"
    version = "1"
    margin = math.inf

    def before_layer(self, layer, experts, tokens_per_expert):
        self.margin = min(self.margin, router_margin(self.engine.routing.logits, self.engine.top_k))
