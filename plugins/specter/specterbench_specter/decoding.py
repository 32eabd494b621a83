"""Self-draft speculative decoding over the offloaded cache, exact under greedy and sampled decoding.

The draft is the target with its routed experts quantized and resident on the device, sharing attention,
routers, norms, embeddings, shared experts *and the KV cache* with the target (as the artifact does). A window:

1. the draft proposes K tokens, each chosen with the request's sampler at its absolute position
   (``sampler.pick(draft_logits, p)``: the same Gumbel noise the target will see at ``p``);
2. the draft's KV entries are dropped and the target verifies ``[last token] + proposals`` in one forward pass;
   row ``i`` of its logits gives the target's own token at position ``p0 + i`` (``sampler.pick_many``);
3. the agreeing prefix is accepted plus the target's token at the first disagreement (or a bonus token), and
   the KV cache is cropped to the accepted length.

Every emitted token is the target's own choice at its position, so the output equals ``engine.decode`` token
for token in both decode modes. A window of K = 0 is one plain target step over the same cache.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter

import torch

from specterbench import Strategy
from specterbench.engine.dense_copy import dense_quantized_bytes, dense_spec, shared_dense
from specterbench.engine.draft import quantized_bytes, shared_quantized
from specterbench.engine.precision import check_draft_below
from specterbench.engine.quant_spec import QuantSpec, draft_label
from specterbench.errors import BudgetError, UsageError

from .acceptance import acceptance_by_position, accepted_prefix, per_token_acceptance
from .batched import BatchedWindows

MAX_K = 32


def parse_window(value, default: int, proposer: str) -> int:
    """``k`` of a strategy that proposes at most a fixed count: ``'auto'`` is ``default``, else 1..MAX_K."""
    try:
        k = int(default if value == "auto" else value)
    except (TypeError, ValueError):
        k = 0
    if not 1 <= k <= MAX_K:
        raise UsageError(f"option k={value!r} is invalid: use the most tokens {proposer} proposes, 1 to {MAX_K}")
    return k


def parse_k(value, allowed: tuple[int, ...] | None = None, auto: bool = True):
    """``k`` option: ``'auto'`` (when ``auto``) or an integer in 1..MAX_K (or one of ``allowed``)."""
    choices = f"one of {', '.join(map(str, allowed))}" if allowed else f"an integer from 1 to {MAX_K}"
    if auto:
        choices += " or 'auto'"
    if auto and value == "auto":
        return value
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"option k={value!r} is invalid: use {choices}") from None
    if (k not in allowed) if allowed else not 1 <= k <= MAX_K:
        raise UsageError(f"option k={k} is out of range: use {choices}")
    return k


class SpeculativeDecoding(BatchedWindows, Strategy):
    """Self-draft speculative decoding; subclasses choose K, the cache policy and what to prefetch. Several
    requests at once: :mod:`.batched` (one batched verification a window, lock step at the shortest acceptance)."""

    version = "2"
    uses_calibration = True
    draft_defaults: dict = {}  # QuantSpec defaults of this strategy
    # bit widths tried in order, when the options do not name ``bits``, where the default draft does not fit the
    # budget or is not below the target's bits (:meth:`draft_spec_for`); empty: the default or a refusal
    draft_fallback_bits: tuple[int, ...] = ()
    dense_bits_default = 16  # the draft's attention, shared experts and head: 16 = the target's own weights
    k_candidates: tuple[int, ...] = (1, 2, 3, 4, 6, 8)  # K profiled on calibration prompts when k=auto
    profile_tokens = 16

    @classmethod
    def option_names(cls):
        return ("k", "dense_bits", "dense_quantizer", "dense_blocksize", "head_error_scale", "draft_noise",
                *QuantSpec.OPTIONS)

    @staticmethod
    def parse_noise(value) -> float:
        """``draft_noise``: the share of draft proposals replaced by another token (0 default) — a deliberately
        degraded draft, to test what a strategy does when acceptance is low. Still lossless: the target verifies."""
        try:
            p = float(value)
        except (TypeError, ValueError):
            p = -1.0
        if not 0.0 <= p < 1.0:
            raise UsageError(f"option draft_noise={value!r} is invalid: use a share from 0 to below 1")
        return p

    @classmethod
    def dense_spec_of(cls, options: dict):
        """The spec of the draft's dense copy (``--set NAME.dense_bits=4``), None when it shares the target's;
        ``dense_quantizer`` / ``dense_blocksize`` name another format (``dense_quantizer=int``: an int8/g64 copy
        dequantized into a scratch)."""
        return dense_spec(options.get("dense_bits", cls.dense_bits_default), options.get("dense_blocksize", 64),
                          head_error_scale=options.get("head_error_scale"),  # None: the model's calibration
                          quantizer=options.get("dense_quantizer"))

    @classmethod
    def parse_depth(cls, value):
        """The ``k`` option: 'auto' or a depth this strategy allows (UsageError otherwise)."""
        return parse_k(value)

    @classmethod
    def reject_unknown_options(cls, options: dict) -> None:
        """One line naming the options this strategy does not have and those it accepts."""
        unknown = sorted(set(options) - set(cls.option_names()))
        if unknown:
            raise UsageError(f"strategy {cls.name!r} has no option(s) {', '.join(unknown)}; it accepts: "
                             f"{', '.join(cls.option_names())}")

    @classmethod
    def validate_options(cls, options: dict) -> None:
        """Every option checked before a model loads (one-line UsageError naming the allowed values)."""
        cls.reject_unknown_options(options)
        cls.parse_depth(options.get("k", "auto"))
        cls.parse_noise(options.get("draft_noise", 0))
        QuantSpec.from_options(options, **cls.draft_defaults)
        cls.dense_spec_of(options)

    @classmethod
    def draft_candidates(cls, options: dict) -> list[QuantSpec]:
        """The draft specs this strategy may run, preferred first: the one the options name, then — only when they
        name neither ``bits`` nor ``quantizer`` — the same format at each of :attr:`draft_fallback_bits`."""
        spec = QuantSpec.from_options(options, **cls.draft_defaults)
        if "bits" in options or "quantizer" in options:  # a format the user chose: that one or a refusal
            return [spec]
        return [spec] + [QuantSpec.from_options({**options, "bits": b}, **cls.draft_defaults)
                         for b in cls.draft_fallback_bits if b != spec.bits]

    @classmethod
    def drafts_below_target(cls, engine, options: dict) -> list[QuantSpec]:
        """The candidate drafts at fewer bits than the target's experts (all of them for a 16-bit target)."""
        bits = engine.precision.expert_bits
        return [s for s in cls.draft_candidates(options) if bits >= 16 or s.bits < bits]

    @classmethod
    def draft_spec_for(cls, engine, budget_bytes: int, options: dict) -> QuantSpec | None:
        """The first candidate draft below the target's bits whose bytes, with its dense copy, leave the budget room
        for the experts one forward needs (None: none does)."""
        dense_bytes = dense_quantized_bytes(engine, cls.dense_spec_of(options))
        return next((spec for spec in cls.drafts_below_target(engine, options)
                     if quantized_bytes(engine, spec) + dense_bytes + engine.min_budget_bytes() <= budget_bytes), None)

    @classmethod
    def check_budget(cls, engine, budget_bytes: int, options: dict) -> None:
        """Refuse, in one line naming the smallest budget that works, a budget that cannot hold the draft (the
        smallest fallback where the options leave the bits open) plus the experts one forward needs."""
        if cls.draft_spec_for(engine, budget_bytes, options) is not None:
            return
        below = cls.drafts_below_target(engine, options)
        check_draft_below(engine.precision, (below or cls.draft_candidates(options))[-1], cls.name)
        spec = below[-1]
        dense = cls.dense_spec_of(options)
        draft = quantized_bytes(engine, spec) + dense_quantized_bytes(engine, dense)
        need = draft + engine.min_budget_bytes()
        if budget_bytes < need:
            pct = math.ceil(1000 * need / engine.total_expert_bytes) / 10
            raise BudgetError(f"budget {budget_bytes} bytes cannot hold {cls.name}'s {draft_label(spec, dense)} "
                              f"draft ({draft} bytes) plus the top-{engine.top_k} experts of one layer; the smallest "
                              f"budget that works is {pct:.1f}% ({need} bytes)")

    def __init__(self, **options):
        super().__init__(**options)
        self.validate_options(options)
        self.k_option = self.parse_depth(options.get("k", "auto"))
        self.spec = QuantSpec.from_options(options, **self.draft_defaults)
        self.dense_spec = self.dense_spec_of(options)
        self.k = 4 if self.k_option == "auto" else self.k_option
        self.k_profile: dict[int, float] = {}
        self.draft_noise = self.parse_noise(options.get("draft_noise", 0))
        self.request_id = ""

    # ---- setup -------------------------------------------------------------------------------------
    def fit_budget(self, engine, budget_bytes: int) -> None:
        """The draft this cell runs: the preferred one where the budget holds it, else the first fallback that fits
        (``draft_fallback_bits``; the row's ``draft_quant`` names it). Nothing fits: the preferred one, which
        ``configure`` then refuses in one line."""
        self.spec = self.draft_spec_for(engine, budget_bytes, self.options) or self.draft_candidates(self.options)[0]

    def device_bytes(self, engine):
        return self.draft_bytes(engine)

    def draft_bytes(self, engine) -> int:
        """The draft's device bytes: its routed experts plus its dense copy (if it has one)."""
        return quantized_bytes(engine, self.spec) + dense_quantized_bytes(engine, self.dense_spec)

    dense = None

    @property
    def dense_ratio(self) -> float:
        """The draft's dense weights over 16-bit (without a copy of its own: the target's, at its precision)."""
        return self.engine.precision.dense_ratio if self.dense is None else self.dense.bytes_ratio

    def attach(self, engine):
        super().attach(engine)
        self.attach_draft(engine)
        self.slots = engine.cache.capacity_bytes // engine.expert_bytes
        self.reset_metrics()
        self.begin_window(0)

    def attach_draft(self, engine) -> None:
        """The self-draft's copies: the target's routed experts quantized, and its dense copy if it has one."""
        check_draft_below(engine.precision, self.spec, self.name)
        self.draft = shared_quantized(engine, self.spec)
        self.dense = shared_dense(engine, self.dense_spec)

    def prepare(self, engine, calibration=None):
        if self.k_option == "auto" and calibration is not None:
            self.profile_k(engine, calibration, self.k_candidates)
        self.reset_metrics()

    def profile_k(self, engine, calibration, candidates):
        """The artifact's depth profiler: decode calibration prompts at each K, keep the fastest."""
        from specterbench.strategy import Request

        for k in candidates:
            self.k = k
            tpots = []
            for i, ids in enumerate(calibration.prompts[:2]):
                request = Request(f"k-profile-{i}", ids, self.profile_tokens, decode=calibration.decode)
                engine.begin_request(request)
                self.generate(engine, request)
                seconds = sum(s.clock_s for s in engine.samples[1:])  # decode time, after the first token
                tpots.append(seconds / max(1, sum(s.tokens for s in engine.samples[1:])))
            self.k_profile[k] = statistics.mean(tpots) * 1e3  # mean per-prompt TPOT, ms (as the artifact)
        self.k = min(self.k_profile, key=self.k_profile.get)

    def on_warmup_end(self):
        """The runner's warm-up request is over: what was learned (the depth) stays, the counters restart."""
        self.reset_metrics()

    def reset_metrics(self):
        self.windows = self.proposed = self.accepted = 0
        self.accepted_lengths: list[int] = []
        self.window_ks: list[int] = []  # K of each drafted window, beside its accepted length
        self.k_hist: Counter = Counter()
        self.recalls: list[float] = []
        self.precisions: list[float] = []
        self.draft_s = self.total_s = 0.0
        self.reset_batch_metrics()

    # ---- decoding ----------------------------------------------------------------------------------
    def choose_k(self, remaining: int) -> int:
        """K for the next window (0: one plain target step)."""
        return min(self.k, remaining)

    def accept(self, proposals: list[int], target: list[int]) -> int:
        """How many proposals to keep; exactness rests on this being :func:`accepted_prefix`."""
        return accepted_prefix(proposals, target)

    def generate(self, engine, request):
        self.request_id = request.id
        sampler = request.sampler()
        n_new = request.max_new_tokens
        seq = self.seq = list(request.prompt_ids)  # seq[i] sits at absolute position i (choose_k may read it)
        kv = engine.new_kv_cache()  # holds every position but the last of seq between windows
        t0 = engine.clock.now()
        logits = engine.forward(torch.tensor([seq]), kv)
        out = [sampler.pick(logits[-1], len(seq))]
        seq.append(out[0])
        engine.emit(1)
        self.on_step_end(out)
        while len(out) < n_new:
            k = self.choose_k(n_new - len(out))
            self.k_hist[k] += 1
            w0 = engine.clock.now()
            self.begin_window(k)
            if k == 0:
                logits = engine.forward(torch.tensor([seq[-1:]]), kv)
                new = [sampler.pick(logits[-1], len(seq))]
            else:
                new = self._window(engine, sampler, seq, kv, k)[: n_new - len(out)]
            seq.extend(new)
            out.extend(new)
            self.end_window(k, len(new), engine.clock.now() - w0)
            engine.emit(len(new))
            self.on_step_end(new)
        self.total_s += engine.clock.now() - t0
        return out

    def _window(self, engine, sampler, seq, kv, k) -> list[int]:
        kept = kv.get_seq_length()  # == len(seq) - 1
        d0 = engine.clock.now()
        proposals = self.propose(engine, sampler, seq, kv, k)
        self.draft_s += engine.clock.now() - d0
        engine.rollback(kv, kept)  # the draft's KV entries go; the target writes its own
        self.before_verify()
        logits = engine.forward(torch.tensor([[seq[-1]] + proposals]), kv, all_logits=True)  # [k + 1, V]
        target = sampler.pick_many(logits, len(seq))
        a = self.accept(proposals, target)
        engine.rollback(kv, kept + 1 + a)
        self.windows += 1
        self.proposed += k
        self.accepted += a
        self.accepted_lengths.append(a)
        self.window_ks.append(k)
        self.last_window = [(k, a)]
        return proposals[:a] + [target[a]]

    def propose(self, engine, sampler, seq, kv, k) -> list[int]:
        """K proposals after ``seq``: the self-draft's own tokens, one draft forward each over the shared KV cache
        (entries the caller drops before verifying)."""
        proposals, last = [], seq[-1]
        for step in range(k):
            self.draft.routing.clear()
            t_step = engine.clock.now()
            dl = engine.forward(torch.tensor([[last]]), kv, experts=self.draft, dense=self.dense)
            last = sampler.pick(dl[-1], len(seq) + step)
            if self.draft_noise:
                last = self.corrupt(last, len(seq) + step, dl.shape[-1])
            proposals.append(last)
            self.after_draft_step(step, self.draft.routing, engine.clock.now() - t_step)
        return proposals

    def corrupt(self, token: int, position: int, vocab: int) -> int:
        """With probability ``draft_noise`` (drawn from (request, position), so every run draws the same), another
        token in place of the draft's own: a weaker draft, its next steps continuing from the corrupted one."""
        digest = hashlib.blake2b(f"draft-noise\x1f{self.request_id}\x1f{position}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "little")
        if (u >> 11) / 2**53 >= self.draft_noise:
            return token
        return (token + 1 + u % (vocab - 1)) % vocab

    # ---- window hooks: the draft's routing, the target's routing during verification -----------------
    def on_request_start(self, request):
        self.begin_window(0)  # no stale predictions from the last request's window during this prefill

    def begin_window(self, k):
        self.window_k = k
        self.window_draft: dict[int, Counter] = {}
        self.window_target: dict[int, set] = {}
        self.verifying = False

    def after_draft_step(self, step, routing, step_s):
        for layer, experts, counts in routing:
            self.window_draft.setdefault(layer, Counter()).update(dict(zip(experts, counts)))

    def before_verify(self):
        self.verifying = True

    def before_layer(self, layer, experts, tokens_per_expert):
        if self.verifying:
            self.window_target[layer] = set(experts)

    def predicted(self) -> dict[int, set] | None:
        """Per layer, the experts this strategy bet the verification would need (None: it bets on none)."""
        return {layer: set(c) for layer, c in self.window_draft.items()}

    def end_window(self, k, emitted, window_s):
        pred = self.predicted() if k else None
        if pred is not None:  # None: a strategy that bets on no experts (no recall or precision to report)
            hit = sum(len(pred.get(l, set()) & t) for l, t in self.window_target.items())
            need = sum(len(t) for t in self.window_target.values())
            bet = sum(len(p) for p in pred.values())
            if need:
                self.recalls.append(hit / need)
            if bet:
                self.precisions.append(hit / bet)
        self.verifying = False

    def draft_metrics(self) -> dict:
        """What the row says of the draft itself."""
        return {
            "draft_quant": draft_label(self.draft.spec, self.dense_spec,  # the calibration the copies took
                                       self.dense.head_error_scale if self.dense else 1.0),
            "draft_bits_per_weight": round(self.spec.bits_per_weight(), 3),
            "draft_noise": self.draft_noise,
            "draft_dense_bits": self.dense_spec.bits if self.dense_spec else 16,
            "draft_device_bytes": self.draft_bytes(self.engine),
        }

    def metrics(self):
        lengths = self.accepted_lengths
        m = {
            "k": self.k,
            "k_hist": {str(k): n for k, n in sorted(self.k_hist.items())},
            **self.draft_metrics(),
            "acceptance_rate": self.accepted / self.proposed if self.proposed else None,
            "mean_accepted_tokens": statistics.mean(lengths) if lengths else None,
            "tokens_per_window": (statistics.mean(lengths) + 1) if lengths else None,
            "accepted_length_hist": {str(a): n for a, n in sorted(Counter(lengths).items())},
            "acceptance_by_position": acceptance_by_position(self.window_ks, lengths),
            "per_token_acceptance": per_token_acceptance(self.window_ks, lengths),
            "expert_recall": statistics.mean(self.recalls) if self.recalls else None,
            "expert_precision": statistics.mean(self.precisions) if self.precisions else None,
            "draft_time_share": self.draft_s / self.total_s if self.total_s else None,
        }
        m.update(self.batch_metrics())
        if self.k_profile:
            m["k_profile_ms_per_token"] = {str(k): v for k, v in self.k_profile.items()}
        return m
