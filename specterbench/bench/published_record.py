"""The published record: each published measurement, what it was measured on, and how the harness reproduces it.

``published/record.toml`` (shipped with the package) lists every figure with its source, hardware profile, model,
precision, budget and setting. :func:`load_record` checks all of it against the plugin host before anything runs
(a missing or unknown field, an unknown name, a bad precision or budget is one line naming the measurement), so a
long ``specterbench published`` never stops halfway on a typo; running and rendering it is
:mod:`specterbench.bench.published`.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from specterbench.engine.geometry import geometry_preset
from specterbench.engine.host_kernels import precision_of_bits
from specterbench.engine.precision import Precision
from specterbench.errors import UsageError

RECORD = Path(__file__).resolve().parent / "published" / "record.toml"
KINDS = ("tpot_ms", "tokens_per_s", "hit_rate", "component_ms")
OPS = ("copy_experts", "host_experts")
#: a subset that runs in seconds (tests): the component figures and one mixtral-offloading pair
QUICK_IDS = ("layerscope-expert-copy", "hostexpert-layer-fetch", "hostexpert-layer-cpu", "mo-t2-a100-full",
             "mo-t2-a100-naive")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One published figure and how the harness reproduces it."""

    id: str
    source: str
    system: str
    model: str
    geometry: str
    profile: str
    kind: str
    value: float
    precision: "Precision"  # the target's stored precision
    strategy: str | None = None
    options: dict = field(default_factory=dict)
    standin: str | None = None
    host_profile: str | None = None
    budget: dict = field(default_factory=dict)
    setting: str | list[str] | None = None  # one setting, or several (a row in more than one comparison)
    lengths: str = "not stated"
    chart: bool = False
    op: str | None = None
    count: int = 1
    threads: int | None = None
    batch: int = 1  # requests decoding together; the value is then tokens/s over the whole batch (per GPU)
    prompt_tokens: int | None = None  # the published prompt length, when the row prices its KV cache
    new_tokens: int | None = None  # the published decode length, likewise

    @property
    def settings(self) -> tuple[str, ...]:
        """Every setting the row is compared in (pairs form within each)."""
        if self.setting is None:
            return ()
        return (self.setting,) if isinstance(self.setting, str) else tuple(self.setting)

    @property
    def kv_context(self) -> int | None:
        """Positions of each request's KV cache as published (prompt + new tokens), or None when not stated."""
        if self.prompt_tokens is None or self.new_tokens is None:
            return None
        return self.prompt_tokens + self.new_tokens

    @property
    def published_ms(self) -> float | None:
        """The published time per token (or per component) in ms; None for a hit rate."""
        if self.kind == "tokens_per_s":
            return 1000.0 / self.value
        return self.value if self.kind in ("tpot_ms", "component_ms") else None

    @property
    def published_text(self) -> str:
        mark = " [chart]" if self.chart else ""
        if self.kind == "tokens_per_s":
            return f"{self.value:g} tok/s = {self.published_ms:.1f} ms{mark}"
        if self.kind == "hit_rate":
            return f"{self.value:.3f}{mark}"
        return f"{self.value:g} ms{mark}"


REQUIRED = ("id", "source", "system", "model", "geometry", "profile", "kind", "value", "precision")
KNOWN = {f.name for f in dataclasses.fields(Measurement)}
BUDGET_KEYS = {"slots_per_layer", "device_memory", "reserve_gib", "minus_draft_of", "plus_draft", "fraction"}


