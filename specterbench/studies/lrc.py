"""Local routing consistency of a routing trace, with the definitions of arXiv 2505.16056 (code: ljcleo/moe-lrc).

A *trace* is one sequence's routing: an int array ``(T, L, k)`` of the top-k experts each token chose in each of
the L MoE layers. Every metric here is computed per sequence (caches start empty at each sequence) and then
averaged over sequences, as in the paper.

Model-level caches (the paper's headline figures) hold ``C = ρ·L·k`` entries keyed by (layer, expert). A token's
L·k accesses form one batch, in layer order: whether each is a hit is decided against the cache as it stood
when the token began, then the accesses update the cache one by one. The paper's simulators also count the
first access of an entry as a hit while fewer than ``C`` distinct entries have been seen (the cache never had to
give anything up yet); that rule is kept so the numbers compare.

Policies (victim = the cached entry with the lowest priority; priorities fixed by the trace, not the cache size):

* ``lru``: last access time;
* ``lfu``: (accesses so far in the sequence, last access time) — counts survive eviction ("perfect" LFU);
* ``belady``: the entry needed again latest (never again = first to go);
* ``sch`` (segment cache, the repository's third SCH version): (uses in the next ``m`` tokens counting the current
  one, last access time) — the cache that keeps what the next ``m``-token segment needs most.

SRP(m) (segment routing best performance): over every window of ``m`` consecutive tokens, predict each expert
on or off for the whole window by one threshold on its count in the window; F1 of that prediction against the
token-level activations, pooled over layers and sequences, best threshold, in points (×100).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

POLICIES = ("lru", "lfu", "belady", "sch")
_BIG = float(2**32)


def model_level(trace: np.ndarray, num_experts: int) -> np.ndarray:
    """(T, L, k) expert indices -> (T, L·k) model-level entry ids ``layer·E + expert`` in layer order."""
    trace = np.asarray(trace)
    T, L, k = trace.shape
    return (trace + (np.arange(L) * num_experts)[None, :, None]).reshape(T, L * k)


def _next_use(flat: np.ndarray) -> np.ndarray:
    """For each position of a 1-D id stream, the position of the same id's next occurrence (len(flat) if none)."""
    n = len(flat)
    nxt = np.full(n, n, dtype=np.int64)
    order = np.lexsort((np.arange(n), flat))  # by id, then position
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def cache_hits(ids: np.ndarray, capacity: int, policy: str, num_items: int, m: int = 16) -> tuple[int, int]:
    """Hits and accesses of one sequence ``ids`` (T, n) through a cache of ``capacity`` entries (module docs)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    ids = np.asarray(ids, dtype=np.int64)
    T, n = ids.shape
    if capacity <= 0:
        return 0, T * n
    flat = ids.reshape(-1)
    in_cache = np.zeros(num_items, dtype=bool)
    seen = np.zeros(num_items, dtype=bool)
    ts = np.zeros(num_items)  # last access time (1-based)
    count = np.zeros(num_items)  # accesses so far (lfu)
    keep = np.zeros(num_items)  # belady: -(next use position)
    nxt = _next_use(flat) if policy == "belady" else None
    fut = None
    if policy == "sch":
        fut = np.zeros(num_items)
        np.add.at(fut, ids[: min(m, T)].reshape(-1), 1.0)
    slots = np.full(capacity, -1, dtype=np.int64)
    free = capacity
    uni = 0
    hits = 0
    clock = 0
    for t in range(T):
        row = ids[t]
        hit_row = in_cache[row]
        new = ~seen[row]
        hits += int(hit_row.sum())
        n_new = int(new.sum())
        if n_new:  # cold entries are free while fewer than `capacity` distinct entries have been seen
            hits += max(0, min(n_new, capacity - uni))
            uni += n_new
            seen[row] = True
        for j in range(n):
            x = int(row[j])
            pos = t * n + j
            clock += 1
            if not in_cache[x]:
                if free:
                    slot = capacity - free
                    free -= 1
                else:
                    items = slots
                    if policy == "lru":
                        pr = ts[items]
                    elif policy == "lfu":
                        pr = count[items] * _BIG + ts[items]
                    elif policy == "belady":
                        pr = keep[items]
                    else:
                        pr = fut[items] * _BIG + ts[items]
                    slot = int(np.argmin(pr))
                    in_cache[slots[slot]] = False
                slots[slot] = x
                in_cache[x] = True
            ts[x] = clock
            if policy == "lfu":
                count[x] += 1
            elif policy == "belady":
                keep[x] = -float(nxt[pos])
            elif policy == "sch":
                fut[x] -= 1
        if fut is not None and t + m < T:
            np.add.at(fut, ids[t + m], 1.0)
    return hits, T * n


def model_hit_rate(traces: Iterable[np.ndarray], num_experts: int, rho: float, policy: str, m: int = 16) -> float:
    """Mean over sequences of the model-level hit rate at a cache of ``round(ρ·L·k)`` entries."""
    rates = []
    for trace in traces:
        T, L, k = np.shape(trace)
        h, a = cache_hits(model_level(trace, num_experts), int(round(rho * L * k)), policy, L * num_experts, m=m)
        rates.append(h / a)
    return float(np.mean(rates)) if rates else float("nan")


def execution_order_hit_rate(traces: Iterable[np.ndarray], num_experts: int, rho: float) -> float:
    """Mean over sequences of a plain model-level LRU's hit rate: ``round(ρ·L·k)`` entries, each access decided and
    applied one by one in execution order (layer by layer, top-k order), every first access a miss. This is what an
    engine's model-level cache sees; the paper's batched reading (:func:`model_hit_rate`) is the more generous one."""
    rates = []
    for trace in traces:
        T, L, k = np.shape(trace)
        capacity = int(round(rho * L * k))
        last: dict[int, int] = {}
        hits = 0
        for pos, x in enumerate(model_level(trace, num_experts).reshape(-1).tolist()):
            if x in last:
                hits += 1
            elif len(last) >= capacity:
                del last[min(last, key=last.__getitem__)]
            last[x] = pos
        rates.append(hits / (T * L * k))
    return float(np.mean(rates)) if rates else float("nan")


def srp(traces: Iterable[np.ndarray], num_experts: int, m: int = 16) -> float:
    """SRP(m) in points: best F1 of a per-window on/off expert set chosen by one count threshold (module docs)."""
    hist = np.zeros(m + 1)
    for trace in traces:
        trace = np.asarray(trace)
        T, L, k = trace.shape
        if T < m:
            continue
        on = np.zeros((T, L, num_experts), dtype=np.int32)
        np.put_along_axis(on, trace, 1, axis=-1)
        c = np.cumsum(np.concatenate([np.zeros((1, L, num_experts), np.int32), on]), axis=0)
        window = c[m:] - c[:-m]  # (T-m+1, L, E) uses of each expert in each window
        hist += np.bincount(window.reshape(-1), minlength=m + 1)[: m + 1]
    levels = np.arange(m + 1)
    matches = np.cumsum((hist * levels)[::-1])[::-1]  # activations covered by predicting count >= threshold
    preds = np.cumsum(hist[::-1])[::-1] * m
    acts = matches[0]
    if acts == 0:
        return float("nan")
    f1 = 2 * matches / np.maximum(preds + acts, 1)
    return float(100 * f1.max())


def per_layer_lru(traces: Iterable[np.ndarray], num_experts: int, budget: float) -> float:
    """Per-layer LRU (the engine's ``lru``): ``floor(budget·L·E)`` slots split evenly over layers (remainder to the
    first ones), caches empty at each sequence, every first access a miss. Hit rate pooled over sequences."""
    hits = total = 0
    for trace in traces:
        trace = np.asarray(trace, dtype=np.int64)
        T, L, k = trace.shape
        base, extra = divmod(int(budget * L * num_experts), L)
        for layer in range(L):
            quota = max(k, base + (1 if layer < extra else 0))
            last = {}
            for t in range(T):
                row = trace[t, layer]
                for e in row.tolist():
                    if e in last:
                        hits += 1
                    last[e] = t
                if len(last) > quota:  # drop least recently used, never the current token's experts
                    for e, _ in sorted(last.items(), key=lambda kv: kv[1])[: len(last) - quota]:
                        del last[e]
            total += T * k
    return hits / total if total else float("nan")


def adjacent_reuse(traces: Iterable[np.ndarray]) -> float:
    """Fraction of a token's top-k experts also chosen by the previous token in the same layer."""
    num = den = 0
    for trace in traces:
        trace = np.asarray(trace)
        prev, cur = trace[:-1], trace[1:]
        num += int((cur[..., :, None] == prev[..., None, :]).any(-1).sum())
        den += cur.size
    return num / den if den else float("nan")


