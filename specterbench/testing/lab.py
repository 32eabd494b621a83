"""Running a strategy under watch, for the conformance battery: the Runner on the tiny models, every rule checked.

A :class:`Watch` instruments one configured strategy (the cache's ledger against the budget after every call into
it, evictions of experts in use, the tokens of each request) and records violations instead of raising, so each
test of :mod:`specterbench.testing.conformance` reports the rule it checks; a :class:`Lab` runs strategies through
the real :class:`~specterbench.bench.runner.Runner` with one, and caches each run for the pytest session, since several
rules read the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specterbench.bench import runner as runner_module
from specterbench.bench.budget import Budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.errors import BudgetError

MODEL = "tiny-random-mixtral"
PROFILE = "a100-40g-pcie4"
# where every strategy must work on the tiny models: a draft is charged what it holds (packed codes, one expert's
# 16-bit scratch, its own int8 dense copy), 49-55% of the tiny-random models' expert bytes for Specter's default
BUDGET = 0.75
TOKENS = 8
SEED = 1234
PROMPT_A = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate."
PROMPTS = (("a", PROMPT_A), ("b", "Now is the winter of our discontent made glorious summer by this sun of York"),
           ("a-again", PROMPT_A))
CALIBRATION = (("cal-0", "To be, or not to be, that is the question: whether 'tis nobler in the mind"),
               ("cal-1", "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise"))


_CALLBACKS = ("prepare", "on_request_start", "on_step_start", "before_layer", "on_miss", "place_miss",
              "substitute", "choose_victim", "after_layer", "on_step_end", "generate")
_BEFORE_COMPUTE = ("before_layer", "on_miss", "place_miss", "substitute")  # the layer's experts are still needed


class Watch:
    """Instruments one configured strategy: after every call into it, the cache's ledger is checked against
    the budget; evictions of experts in use are recorded; ``generate``'s tokens are kept.

    ``limit`` is the cache size the budget leaves after the strategy's own device bytes, as
    :meth:`Engine.configure` computes it, plus what the strategy has given back since
    (:meth:`Engine.release_device_bytes`); ``allowed`` the largest it has been. Violations are recorded, not raised,
    so each test reports its rule.
    """

    def __init__(self, engine, strategy, budget_bytes: int):
        self.engine, self.strategy, self.cache = engine, strategy, engine.cache
        self.budget_bytes = budget_bytes
        self.limit = self.base_limit = self.allowed = budget_bytes - strategy.device_bytes(engine)
        self.violations: dict[str, list[str]] = {"budget": [], "in use": []}
        self.peak_bytes = 0
        self.outputs: list[tuple[str, tuple[int, ...]]] = []  # (request id, tokens) per generate() call
        self.running: set | None = None  # (layer, expert) routed to by the MoE layer now running
        self.inside: str | None = None  # the _BEFORE_COMPUTE callback running, if any
        for name in _CALLBACKS:
            if callable(getattr(strategy, name, None)):
                setattr(strategy, name, self._wrap(name, getattr(strategy, name)))
        remove = self.cache.remove
        self.cache.remove = lambda key: self._on_remove(key, remove)
        self.check("attach")

    def _wrap(self, name, method):
        def call(*args, **kwargs):
            outer = self.inside
            if name == "before_layer":
                self.running = {(args[0], int(e)) for e in args[1]}
            elif name == "after_layer":
                self.running = None  # the layer's experts are computed: evicting them now is fine
            if name in _BEFORE_COMPUTE:
                self.inside = name
            try:
                result = method(*args, **kwargs)
            finally:
                self.inside = outer
            if name == "generate":
                request = kwargs["request"] if "request" in kwargs else args[1]
                self.outputs.append((request.id, tuple(int(t) for t in result)))
            self.check(name)
            return result
        return call

    def _on_remove(self, key, remove):
        if key == self.cache.in_use:
            self.violate("in use", f"expert {key} was evicted while the layer computed with it")
        elif self.inside and self.running and key in self.running:
            self.violate("in use", f"{self.inside}() evicted expert {key}, which the running layer is routed to "
                                   f"and has not computed yet (protect the layer's experts)")
        return remove(key)

    def check(self, where: str) -> None:
        cache = self.engine.cache
        if cache is not self.cache:
            self.violate("budget", f"after {where}(): the engine's expert cache was replaced")
            return
        held = sum(slot.nbytes for slot in cache.slots.values())
        self.peak_bytes = max(self.peak_bytes, held)
        # device bytes the strategy gave back (engine.release_device_bytes, e.g. a dropped draft) become cache
        self.limit = min(self.budget_bytes, self.base_limit + self.engine.device_bytes_released)
        self.allowed = max(self.allowed, self.limit)
        if cache.capacity_bytes != self.limit:
            self.violate("budget", f"after {where}(): cache capacity changed from {self.limit} to "
                                   f"{cache.capacity_bytes} bytes")
        if held != cache.used_bytes:
            self.violate("budget", f"after {where}(): the cache holds {held} bytes but its ledger says "
                                   f"{cache.used_bytes} (slots changed behind insert()/remove())")
        if held > self.limit:
            self.violate("budget", f"after {where}(): the cache holds {held} bytes, over the {self.limit} the "
                                   f"budget of {self.budget_bytes} leaves")

    def violate(self, rule: str, message: str) -> None:
        if message not in self.violations[rule]:
            self.violations[rule].append(message)


# ---- running a strategy --------------------------------------------------------------------------------
@dataclass
class Trial:
    """What one Runner run of one strategy produced: rows, the watch of each configured cell (by budget
    bytes), refusals (by budget bytes) and an error raised outside any cell."""

    rows: list = field(default_factory=list)
    watches: dict = field(default_factory=dict)
    refusals: dict = field(default_factory=dict)
    error: Exception | None = None
    reference: object = None  # the runner's Reference: each prompt decoded from a clean state, all experts resident


class Lab:
    """Runs strategies through the Runner with a :class:`Watch`; runs are cached for the pytest session by their
    arguments, so several tests read one run."""

    def __init__(self, host, root: Path):
        self.host, self.root = host, root
        self._trials: dict = {}

    def strategy_class(self, name: str):
        return self.host.strategies().get(name)

    def run(self, name: str, *, model: str = MODEL, budgets=(BUDGET,), prompts=PROMPTS, tokens: int = TOKENS,
            max_prompt_tokens: int = 64, seed: int = SEED, tag: str = "", batch: int = 1) -> Trial:
        key = (name, model, tuple(budgets), tuple(prompts), tokens, max_prompt_tokens, seed, tag, batch)
        if key not in self._trials:
            self._trials[key] = self._run(name, model, budgets, prompts, tokens, max_prompt_tokens, seed, batch)
        return self._trials[key]

    def _run(self, name, model, budgets, prompts, tokens, max_prompt_tokens, seed, batch=1) -> Trial:

        cls = self.strategy_class(name)
        trial = Trial()

        class WatchedRunner(Runner):
            def check_budgets(self, engine):
                # A strategy's own floor (e.g. a draft that does not fit a low budget) refuses that budget's cell at
                # configure, where the watch records it; the run's other budgets still run.
                try:
                    super().check_budgets(engine)
                except BudgetError:
                    pass

            def record_reference(self, engine, prompts):
                trial.reference = super().record_reference(engine, prompts)
                return trial.reference

            def load_engine(self, model_name):
                engine = super().load_engine(model_name)
                configure = engine.configure

                def watched_configure(strategy, budget_bytes, clock):
                    if type(strategy) is not cls:  # the reference pass
                        return configure(strategy, budget_bytes, clock)
                    try:
                        configure(strategy, budget_bytes, clock)
                    except BudgetError as err:
                        trial.refusals[budget_bytes] = str(err)
                        raise
                    trial.watches[budget_bytes] = Watch(engine, strategy, budget_bytes)

                engine.configure = watched_configure
                return engine

        config = BenchConfig(
            models=(model,), strategies=(name,), budgets=tuple(Budget(f"{b:.0%}", fraction=b) for b in budgets),
            profile=PROFILE, workload="conformance", calibration="conformance-calibration", prompts=len(prompts),
            tokens=tokens, max_prompt_tokens=max_prompt_tokens, seed=seed, threads=1, batches=(batch,))

        def load_prompts(workload, n):
            return list(CALIBRATION if workload == config.calibration else prompts)[:n]

        run_dir = self.root / f"run-{len(self._trials)}"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runner_module, "load_prompts", load_prompts)
            try:
                trial.rows = WatchedRunner(self.host, config, run_dir, env={}).run()
            except Exception as err:  # outside any cell: the test decides whether it is the expected one
                trial.error = err
        return trial
