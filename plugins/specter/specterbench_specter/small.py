"""Speculation with a separate small draft: ``spec-small``, a dense draft model verified as Specter verifies.

The system it stands for is llama.cpp's ``-md`` (``--model-draft``) and vLLM's draft-model speculator: a small dense
model of the target's family, sharing its tokenizer, proposes up to ``k`` tokens greedily from its own KV cache,
stopping before a token whose probability under the draft is below ``p_min`` (llama.cpp's ``--draft-p-min`` and its
default; ``p_min=0``: always ``k``, as vLLM's fixed ``num_speculative_tokens``); the target verifies them in one
forward pass and keeps the agreeing prefix plus its own next token, so the output is the target's under greedy and
sampled decoding. The draft (``draft=auto``: the one sharing the target's
tokenizer) is ``tiny-draft`` on the stand-ins, trained by the project on their corpus with their tokenizer, and a
seeded random one on the ``tiny-random-*`` test models (:mod:`specterbench.catalog.drafts`); it really runs, on the
engine's device.

The draft's KV cache holds every position the draft has read; after a verification it is cropped to the accepted
prefix, and the next window first feeds it what it has not read (the target's own token, and after a plain step
more). Its weights and that KV cache (at the draft's full context) sit on the device: the strategy's expert cache
shrinks by them. The cache and the verification are Specter's without its lookahead (a dense draft routes nothing):
the calibration's popular experts resident, transients by recency, a missed expert computed on the host when that
is predicted to finish first (``host=off``: always fetched).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import torch
from transformers import DynamicCache

from specterbench.catalog import drafts
from specterbench.engine.compat import cache_kwarg
from specterbench.engine.costs import CostModel
from specterbench.engine.geometry import PRICED_DTYPE_BYTES, Geometry
from specterbench.errors import BudgetError, ModelError, UsageError
from specterbench.strategy import FETCH, ON_HOST

from .decoding import SpeculativeDecoding, parse_window
from .eviction import CacheOrder

#: a proposal needs at least this probability under the draft, else the window stops before it: llama.cpp's default
#: (``common_speculative_params::p_min`` in common/speculative.h, ``--draft-p-min``)
P_MIN = 0.75
#: under a projection the draft is priced as a dense draft of the projected model's family at this size, with the
#: projected model's vocabulary: 24 layers, hidden 1024, MLP 5632, 16 heads of 64 (4 KV heads) — about 0.5B
#: parameters with Mixtral's 32000-token vocabulary, the size of the small drafts served beside such targets
PROJECTED_DRAFT = dict(hidden=1024, dense_intermediate=5632, layers=24, heads=16, kv_heads=4, head_dim=64)


@lru_cache(maxsize=4)
def _draft_model(name: str, dtype: torch.dtype, device: str):
    """The draft's weights, loaded once per process and device (eval mode, never written to)."""
    model, tokenizer = drafts.load(name, dtype=dtype)
    return model.to(device), tokenizer


def draft_geometry(name: str, config) -> Geometry:
    """A dense draft's own geometry, read off its config (no experts: every layer is a dense layer)."""
    return Geometry(name=name, hidden=config.hidden_size, expert_intermediate=0, num_experts=0, top_k=0,
                    moe_layers=0, layers=config.num_hidden_layers, heads=config.num_attention_heads,
                    kv_heads=config.num_key_value_heads,
                    head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                    vocab=config.vocab_size, dense_intermediate=config.intermediate_size)


def priced_draft_geometry(own: Geometry, target: Geometry) -> Geometry:
    """The draft geometry the clock prices: its own at the target's own geometry; under a projection the stated
    dense draft of the projected model's family (:data:`PROJECTED_DRAFT`, the projected model's vocabulary)."""
    if target.projected_from is None:
        return own
    return replace(own, name=f"{target.name}-draft", vocab=target.vocab, **PROJECTED_DRAFT)


def geometry_params(g: Geometry) -> int:
    """Weights of a dense geometry: its layers and one tied embedding / head (norms not counted)."""
    return g.layers * g.layer_dense_params(moe=False) + g.vocab * g.hidden


