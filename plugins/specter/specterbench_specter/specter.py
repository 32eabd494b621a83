"""Speculative offloading (Specter, arXiv 2511.14102) and plain speculative decoding over an offloaded cache.

Both decode with a *self-draft*: the target with its routed experts quantized (4-bit by default) and resident
on the device, sharing attention, routers, norms, embeddings and shared experts. Each window the draft
proposes K tokens greedily; the target verifies them in one forward pass, keeps the longest prefix equal to
its own greedy choices plus one token of its own, and both KV caches roll back to the accepted length.
Tokens equal the target's greedy tokens.

Specter also plans: the draft's routing over the K steps names the experts the verification will need; the
top-M per layer (M = cache slots per layer) are prefetched while the draft still runs, earliest-needed first
(by draft step, then layer; the copy queue serves earlier layers first), in chunks sized by the link bandwidth
measured so far. ``spec-decode`` is the same decoding with a per-layer LRU cache and no plan.
"""

from __future__ import annotations

import statistics
from collections import Counter

import torch

from specterbench import Strategy
from specterbench.baselines.lru import LRU
from specterbench.engine.draft import QuantSpec, quantized_bytes, shared_quantized
from specterbench.errors import UsageError

K_CANDIDATES = (1, 2, 3, 4, 6, 8)
MAX_K = 64


def _parse_k(k):
    if k == "auto":
        return k
    try:
        k = int(k)
    except (TypeError, ValueError):
        raise UsageError(f"K must be an integer from 1 to {MAX_K} or 'auto', got {k!r}") from None
    if not 1 <= k <= MAX_K:
        raise UsageError(f"K must be from 1 to {MAX_K}, got {k}")
    return k


def accepted_prefix(proposals: list[int], greedy: list[int]) -> int:
    """How many proposals the target accepts: the longest prefix equal to its own greedy choices.

    ``greedy[i]`` is the target's choice after seeing the last accepted token and ``proposals[:i]``; so
    ``len(greedy) == len(proposals) + 1`` and the window emits ``proposals[:a] + [greedy[a]]``.
    """
    a = 0
    while a < len(proposals) and proposals[a] == greedy[a]:
        a += 1
    return a