def load_record(host, path: Path | str = RECORD) -> list[Measurement]:
    """Every measurement of the record, each checked before anything runs: a missing or unknown field, an unknown
    model, profile, strategy or geometry, a bad precision or budget is one UsageError line naming the row."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--record {path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"--record {path}: malformed ({str(err).splitlines()[0]})") from None
    rows = data.get("measurement")
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"--record {path}: no [[measurement]] entries")
    out, seen = [], set()
    for i, row in enumerate(rows):
        where = f"published record {path.name}: measurement {row.get('id', f'#{i + 1}')!r}"
        try:
            m = _measurement(row, Precision)
            if m.id in seen:
                raise UsageError("duplicate id")
            seen.add(m.id)
            geometry_preset(m.geometry)
            host.profiles().entry(m.profile)
            if m.host_profile is not None:
                host.host_profiles().entry(m.host_profile)
            if m.kind == "component_ms":
                if m.op not in OPS:
                    raise UsageError(f"op {m.op!r} is not one of {', '.join(OPS)}")
                if m.op == "host_experts" and m.host_profile is None:
                    raise UsageError("op host_experts needs a host_profile")
            else:
                if m.standin is None or m.strategy is None:
                    raise UsageError("a decode measurement needs a standin model and a strategy")
                host.models().entry(m.standin)
                cls = host.strategies().get(m.strategy)
                if hasattr(cls, "validate_options"):
                    cls.validate_options(dict(m.options))
                cls.check_profile(host.profiles().get(m.profile), dict(m.options))
                if m.host_profile is not None:
                    cpu = host.host_profiles().get(m.host_profile)
                    cls.check_host_profile(cpu, dict(m.options))
                    cpu.kernel_rate(precision_of_bits(m.precision.expert_bits))  # its host experts' rate
                _check_budget(m, host)
        except UsageError as err:
            raise UsageError(f"{where}: {err}") from None
        out.append(m)
    return out


def _measurement(row: dict, Precision) -> Measurement:
    if not isinstance(row, dict):
        raise UsageError("is not a table")
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise UsageError(f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(row) - KNOWN)
    if unknown:
        raise UsageError(f"unknown field(s) {', '.join(unknown)}")
    kind = row["kind"]
    if kind not in KINDS:
        raise UsageError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    value = row["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"value must be a finite positive number, got {value!r}")
    if kind == "hit_rate" and value > 1:
        raise UsageError(f"a hit rate is at most 1, got {value!r}")
    p = row["precision"]
    if not isinstance(p, dict) or set(p) - {"expert_bits", "dense_bits", "quantizer", "group"}:
        raise UsageError(f"precision must be a table of expert_bits, dense_bits, quantizer, group; got {p!r}")
    precision = Precision.parse(p.get("expert_bits", 16), p.get("dense_bits", 16), p.get("quantizer", "int"),
                                p.get("group", 128))
    count = row.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"count must be a positive integer, got {count!r}")
    for name in ("batch", "prompt_tokens", "new_tokens"):
        n = row.get(name, 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError(f"{name} must be a positive integer, got {n!r}")
    if row.get("batch", 1) > 1 and kind != "tokens_per_s":
        raise UsageError(f"batch {row['batch']} needs kind = \"tokens_per_s\" (the batch's tokens/s per GPU), got "
                         f"kind {kind!r}")
    if ("prompt_tokens" in row) != ("new_tokens" in row):
        raise UsageError("prompt_tokens and new_tokens come together (the published lengths whose KV is charged)")
    setting = row.get("setting")
    if setting is not None and not (isinstance(setting, str) or (
            isinstance(setting, list) and setting and all(isinstance(x, str) for x in setting))):
        raise UsageError(f"setting must be a string or a list of strings, got {setting!r}")
    return Measurement(**{**row, "value": float(value), "precision": precision,
                          "options": dict(row.get("options", {})), "budget": dict(row.get("budget", {}))})


def _check_budget(m: Measurement, host) -> None:
    b = m.budget
    unknown = sorted(set(b) - BUDGET_KEYS)
    if unknown:
        raise UsageError(f"budget has unknown key(s) {', '.join(unknown)}")
    kinds = [k for k in ("slots_per_layer", "device_memory", "fraction") if k in b]
    if len(kinds) != 1:
        raise UsageError("budget needs exactly one of slots_per_layer, device_memory, fraction")
    if "slots_per_layer" in b and not (isinstance(b["slots_per_layer"], int) and b["slots_per_layer"] > 0):
        raise UsageError(f"slots_per_layer must be a positive integer, got {b['slots_per_layer']!r}")
    if "fraction" in b and not (isinstance(b["fraction"], (int, float)) and 0 <= b["fraction"] <= 1):
        raise UsageError(f"budget fraction must be in [0, 1] (0: no expert on the device), got {b['fraction']!r}")
    reserve = b.get("reserve_gib", 0.0)
    if not isinstance(reserve, (int, float)) or not math.isfinite(reserve) or reserve < 0:
        raise UsageError(f"reserve_gib must be a finite number >= 0, got {reserve!r}")
    if "minus_draft_of" in b:
        host.strategies().entry(b["minus_draft_of"])
