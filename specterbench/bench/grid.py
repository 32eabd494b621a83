"""The grid of a sweep: a TOML file naming each axis, expanded into cells and the shared jobs they need.

Cells' keys equal the keys ``specterbench run`` writes, so ``report``, the gate and ``--resume`` read a sweep's
rows exactly as a single run's. See ``docs/sweeps.md`` for the format.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig, resolve_geometry
from specterbench.bench.device_memory import card_budgets, parse_memory, with_profile_memory
from specterbench.bench.runner import Runner
from specterbench.engine.precision import Precision
from specterbench.engine.sampling import DEFAULT_DECODE, DecodeSetting
from specterbench.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.bench.budget import Budget
    from specterbench.bench.config import BenchConfig
    from specterbench.plugins.host import PluginHost

DEFAULT_PROFILE = "a100-40g-pcie4"  # as ``specterbench run``

# ---- the grid ---------------------------------------------------------------------------------------------

# TOML key -> Grid field, for the axes (a scalar or a list of values; a list expands to cells)
AXES = {"models": "models", "strategies": "strategies", "budgets": "budgets", "profiles": "profiles",
        "geometry": "geometries", "seeds": "seeds", "tokens": "tokens", "prompts": "prompts",
        "workload": "workloads", "gpu_memory": "budgets"}
# TOML key -> BenchConfig field, for settings shared by every cell (one value each)
SETTINGS = {"clock": str, "host_profile": str, "calibration": str, "max_prompt_tokens": int, "repeats": int,
            "device": str, "threads": int, "warmup": bool}
# TOML key -> DecodeSetting field: how tokens are chosen, shared by every cell (decode = "greedy" | "sample")
DECODE_KEYS = {"decode": "mode", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
# TOML key -> Precision.parse argument: the target's stored precision, shared by every cell (as run --expert-bits)
PRECISION_KEYS = {"expert_bits": "expert_bits", "dense_bits": "dense_bits", "expert_quantizer": "quantizer",
                  "expert_group": "group"}
OWN_GEOMETRY = "own"  # the geometry axis value that prices the model at its own sizes


@dataclass(frozen=True, slots=True)
class Grid:
    """A parsed grid file: every axis as a tuple of values, strategy options as axes of their own."""

    models: tuple[str, ...]
    strategies: tuple[str, ...]  # ("all",) expands to every registered strategy
    budgets: tuple["Budget", ...]
    profiles: tuple[str, ...] = (DEFAULT_PROFILE,)
    # as `specterbench run`: priced at the real model a stand-in stands for ("auto"); None: its own sizes
    geometries: tuple[str | None, ...] = ("auto",)
    # None: one value, BenchConfig's default
    seeds: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None
    prompts: tuple[int, ...] | None = None
    workloads: tuple[str, ...] | None = None
    strategy_options: dict = field(default_factory=dict)  # strategy -> {option: tuple of values}
    settings: dict = field(default_factory=dict)  # SETTINGS given in the file
    source: str = "<grid>"

    @property
    def device(self) -> str:
        return self.settings.get("device", "cpu")

    @property
    def threads(self) -> int:
        return self.settings.get("threads", 1)


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def _values(source: str, key: str, value, kind: type) -> tuple:
    values = tuple(value) if isinstance(value, list) else (value,)
    if not values:
        raise UsageError(f"{source}: {key} is empty; give at least one value")
    for v in values:
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise UsageError(f"{source}: {key} takes whole numbers, got {v!r}")
        if kind is str and not isinstance(v, str):
            raise UsageError(f"{source}: {key} takes names (strings), got {v!r}")
    return values


def parse_grid(data: dict, source: str = "<grid>") -> Grid:
    """A :class:`Grid` from the TOML's table; an unknown key or a malformed value is a one-line UsageError."""

    known = [*AXES, *SETTINGS, *DECODE_KEYS, *PRECISION_KEYS, "gpu_reserve", "strategy_options"]
    for key in data:
        if key not in known:
            raise UsageError(f"{source}: unknown key {key!r}; {_did_you_mean(key, known)}"
                             f"known keys: {', '.join(known)}")
    for key in ("models", "strategies", "budgets"):
        if key not in data and not (key == "budgets" and "gpu_memory" in data):
            raise UsageError(f"{source}: no {key!r}; a grid names at least models, strategies and budgets (or "
                             f"gpu_memory)")
    kw: dict[str, Any] = {"source": source}
    for key in ("models", "strategies", "profiles", "workload"):
        if key in data:
            kw[AXES[key]] = _values(source, key, data[key], str)
    for key in ("seeds", "tokens", "prompts"):
        if key in data:
            kw[AXES[key]] = _values(source, key, data[key], int)
    budgets = []
    for b in _values(source, "budgets", data["budgets"], object) if "budgets" in data else ():
        if isinstance(b, bool) or not isinstance(b, (str, int, float)):
            raise UsageError(f"{source}: budgets takes '35%', 0.35 or '120MB', got {b!r}")
        budgets.append(parse_budget(str(b)))
    kw["budgets"] = card_axis(source, data, tuple(budgets))
    if "geometry" in data:
        kw["geometries"] = tuple(None if g in (OWN_GEOMETRY, "") else g
                                 for g in _values(source, "geometry", data["geometry"], str))
    settings = {}
    for key, kind in SETTINGS.items():
        if key in data:
            value = data[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise UsageError(f"{source}: {key} takes one {kind.__name__} value, got {value!r}")
            settings[key] = value
    decode = {field: data[key] for key, field in DECODE_KEYS.items() if key in data}
    if decode.get("mode") == "greedy" and len(decode) > 1:
        key = next(k for k, f in DECODE_KEYS.items() if f in decode and f != "mode")
        raise UsageError(f"{source}: {key} shapes sampling, but decode = 'greedy'; drop {key}, or set decode = "
                         f"'sample'")
    if decode:

        base = DEFAULT_DECODE.to_dict() if decode.get("mode", DEFAULT_DECODE.mode) == "sample" else {}
        try:
            settings["decode"] = DecodeSetting.from_dict({**base, **decode})
        except UsageError as err:
            raise UsageError(f"{source}: {err}") from None
        except (TypeError, ValueError):
            raise UsageError(f"{source}: decode settings take decode = 'greedy' | 'sample', temperature = "
                             f"number, top_p = number, top_k = integer; got {decode}") from None
    precision = {arg: data[key] for key, arg in PRECISION_KEYS.items() if key in data}
    if precision:

        try:
            settings["precision"] = Precision.parse(**precision)
        except UsageError as err:
            raise UsageError(f"{source}: {err}") from None
    kw["settings"] = settings
    options = data.get("strategy_options", {})
    if not isinstance(options, dict):
        raise UsageError(f"{source}: strategy_options is a table: [strategy_options.NAME] OPTION = [values]")
    parsed = {}
    for sname, table in options.items():
        if not isinstance(table, dict):
            raise UsageError(f"{source}: strategy_options.{sname} is a table of OPTION = value or [values]")
        parsed[sname] = {opt: _values(source, f"strategy_options.{sname}.{opt}", v, object)
                         for opt, v in table.items()}
    kw["strategy_options"] = parsed
    return Grid(**kw)


def card_axis(source: str, data: dict, budgets: tuple) -> tuple:
    """``budgets`` and, for ``gpu_memory = ["24GiB", "48GiB"]``, card budgets beside them (``gpu_reserve``: the
    runtime reserve of every card budget, ``budgets = ["device"]`` included: the profile's memory)."""
    reserve = data.get("gpu_reserve")
    if reserve is not None and not isinstance(reserve, str):
        raise UsageError(f"{source}: gpu_reserve takes one size with a unit, e.g. '1GiB', got {reserve!r}")
    try:
        reserve_bytes = None if reserve is None else parse_memory(reserve, "gpu_reserve")
        budgets = tuple(dataclasses.replace(b, card_reserve=reserve_bytes) if b.card_bytes == 0 else b
                        for b in budgets)
        if "gpu_memory" not in data:
            return budgets
        sizes = _values(source, "gpu_memory", data["gpu_memory"], str)
        return budgets + tuple(card_budgets(",".join(sizes), reserve, flag="gpu_memory"))
    except UsageError as err:
        raise UsageError(f"{source}: {err}") from None


def load_grid(path) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no grid file at {path}; see examples/grid.toml")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err})") from None
    return parse_grid(data, str(path))