class SpecSmall(CacheOrder, SpeculativeDecoding):
    name = "spec-small"
    version = "1"
    description = ("speculation with a separate small dense draft (tiny-draft, its own KV cache, its bytes on the "
                   "device): up to K greedy proposals, the target verifies in one pass; Specter's residents and "
                   "host path for misses")
    plan_on = False  # a dense draft routes nothing: CacheOrder keeps no draft-predicted experts
    k_default = 8
    max_batch = 1
    max_batch_reason = ("its separate draft model keeps one request's own KV cache (charged for one request's "
                        "positions); its windows are not batched")

    @classmethod
    def option_names(cls):
        return ("k", "p_min", "draft", "host")

    @classmethod
    def parse_depth(cls, value):
        return parse_window(value, cls.k_default, "the draft")

    @staticmethod
    def parse_p_min(value) -> float:
        try:
            p = float(value)
        except (TypeError, ValueError):
            p = -1.0
        if not 0.0 <= p < 1.0:
            raise UsageError(f"option p_min={value!r} is invalid: use the least draft probability a proposal needs, "
                             f"from 0 (always propose k) to below 1")
        return p

    @classmethod
    def validate_options(cls, options: dict) -> None:
        cls.reject_unknown_options(options)
        cls.parse_depth(options.get("k", cls.k_default))
        if str(options.get("host", "auto")) not in ("auto", "off"):
            raise UsageError(f"option host={options.get('host')!r} is invalid: use one of auto, off")
        cls.parse_p_min(options.get("p_min", P_MIN))
        if str(options.get("draft", "auto")) not in ("auto", *drafts.DRAFT_MODELS):
            raise UsageError(f"option draft={options.get('draft')!r} is invalid: use auto (the draft that shares the "
                             f"target's tokenizer) or one of {', '.join(drafts.DRAFT_MODELS)}")

    # ---- the draft's bytes and prices ------------------------------------------------------------------
    @classmethod
    def draft_sizes(cls, engine, options: dict) -> dict:
        """The draft this cell would run on ``engine``: its priced geometry, weights and KV bytes there, and what
        they charge against the budget (the budget's bytes are the engine's own experts': under a projection the
        priced draft takes the same share of them as of the projected model's expert bytes)."""
        requested = str(options.get("draft", "auto"))
        for name in drafts.DRAFT_MODELS if requested == "auto" else (requested,):
            model, tokenizer = _draft_model(name, engine.compute_dtype, str(engine.device))
            if drafts.same_tokenizer(tokenizer, engine.tokenizer):
                break
        else:
            which = "any draft's" if requested == "auto" else f"draft {requested}'s"
            raise ModelError(f"{engine.name}'s tokenizer is not {which} ({cls.name} proposes token ids the target "
                             f"must read as the draft meant them): run it on a stand-in (tiny-mixtral, tiny-qwen-moe, "
                             f"tiny-deepseek) or a tiny-random-* model")
        own = draft_geometry(name, model.config)
        priced = priced_draft_geometry(own, engine.geometry)
        positions = int(model.config.max_position_embeddings)
        kv = positions * priced.layers * 2 * priced.kv_heads * priced.head_dim * PRICED_DTYPE_BYTES
        if priced is own:
            params = sum(p.numel() for p in model.parameters())
            weights = params * PRICED_DTYPE_BYTES
            charged = weights + kv
        else:
            params = geometry_params(priced)
            weights = params * PRICED_DTYPE_BYTES
            charged = math.ceil((weights + kv) * engine.total_expert_bytes / engine.geometry.all_expert_bytes)
        return {"name": name, "model": model, "own": own, "priced": priced, "positions": positions,
                "priced_params": params, "weight_bytes": weights, "kv_bytes": kv, "charged": charged}

    @classmethod
    def check_budget(cls, engine, budget_bytes: int, options: dict) -> None:
        """Refuse, in one line naming the smallest budget that works, a budget that cannot hold the draft (weights
        and KV cache) plus the experts one forward needs; refuse a target whose tokenizer is not the draft's."""
        sizes = cls.draft_sizes(engine, options)
        need = sizes["charged"] + engine.min_budget_bytes()
        if budget_bytes < need:
            pct = math.ceil(1000 * need / engine.total_expert_bytes) / 10
            raise BudgetError(f"budget {budget_bytes} bytes cannot hold {cls.name}'s draft {sizes['name']} "
                              f"({sizes['charged']} bytes: weights and a KV cache of {sizes['positions']} positions) "
                              f"plus the top-{engine.top_k} experts of one layer; the smallest budget that works is "
                              f"{pct:.1f}% ({need} bytes)")

    def __init__(self, **options):
        super().__init__(**options)
        self.host_option = str(options.get("host", "auto"))
        self.p_min = self.parse_p_min(options.get("p_min", P_MIN))
        self.pending: list[int] = []
        self.window_start = self.fed = 0
        self.sizes: dict | None = None
        self.dkv = None
        self.dkv_len = 0

    def fit_budget(self, engine, budget_bytes: int) -> None:
        """One draft, no fallback: ``check_budget`` refuses a budget it does not fit."""

    def draft_bytes(self, engine) -> int:
        return self.draft_sizes(engine, self.options)["charged"]

    def attach_draft(self, engine) -> None:
        self.draft = self.dense = None  # no self-draft copies: the separate model proposes
        self.sizes = self.draft_sizes(engine, self.options)
        self.draft_model = self.sizes["model"]
        self.draft_kwarg = cache_kwarg(self.draft_model)
        # the draft's forward on the compute stream, at its priced geometry on the engine's profile
        self.draft_costs = CostModel(engine.clock.costs.profile, self.sizes["priced"])

    def attach(self, engine):
        super().attach(engine)
        self.host_path = self.host_option == "auto" and engine.clock.costs.host is not None
        self.host_calls = self.fetch_calls = 0
        self.transients: dict = {}
        self.transient_heap: list = []

    def prepare(self, engine, calibration=None):
        self.load_residents(engine, calibration)
        self.reset_metrics()
        self.host_calls = self.fetch_calls = 0

    def on_warmup_end(self):
        super().on_warmup_end()
        self.host_calls = self.fetch_calls = 0

    def on_request_start(self, request):
        super().on_request_start(request)
        self.dkv = DynamicCache(config=self.draft_model.config)
        self.dkv_len = 0

    # ---- decoding --------------------------------------------------------------------------------------
    def choose_k(self, remaining: int) -> int:
        """The draft proposes here, before the window: up to ``k`` tokens (one fewer than the tokens left: the
        verification adds its own), stopping before the first whose probability under the draft is below ``p_min``
        (llama.cpp's ``--draft-p-min``); none proposed: a plain step. Its forwards count as draft time."""
        n = min(self.k, remaining - 1)
        self.pending = []
        if n < 1:
            return 0
        clock = self.engine.clock
        t0 = clock.now()
        self.window_start = len(self.seq)
        self.fed = 0  # proposals the draft has read (its KV cache holds them)
        token, p = self._draft_forward(self.engine, self.seq[self.dkv_len:])
        while p >= self.p_min:
            self.pending.append(token)
            if len(self.pending) == n:
                break
            token, p = self._draft_forward(self.engine, [token])
            self.fed += 1
        self.draft_s += clock.now() - t0
        return len(self.pending)

    @torch.inference_mode()
    def _draft_forward(self, engine, ids: list[int]) -> tuple[int, float]:
        """Feed ``ids`` to the draft over its KV cache; its greedy next token and that token's probability. The
        forward is charged on the compute stream as a dense model at the priced geometry (its layers, head and the
        on-device pick)."""
        context = self.dkv_len + len(ids)
        costs = self.draft_costs
        for _ in range(costs.geometry.layers):
            engine.charge(costs.dense_layer(len(ids), context, moe=False))
        engine.charge(costs.head(1))
        engine.charge(costs.sample(1))
        out = self.draft_model(input_ids=torch.tensor([ids], device=engine.device), use_cache=True,
                               logits_to_keep=1, **{self.draft_kwarg: self.dkv})
        self.dkv_len = context
        probs = out.logits[0, -1].float().softmax(-1)
        token = int(probs.argmax())
        return token, float(probs[token])

    def propose(self, engine, sampler, seq, kv, k) -> list[int]:
        """What the draft proposed in :meth:`choose_k`."""
        return self.pending[:k]

    def accept(self, proposals: list[int], target: list[int]) -> int:
        a = super().accept(proposals, target)
        keep = self.window_start + min(a, self.fed)  # what the draft read that the target kept
        if self.dkv_len > keep:
            self.engine.rollback(self.dkv, keep)
            self.dkv_len = keep
        return a

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
        s = self.sizes
        priced = s["priced"]
        return {"draft": s["name"], "draft_p_min": self.p_min,
                "draft_params": sum(p.numel() for p in self.draft_model.parameters()),
                "draft_priced_as": (f"{priced.name}: dense, {priced.layers} layers, hidden {priced.hidden}, MLP "
                                    f"{priced.dense_intermediate}, vocab {priced.vocab}, bf16"),
                "draft_priced_params": s["priced_params"], "draft_kv_positions": s["positions"],
                "draft_device_bytes": s["charged"]}

    def metrics(self):
        m = super().metrics()
        m.update({"host_calls": self.host_calls, "fetch_calls": self.fetch_calls})
        return m


__all__ = ["SpecSmall", "draft_geometry", "priced_draft_geometry"]
