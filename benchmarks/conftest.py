"""Wall-clock benchmarks of the harness's hot paths (pytest-benchmark, pedantic mode).

Not tests: the files are named ``bench_*.py`` so that ``pytest`` (testpaths ``tests`` and the plugin's tests)
never collects them. Run them with ``make bench-wallclock``, i.e.::

    python -m pytest benchmarks -o python_files='bench_*.py' --benchmark-only \
        --benchmark-storage=file://results/benchmarks --benchmark-autosave \
        --benchmark-json=results/benchmarks/wallclock.json

Host wall time of a tiny model on this machine: the harness's own overhead (lower is better), never a GPU's
TPOT and not the speedup gate (that is ``specterbench gate`` on the modeled clock).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

MODEL = "tiny-random-mixtral"
PROFILE = "a100-40g-pcie4"
BUDGET_FRACTION = 0.5  # every strategy fits (Specter's 4-bit draft needs ~41% of expert bytes)
NEW_TOKENS = 8
STRATEGY_OPTIONS = {"specter": {"k": 4}, "spec-decode": {"k": 4}}  # a fixed K: no K profiling in setup


@dataclass
class World:
    host: object
    config: object
    engine: object
    prompts: list
    reference: object
    calibration: object

    def strategy(self, name: str):
        """A fresh strategy ``name`` attached to the shared engine with a fresh cache and modeled clock."""
        from specterbench.bench.runner import make_clock

        cls = self.host.strategies().get(name)
        strategy = cls(**STRATEGY_OPTIONS.get(name, {}))
        total = self.engine.total_expert_bytes
        budget = total if cls.fixed_budget_fraction is not None else int(BUDGET_FRACTION * total)
        self.engine.configure(strategy, budget, make_clock(self.config, self.host, self.engine))
        strategy.prepare(self.engine, self.calibration if cls.uses_calibration else None)
        return strategy

    def request(self, i: int = 0, new_tokens: int = NEW_TOKENS):
        from specterbench import Request

        pid, ids = self.prompts[i]
        return Request(pid, ids, new_tokens, self.reference.tokens[pid], self.reference.traces[pid],
                       self.config.decode)  # the reference's decode setting: same tokens


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    """One engine on the tiny model, its reference tokens and routing, and the calibration (built once)."""
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner, encode_prompts
    from specterbench.plugins.host import get_host
    from specterbench.testing.pytest_plugin import SMALL_PROMPTS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    host = get_host()
    config = BenchConfig(models=(MODEL,), strategies=(), budgets=(parse_budget(f"{BUDGET_FRACTION}"),),
                         profile=PROFILE, tokens=NEW_TOKENS)
    runner = Runner(host, config, tmp_path_factory.mktemp("bench-run"), env={})
    engine = runner.load_engine(MODEL)
    prompts = encode_prompts(engine, SMALL_PROMPTS, config.max_prompt_tokens)
    reference = runner.record_reference(engine, prompts)
    return World(host, config, engine, prompts, reference, runner.calibrate(engine))
