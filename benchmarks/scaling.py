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
# Specter's options: K = 4 and its default draft (int4, group 128, int8 dense copy), as a run uses it;
# ``--specter-bits=3`` pins the int3 draft
OPTIONS = {"specter": {"k": 4}}
BUDGET_FRACTION = 0.5
PROMPT_TOKENS = 16
NEW_TOKENS = 16
PROMPTS = 3  # requests per cell and round, each with its own prompt and reference
ROUNDS = 5  # every cell measured once per round, rounds interleaved: a ratio is the median of per-round ratios
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
    prompts: tuple[tuple[int, ...], ...]
    references: tuple[tuple[tuple[int, ...], tuple], ...]  # per prompt: (tokens, routing trace)
    calibration: object

    @property
    def reference_tokens(self) -> tuple[int, ...]:  # the first prompt's (``bench_scaling.py`` decodes it)
        return self.references[0][0]

    @classmethod
    def build(cls, geometry: str) -> "World":
        from specterbench.engine.engine import Engine
        from specterbench.strategy import Request, RoutingCalibration

        experts, layers, top_k = GEOMETRIES[geometry]
        engine = Engine(random_model(experts, layers, top_k), name=f"random-{geometry}")
        gen = torch.Generator().manual_seed(1)
        prompts = tuple(tuple(torch.randint(0, 256, (PROMPT_TOKENS,), generator=gen).tolist())
                        for _ in range(PROMPTS))
        configure(engine, _Resident(), engine.total_expert_bytes)
        engine.strategy.prepare(engine)
        references = []
        for i, prompt in enumerate(prompts):
            rec = engine.start_recording()
            request = Request(f"p{i}", prompt, NEW_TOKENS)
            engine.begin_request(request)
            tokens = tuple(engine.decode(request))
            engine.stop_recording()
            references.append((tokens, tuple(rec.trace)))
        sequences = []
        for i in range(2):  # calibration prompts, apart from the measured ones
            cal = tuple(torch.randint(0, 256, (PROMPT_TOKENS,), generator=gen).tolist())
            one = engine.start_recording()
            engine.begin_request(Request(f"c{i}", cal, 4))
            engine.decode(Request(f"c{i}", cal, 4))
            engine.stop_recording()
            sequences.append(one.counts.clone())
        calibration = RoutingCalibration(sum(sequences), (), tuple(sequences))
        return cls(engine, prompts, tuple(references), calibration)

    def request(self, i: int = 0):
        from specterbench.strategy import Request

        tokens, trace = self.references[i]
        return Request(f"p{i}", self.prompts[i], NEW_TOKENS, tokens, trace)

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

    def host_ms_per_token(self, strategy, i: int = 0) -> tuple[float, list[int]]:
        """Mean host CPU ms per decode token of request ``i`` (prefill and the first token excluded: from the first
        emitted token to the last), and the tokens. CPU time of this process, not wall time: the machine is shared,
        and wall time would count other processes."""
        cpu_s, n, _, tokens = self._decode(strategy, i)
        return cpu_s * 1e3 / n, tokens

    def _decode(self, strategy, i: int):
        """One request: (CPU seconds after its first emitted token, tokens emitted after it, per-token ms — a
        speculative window's tokens share its figure —, the tokens)."""
        engine, request = self.engine, self.request(i)
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
        return marks[-1][0] - marks[0][0], len(per_token), per_token, tokens

    def measure(self, name: str) -> "Sample":
        """Every prompt once through one new ``name`` strategy: host CPU ms per decode token over all of them (mean:
        their CPU time over their tokens; median of the per-token figures beside it), and whether each request's
        tokens equal its reference."""
        cpu_s, n, per_token, same = 0.0, 0, [], True
        strategy = self.strategy(name)  # one strategy serves the prompts in turn, as a run's cell does
        for i in range(len(self.prompts)):
            s, m, ms, tokens = self._decode(strategy, i)
            cpu_s, n, per_token = cpu_s + s, n + m, per_token + ms
            same = same and (not strategy.lossless or tuple(tokens) == self.references[i][0])
        return Sample(cpu_s * 1e3 / n, statistics.median(per_token), same)


@dataclass
class Sample:
    mean_ms: float  # host CPU ms per decode token: the cell's CPU time over its tokens
    median_ms: float  # median of the per-token figures
    tokens_match: bool  # every request of a lossless strategy emitted its reference's tokens


def stock_ms_per_token(geometry: str) -> Sample:
    """The same random model with its own experts module (no offloading), the same prompts: CPU ms per decode
    token (mean over the prompts' tokens, median beside it)."""
    from transformers import DynamicCache

    model = random_model(*GEOMETRIES[geometry])
    gen = torch.Generator().manual_seed(1)  # the prompts World.build draws
    per_token = []
    with torch.inference_mode():
        for _ in range(PROMPTS):
            ids = torch.randint(0, 256, (1, PROMPT_TOKENS), generator=gen)
            kv = DynamicCache(config=model.config)
            token = model(input_ids=ids, cache=kv, use_cache=True).logits[0, -1].argmax().view(1, 1)
            for _ in range(NEW_TOKENS - 1):  # the first token comes from the prefill, as in the engine's figure
                t0 = time.process_time()
                token = model(input_ids=token, cache=kv, use_cache=True).logits[0, -1].argmax().view(1, 1)
                per_token.append((time.process_time() - t0) * 1e3)
    return Sample(statistics.fmean(per_token), statistics.median(per_token), True)


