"""The lm-eval model type ``specterbench``: lm-eval tasks scored through the offloaded engine and a strategy.

    specterbench-lm-eval --model specterbench \\
        --model_args model=tiny-mixtral,strategy=specter,budget=50% --tasks shakespeare_scramble --device cpu

``model_args``:

- ``model``     a registered specterbench model (``specterbench list``)
- ``strategy``  a registered strategy, ``reference`` (the target with every expert resident) or ``draft``
                (the 4-bit self-draft alone: the target with its routed experts quantized, no offloading)
- ``budget``    device bytes for experts: ``50%``, ``0.5`` or ``120MB`` (default 50%; ignored by
                ``reference`` and ``draft``, and by strategies with a fixed budget such as ``resident``)
- ``profile``, ``clock``  the modeled clock's hardware profile (default ``a100-40g-pcie4``) or
                ``clock=measured`` (CUDA events on a GPU, host wall time elsewhere)
- ``max_length``, ``max_gen_toks``  context window (default: the model's) and default generation length
- ``threads``   torch host threads (default 1, as ``specterbench run``); ``progress=false`` hides the bars
- anything else is a strategy option (``k=4``, ``bits=8``); ``draft`` takes ``bits``, ``quant_type``,
  ``blocksize``

Log-likelihoods (``loglikelihood``, ``loglikelihood_rolling``) are target forward passes through the
engine with the strategy managing the expert cache; ``generate_until`` decodes greedily through the
strategy's own :meth:`~specterbench.Strategy.generate`, so a speculative strategy's draft-and-verify path is
what gets scored. Requests are scored one at a time (batch size 1).

Why a wrapper command: lm-eval 0.4.x finds model types only in its own ``lm_eval.models`` table — it has
no entry-point group for third-party models, and ``--include_path`` YAML ``!function`` modules are
imported only after the model is built. ``specterbench-lm-eval``
registers this model type and then runs lm-eval's own command line with the same arguments; it adds
``--include_path <shipped tasks>`` when none is given. See docs/eval.md.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry, register_model

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.progress import is_quiet
from specterbench.bench.resident import ReferenceStrategy
from specterbench.bench.runner import make_clock
from specterbench.engine.dense_copy import dense_spec, shared_dense
from specterbench.engine.draft import QuantSpec, shared_quantized
from specterbench.engine.engine import Engine
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.quant_spec import draft_label
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.errors import BudgetError, UsageError
from specterbench.plugins.host import get_host
from specterbench.quality.scoring_engine import DEFAULT_PROFILE, RouterMarginProbe, calibrate, load_engine
from specterbench.strategy import Request, RoutingCalibration

log = logging.getLogger(__name__)

MODEL_TYPE = "specterbench"
REFERENCE, DRAFT = "reference", "draft"
DEFAULT_MODEL = "tiny-random-mixtral"
DEFAULT_BUDGET = "50%"
DRAFT_OPTIONS = ("bits", "quant_type", "blocksize", "quantizer", "dense_bits")
_LM_EVAL_INJECTED = ("trust_remote_code",)  # model_args lm-eval adds on its own


class SpecterbenchLM(TemplateLM):
    """An lm-eval ``LM`` backed by a specterbench :class:`Engine` and one strategy (or reference / draft)."""

    def __init__(self, model: str = DEFAULT_MODEL, strategy: str = REFERENCE, budget=DEFAULT_BUDGET,
                 profile: str = DEFAULT_PROFILE, clock: str = "modeled", max_length=None, max_gen_toks=256,
                 device=None, batch_size=None, max_batch_size=None, engine: Engine | None = None,
                 calibration: RoutingCalibration | None = None, progress=True, threads=1, decode=None, **options):
        super().__init__()

        for key in _LM_EVAL_INJECTED:
            options.pop(key, None)
        if str(batch_size or 1) not in ("1", "auto"):
            log.warning("specterbench scores one request at a time; batch_size=%s is ignored", batch_size)
        if threads:
            torch.set_num_threads(int(threads))  # as the runner: 1 keeps tiny models from thrashing the host
        self.host = get_host()
        self.variant = str(strategy)
        self.budget_text = str(budget)
        self.profile = str(profile)
        self.clock_kind = str(clock)
        if self.clock_kind not in ("modeled", "measured"):
            raise UsageError(f"unknown clock {clock!r}; use 'modeled' or 'measured'")
        self.engine = engine if engine is not None else load_engine(str(model), str(device or "cpu"), self.host)
        self._device = self.engine.device
        self.tokenizer = self.engine.tokenizer
        self._max_length = int(max_length) if max_length else self._model_max_length()
        self._max_gen_toks = int(max_gen_toks)
        self._calibration = calibration
        self._requests = 0

        # generate_until: greedy unless asked (lm-eval's exact-match tasks score greedy continuations); a
        # DecodeSetting, its dict, or "greedy"/"sample"
        if isinstance(decode, str):
            decode = DecodeSetting(mode=decode)
        self.decode = decode if isinstance(decode, DecodeSetting) else DecodeSetting.from_dict(decode) \
            if decode else GREEDY

        self.progress = str(progress).lower() not in ("false", "0", "no") and not is_quiet()
        #: the reference's smallest router top-k margin per scored request (lm-eval's arguments), where its routing
        #: came near a tie (:mod:`specterbench.engine.numerics`); filled by the reference variant only
        self.router_margins: dict[tuple, float] = {}
        self._setup(options)

    # ---- setup -------------------------------------------------------------------------------------
    def _setup(self, options: dict) -> None:

        engine = self.engine
        total = engine.total_expert_bytes
        self.draft = self.draft_dense = None
        self.lossless = True
        if self.variant in (REFERENCE, DRAFT):
            allowed = DRAFT_OPTIONS if self.variant == DRAFT else ()
            unknown = sorted(set(options) - set(allowed))
            if unknown:
                raise UsageError(f"{self.variant!r} takes no option(s) {', '.join(unknown)}; it accepts: "
                                 f"{', '.join(allowed) or 'none'}")
            self.strategy = RouterMarginProbe() if self.variant == REFERENCE else ReferenceStrategy()
            self.budget_bytes = total
            engine.configure(self.strategy, total, HostWallClock())
            if self.variant == REFERENCE:
                self.strategy.prepare(engine)
            else:

                spec = QuantSpec.from_options(options)  # one parser, one-line errors (bits, group, quantizer)
                dense = dense_spec(options.get("dense_bits", 16))  # the draft's own attention/shared/head copy
                # the same quantized copies a speculative strategy with this spec drafts with
                self.draft = shared_quantized(engine, spec)
                self.draft_dense = shared_dense(engine, dense)
                self.draft_label, self.draft_spec = draft_label(self.draft.spec, dense), self.draft.spec
                self.lossless = False
            return
        cls = self.host.strategies().get(self.variant)
        if cls.uses_reference_trace:
            raise UsageError(f"strategy {self.variant!r} needs the recorded routing of each request before it "
                             f"runs (it is a bound, not a strategy a model can be evaluated with)")
        if cls.fixed_budget_fraction is not None:
            nbytes = int(cls.fixed_budget_fraction * total)
        else:
            nbytes = parse_budget(self.budget_text).resolve(total)
        if nbytes > total:
            raise BudgetError(f"budget {self.budget_text} = {nbytes} bytes is above all expert bytes of "
                              f"{engine.name} ({total}); use at most 100%")
        self.budget_bytes = nbytes
        self.lossless = bool(cls.lossless)
        strategy = cls(**options)
        config = BenchConfig(models=(engine.name,), strategies=(self.variant,), budgets=(), profile=self.profile,
                             clock=self.clock_kind)
        if self.clock_kind == "modeled":
            self.host.profiles().entry(self.profile)  # did-you-mean on a typo
        calibration = None
        if cls.uses_calibration:
            if self._calibration is None:
                self._calibration = calibrate(engine, self.host)
            calibration = self._calibration
        engine.configure(strategy, nbytes, make_clock(config, self.host, engine))
        strategy.prepare(engine, calibration)
        self.strategy = strategy

    @property
    def calibration(self) -> RoutingCalibration | None:
        """The calibration this model profiled with (reuse it for the next strategy on the same engine)."""
        return self._calibration

    def _model_max_length(self) -> int:
        config = self.engine.model.config
        n = getattr(config, "max_position_embeddings", None) or 2048
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tok_max, int) and 0 < tok_max < n:
            n = tok_max
        return int(n)

    def _ensure_active(self) -> None:
        """Engines are shared between LM objects (one per strategy); refuse to run on another's cache."""
        if self.engine.strategy is not self.strategy:
            raise UsageError(f"the engine of {self.engine.name!r} was reconfigured for another strategy after "
                             f"this lm-eval model ({self.variant}) was built; build one model per evaluation")

    # ---- what lm-eval asks -------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        tok = self.tokenizer
        for attr in ("eos_token_id", "bos_token_id"):
            value = getattr(tok, attr, None)
            if value is not None:
                return int(value)
        return int(tok.encode("\n")[0])  # byte-level tokenizers of the random seam-test models have no EOS

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return f"specterbench-{self.engine.name}"

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        try:
            return list(self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)))
        except TypeError:  # a plain tokenizer without the keyword (ByteTokenizer)
            return list(self.tokenizer.encode(string))

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens))

    def get_model_info(self) -> dict:
        """Recorded by lm-eval in the results' ``config`` (called after the evaluation)."""
        engine, stats = self.engine, self.engine.stats
        info = {
            "specterbench_model": engine.name,
            "specterbench_variant": self.variant,
            "lossless": self.lossless,
            "budget_bytes": self.budget_bytes,
            "budget_fraction": self.budget_bytes / engine.total_expert_bytes,
            "total_expert_bytes": engine.total_expert_bytes,
            "ledger_h2d_bytes": stats.h2d_bytes,
            "hits": stats.hits,
            "misses": stats.misses,
        }
        if self.draft is not None:
            info["draft_quant"] = self.draft_label
            info["draft_device_bytes"] = self.draft.nbytes + (self.draft_dense.nbytes if self.draft_dense else 0)
            info["draft_bits_per_weight"] = round(self.draft_spec.bits_per_weight(), 3)
        else:
            info["strategy_device_bytes"] = self.strategy.device_bytes(engine)
        return info

    # ---- scoring -----------------------------------------------------------------------------------
    def _logits(self, ids: list[int]) -> torch.Tensor:
        """All-position logits [T, V] of one fresh forward over ``ids``."""
        self._ensure_active()
        engine = self.engine
        kv = engine.new_kv_cache()
        x = torch.tensor([ids], dtype=torch.long)  # [1, T]
        if self.draft is not None:
            out = engine.forward(x, kv, all_logits=True, experts=self.draft, dense=self.draft_dense)
            self.draft.routing.clear()  # it records every call; nobody reads it here
            return out
        self._requests += 1
        engine.begin_request(Request(f"lm-eval-{self._requests}", tuple(ids), 1))
        return engine.forward(x, kv, all_logits=True)

    def _probe_start(self) -> None:
        if isinstance(self.strategy, RouterMarginProbe):
            self.strategy.margin = math.inf

    def _probe_end(self, key) -> None:
        """The reference's smallest router top-k margin while scoring the request ``key`` (lm-eval's arguments)."""
        if isinstance(self.strategy, RouterMarginProbe) and key is not None:
            self.router_margins[tuple(key)] = min(self.strategy.margin, self.router_margins.get(tuple(key), math.inf))

    def score_tokens(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Log-probability of ``continuation`` after ``context`` and whether it is the greedy continuation."""
        ids = (context + continuation)[-(self.max_length + 1):]
        n = min(len(continuation), len(ids) - 1)
        logits = self._logits(ids[:-1])[-n:]  # [n, V]
        logp = F.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(ids[-n:], dtype=torch.long)  # [n]
        total = float(logp.gather(-1, target[:, None]).sum())
        greedy = bool((logp.argmax(-1) == target).all())
        return total, greedy

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        from tqdm import tqdm

        out = []
        quiet = disable_tqdm or not self.progress
        for cache_key, context, continuation in tqdm(requests, disable=quiet, desc="specterbench ll"):
            self._probe_start()
            result = self.score_tokens(list(context), list(continuation))
            self._probe_end(cache_key)
            if cache_key is not None:
                self.cache_hook.add_partial("loglikelihood", cache_key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from tqdm import tqdm

        out = []
        for req in tqdm(requests, disable=disable_tqdm or not self.progress, desc="specterbench rolling"):
            (string,) = req.args
            self._probe_start()
            windows = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            total = sum(self.score_tokens(list(ctx), list(cont))[0] for ctx, cont in windows)
            self._probe_end((string,))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    # ---- generation --------------------------------------------------------------------------------
    def generate_tokens(self, context: list[int], max_new_tokens: int) -> list[int]:
        """Tokens after ``context`` under ``self.decode``: through the strategy's decoding, or the draft alone.
        Request ids count generation requests in order, so every strategy samples a document with one noise."""
        self._ensure_active()
        engine = self.engine
        self._requests += 1
        request = Request(f"lm-eval-{self._requests}", tuple(context), max_new_tokens, decode=self.decode)
        if self.draft is None:
            engine.begin_request(request)
            return list(self.strategy.generate(engine, request))
        sampler, position = request.sampler(), len(context)
        kv = engine.new_kv_cache()
        logits = engine.forward(torch.tensor([context]), kv, experts=self.draft, dense=self.draft_dense)
        tokens = [sampler.pick(logits[-1], position)]
        while len(tokens) < max_new_tokens:
            logits = engine.forward(torch.tensor([tokens[-1:]]), kv, experts=self.draft, dense=self.draft_dense)
            tokens.append(sampler.pick(logits[-1], position + len(tokens)))
        self.draft.routing.clear()
        return tokens

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        out = []
        warned = False
        for req in tqdm(requests, disable=disable_tqdm or not self.progress, desc="specterbench generate"):
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            until = kwargs.pop("until", None)
            until = [until] if isinstance(until, str) else list(until or [])
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            if (kwargs.get("do_sample") or float(kwargs.get("temperature", 0) or 0) > 0) and not warned:
                log.warning("specterbench decodes greedily (lossless strategies are defined against greedy "
                            "decoding); sampling arguments %s are ignored", kwargs)
                warned = True
            budget = max(1, self.max_length - max_new)
            ids = self.tok_encode(context)[-budget:] or [self.prefix_token_id]
            tokens = self.generate_tokens(ids, max_new)
            eot = self.eot_token_id
            if eot in tokens and getattr(self.tokenizer, "eos_token_id", None) is not None:
                tokens = tokens[: tokens.index(eot)]
            text = self.tok_decode(tokens)
            for stop in until:
                if stop:
                    text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out


def _register() -> None:
    """Register the model type once per process (a second import of this module, as a test's fresh import, finds
    it registered by the same class path and leaves it)."""
    if MODEL_TYPE in model_registry.keys():
        current = model_registry.get(MODEL_TYPE)
        if (current.__module__, current.__qualname__) == (SpecterbenchLM.__module__, SpecterbenchLM.__qualname__):
            return
    register_model(MODEL_TYPE)(SpecterbenchLM)


_register()