@dataclass(frozen=True, slots=True)
class Cell:
    """One row to produce: a single-model, single-strategy, single-budget config and its repeat."""

    key: str  # equal to the key ``specterbench run`` gives the same cell
    config: "BenchConfig"
    strategy: str
    budget: "Budget"
    repeat: int

    @property
    def model(self) -> str:
        return self.config.models[0]

    def shared_keys(self, uses_calibration: bool) -> tuple[tuple, ...]:
        keys = (reference_key(self.config),)
        return keys + (calibration_key(self.config),) if uses_calibration else keys


def reference_key(cfg: "BenchConfig") -> tuple:
    """What the reference tokens and routing trace depend on (not geometry, profile, budget or seed)."""
    return ("reference", cfg.models[0], cfg.device, cfg.workload, cfg.prompts, cfg.tokens, cfg.max_prompt_tokens,
            cfg.decode.label if cfg.decode.mode == "sample" else "greedy") + _precision_key(cfg)


def calibration_key(cfg: "BenchConfig") -> tuple:
    return ("calibration", cfg.models[0], cfg.device, cfg.calibration, cfg.max_prompt_tokens) + _precision_key(cfg)


def _precision_key(cfg: "BenchConfig") -> tuple:
    """A quantized target is another model: its reference and calibration are its own (bf16 keys stay as they were)."""
    return (cfg.precision.label(),) if cfg.precision.quantized else ()