class SpeculativeDecoding(Strategy):
    """Self-draft speculative decoding over the offloaded cache; subclasses decide what to prefetch."""

    version = "1"

    @classmethod
    def option_names(cls):
        return ("k", *QuantSpec.OPTIONS)

    def __init__(self, **options):
        super().__init__(**options)
        self.k_option = _parse_k(options.get("k", "auto"))
        self.spec = QuantSpec.from_options(options)
        self.k = 4 if self.k_option == "auto" else self.k_option
        self.k_profile: dict[int, float] = {}

    # ---- setup -------------------------------------------------------------------------------------
    def device_bytes(self, engine):
        return quantized_bytes(engine, self.spec)

    uses_calibration = True  # the K profiler decodes calibration prompts, never benchmark ones

    def attach(self, engine):
        super().attach(engine)
        self.draft = shared_quantized(engine, self.spec)
        if self.draft.nbytes != self.device_bytes(engine):
            raise UsageError(f"draft bytes {self.draft.nbytes} differ from the charged estimate "
                             f"{self.device_bytes(engine)}")
        self.slots = engine.cache.capacity_bytes // engine.expert_bytes
        self.reset_metrics()
        self.begin_window()

    def prepare(self, engine, calibration=None):
        if self.k_option != "auto" or calibration is None:
            return
        from specterbench.plugins.strategy import Request

        for k in K_CANDIDATES:
            self.k = k
            seconds = tokens = 0
            for i, ids in enumerate(calibration.prompts[:2]):
                request = Request(f"k-profile-{i}", ids, 16)
                engine.begin_request(request)
                self.generate(engine, request)
                seconds += sum(s.clock_s for s in engine.samples[1:])  # decode time, after the first token
                tokens += sum(s.tokens for s in engine.samples[1:])
            self.k_profile[k] = seconds / max(tokens, 1) * 1e3  # ms per decode token
        self.k = min(self.k_profile, key=self.k_profile.get)
        self.reset_metrics()

    def reset_metrics(self):
        self.windows = self.proposed = self.accepted = 0
        self.accepted_lengths: list[int] = []
        self.recalls: list[float] = []
        self.precisions: list[float] = []
        self.draft_s = self.total_s = 0.0

    # ---- decoding ----------------------------------------------------------------------------------
    def generate(self, engine, request):
        n_new = request.max_new_tokens
        seq = list(request.prompt_ids)
        target_kv, draft_kv = engine.new_kv_cache(), engine.new_kv_cache()
        t0 = engine.clock.now()
        logits = engine.forward(torch.tensor([seq]), target_kv)
        out = [int(logits[-1].argmax())]
        seq.append(out[0])
        engine.emit(1)
        self.on_step_end(out)
        while len(out) < n_new:
            k = min(self.k, n_new - len(out))
            self.begin_window()
            proposals, pending = [], seq[draft_kv.get_seq_length():]
            d0 = engine.clock.now()
            for step in range(k):
                self.draft.routing.clear()
                t_step = engine.clock.now()
                dl = engine.forward(torch.tensor([pending]), draft_kv, experts=self.draft)
                proposals.append(int(dl[-1].argmax()))
                pending = proposals[-1:]
                self.after_draft_step(step, self.draft.routing, engine.clock.now() - t_step)
            self.draft_s += engine.clock.now() - d0
            self.before_verify()
            kept = target_kv.get_seq_length()  # all of seq but its last token
            logits = engine.forward(torch.tensor([[seq[-1]] + proposals]), target_kv, all_logits=True)
            greedy = logits.argmax(-1).tolist()  # [k + 1]
            a = accepted_prefix(proposals, greedy)
            new = (proposals[:a] + [greedy[a]])[: n_new - len(out)]
            engine.rollback(target_kv, kept + 1 + a)
            engine.rollback(draft_kv, len(seq) + a)
            seq.extend(new)
            out.extend(new)
            self.windows += 1
            self.proposed += k
            self.accepted += a
            self.accepted_lengths.append(a)
            self.end_window()
            engine.emit(len(new))
            self.on_step_end(new)
        self.total_s += engine.clock.now() - t0
        return out

    # window hooks: the draft's routing, the target's routing during verification
    def on_request_start(self, request):
        self.begin_window()  # no stale predictions from the last request's window during this prefill

    def begin_window(self):
        self.window_draft: dict[int, Counter] = {}
        self.window_target: dict[int, set] = {}
        self.verifying = False

    def after_draft_step(self, step, routing, step_s):
        for layer, experts, counts in routing:
            self.window_draft.setdefault(layer, Counter()).update(dict(zip(experts, counts)))

    def before_verify(self):
        self.verifying = True

    def before_layer(self, layer, experts, tokens_per_expert):
        if getattr(self, "verifying", False):
            self.window_target[layer] = set(experts)

    def predicted(self) -> dict[int, set]:
        """Per layer, the experts this strategy bet the verification would need."""
        return {layer: set(c) for layer, c in self.window_draft.items()}

    def end_window(self):
        pred = self.predicted()
        hit = sum(len(pred.get(l, set()) & t) for l, t in self.window_target.items())
        need = sum(len(t) for t in self.window_target.values())
        bet = sum(len(p) for p in pred.values())
        if need:
            self.recalls.append(hit / need)
        if bet:
            self.precisions.append(hit / bet)
        self.verifying = False

    def metrics(self):
        m = {
            "k": self.k,
            "draft_quant": self.spec.label(),
            "draft_device_bytes": self.draft.nbytes,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else None,
            "mean_accepted_tokens": statistics.mean(self.accepted_lengths) if self.accepted_lengths else None,
            "tokens_per_window": (statistics.mean(self.accepted_lengths) + 1) if self.accepted_lengths else None,
            "accepted_length_hist": dict(Counter(self.accepted_lengths)),
            "expert_recall": statistics.mean(self.recalls) if self.recalls else None,
            "expert_precision": statistics.mean(self.precisions) if self.precisions else None,
            "draft_time_share": self.draft_s / self.total_s if self.total_s else None,
        }
        if self.k_profile:
            m["k_profile_ms_per_token"] = {str(k): v for k, v in self.k_profile.items()}
        return m


