"""A finished cell's numbers: speed, traffic and cache metrics from the engine's samples, and the check of its
tokens against the reference (lossless strategies fail on a divergence unless it is numerics)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from specterbench.engine.numerics import classify_divergence
from specterbench.engine.sampling import DecodeSetting
from specterbench.runfiles.results import ResultRow


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _median(xs):
    return statistics.median(xs) if xs else None


def p90(xs):
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def fill_metrics(row: ResultRow, engine, strategy, all_samples, prompt_lengths=None) -> None:
    """The row's speed, traffic and cache metrics from the engine and the per-request samples (warm-up excluded);
    ``prompt_lengths``: each request's prompt tokens, for its prefill rate."""
    ttft, tpot, host, tokens, decode_s = [], [], [], 0, 0.0
    for samples in all_samples:
        first, rest = samples[0], samples[1:]
        ttft.append(first.clock_s * 1e3 if row.clock != "host" else first.wall_s * 1e3)
        tokens += sum(s.tokens for s in samples)
        for s in rest:
            tpot.extend([s.clock_s * 1e3 / s.tokens] * s.tokens)
            host.extend([s.wall_s * 1e3 / s.tokens] * s.tokens)
            decode_s += s.clock_s if row.clock != "host" else s.wall_s
    decode_tokens = sum(s.tokens for samples in all_samples for s in samples[1:])
    st = engine.stats
    if row.clock != "host":
        row.tpot_ms, row.tpot_p90_ms = _median(tpot), p90(tpot)
        row.tpot_mean_ms = sum(tpot) / len(tpot) if tpot else None
    row.ttft_ms = _median(ttft)
    row.tokens_per_s = decode_tokens / decode_s if decode_s > 0 else None
    row.host_ms_per_token = _median(host)
    row.hits, row.misses = st.hits, st.misses
    row.hit_rate = st.hits / (st.hits + st.misses) if st.hits + st.misses else None
    row.h2d_bytes, row.demand_bytes, row.prefetch_bytes = st.h2d_bytes, st.demand_bytes, st.prefetch_bytes
    row.h2d_bytes_per_token = st.h2d_bytes / tokens if tokens else None
    decode_bytes = sum(s.h2d_bytes for samples in all_samples for s in samples[1:])
    row.decode_h2d_bytes_per_token = decode_bytes / decode_tokens if decode_tokens else None
    row.d2h_bytes = st.d2h_bytes
    row.prefetch_issued, row.prefetch_used, row.prefetch_wasted = (st.prefetch_issued, st.prefetch_used,
                                                                   st.prefetch_wasted)
    row.host_experts, row.activation_bytes, row.substituted = st.host_experts, st.activation_bytes, st.substituted
    decode_stall_s = sum(s.stall_s for samples in all_samples for s in samples[1:])  # the prefill's excluded
    row.stall_ms_per_token = (decode_stall_s * 1e3 / decode_tokens if decode_tokens and row.clock != "host"
                              else None)
    row.peak_cache_bytes = engine.cache.peak_bytes
    row.samples = {"tpot_ms": tpot if row.clock != "host" else [], "host_ms": host, "ttft_ms": ttft,
                   **request_rates(all_samples, prompt_lengths, row.clock != "host")}
    row.extra.update(strategy.metrics())


def request_rates(all_samples, prompt_lengths, device_clock: bool) -> dict:
    """Per request: its prompt's length, its prefill rate (prompt tokens over the time to the first token) and its
    generation rate (tokens after the first over their time), in tokens/s — the repeats a mean ± standard deviation
    is taken over."""
    pp, tg = [], []
    lengths = list(prompt_lengths) if prompt_lengths is not None else []
    for i, samples in enumerate(all_samples):
        seconds = [s.clock_s if device_clock else s.wall_s for s in samples]
        if i < len(lengths) and seconds[0] > 0:
            pp.append(lengths[i] / seconds[0])
        decoded, spent = sum(s.tokens for s in samples[1:]), sum(seconds[1:])
        if decoded and spent > 0:
            tg.append(decoded / spent)
    return {"prompt_tokens": lengths, "pp_tokens_per_s": pp, "tg_tokens_per_s": tg}


def check_tokens(row: ResultRow, outputs, reference, lossless: bool, numerics: TokenNumerics | None = None) -> None:
    """Token agreement with the reference. A lossless strategy's row records how it matched: ``bit-identical``, or
    ``equal within numerics`` with the positions where the reference's choice was a near-tie and the strategy's
    sampler took the reference's token (:mod:`specterbench.engine.numerics`). Any other difference fails the row —
    unless it falls at such a near-tie itself (a strategy that does not choose through ``request.sampler()``)."""
    same = total = 0
    first = None
    for pid, toks in outputs.items():
        ref = reference.tokens[pid]
        n = max(len(ref), len(toks))
        for i in range(n):
            a = toks[i] if i < len(toks) else None
            b = ref[i] if i < len(ref) else None
            total += 1
            if a == b:
                same += 1
            elif first is None:
                first = {"prompt": pid, "position": i, "got": a, "expected": b}
    row.token_agreement = same / total if total else None
    row.lossless = first is None
    row.first_divergence = first
    followed = {pid: sorted(p) for pid, p in (numerics.followed if numerics else {}).items() if p}
    if followed:
        row.extra["within_numerics"] = followed
    if lossless:
        row.extra["numerics"] = "equal within numerics" if followed else "bit-identical"
    if lossless and first is not None:
        note = None
        if numerics is not None:
            decode = numerics.decode
            note = classify_divergence(reference.margins.get(first["prompt"]),
                                       len(numerics.prompt_ids[first["prompt"]]) + first["position"], numerics.dtype,
                                       numerics.layers, decode.temperature if decode.mode == "sample" else None)
        if note is not None:
            row.extra["divergence"] = note
            row.extra["numerics"] = "equal within numerics"
            return
        row.extra.pop("numerics", None)
        row.status = "diverged"
        row.error = (f"tokens differ from the reference at prompt {first['prompt']} position "
                     f"{first['position']}: got {first['got']}, expected {first['expected']}")


@dataclass(frozen=True, slots=True)
class TokenNumerics:
    """What the lossless check within numerics needs of a cell: each prompt's ids, the compute dtype and depth the
    tolerance derives from, the decode setting, and the positions where a strategy's sampler followed the
    reference at a near-tie (per prompt id)."""

    prompt_ids: dict
    dtype: torch.dtype
    layers: int
    decode: DecodeSetting
    followed: dict


def samples_of(samples) -> dict:
    return {"tokens": [s.tokens for s in samples], "clock_ms": [s.clock_s * 1e3 for s in samples],
            "host_ms": [s.wall_s * 1e3 for s in samples]}
