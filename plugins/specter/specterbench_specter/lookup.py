"""Draft-free speculation: ``spec-ngram``, prompt / n-gram lookup drafting verified as Specter verifies.

The proposals come from the sequence itself (prompt lookup decoding; vLLM's ``ngram`` speculator, llama.cpp's
lookup decoding): the longest suffix of up to ``ngram_max`` tokens that occurred earlier in the prompt or the
output, at least ``ngram_min`` long, proposes the up to ``k`` tokens that followed its latest earlier occurrence. No
draft model, so no draft bytes on the device and no draft forward on the clock: the lookup is a host-side dictionary
probe, as cheap here as in those systems. Where nothing matches, the step is one plain target step over the same
cache. The target verifies the proposals in one forward pass and keeps the agreeing prefix plus its own next token,
so the output is the target's under greedy and sampled decoding.

The cache and the verification are Specter's without its lookahead (there is no draft routing to plan from): the
calibration's popular experts resident, transients by recency, and a missed expert computed on the host when that
is predicted to finish first (``host=off``: always fetched).
"""

from __future__ import annotations

from specterbench.errors import UsageError
from specterbench.strategy import FETCH, ON_HOST

from .decoding import SpeculativeDecoding, parse_window
from .eviction import CacheOrder

NGRAM_LIMIT = 8  # longest suffix the lookup tries


class NgramIndex:
    """The latest start of every n-gram (n in ``sizes``) of a growing sequence whose continuation is known, indexed
    as the sequence grows: a lookup costs a dictionary probe per size, not a scan."""

    def __init__(self, sizes: range):
        self.sizes = sizes
        self.starts: dict[int, dict[tuple, int]] = {n: {} for n in sizes}
        self.indexed = 0  # n-grams starting before this position are indexed (for every size that fits)

    def lookup(self, seq: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of ``seq``'s longest matching suffix."""
        end = len(seq) - 1  # an n-gram is indexed once the token after it exists: it then has a continuation
        for n in self.sizes:
            table = self.starts[n]
            for i in range(max(0, self.indexed - n + 1), end - n + 1):
                table[tuple(seq[i:i + n])] = i
        self.indexed = max(self.indexed, end)
        for n in reversed(self.sizes):
            if len(seq) > n and (i := self.starts[n].get(tuple(seq[-n:]))) is not None:
                return seq[i + n:i + n + k]
        return []


class SpecNgram(CacheOrder, SpeculativeDecoding):
    name = "spec-ngram"
    version = "1"
    description = ("draft-free speculation: prompt/n-gram lookup proposes up to K tokens (no draft bytes), the "
                   "target verifies in one pass; Specter's residents and host path for misses")
    plan_on = False  # nothing to plan from: CacheOrder keeps no draft-predicted experts
    k_default = 8

    @classmethod
    def option_names(cls):
        return ("k", "ngram_min", "ngram_max", "host")

    @classmethod
    def parse_depth(cls, value):
        return parse_window(value, cls.k_default, "a lookup")

    @classmethod
    def ngram_sizes(cls, options: dict) -> range:
        try:
            low, high = int(options.get("ngram_min", 2)), int(options.get("ngram_max", 3))
        except (TypeError, ValueError):
            low = high = 0
        if not 1 <= low <= high <= NGRAM_LIMIT:
            raise UsageError(f"options ngram_min={options.get('ngram_min', 2)!r}, "
                             f"ngram_max={options.get('ngram_max', 3)!r} are invalid: use 1 <= ngram_min <= "
                             f"ngram_max <= {NGRAM_LIMIT}")
        return range(low, high + 1)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        cls.reject_unknown_options(options)
        cls.parse_depth(options.get("k", cls.k_default))
        cls.ngram_sizes(options)
        if str(options.get("host", "auto")) not in ("auto", "off"):
            raise UsageError(f"option host={options.get('host')!r} is invalid: use one of auto, off")

    @classmethod
    def check_budget(cls, engine, budget_bytes: int, options: dict) -> None:
        """No draft to hold: any budget the engine accepts."""

    def __init__(self, **options):
        super().__init__(**options)
        self.sizes = self.ngram_sizes(options)
        self.host_option = str(options.get("host", "auto"))
        self.index = NgramIndex(self.sizes)
        self.pending: list[int] = []

    def fit_budget(self, engine, budget_bytes: int) -> None:
        """Nothing to fit: the lookup holds no device bytes."""

    def draft_bytes(self, engine) -> int:
        return 0

    def attach_draft(self, engine) -> None:
        self.draft = self.dense = None

    def attach(self, engine):
        super().attach(engine)
        self.host_path = self.host_option == "auto" and engine.clock.costs.host is not None
        self.host_calls = self.fetch_calls = self.lookups = self.matches = 0
        self.transients: dict = {}
        self.transient_heap: list = []

    def prepare(self, engine, calibration=None):
        self.load_residents(engine, calibration)
        self.reset_metrics()
        self.host_calls = self.fetch_calls = self.lookups = self.matches = 0

    def on_warmup_end(self):
        super().on_warmup_end()
        self.host_calls = self.fetch_calls = self.lookups = self.matches = 0

    def on_request_start(self, request):
        super().on_request_start(request)
        self.index = NgramIndex(self.sizes)

    def choose_k(self, remaining: int) -> int:
        """As many tokens as the lookup proposes (at most ``k``, and one fewer than the tokens left: the
        verification adds its own); none is a plain step."""
        self.lookups += 1
        self.pending = self.index.lookup(self.seq, min(self.k, remaining - 1)) if remaining > 1 else []
        self.matches += bool(self.pending)
        return len(self.pending)

    def propose(self, engine, sampler, seq, kv, k) -> list[int]:
        return self.pending[:k]

    def begin_batch_windows(self, requests) -> None:
        self.indices = [NgramIndex(self.sizes) for _ in requests]  # each request looks up its own sequence

    def batch_choose_k(self, seqs, remaining) -> int:
        """Each request's own lookup (as :meth:`choose_k`, over its own sequence); K is the longest found."""
        self.batch_pending = []
        for seq, index, left in zip(seqs, self.indices, remaining):
            self.seq, self.index = seq, index
            self.batch_pending.append(self.pending if left > 1 and self.choose_k(left) else [])
        return max(map(len, self.batch_pending))

    def propose_batch(self, engine, requests, samplers, rows, L, T, kv, k) -> list[int]:
        """Each request's own lookup, as much of it as its row has room for (the rest filled by the caller)."""
        made = []
        for row, found in zip(rows, self.batch_pending):
            take = found[:T - len(row)]
            row.extend(take)
            made.append(len(take))
        return made

    def place_miss(self, key, n_tokens):
        """Misses of a verification or a plain step: the host when it is predicted to finish first."""
        if self.host_path and self.engine.costs.host_or_fetch(n_tokens).place == ON_HOST:
            self.host_calls += 1
            return ON_HOST
        self.fetch_calls += 1
        return FETCH

    def predicted(self):
        return None

    def draft_metrics(self) -> dict:
        return {"draft": "n-gram lookup", "ngram_sizes": f"{self.sizes.start}..{self.sizes.stop - 1}",
                "draft_device_bytes": 0, "lookup_match_rate": self.matches / self.lookups if self.lookups else None}

    def metrics(self):
        m = super().metrics()
        m.update({"host_calls": self.host_calls, "fetch_calls": self.fetch_calls})
        return m


__all__ = ["NgramIndex", "SpecNgram"]