def popular_half_share(traces: Sequence[np.ndarray], num_experts: int) -> float:
    """Share of routed (token, expert) selections taken by the more popular half of each layer's experts, averaged
    over layers (0.5 = perfectly even; 1.0 = half of the experts never used)."""
    traces = [np.asarray(t) for t in traces]
    L = traces[0].shape[1]
    shares = []
    for layer in range(L):
        counts = np.bincount(np.concatenate([t[:, layer].reshape(-1) for t in traces]), minlength=num_experts)
        top = np.sort(counts)[::-1][: num_experts // 2].sum()
        shares.append(top / counts.sum())
    return float(np.mean(shares))


def summary(traces: Sequence[np.ndarray], num_experts: int, m: int = 16, budgets=(0.35, 0.5)) -> dict:
    """Every trace metric the realism report shows, keyed as in ``published_routing.json``."""
    out = {
        "lru_rho1": model_hit_rate(traces, num_experts, 1, "lru"),
        "lru_rho2": model_hit_rate(traces, num_experts, 2, "lru"),
        "lru_exec_rho1": execution_order_hit_rate(traces, num_experts, 1),
        "lru_exec_rho2": execution_order_hit_rate(traces, num_experts, 2),
        "belady_rho1": model_hit_rate(traces, num_experts, 1, "belady"),
        "belady_rho2": model_hit_rate(traces, num_experts, 2, "belady"),
        "lfu_rho1": model_hit_rate(traces, num_experts, 1, "lfu"),
        "lfu_rho2": model_hit_rate(traces, num_experts, 2, "lfu"),
        "srp_m16": srp(traces, num_experts, m),
        "sch_rho2_m16": model_hit_rate(traces, num_experts, 2, "sch", m=m),
        "adjacent_reuse": adjacent_reuse(traces),
        "popular_half_share": popular_half_share(traces, num_experts),
    }
    for b in budgets:
        out[f"layer_lru_{round(b * 100)}pct"] = per_layer_lru(traces, num_experts, b)
    return out
