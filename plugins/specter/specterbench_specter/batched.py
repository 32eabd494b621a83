"""Speculative windows of several requests verified together (``--batch B``): lock step at the shortest acceptance.

The B requests share one KV cache holding every request's rows at one length ``L``, as a plain batched step does
(:mod:`specterbench.engine.batch`). A window:

1. each request ``b`` has ``p_b ≥ 1`` *pending* tokens, emitted but not in the cache: its last token, plus those it
   accepted beyond the batch's shortest acceptance in the last window. The window is ``T = max(K + 1, max p_b)``
   tokens wide; request ``b`` gets ``T − p_b`` proposals;
2. the draft proposes for every request at once (:meth:`BatchedWindows.propose_batch`): one batched draft forward
   over the first ``min p_b`` pending tokens of every request, then one batched forward per further position, each
   request feeding its own next pending token or its latest proposal, each proposal chosen with that request's
   sampler at its absolute position; the draft's KV entries are dropped;
3. the target verifies all ``[B, T]`` tokens in one forward; request ``b`` keeps the agreeing prefix of its
   proposals plus the target's own token after it — every token it accepted is kept;
4. the cache is cropped to the shortest accepted length over the batch, ``min_b(L + p_b + a_b)``; a request's
   accepted tokens past it are its pending tokens of the next window and are verified again there (the target's KV
   for them is recomputed; the tokens themselves are already emitted and stay).

Why lock step rather than one KV length per request (rejected positions left in the cache and masked with a 2-D
attention mask and explicit position ids): every request keeps one position per cache index, so no model's
attention has to honour a mask over a ``DynamicCache``, no masked positions are read by attention or held in the
KV, and the sampler's position of every token is its cache index. The price is work done twice or for nothing,
which runs and is priced as any forward row (each MoE layer over all B·T tokens, the union of their experts) and is
counted in the row: re-verified positions (``p_b − 1`` a window), filler positions (when K = 0 — a plain step, or
no draft — but another request has several pending tokens, the others' rows are filled with their last token
repeated, verified like any proposal), positions of requests that already have all their tokens (kept in lock step
until the batch's last request finishes), and the draft's rows over pending tokens.

Every emitted token is the target's own pick at its position from its own logits row, as at batch 1, so each
request's tokens equal its own batch-1 decode under greedy and sampled decoding.
"""

from __future__ import annotations

import statistics

import torch