def _cell(samples: list[Sample]) -> str:
    """A cell's figures over the rounds: the median of the rounds' means / of their medians."""
    return (f"{statistics.median(s.mean_ms for s in samples):.1f} / "
            f"{statistics.median(s.median_ms for s in samples):.1f}")


class _Resident:
    """Every expert on the device: records the reference (not registered: a helper of this benchmark)."""

    name = "reference"
    lossless = True

    def __new__(cls):
        from specterbench import Strategy

        class Reference(Strategy):
            name = "reference"
            version = "1"

            def min_cache_bytes(self, engine):
                return engine.total_expert_bytes

            def prepare(self, engine, calibration=None):
                for key in engine.store.weights:
                    engine.prefetch(key)

        return Reference()


def configure(engine, strategy, budget_bytes: int) -> None:
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile, default_profile

    engine.configure(strategy, budget_bytes, ModeledClock(default_profile(), engine.geometry,
                                                          default_host_profile()))


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    # --specter-default: the default draft (accepted so that recorded commands that name it still run)
    argv = [a for a in argv if a != "--specter-default"]
    for a in [a for a in argv if a.startswith(("--specter-k=", "--specter-bits="))]:  # Specter's window / draft bits
        argv.remove(a)
        flag, value = a.split("=", 1)
        if flag == "--specter-k" and (not value.isdigit() or int(value) < 1):
            print(f"{a}: K must be a whole number of draft tokens ≥ 1, e.g. --specter-k=2", file=sys.stderr)
            return 2
        if flag == "--specter-bits" and value not in ("2", "3", "4", "8"):
            print(f"{a}: the draft's bits must be one of 2, 3, 4, 8, e.g. --specter-bits=3", file=sys.stderr)
            return 2
        OPTIONS["specter"] = {**OPTIONS["specter"], flag.removeprefix("--specter-"): int(value)}
    unknown = [a for a in argv if a not in GEOMETRIES]
    if unknown:
        print(f"unknown geometry {unknown[0]!r}: use any of {', '.join(GEOMETRIES)} (and --specter-k=N for "
              f"Specter's window, --specter-bits=N for its draft's bits)", file=sys.stderr)
        return 2
    geometries = argv or list(GEOMETRIES)
    print(f"host CPU ms per decode token, modeled clock, budget {BUDGET_FRACTION:.0%} of expert bytes, {PROMPTS} "
          f"prompts of {PROMPT_TOKENS} tokens × {NEW_TOKENS} new tokens per cell and round, {ROUNDS} rounds (mean / "
          f"median; random-init, hidden 32); specter options {OPTIONS['specter']}")
    print("| geometry (experts × MoE layers, top-k) | stock model | engine, all resident | "
          + " | ".join(STRATEGIES) + f" | {SPECTER_RESIDENT} |")
    print("|---|---|---|" + "---|" * (len(STRATEGIES) + 1))
    for geometry in geometries:
        t0 = time.perf_counter()
        world = World.build(geometry)
        names = (FLOOR, *STRATEGIES, SPECTER_RESIDENT)
        samples: dict[str, list[Sample]] = {name: [] for name in ("stock", *names)}
        errors: dict[str, str] = {}
        for name in names:  # warm-up, and each strategy's tokens checked against the references
            try:
                if not world.measure(name).tokens_match:
                    errors[name] = "tokens differ!"
            except Exception as err:  # a strategy's failure is its cell's
                errors[name] = f"error: {type(err).__name__}: {err}"[:80]
        for _ in range(ROUNDS):  # side by side: each round measures every cell once, so load drifts hit all alike
            samples["stock"].append(stock_ms_per_token(geometry))
            for name in names:
                if name not in errors:
                    samples[name].append(world.measure(name))
        cells, spread = [_cell(samples["stock"])], []
        for name in names:
            if name in errors and not samples[name]:
                cells.append(errors[name])
                continue
            base = "stock" if name == FLOOR else FLOOR
            target = STOCK_TARGET.get(geometry) if name == FLOOR else TARGETS.get((geometry, name))
            ratios = [a.mean_ms / b.mean_ms for a, b in zip(samples[name], samples[base])]
            ratio = statistics.median(ratios) if ratios else None
            mark = (f" ({ratio:.2f}×, target ≤ {target:g}×{'' if ratio <= target else ': missed'})" if target and ratio
                    else f" ({ratio:.2f}×)" if name == SPECTER_RESIDENT and ratio else "")
            cells.append(_cell(samples[name]) + mark + (f" ({errors[name]})" if name in errors else ""))
            if ratios:
                spread.append(f"{name} {min(ratios):.2f}–{max(ratios):.2f}×")
        e, layers, k = GEOMETRIES[geometry]
        print(f"| {geometry} ({e} × {layers}, top-{k}) | " + " | ".join(cells) + " |", flush=True)
        print(f"  (built and measured in {time.perf_counter() - t0:.0f} s; a ratio is the median over {ROUNDS} rounds "
              f"of per-round ratios of means; per-round range: {', '.join(spread)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ".")
    raise SystemExit(main(sys.argv[1:]))
