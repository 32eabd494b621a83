"""A run's configuration: models, strategies, budgets, the clock and its profiles, the workload and the decode
setting, checked in one line per problem before anything loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specterbench.bench.budget import Budget
from specterbench.bench.checks import check_device, check_strategy_options
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.graphs import check_setting as check_graph_setting
from specterbench.engine.host_kernels import precision_of_bits
from specterbench.engine.precision import BF16, Precision
from specterbench.engine.sampling import DEFAULT_DECODE, DecodeSetting
from specterbench.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.plugins.host import PluginHost


@dataclass(frozen=True, slots=True)
class BenchConfig:
    models: tuple[str, ...]
    strategies: tuple[str, ...]
    budgets: tuple[Budget, ...]
    profile: str
    host_profile: str = "desktop-ddr5"  # the host CPU, for strategies that compute experts there
    geometry: str | None = None  # a preset (mixtral, qwen-moe, ...) to price the routing at a real model's sizes
    # (a modeled projection); "auto": the real model an embedded one stands in for; None or "own": its own sizes
    clock: str = "modeled"  # modeled | measured
    workload: str = "shakespeare-heldout-v1"
    calibration: str = "calibration-v1"
    prompts: int = 8
    tokens: int = 32
    max_prompt_tokens: int = 64
    repeats: int = 1
    seed: int = 0
    device: str = "cpu"
    threads: int = 1  # torch intra-op threads on the host; 1 keeps tiny models' wall times stable
    warmup: bool = True
    strategy_options: dict = field(default_factory=dict)  # strategy name -> {option: value}
    decode: DecodeSetting = DEFAULT_DECODE  # greedy, or Gumbel-max sampling shared by reference, strategies and drafts
    precision: Precision = BF16  # the target's stored weights (--expert-bits, --dense-bits): quantized before the
    # reference is recorded, so the reference is the quantized model itself
    cuda_graphs: str = "auto"  # --cuda-graphs: auto (capture on CUDA, eager elsewhere or on failure) | off
    prompt_tokens: tuple[int, ...] = ()  # --prompt-tokens: prompts of exactly these lengths (bench.prompts)
    depths: tuple[int, ...] = (0,)  # --depth: context prefilled before each prompt, outside the timing
    batches: tuple[int, ...] = (1,)  # --batch: requests decoding together per cell (bench.batching)

    def __post_init__(self):
        if self.decode.mode == "sample" and self.decode.seed != self.seed:  # one seed: the noise follows --seed
            object.__setattr__(self, "decode", dataclasses.replace(self.decode, seed=self.seed))

    def validate(self, host: PluginHost) -> None:
        if self.tokens <= 0:
            raise UsageError(f"TOKENS must be a positive number of new tokens, got {self.tokens}")
        if self.prompts <= 0:
            raise UsageError(f"PROMPTS must be positive, got {self.prompts}")
        if self.threads <= 0:
            raise UsageError(f"threads must be positive, got {self.threads}")
        check_threads(self.threads)
        if self.repeats <= 0:
            raise UsageError(f"repeats must be positive, got {self.repeats}")
        check_graph_setting(self.cuda_graphs)
        if not self.batches or min(self.batches) < 1:
            raise UsageError(f"--batch {','.join(map(str, self.batches))}: a batch is a positive number of requests, "
                             f"e.g. --batch 1,4,16")
        if max(self.depths, default=0) > 0 and max(self.batches) > 1:
            raise UsageError("--depth with --batch above 1 is not supported (a batch's requests share one prefill); "
                             "run the depths at --batch 1")
        if self.clock not in ("modeled", "measured"):
            raise UsageError(f"unknown clock {self.clock!r}; use 'modeled' or 'measured'")
        if not self.budgets:
            raise UsageError("no budgets given; pass e.g. --budgets 35%,50%")
        for name in self.models:
            host.models().entry(name)
        for name in self.strategies:
            host.strategies().entry(name)
        check_strategy_options(host, self.strategy_options, self.strategies)
        check_device(self.device)
        host.profiles().entry(self.profile)
        host.host_profiles().entry(self.host_profile)
        if self.clock == "modeled":  # a figure the strategy's options are priced with and the profile lacks
            profile, cpu = host.profiles().get(self.profile), host.host_profiles().get(self.host_profile)
            for name in self.strategies:
                cls, options = host.strategies().get(name), self.strategy_options.get(name, {})
                cls.check_profile(profile, dict(options))
                cls.check_host_profile(cpu, dict(options))
            cpu.kernel_rate(precision_of_bits(self.precision.expert_bits))  # host experts' kernel at --expert-bits
        if self.geometry not in (None, "own", "auto"):
            if self.clock != "modeled":
                raise UsageError("GEOMETRY prices a model at another model's sizes, which only the modeled clock "
                                 "can do; drop GEOMETRY or use --clock modeled")
            geometry_preset(self.geometry)

    @property
    def batch(self) -> tuple[int, ...]:
        """The batch axis as a card's plan reads it (its largest batch's KV is on the card)."""
        return self.batches

    def geometry_for(self, spec) -> str | None:
        """The geometry preset ``spec``'s routing is priced at, or None for its own sizes."""
        return resolve_geometry(self.geometry, spec, self.clock)


def check_threads(threads: int) -> None:
    """Refuse more host threads than this machine has (OpenMP aborts the process on some counts)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads > cores:
        raise UsageError(f"threads {threads} is more than the {cores} CPU threads this process may use; give at "
                         f"most {cores} (1 keeps tiny models' wall times stable)")


def resolve_geometry(geometry: str | None, spec, clock: str) -> str | None:
    """``auto`` → the real model an embedded one stands in for (modeled clock only); ``own``/None → None."""
    if geometry in (None, "own"):
        return None
    if geometry == "auto":
        return spec.geometry if clock == "modeled" else None
    return geometry
