"""``oracle-spec``: the bound for speculative decoding with host execution of misses, at the same budget and prices.

A perfect draft that costs nothing and is always accepted (its proposals are the reference's tokens), so every
window verifies ``MAX_WINDOW`` tokens (32, Specter's deepest) and emits ``MAX_WINDOW + 1``; no draft bytes, so the
whole budget is expert cache. The window's exact expert set per layer (the union of the reference routing of its
tokens) is known in advance: Belady eviction and perfect prefetch over the sequence of windows (the ``oracle``'s
schedule, applied to window unions instead of single tokens), copies issued the moment the expert they replace has
had its last use; when a layer comes, a copy still queued that the host would finish sooner is dropped and the
expert computed on the host. A miss the schedule could not cover runs on the host or is fetched, whichever is
predicted sooner (both queues counted, as Specter decides). Every price is the one every strategy pays (host DRAM
shared with the link included). What it does not optimise (copy order against the host's queue, a depth per window)
keeps it a strong reference rather than a proof: Specter and ``spec-host`` are compared with it, per-token strategies
with ``oracle``.
"""

from __future__ import annotations

import torch

from specterbench.errors import EngineViolation
from specterbench.strategy import FETCH, ON_HOST

from .oracle import Oracle

MAX_WINDOW = 32  # tokens verified per window (Specter's deepest K)


def window_lengths(n_new: int, depth: int = MAX_WINDOW) -> list[int]:
    """Draft depths of the windows that decode ``n_new`` tokens after the prefill's first one, each emitting
    ``depth + 1`` tokens (the last window shorter, so that none overshoots)."""
    out, made = [], 1
    while made < n_new:
        k = min(depth, n_new - made - 1)
        out.append(k)
        made += k + 1
    return out


def window_trace(trace, num_layers: int, n_new: int, depth: int = MAX_WINDOW) -> list[tuple[int, tuple[int, ...]]]:
    """The reference's per-forward routing trace (prefill, then one forward per token) regrouped as the forwards of
    a perfectly accepted speculative decode: the prefill, then per window and layer the union of its tokens'
    experts. A window of depth ``k`` after ``m`` emitted tokens verifies the tokens of reference forwards
    ``m .. m + k``. A request with context (``--depth``) prefills it in a forward of its own first: those layer
    calls lead the trace and stay in the prefill."""
    context = len(trace) - num_layers * n_new
    if context not in (0, num_layers):
        raise EngineViolation(f"oracle-spec: the reference trace has {len(trace)} layer calls, expected "
                              f"{num_layers} layers x {n_new} forwards (one more with a context)")
    out = list(trace[:context + num_layers])
    m = 1
    for k in window_lengths(n_new, depth):
        for layer in range(num_layers):
            experts = set()
            for f in range(m, m + k + 1):
                experts.update(trace[context + f * num_layers + layer][1])
            out.append((layer, tuple(sorted(experts))))
        m += k + 1
    return out


class OracleSpec(Oracle):
    name = "oracle-spec"
    version = "1"
    description = ("the bound for speculative decoding with host execution: a free, always-accepted draft of 32, "
                   "each window's exact experts Belady-prefetched, misses on the host or fetched")
    uses_reference_trace = True
    max_batch_reason = "one request's draft window verified at a time, Belady over its recorded routing"

    def attach(self, engine):
        super().attach(engine)
        self.host_path = engine.clock.costs.host is not None
        self.on_warmup_end()

    def on_warmup_end(self):
        """The counters metrics() reports restart after the runner's warm-up request (and at attach)."""
        self.windows = self.window_tokens = self.mismatches = self.host_calls = self.fetch_calls = self.dropped = 0

    def on_request_start(self, request):
        if request.reference_trace is None or request.reference_tokens is None:
            raise EngineViolation("oracle-spec needs the reference tokens and routing trace; the runner records them")
        self.request = request
        self.start_trace(window_trace(request.reference_trace, self.engine.num_layers, request.max_new_tokens))

    def before_layer(self, layer, experts, tokens_per_expert):
        if self.pos >= len(self.trace) or self.trace[self.pos] != (layer, tuple(experts)):
            self.mismatches += 1  # a near-tie routed differently in a batch: the schedule still applies
        self.issue_due()
        if self.host_path:
            self.drop_late_copies(layer, experts, tokens_per_expert)

    def drop_late_copies(self, layer, experts, tokens_per_expert) -> None:
        """The schedule's copies of this layer still queued (not on the link) whose expert the host, its queue
        counted, would finish before the copy lands as a demand fetch are dropped: the host computes them (the
        link and the host both work, as the prices allow)."""
        e, c = self.engine, self.engine.costs
        host_s = c.host_backlog_s()
        for expert, n in zip(experts, tokens_per_expert):
            key = (layer, expert)
            if key not in e.cache or e.landed(key):
                continue
            choice = c.host_or_fetch(n, host_queue_s=host_s)
            if choice.place == ON_HOST and e.cancel(key):
                self.dropped += 1
                host_s = choice.host_s

    def place_miss(self, key, n_tokens):
        if not self.host_path:
            return FETCH
        if self.engine.costs.host_or_fetch(n_tokens).place == ON_HOST:
            self.host_calls += 1
            return ON_HOST
        self.fetch_calls += 1
        return FETCH

    def generate(self, engine, request):
        """Prefill, then windows whose proposals are the reference's own tokens, verified in one forward each."""
        sampler = request.sampler()
        seq = list(request.prompt_ids)
        kv = engine.new_kv_cache()  # every position but the last of seq between windows
        logits = engine.forward(torch.tensor([seq]), kv)
        out = [sampler.pick(logits[-1], len(seq))]
        seq.append(out[0])
        engine.emit(1)
        self.on_step_end(out)
        reference = request.reference_tokens
        for k in window_lengths(request.max_new_tokens):
            proposals = list(reference[len(out):len(out) + k])
            logits = engine.forward(torch.tensor([[seq[-1]] + proposals]), kv, all_logits=True)  # [k + 1, V]
            target = sampler.pick_many(logits, len(seq))
            a = 0
            while a < len(proposals) and proposals[a] == target[a]:
                a += 1
            engine.rollback(kv, len(seq) + a)
            new = (proposals[:a] + [target[a]])[:request.max_new_tokens - len(out)]
            seq.extend(new)
            out.extend(new)
            self.windows += 1
            self.window_tokens += len(new)
            engine.emit(len(new))
            self.on_step_end(new)
        while len(out) < request.max_new_tokens:  # a window accepted less (a near-tie): plain steps for the rest
            logits = engine.forward(torch.tensor([seq[-1:]]), kv)
            out.append(sampler.pick(logits[-1], len(seq)))
            seq.append(out[-1])
            engine.emit(1)
            self.on_step_end(out[-1:])
        return out

    def metrics(self):
        return {"windows": self.windows, "tokens_per_window": self.window_tokens / self.windows if self.windows else
                None, "routing_mismatches": self.mismatches, "host_calls": self.host_calls,
                "fetch_calls": self.fetch_calls, "copies_dropped_for_host": self.dropped}