@dataclass(frozen=True, slots=True)
class SharedJob:
    """Work shared by cells: ``kind`` "reference" (tokens, trace and encoded prompts) or "calibration"."""

    key: tuple
    config: "BenchConfig"

    @property
    def kind(self) -> str:
        return self.key[0]


def expand(grid: Grid, host: "PluginHost") -> list[Cell]:
    """Every cell of the grid, validated up front, in a stable order (model outermost); duplicates dropped."""

    strategies = tuple(host.strategies().names()) if grid.strategies == ("all",) else grid.strategies
    for sname in strategies:
        host.strategies().entry(sname)
    for sname, table in grid.strategy_options.items():
        if sname not in strategies:
            raise UsageError(f"{grid.source}: strategy_options.{sname}: {sname!r} is not among the strategies "
                             f"({', '.join(strategies)})")
        cls = host.strategies().get(sname)
        unknown = sorted(set(table) - set(cls.option_names()))
        if unknown:
            raise UsageError(f"{grid.source}: strategy {sname!r} has no option {unknown[0]!r}; it accepts: "
                             f"{', '.join(cls.option_names()) or 'none'}")
    combos = {s: _option_combos(grid.strategy_options.get(s, {})) for s in strategies}
    for sname, options in combos.items():
        cls = host.strategies().get(sname)
        for opts in options:
            try:
                cls(**opts)  # strategies parse their options in the constructor (cheap: attach does the work)
            except (TypeError, ValueError) as err:
                raise UsageError(f"{grid.source}: strategy {sname!r} rejects options {opts}: {err}") from None
    default = {f.name: f.default for f in dataclasses.fields(BenchConfig)}
    cells, seen = [], set()
    for model, workload, prompts, tokens, geometry, profile, seed in itertools.product(
            grid.models, grid.workloads or (default["workload"],), grid.prompts or (default["prompts"],),
            grid.tokens or (default["tokens"],), grid.geometries, grid.profiles, grid.seeds or (default["seed"],)):
        base = BenchConfig(models=(model,), strategies=strategies, budgets=grid.budgets, profile=profile,
                           geometry=resolve_geometry(geometry, host.models().get(model),
                                                     grid.settings.get("clock", "modeled")),
                           workload=workload, prompts=prompts, tokens=tokens, seed=seed,
                           **grid.settings)
        base.validate(host)
        base = dataclasses.replace(base, budgets=with_profile_memory(base.budgets, host.profiles().get(profile)))
        for sname in strategies:
            for opts in combos[sname]:
                cfg = dataclasses.replace(base, strategies=(sname,), strategy_options={sname: opts} if opts else {})
                for key, _, _, budget, repeat in Runner(host, cfg, Path("."), env={}).cells(model):
                    if key not in seen:
                        seen.add(key)
                        cells.append(Cell(key, dataclasses.replace(cfg, budgets=(budget,)), sname, budget, repeat))
    return cells


def _option_combos(table: dict) -> list[dict]:
    if not table:
        return [{}]
    names = sorted(table)
    return [dict(zip(names, values)) for values in itertools.product(*(table[n] for n in names))]