class SpecDecode(SpeculativeDecoding):
    name = "spec-decode"
    description = "self-draft speculative decoding (4-bit draft) over a per-layer LRU cache, no prefetch plan"

    def attach(self, engine):
        super().attach(engine)
        self._lru = LRU()
        self._lru.attach(engine)

    def choose_victim(self, candidates, needed):
        return self._lru.choose_victim(candidates, needed)


class Specter(SpeculativeDecoding):
    """Speculative offloading: the draft's routing over the window is the prefetch plan.

    Every expert the draft routed to in the window is *predicted*; predicted experts are brought in by order of
    need — layer first (the verification runs layer by layer), then how many draft tokens used them — for as
    many per layer as the budget allows (top-M), while the draft still runs, in chunks the link can move during
    one draft step (bandwidth measured from the copies so far). Room is made by evicting experts the draft did
    not predict (least recently used first), then predicted ones of layers the verification has passed.
    """

    name = "specter"
    description = ("speculative offloading: 4-bit self-draft runs K ahead, its routing plans top-M prefetch per "
                   "layer, target verifies K tokens in one pass")

    def begin_window(self):
        super().begin_window()
        self.planned: set[tuple[int, int]] = set()  # issued or found cached this window
        self.verify_layer = -1

    def waiting(self) -> list[tuple[int, int]]:
        """Predicted experts not yet planned, earliest needed first."""
        keys = [(layer, e, n) for layer, counts in self.window_draft.items() for e, n in counts.items()
                if (layer, e) not in self.planned]
        return [(layer, e) for layer, e, n in sorted(keys, key=lambda x: (x[0], -x[2], x[1]))]

    def after_draft_step(self, step, routing, step_s):
        super().after_draft_step(step, routing, step_s)
        engine = self.engine
        bw = engine.link_bytes_per_s()  # bandwidth-aware chunk: what the link moves during one draft step
        chunk = None if bw is None or step_s <= 0 else max(1, int(bw * step_s // engine.priced_expert_bytes))
        self._issue(chunk)

    def before_verify(self):
        super().before_verify()
        self._issue(None)

    def _issue(self, n):
        engine = self.engine
        predicted = {(layer, e) for layer, counts in self.window_draft.items() for e in counts}
        for key in self.waiting()[:n]:
            if key in engine.cache:
                engine.cache.touch(key)
            elif engine.make_room(engine.expert_bytes, protect=predicted, needed=key):
                engine.prefetch(key, priority=-float(key[0]))  # the verification needs earlier layers first
            else:
                return  # the cache holds only predicted experts: the budget allows no more
            self.planned.add(key)

    def before_layer(self, layer, experts, tokens_per_expert):
        super().before_layer(layer, experts, tokens_per_expert)
        if self.verifying:
            self.verify_layer = layer

    def choose_victim(self, candidates, needed):
        predicted = self.window_draft
        unpredicted = [k for k in candidates if k[1] not in predicted.get(k[0], ())]
        if unpredicted:
            return unpredicted[0]
        done = [k for k in candidates if k[0] < self.verify_layer]  # layers the verification has passed
        if done:
            return done[0]
        # all predicted and still ahead: give up the one needed last (latest layer, fewest draft tokens)
        return max(candidates, key=lambda k: (k[0], -predicted[k[0]][k[1]]))

    def predicted(self):
        pred: dict[int, set] = {}
        for layer, e in self.planned:
            pred.setdefault(layer, set()).add(e)
        return pred
