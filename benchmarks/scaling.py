"""The harness at real routing geometries: host milliseconds per decode token on the modeled clock.

Random-init Mixtral-family models with a small hidden size (32) but the routing geometry of real MoE models —
experts per layer × MoE layers, top-k — priced at their own (tiny) sizes: what is measured is the harness's own
host time (router → cache → scheduler/clock → strategy), which grows with experts, layers and cache entries,
not the model's arithmetic. ``python benchmarks/scaling.py`` prints the table; ``bench_scaling.py`` runs the same
cells under pytest-benchmark (``make bench-wallclock``).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import torch

GEOMETRIES = {  # name: (experts per layer, MoE layers, top-k) of the real model
    "mixtral": (8, 32, 2),
    "deepseek-v2-lite": (64, 26, 6),
    "qwen3-30b-a3b": (128, 48, 8),
    "deepseek-v3": (256, 58, 8),
}
STRATEGIES = ("lru", "specter", "oracle", "activation-aware")
FLOOR = "resident"  # every expert cached: the engine's per-expert compute without any cache decision
#: Specter with every expert cached beside its draft (budget: all expert bytes plus the draft, every expert fetched
#: before the request): no miss to place, fetch or evict — what drafting and verifying cost the host on their own,
#: so that the gap of Specter's cell splits into speculation's share and the misses'
SPECTER_RESIDENT = "specter, all resident"
OPTIONS = {"specter": {"k": 4, "bits": 3}}  # the int3 draft this table was measured with (the default is int4)
BUDGET_FRACTION = 0.5
PROMPT_TOKENS = 16
NEW_TOKENS = 16
ROUNDS = 3  # every cell measured once per round, rounds interleaved: a ratio is the median of per-round ratios
#: targets at DeepSeek-V3 geometry, as ratios measured side by side in one process: the engine with every expert
#: resident against the stock model, the strategies against the engine with every expert resident
STOCK_TARGET = {"deepseek-v3": 0.8}
TARGETS = {("deepseek-v3", "lru"): 1.1, ("deepseek-v3", "oracle"): 1.2, ("deepseek-v3", "specter"): 1.5}


def random_model(experts: int, layers: int, top_k: int, seed: int = 0):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=256, hidden_size=32, intermediate_size=16, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=experts,
                           num_experts_per_tok=top_k, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = MixtralForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


@dataclass
class World:
    """One engine at a geometry with its reference (tokens, routing) and calibration, built once."""

    engine: object
    prompt: tuple[int, ...]
    reference_tokens: tuple[int, ...]
    reference_trace: tuple
    calibration: object

    @classmethod
    def build(cls, geometry: str) -> "World":
        from specterbench.engine.engine import Engine
        from specterbench.plugins.strategy import Calibration, Request

        experts, layers, top_k = GEOMETRIES[geometry]
        engine = Engine(random_model(experts, layers, top_k), name=f"random-{geometry}")
        gen = torch.Generator().manual_seed(1)
        prompt = tuple(torch.randint(0, 256, (PROMPT_TOKENS,), generator=gen).tolist())
        configure(engine, _Resident(), engine.total_expert_bytes)
        engine.strategy.prepare(engine)
        rec = engine.start_recording()
        request = Request("p0", prompt, NEW_TOKENS)
        engine.begin_request(request)
        tokens = tuple(engine.decode(request))
        engine.stop_recording()
        sequences = []
        for i in range(2):  # calibration prompts, apart from the measured one
            cal = tuple(torch.randint(0, 256, (PROMPT_TOKENS,), generator=gen).tolist())
            one = engine.start_recording()
            engine.begin_request(Request(f"c{i}", cal, 4))
            engine.decode(Request(f"c{i}", cal, 4))
            engine.stop_recording()
            sequences.append(one.counts.clone())
        calibration = Calibration(sum(sequences), (), tuple(sequences))
        return cls(engine, prompt, tokens, tuple(rec.trace), calibration)

    def request(self):
        from specterbench.plugins.strategy import Request

        return Request("p0", self.prompt, NEW_TOKENS, self.reference_tokens, self.reference_trace)

    def strategy(self, name: str):
        from specterbench.plugins.host import get_host

        resident = name == SPECTER_RESIDENT
        name = "specter" if resident else name
        cls = get_host().strategies().get(name)
        strategy = cls(**OPTIONS.get(name, {}))
        fraction = 2.0 if resident else cls.fixed_budget_fraction or BUDGET_FRACTION  # 2×: every expert and a draft
        configure(self.engine, strategy, int(fraction * self.engine.total_expert_bytes))
        strategy.prepare(self.engine, self.calibration if cls.uses_calibration else None)
        if resident:
            for key in self.engine.store.weights:
                self.engine.prefetch(key)
        return strategy

    def host_ms_per_token(self, strategy) -> tuple[float, list[int]]:
        """Median host CPU ms per decode token of one request (prefill excluded), and the tokens. CPU time of
        this process, not wall time: the machine is shared, and wall time would count other processes."""
        engine, request = self.engine, self.request()
        marks, emit = [], engine.emit

        def timed_emit(n):
            emit(n)
            marks.append((time.process_time(), n))

        engine.emit = timed_emit
        try:
            engine.begin_request(request)
            tokens = strategy.generate(engine, request)
        finally:
            del engine.emit
        per_token = [(b - a) * 1e3 / n for (a, _), (b, n) in zip(marks, marks[1:]) for _ in range(n)]
        return statistics.median(per_token), tokens


def stock_ms_per_token(geometry: str) -> float:
    """The same random model with its own experts module (no offloading): median CPU ms per decode token."""
    from transformers import DynamicCache

    model = random_model(*GEOMETRIES[geometry])
    ids = torch.randint(0, 256, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    kv = DynamicCache(config=model.config)
    per_token = []
    with torch.inference_mode():
        token = model(input_ids=ids, cache=kv, use_cache=True).logits[0, -1].argmax().view(1, 1)
        for _ in range(NEW_TOKENS):
            t0 = time.process_time()
            token = model(input_ids=token, cache=kv, use_cache=True).logits[0, -1].argmax().view(1, 1)
            per_token.append((time.process_time() - t0) * 1e3)
    return statistics.median(per_token)


class _Resident:
    """Every expert on the device: records the reference (not registered: a helper of this benchmark)."""

    name = "reference"
    lossless = True

    def __new__(cls):
        from specterbench import Strategy

        class Reference(Strategy):
            name = "reference"

            def min_cache_bytes(self, engine):
                return engine.total_expert_bytes

            def prepare(self, engine, calibration=None):
                for key in engine.store.weights:
                    engine.prefetch(key)

        return Reference()


def configure(engine, strategy, budget_bytes: int) -> None:
    from specterbench.engine.clocks import ModeledClock
    from specterbench.engine.profiles import BUILTIN_HOST_PROFILES, BUILTIN_PROFILES

    engine.configure(strategy, budget_bytes, ModeledClock(BUILTIN_PROFILES[0], engine.geometry,
                                                          BUILTIN_HOST_PROFILES[0]))


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    if "--specter-default" in argv:  # Specter with its default draft (int4, group 128) in place of the pinned int3
        argv = [a for a in argv if a != "--specter-default"]
        OPTIONS["specter"] = {"k": 4}
    unknown = [a for a in argv if a not in GEOMETRIES]
    if unknown:
        print(f"unknown geometry {unknown[0]!r}: use any of {', '.join(GEOMETRIES)} (and --specter-default for "
              f"Specter's int4 default draft)", file=sys.stderr)
        return 2
    geometries = argv or list(GEOMETRIES)
    print(f"host CPU ms per decode token, modeled clock, budget {BUDGET_FRACTION:.0%} of expert bytes, "
          f"{NEW_TOKENS} new tokens after a {PROMPT_TOKENS}-token prompt (median; random-init, hidden 32); specter "
          f"options {OPTIONS['specter']}")
    print("| geometry (experts × MoE layers, top-k) | stock model | engine, all resident | "
          + " | ".join(STRATEGIES) + f" | {SPECTER_RESIDENT} |")
    print("|---|---|---|" + "---|" * (len(STRATEGIES) + 1))
    for geometry in geometries:
        t0 = time.perf_counter()
        world = World.build(geometry)
        names = (FLOOR, *STRATEGIES, SPECTER_RESIDENT)
        ms: dict[str, list[float]] = {name: [] for name in ("stock", *names)}
        errors: dict[str, str] = {}
        for name in names:  # warm-up, and each strategy's tokens checked against the reference
            try:
                tokens = world.host_ms_per_token(world.strategy(name))[1]
                if tuple(tokens) != world.reference_tokens:
                    errors[name] = "tokens differ!"
            except Exception as err:  # a strategy's failure is its cell's
                errors[name] = f"error: {type(err).__name__}: {err}"[:80]
        for _ in range(ROUNDS):  # side by side: each round measures every cell once, so load drifts hit all alike
            ms["stock"].append(stock_ms_per_token(geometry))
            for name in names:
                if name not in errors:
                    ms[name].append(world.host_ms_per_token(world.strategy(name))[0])
        cells = [f"{statistics.median(ms['stock']):.1f}"]
        for name in names:
            if name in errors and not ms[name]:
                cells.append(errors[name])
                continue
            base = "stock" if name == FLOOR else FLOOR
            target = STOCK_TARGET.get(geometry) if name == FLOOR else TARGETS.get((geometry, name))
            ratio = statistics.median(a / b for a, b in zip(ms[name], ms[base])) if ms[base] else None
            mark = (f" ({ratio:.2f}×, target ≤ {target:g}×)" if target and ratio
                    else f" ({ratio:.2f}×)" if name == SPECTER_RESIDENT and ratio else "")
            cells.append(f"{statistics.median(ms[name]):.1f}{mark}" + (f" ({errors[name]})" if name in errors else ""))
        e, layers, k = GEOMETRIES[geometry]
        print(f"| {geometry} ({e} × {layers}, top-{k}) | " + " | ".join(cells) + " |", flush=True)
        print(f"  (built and measured in {time.perf_counter() - t0:.0f} s; ratios: median over {ROUNDS} rounds of "
              f"per-round ratios)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ".")
    raise SystemExit(main(sys.argv[1:]))
