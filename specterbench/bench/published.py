"""``specterbench published``: the modeled clock held against published measurements, run and rendered.

The published record (:mod:`specterbench.bench.published_record`) lists each measurement with its source, hardware
profile, model, precision, budget, setting and value. For every end-to-end figure the command runs the
strategy that stands for the published system (``lru`` for Mixtral-Offloading's released code, ``next-layer-gate``
for mixtral-offloading's full algorithm, ``cpu-experts`` for Fiddler, ``specter-artifact`` for MoE-SpeQ,
``on-demand`` for naive offloading) on the stand-in of that model family, priced at the real model's geometry,
precision, profile and budget, and prints the modeled figure beside the published one with their ratio. Component
figures (one expert's copy, one MoE layer on the host) are priced by the cost model alone. Then, for every two
systems measured in one setting on one hardware, the published speed-up beside the modeled one.

Nothing is fitted per row: every price comes from the profile files (each figure cited), every budget from the
published cache size or from the device memory the profile states. Where the clock is faster than a published
system, the gap is what that system pays and the clock does not model (``docs/published.md``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from specterbench.bench.budget import Budget
from specterbench.bench.checks import check_context, context_tokens
from specterbench.bench.config import BenchConfig
from specterbench.bench.device_memory import kv_bytes_per_token
from specterbench.bench.prompts import Shape, shaped_prompts
from specterbench.bench.published_record import Measurement
from specterbench.bench.runner import Runner, encode_prompts, load_prompts
from specterbench.bench.validate import mean_tpot_ms
from specterbench.engine.costs import CostModel
from specterbench.engine.dense_copy import dense_params
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.precision import priced_geometry
from specterbench.engine.profiles import DEFAULT_HOST_PROFILE

TIME_KINDS = ("tpot_ms", "tokens_per_s")
#: what the modeled clock is held to
COMPONENT_TOLERANCE = 0.25  # components within ±25%
HIT_TOLERANCE = 0.08  # LRU hit rates within ±0.08 (absolute)
PAIR_TOLERANCE = 0.35  # published speed-ups within ±35% ...
PAIR_SHARE = 2 / 3  # ... in at least two thirds of the pairs, with the same winner in every pair


@dataclass(slots=True)
class Outcome:
    """What the harness made of one measurement: the modeled figure, the budget it ran at, and why it failed."""

    measurement: Measurement
    modeled: float | None = None  # ms (time kinds, components) or a hit rate
    budget_fraction: float | None = None
    status: str = "ok"
    note: str = ""
    prompt_tokens: int | None = None  # the stand-in's prompt length, where the row asks for one

    @property
    def ratio(self) -> float | None:
        """modeled / published (for a hit rate: the difference modeled - published)."""
        m = self.measurement
        if self.modeled is None:
            return None
        if m.kind == "hit_rate":
            return self.modeled - m.value
        return self.modeled / m.published_ms


@dataclass(frozen=True, slots=True)
class Pair:
    """Two systems measured in one setting: their published speed-up beside the modeled one."""

    setting: str
    fast: Outcome  # the faster system as published
    slow: Outcome

    @property
    def published(self) -> float:
        return self.slow.measurement.published_ms / self.fast.measurement.published_ms

    @property
    def modeled(self) -> float | None:
        a, b = self.fast.modeled, self.slow.modeled
        return b / a if a and b else None

    @property
    def error(self) -> float | None:
        return None if self.modeled is None else self.modeled / self.published - 1


# ---- pricing ------------------------------------------------------------------------------------------------------
def _priced(m: Measurement):
    return priced_geometry(geometry_preset(m.geometry), m.precision)


def price_component(host, m: Measurement) -> float:
    """A component figure in ms, from the cost model alone: ``count`` expert copies one after another on an idle
    link, or ``count`` experts of one token on an idle host (activations down and back included)."""

    profile = host.profiles().get(m.profile)
    hp = host.host_profiles().get(m.host_profile) if m.host_profile else None
    costs = CostModel(profile, _priced(m), hp)
    if m.op == "copy_experts":
        return 1e3 * m.count * costs.copy_seconds(costs.expert_copy_bytes)
    return 1e3 * m.count * costs.host_expert_seconds(1, m.threads or hp.threads)


def dense_bytes(geometry, precision) -> float:
    """Device bytes of everything but the routed experts at ``geometry`` (a projection's real model): attention,
    shared and dense MLPs and the head at the target's dense bits, the embedding and the routers at 16 bits."""

    g = geometry
    spec = precision.dense_spec
    per_weight = g.dtype_bytes if spec is None else spec.bits_per_weight() / 8
    routers = g.layer_scale * g.moe_layers * g.hidden * g.num_experts
    return dense_params(g) * per_weight + (g.vocab * g.hidden + routers) * g.dtype_bytes


def draft_bytes(host, engine, strategy: str, options: dict) -> int:
    """What ``strategy`` keeps on the device besides its cache (its draft), in the engine's byte units."""
    return int(host.strategies().get(strategy)(**options).device_bytes(engine))


def budget_bytes(host, engine, m: Measurement) -> tuple[int, str]:
    """The measurement's budget in the engine's bytes, and how it was derived (printed beside the row)."""
    b, total = m.budget, engine.total_expert_bytes
    if "slots_per_layer" in b:
        real_e = geometry_preset(m.geometry).num_experts
        n = b["slots_per_layer"]
        nbytes = int(round(n * engine.num_experts / real_e)) * engine.num_layers * engine.expert_bytes
        how = f"{n} of {real_e} experts per layer"
    elif "fraction" in b:
        nbytes, how = int(b["fraction"] * total), f"{b['fraction']:.0%} of expert bytes"
    else:  # the real model's sizes (a projection may stand fewer experts for more: Phi's 16 by tiny-mixtral's 8)
        real = _priced(m)
        profile = host.profiles().get(m.profile)
        dense = dense_bytes(real, m.precision)
        kv = kv_bytes_per_token(real) * m.kv_context * m.batch if m.kv_context else 0
        free = profile.device_memory_bytes - dense - kv - b.get("reserve_gib", 0.0) * 2**30
        fraction = max(0.0, min(1.0, free / real.all_expert_bytes))
        nbytes = int(fraction * total)
        kv_text = f" - KV {m.batch} x {m.kv_context} positions {kv / 1e9:.1f} GB" if kv else ""
        how = (f"{profile.device_memory_bytes / 2**30:.0f} GiB - dense {dense / 1e9:.1f} GB{kv_text} - "
               f"{b.get('reserve_gib', 0.0):g} GiB reserve, of {real.all_expert_bytes / 1e9:.1f} GB of experts")
    if "minus_draft_of" in b:
        nbytes -= draft_bytes(host, engine, b["minus_draft_of"], {})
        how += f" - {b['minus_draft_of']}'s draft"
    if b.get("plus_draft"):
        nbytes += draft_bytes(host, engine, m.strategy, m.options)
        how += " + its draft"
    return max(0, min(nbytes, total)), how


# ---- running ------------------------------------------------------------------------------------------------------
def run_record(host, measurements: list[Measurement], *, prompts: int, tokens: int, out: Path,
               progress=None) -> list[Outcome]:
    """Price the components and run every decode measurement (grouped by stand-in, geometry and precision: one
    engine and one reference per group); rows go to ``out/rows.jsonl``."""
    outcomes = {m.id: Outcome(m) for m in measurements}
    for m in measurements:
        if m.kind == "component_ms":
            outcomes[m.id].modeled = price_component(host, m)
    groups: dict[tuple, list[Measurement]] = {}
    for m in measurements:  # one engine and reference per stand-in, pricing, prompt length and prompt count
        if m.kind != "component_ms":
            key = (m.standin, m.geometry, m.precision, m.prompt_tokens, max(prompts, m.batch))
            groups.setdefault(key, []).append(m)
    for (standin, geometry, precision, _, n), rows in groups.items():
        if progress:
            progress(f"published · {standin} @ {geometry} · {precision.label()} · {len(rows)} measurement(s)")
        _run_group(host, standin, geometry, precision, rows, outcomes, n, tokens, out, progress)
    return [outcomes[m.id] for m in measurements]


def group_prompts(engine, workload: str, n: int, tokens: int, prompt_tokens: int | None, default_limit: int):
    """The group's ``n`` prompts: the workload's own (cut at ``default_limit`` tokens), or, where the record states a
    published prompt length, ``n`` windows of the workload's text of that length, or of the longest the stand-in's
    context leaves beside ``tokens`` new tokens when the published one is longer (all of one length: a batch
    decodes in lock step)."""
    if prompt_tokens is None:
        return encode_prompts(engine, load_prompts(workload, n), default_limit)
    limit = context_tokens(engine)
    length = prompt_tokens if limit is None else max(1, min(prompt_tokens, limit - tokens))
    return shaped_prompts(engine.tokenizer, load_prompts(workload, 10**6), n, Shape(length))


def _run_group(host, standin, geometry, precision, rows, outcomes, prompts, tokens, out, progress) -> None:
    first = rows[0]
    base = BenchConfig(models=(standin,), strategies=tuple(dict.fromkeys(m.strategy for m in rows)),
                       budgets=(Budget("100%", fraction=1.0),), profile=first.profile,
                       host_profile=first.host_profile or DEFAULT_HOST_PROFILE, geometry=geometry, prompts=prompts,
                       tokens=tokens, precision=precision)
    base.validate(host)
    runner = Runner(host, base, Path(out))
    engine = runner.load_engine(standin)
    encoded = group_prompts(engine, base.workload, prompts, tokens, first.prompt_tokens, base.max_prompt_tokens)
    check_context(engine, encoded, base.tokens)
    reference = runner.record_reference(engine, encoded)
    calibration = None
    ran: dict[tuple, tuple] = {}  # cell inputs -> (the first row's id, its row)
    for m in rows:
        o = outcomes[m.id]
        cls = host.strategies().get(m.strategy)
        runner.config = dataclasses.replace(base, profile=m.profile,
                                            host_profile=m.host_profile or DEFAULT_HOST_PROFILE,
                                            strategy_options={m.strategy: dict(m.options)} if m.options else {})
        nbytes, how = budget_bytes(host, engine, m)
        o.note = how
        o.prompt_tokens = len(encoded[0][1]) if m.prompt_tokens is not None else None
        o.budget_fraction = nbytes / engine.total_expert_bytes
        if cls.uses_calibration and calibration is None:
            calibration = runner.calibrate(engine)
        if progress:
            progress(f"published · {m.id}: {m.strategy} @ {o.budget_fraction:.1%} on {m.profile}")
        same = (m.strategy, json.dumps(m.options, sort_keys=True), nbytes, m.profile, m.host_profile, m.batch)
        if same in ran:  # the same cell as an earlier row (several systems stood for by one strategy): its row
            row = copy.deepcopy(ran[same][1])
            row.cell = f"published|{m.id}|{precision.label()}"
            row.extra["same_cell_as"] = ran[same][0]
            o.note += f"; the same cell as {ran[same][0]}"
        else:
            # a batch row's budget holds its KV at the published lengths already (budget_bytes); the run's config
            # has no batch axis, so the runner charges none of its own
            row = runner.run_cell(engine, f"published|{m.id}|{precision.label()}", m.strategy, cls,
                                  Budget(f"{nbytes}B", nbytes=nbytes), 0,
                                  encoded[:max(1, len(encoded) // m.batch * m.batch)], reference, calibration,
                                  batch=m.batch)
            ran[same] = (m.id, copy.deepcopy(row))
        row.extra["published"] = {"id": m.id, "source": m.source, "value": m.value, "kind": m.kind}
        runner.writer.append(row)
        if row.status != "ok":
            o.status = f"{row.status}: {row.error}"
            continue
        if m.kind == "hit_rate":
            o.modeled = row.hit_rate
        elif m.batch > 1:  # ms per token of the whole batch: the GPU's tokens/s, as the published figure
            o.modeled = 1000.0 / row.tokens_per_s_total if row.tokens_per_s_total else None
        else:
            o.modeled = mean_tpot_ms(row, "tpot_ms")


def pairs_of(outcomes: list[Outcome]) -> list[Pair]:
    """Every two end-to-end time measurements of one setting (same source, hardware, model and budget scheme)."""
    by_setting: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.measurement.kind in TIME_KINDS:
            for setting in o.measurement.settings:
                by_setting.setdefault(setting, []).append(o)
    out = []
    for setting, group in by_setting.items():
        for a, b in itertools.combinations(group, 2):
            fast, slow = (a, b) if a.measurement.published_ms <= b.measurement.published_ms else (b, a)
            out.append(Pair(setting, fast, slow))
    return out


# ---- report -------------------------------------------------------------------------------------------------------
def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def summary(outcomes: list[Outcome]) -> dict:
    """The targets, measured: components, LRU hit rates at MoE-SpeQ Table 3's slots, pairwise speed-ups,
    and the geometric-mean ratio of the end-to-end times."""
    comps = [o for o in outcomes if o.measurement.kind == "component_ms" and o.ratio is not None]
    lru = [o for o in outcomes if o.measurement.kind == "hit_rate" and o.measurement.strategy == "lru"
           and o.ratio is not None]
    times = [o for o in outcomes if o.measurement.kind in TIME_KINDS and o.ratio is not None]
    pairs = [p for p in pairs_of(outcomes) if p.modeled is not None]
    within = [p for p in pairs if abs(p.error) <= PAIR_TOLERANCE]
    return {
        "components_within": sum(abs(o.ratio - 1) <= COMPONENT_TOLERANCE for o in comps), "components": len(comps),
        "lru_hits_within": sum(abs(o.ratio) <= HIT_TOLERANCE for o in lru), "lru_hits": len(lru),
        "pairs_within": len(within), "pairs": len(pairs),
        "pairs_same_winner": sum(p.modeled > 1 for p in pairs),
        "geomean_ratio": math.exp(statistics.fmean(math.log(o.ratio) for o in times)) if times else None,
        "time_rows": len(times),
    }


def render(outcomes: list[Outcome]) -> str:
    lines = ["## Published measurements, modeled beside published", "",
             "ratio = modeled / published (hit rates: modeled - published); budget = share of the stored expert "
             "bytes of the stand-in, and how it was derived", "",
             "| id | system → strategy | model (stand-in @ geometry, precision) | profile | budget | published | "
             "modeled | ratio | status |", "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.measurement
        opts = "".join(f" {k}={json.dumps(v)}" for k, v in m.options.items())
        who = m.system if m.strategy is None else f"{m.system} → `{m.strategy}{opts}`"
        model = (f"{m.model} ({m.precision.label()})" if m.standin is None else
                 f"{m.model} ({m.standin} @ {m.geometry}, {m.precision.label()})")
        if m.batch > 1 or m.prompt_tokens is not None:
            model += f", B={m.batch}" + ("" if o.prompt_tokens is None else
                                          f", prompt {o.prompt_tokens} of {m.prompt_tokens} tokens")
        prof = m.profile + (f" + {m.host_profile}" if m.host_profile and m.kind != "hit_rate" else "")
        budget = "-" if o.budget_fraction is None else f"{o.budget_fraction:.1%} ({o.note})"
        if m.kind == "hit_rate":
            modeled, ratio = _f(o.modeled, ".3f"), _f(o.ratio, "+.3f")
        else:
            modeled, ratio = _f(o.modeled, ".1f") + (" ms" if o.modeled is not None else ""), _f(o.ratio, ".2f")
        lines.append(f"| {m.id} | {who} | {model} | {prof} | {budget} | {m.published_text} | {modeled} | {ratio} | "
                     f"{o.status} |")
    pairs = pairs_of(outcomes)
    if pairs:
        lines += ["", "## Same hardware, pairwise speed-ups (slower / faster as published)", "",
                  "| setting | faster → slower (published) | published | modeled | error | same winner |",
                  "|---|---|---|---|---|---|"]
        for p in pairs:
            same = "-" if p.modeled is None else ("yes" if p.modeled > 1 else "**no**")
            lines.append(f"| {p.setting} | {p.fast.measurement.system} → {p.slow.measurement.system} | "
                         f"{p.published:.2f}x | {_f(p.modeled, '.2f')}x | {_f(p.error, '+.0%')} | {same} |")
    s = summary(outcomes)
    lines += ["", "## Targets", "",
              f"- components within ±{COMPONENT_TOLERANCE:.0%}: {s['components_within']} of {s['components']}",
              f"- LRU hit rates within ±{HIT_TOLERANCE}: {s['lru_hits_within']} of {s['lru_hits']}",
              f"- pairwise speed-ups within ±{PAIR_TOLERANCE:.0%}: {s['pairs_within']} of {s['pairs']} "
              f"(target: at least {PAIR_SHARE:.0%}); same winner: {s['pairs_same_winner']} of {s['pairs']}",
              f"- end-to-end times: geometric-mean ratio modeled / published {_f(s['geomean_ratio'], '.2f')} over "
              f"{s['time_rows']} measurement(s)"]
    return "\n".join(lines) + "\n"


def to_json(outcomes: list[Outcome]) -> dict:
    rows = []
    for o in outcomes:
        m = o.measurement
        rows.append({"id": m.id, "source": m.source, "system": m.system, "strategy": m.strategy,
                     "options": m.options, "model": m.model, "standin": m.standin, "geometry": m.geometry,
                     "precision": m.precision.label(), "profile": m.profile, "host_profile": m.host_profile,
                     "kind": m.kind, "published": m.value, "published_ms": m.published_ms, "chart": m.chart,
                     "modeled": o.modeled, "ratio": o.ratio, "budget_fraction": o.budget_fraction,
                     "budget": o.note, "status": o.status, "batch": m.batch, "settings": list(m.settings),
                     "prompt_tokens_published": m.prompt_tokens, "prompt_tokens_run": o.prompt_tokens})
    pairs = [{"setting": p.setting, "faster": p.fast.measurement.id, "slower": p.slow.measurement.id,
              "published": p.published, "modeled": p.modeled, "error": p.error} for p in pairs_of(outcomes)]
    return {"measurements": rows, "pairs": pairs, "summary": summary(outcomes)}


__all__ = ["Outcome", "Pair", "pairs_of", "price_component", "render", "run_record", "summary", "to_json"]