class BatchedWindows:
    """The batched window of :class:`~.decoding.SpeculativeDecoding` (its hooks: ``choose_k``, ``begin_window``,
    ``after_draft_step``, ``before_verify``, ``accept``, ``end_window``), for ``generate_batch``."""

    max_batch = None
    batch_window_tokens = 0

    def reset_batch_metrics(self) -> None:
        self.batch_positions = self.batch_reverified = self.batch_filler = self.batch_finished = 0
        self.batch_draft_rows = self.batch_draft_used = 0
        self.request_acceptance: dict[str, list[int]] = {}  # request id -> [proposed, accepted]
        self.last_window: list[tuple[int, int]] = []  # (proposals, accepted) of each request of the last window

    def begin_batch_windows(self, requests) -> None:
        """A batch starts (after every request's ``on_request_start``): a strategy keeping per-request state makes
        one per request here."""

    def batch_choose_k(self, seqs: list[list[int]], remaining: list[int]) -> int:
        """K of the batch's next window (0: no draft proposals), from the most tokens any request still needs."""
        return self.choose_k(max(remaining))

    def generate_batch(self, engine, requests):
        """Decode ``requests`` together, one batched verification per window (see the module)."""
        samplers = [r.sampler() for r in requests]
        n_new = requests[0].max_new_tokens
        seqs = [list(r.prompt_ids) for r in requests]
        outs: list[list[int]] = [[] for _ in requests]
        kv = engine.new_kv_cache()
        self.begin_batch_windows(requests)
        engine.batch = len(requests)
        t0 = engine.clock.now()
        try:
            logits = engine._forward(torch.tensor(seqs), kv)  # [B, 1, V]
            first = [[s.pick(logits[b, -1].float(), len(seqs[b]))] for b, s in enumerate(samplers)]
            self._keep(engine, seqs, outs, first, n_new)
            while min(len(o) for o in outs) < n_new:
                self._batch_window(engine, requests, samplers, seqs, outs, kv, n_new)
        finally:
            engine.batch = 1
        self.total_s += engine.clock.now() - t0
        return outs

    def _keep(self, engine, seqs, outs, news, n_new) -> list[int]:
        """Append each request's new tokens to its sequence, and to its output up to ``n_new``; emit the step."""
        kept = []
        for seq, out, new in zip(seqs, outs, news):
            seq.extend(new)
            take = new[:max(0, n_new - len(out))]
            out.extend(take)
            kept.append(len(take))
        engine.emit(max(kept), per_request=kept)
        self.on_step_end([t for new, n in zip(news, kept) for t in new[:n]])
        return kept

    def _batch_window(self, engine, requests, samplers, seqs, outs, kv, n_new) -> None:
        L = kv.get_seq_length()  # every request's cache rows hold positions 0..L-1
        live = [len(o) < n_new for o in outs]
        k = self.batch_choose_k(seqs, [n_new - len(o) for o in outs])
        self.k_hist[k] += 1
        w0 = engine.clock.now()
        self.begin_window(k)
        rows = [seq[L:] for seq in seqs]  # each request's pending tokens, at positions L, L+1, …
        pending = [len(r) for r in rows]
        T = max(k + 1, max(pending))
        d0 = engine.clock.now()
        made = self.propose_batch(engine, requests, samplers, rows, L, T, kv, k)
        self.draft_s += engine.clock.now() - d0
        for r in rows:  # no draft proposal: the last token repeated (a guess the target verifies like any other)
            r.extend([r[-1]] * (T - len(r)))
        engine.rollback(kv, L)  # the draft's KV entries go; the target writes its own
        self.before_verify()
        logits = engine._forward(torch.tensor(rows), kv, all_logits=True)  # [B, T, V]
        news, self.last_window = [], []
        for b, (sampler, row, p) in enumerate(zip(samplers, rows, pending)):
            target = sampler.pick_many(logits[b, p - 1:].float(), L + p)  # T - p + 1 tokens from position L + p
            proposals = row[p:]
            a = self.accept(proposals, target)
            news.append(proposals[:a] + [target[a]])
            self._count(requests[b].id, live[b], T, p, made[b], min(a, made[b]))
        engine.rollback(kv, min(L + p + len(new) - 1 for p, new in zip(pending, news)))
        emitted = self._keep(engine, seqs, outs, news, n_new)
        self.batch_window_tokens = sum(emitted)  # every request's tokens of this window
        self.end_window(k, statistics.mean(n for n, on in zip(emitted, live) if on), engine.clock.now() - w0)

    def _count(self, rid: str, live: bool, T: int, p: int, made: int, accepted: int) -> None:
        """One request's share of a window: its positions, what of them was work again or for nothing, its
        acceptance (a request that proposed nothing had no window of its own)."""
        self.batch_positions += T
        if not live:
            self.batch_finished += T
            return
        self.batch_reverified += p - 1
        self.batch_filler += T - p - made
        if made:
            self.windows += 1
            self.proposed += made
            self.accepted += accepted
            self.accepted_lengths.append(accepted)
            self.window_ks.append(made)
            self.last_window.append((made, accepted))
            mine = self.request_acceptance.setdefault(rid, [0, 0])
            mine[0] += made
            mine[1] += accepted

    def propose_batch(self, engine, requests, samplers, rows, L, T, kv, k) -> list[int]:
        """Extend each request's row (its pending tokens, from position ``L``) with proposals up to ``T`` tokens;
        the number each got. The self-draft: batched draft forwards over the shared cache (see the module); none
        when ``k`` is 0 (the caller fills the rows)."""
        pending = [len(r) for r in rows]
        j = min(pending) - 1  # the last index every row has
        if k == 0 or j + 1 >= T:
            return [0] * len(rows)
        ids = torch.tensor([r[:j + 1] for r in rows])
        step = 0
        while j + 1 < T:
            self.draft.routing.clear()
            t_step = engine.clock.now()
            dl = engine._forward(ids, kv, experts=self.draft, dense=self.dense)  # [B, 1, V], predicts index j + 1
            self.batch_draft_rows += ids.numel()
            for b, row in enumerate(rows):
                if len(row) == j + 1:  # this request's next token is a proposal
                    token = samplers[b].pick(dl[b, -1].float(), L + j + 1)
                    if self.draft_noise:
                        self.request_id = requests[b].id
                        token = self.corrupt(token, L + j + 1, dl.shape[-1])
                    row.append(token)
                    self.batch_draft_used += 1
            self.after_draft_step(step, self.draft.routing, engine.clock.now() - t_step)
            step, j = step + 1, j + 1
            ids = torch.tensor([[r[j]] for r in rows])
        return [T - p for p in pending]

    def batch_metrics(self) -> dict:
        """What the batched windows cost (empty at batch 1): verification positions, of them re-verified, filler
        and finished requests', the draft's rows and those whose prediction no request used (rows over pending tokens,
        the first forward's inner rows), and each request's acceptance."""
        if not self.batch_positions:
            return {}
        n = self.batch_positions
        wasted = self.batch_reverified + self.batch_filler + self.batch_finished
        return {
            "batch_verify_positions": n, "batch_reverified_positions": self.batch_reverified,
            "batch_filler_positions": self.batch_filler, "batch_finished_positions": self.batch_finished,
            "batch_wasted_share": round(wasted / n, 4),
            "batch_draft_rows": self.batch_draft_rows,
            "batch_draft_rows_unused": self.batch_draft_rows - self.batch_draft_used,
            "acceptance_per_request": {rid: round(a / p, 4) if p else None
                                       for rid, (p, a) in self.request_acceptance.items()},
        }
