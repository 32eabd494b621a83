"""The runner: a grid of cells (model × strategy × budget × repeat), each decoded over a workload, as rows.

For each model it records the reference once — greedy tokens and routing trace of every prompt with all
experts resident — then runs every cell, checks lossless strategies token for token against the reference,
and appends one row per cell to ``rows.jsonl`` as soon as the cell ends.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch

from specterbench.bench import batching
from specterbench.bench import prompts as prompts_axis
from specterbench.bench.budget import Budget
from specterbench.bench.cell_metrics import TokenNumerics, check_tokens, fill_metrics, peak_rss_bytes, samples_of
from specterbench.bench.checks import check_context, check_device_memory, check_workload_size
from specterbench.bench.config import BenchConfig
from specterbench.bench.device_memory import resolve_cards
from specterbench.bench.failures import describe_failure, where
from specterbench.bench.progress import CellProgress
from specterbench.bench.resident import WARMUP_TEXT, Reference, reference_strategy, warns_warmup_metrics
from specterbench.bench.workloads import load_workload
from specterbench.engine.costs import CostModel
from specterbench.engine.cuda_clock import CudaClock, HostPool
from specterbench.engine.draft import drafts_allocated_bytes
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.numerics import NumericsGuide, margin_tolerance
from specterbench.engine.precision import quantize_model
from specterbench.errors import BudgetError, EngineViolation, SpecterbenchError, UsageError
from specterbench.plugins.host import PluginHost
from specterbench.runfiles.reference import write_reference
from specterbench.runfiles.results import ResultRow, RowWriter, read_rows, strategy_label
from specterbench.runfiles.rundir import run_identity
from specterbench.strategy import Request, RoutingCalibration


def make_clock(config: BenchConfig, host: PluginHost, engine: Engine, host_pool=None):
    """The cell's clock. A measured one prices with the run's ``--profile`` and host profile too, so that its
    strategies decide as they would on the modeled clock; ``host_pool``: the run's one pool for host experts."""
    profile, host_profile = host.profiles().get(config.profile), host.host_profiles().get(config.host_profile)
    if config.clock == "modeled":
        return ModeledClock(profile, engine.geometry, host_profile)
    costs = CostModel(profile, engine.geometry, host_profile)
    if engine.device.type == "cuda":  # pragma: no cover - needs CUDA
        return CudaClock(engine.device, costs, host_pool=host_pool)
    return HostWallClock(costs)


def encode_prompts(engine: Engine, texts: list[tuple[str, str]], limit: int) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for pid, text in texts:
        ids = list(engine.tokenizer.encode(text))[:limit]
        if not ids:
            raise UsageError(f"prompt {pid!r} encodes to no tokens")
        out.append((pid, tuple(ids)))
    return out


def load_prompts(name: str, n: int) -> list[tuple[str, str]]:

    items = load_workload(name)
    return [(str(item["id"]), item["text"]) for item in items[:n]]


class Runner:
    def __init__(self, host: PluginHost, config: BenchConfig, run_dir: Path, *, resume: bool = False,
                 progress: Callable[[str], None] | None = None, env: dict | None = None):
        self.host = host
        self.config = config
        self.run_dir = Path(run_dir)  # created on the first row: a sweep worker never touches the driver's folder
        self._writer: RowWriter | None = None
        self.progress = progress or (lambda msg: None)
        self.env = env if env is not None else host.environment()
        self.done: set[str] = set()
        if resume and (self.run_dir / "rows.jsonl").exists():
            self.done = {r.cell for r in read_rows(self.run_dir / "rows.jsonl", on_error="skip", allow_empty=True)
                         if r.status != "error"}
        self.rows: list[ResultRow] = []
        self._host_pool: HostPool | None = None  # one pool for host experts per run (CUDA)
        self.contexts: dict[str, int] = {}  # prompt id -> its leading context tokens (--depth), for its requests
        self.budgets = config.budgets  # a card's memory resolved per model (device_memory.resolve_cards)

    @property
    def writer(self) -> RowWriter:
        if self._writer is None:
            self._writer = RowWriter(self.run_dir / "rows.jsonl")
        return self._writer

    # ---- grid --------------------------------------------------------------------------------------
    def cells(self, model: str):
        """``(key, strategy, class, budget, repeat)`` of each cell of ``model``, each key once (a strategy or budget
        named twice is one cell: it is run and stored once)."""
        cfg = self.config
        seen: set[str] = set()
        for sname in cfg.strategies:
            cls = self.host.strategies().get(sname)
            budgets = ([Budget("100%", fraction=cls.fixed_budget_fraction)]
                       if cls.fixed_budget_fraction is not None else cfg.budgets)
            label = strategy_label(sname, cfg.strategy_options.get(sname))
            geometry = cfg.geometry_for(self.host.models().get(model)) or "own"
            for budget in budgets:
                for repeat in range(cfg.repeats):
                    key = "|".join([model, geometry, label, budget.key(), cfg.workload, cfg.profile,
                                    cfg.clock, str(cfg.tokens), str(cfg.prompts), str(cfg.seed), str(repeat)]
                                   + ([] if cfg.decode.mode == "greedy" else [cfg.decode.label])
                                   + ([cfg.precision.label()] if cfg.precision.quantized else []))
                    if key not in seen:
                        seen.add(key)
                        yield key, sname, cls, budget, repeat

    def run(self) -> list[ResultRow]:
        self.config.validate(self.host)
        if self.config.device.startswith("cuda"):  # pragma: no cover - needs CUDA
            self._host_pool = HostPool()
        try:
            return self._run()
        finally:
            if self._host_pool is not None:  # pragma: no cover - needs CUDA
                self._host_pool.close()
                self._host_pool = None

    def _run(self) -> list[ResultRow]:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads)
        texts = load_prompts(cfg.workload, cfg.prompts)
        check_workload_size(cfg.workload, cfg.prompts, texts)  # before any model loads
        plan = {m: [c for c in prompts_axis.shaped_cells(self, m, batching.batch_cells(self, m))
                    if c[0] not in self.done] for m in dict.fromkeys(cfg.models)}
        eta = CellProgress(sum(len(todo) for todo in plan.values()), self.progress)
        for model_name, todo in plan.items():  # a model named twice runs once
            if not todo:
                continue
            engine = self.load_engine(model_name)
            calibration = None
            for shape in dict.fromkeys(c[-1] for c in todo):  # each prompt length and depth: its prompts, reference
                calibration = self._run_shape(engine, model_name, texts, shape, [c for c in todo if c[-1] == shape],
                                              calibration, eta)
        return self.rows

    def _run_shape(self, engine, model_name, texts, shape, todo, calibration, eta):
        """The cells of one prompt length and depth: their prompts, checks, reference, then each cell's row.
        Returns the model's routing calibration (made once, by the first cell that needs it)."""
        cfg = self.config
        prompts = prompts_axis.prompts_for(engine, encode_prompts(engine, texts, cfg.max_prompt_tokens),
                                           load_prompts(cfg.workload, 10**6), cfg.prompts, shape, cfg.tokens)
        if cfg.batches != (1,):  # a batch decodes requests of one length
            prompts = batching.cut_to_shortest(prompts)
        check_context(engine, prompts, cfg.tokens)
        self.budgets = resolve_cards(cfg.budgets, engine, max(len(ids) for _, ids in prompts), cfg.tokens, cfg)
        self.check_budgets(engine)
        batching.check_fit(self, engine, prompts)
        self.check_device_memory(engine, prompts)  # before minutes of reference and calibration passes
        self.contexts = {pid: shape.depth for pid, _ in prompts}
        reference = self.record_reference(engine, prompts)
        write_reference(self.run_dir, model=model_name, workload=cfg.workload + shape.suffix, decode=cfg.decode,
                        prompts=prompts, reference=reference, tokenizer=engine.tokenizer, top_k=engine.top_k)
        resolved = {b.key(): b for b in self.budgets}
        for key, sname, cls, budget, repeat, batch, _ in todo:
            budget = resolved.get(budget.key(), budget)
            if cls.uses_calibration and calibration is None and not batching.unsupported_class(cls, batch):
                calibration = self.calibrate(engine)
            eta.start(f"{model_name} · {strategy_label(sname, cfg.strategy_options.get(sname))} @ {budget.text}"
                      + (f" (repeat {repeat})" if cfg.repeats > 1 else "")
                      + (f" × batch {batch}" if cfg.batches != (1,) else "") + shape.progress)
            row = self.run_cell(engine, key, sname, cls, budget, repeat, prompts, reference, calibration,
                                batch=batch, shape=shape)
            self.writer.append(row)
            self.rows.append(row)
            self.host.pm.hook.specterbench_row_written(row=row)
        return calibration

    def load_engine(self, model_name: str) -> Engine:
        spec = self.host.models().get(model_name)
        model, tokenizer = spec.load()
        quantize_model(model, self.config.precision)  # the reference and every cell run the quantized model
        engine = Engine(model, name=model_name, device=self.config.device, tokenizer=tokenizer,
                        precision=self.config.precision)  # a quantized target's experts are packed as it is built
        geometry = self.config.geometry_for(spec)
        if geometry is not None:
            engine.geometry = project(engine.own_geometry, geometry)
        engine.set_precision(self.config.precision)
        return engine

    def cell_budgets(self, engine: Engine) -> list[tuple[str, int]]:
        """Every budget a cell of this run holds on the device, as (text, bytes): the run's budgets and the fixed
        ones of strategies like ``resident``."""
        total = engine.total_expert_bytes
        out = {b.text: b.resolve(total) for b in self.budgets if b.card_bytes is None or b.fraction is not None}
        for name in self.config.strategies:
            cls = self.host.strategies().get(name)
            if cls.fixed_budget_fraction is not None:
                b = Budget("100%", fraction=cls.fixed_budget_fraction)
                out[b.text] = b.resolve(total)
        return sorted(out.items(), key=lambda kv: kv[1])

    def reference_budget_bytes(self, engine: Engine) -> int | None:
        """The reference and calibration passes' cache on a GPU: the largest budget among the run's cells (None
        without cells: the smallest that streams)."""
        return max((n for _, n in self.cell_budgets(engine)), default=None)

    def check_device_memory(self, engine: Engine, prompts) -> None:
        """Before the long passes: the largest cell's budget, plus KV cache and activations, fits in the device
        memory left after the model's dense weights (one line naming the largest budget that fits otherwise)."""
        if engine.device.type != "cuda":
            return
        free, _ = torch.cuda.mem_get_info(engine.device)  # pragma: no cover - needs CUDA
        longest = max((len(ids) for _, ids in prompts), default=0)  # pragma: no cover
        check_device_memory(engine, self.cell_budgets(engine), longest, self.config.tokens, free)  # pragma: no cover

    def check_budgets(self, engine: Engine) -> None:
        """Every budget within the model's expert bytes and, for each strategy, at or above the least it can run
        with (:meth:`~specterbench.strategy.Strategy.min_budget`: one forward's top-k experts for most; nothing for
        those that compute every expert on the host): one line naming the strategy and the floor otherwise."""
        total = engine.total_expert_bytes
        for b in self.budgets:
            nbytes = b.resolve(total)
            if nbytes > total:
                raise BudgetError(f"budget {b.text} = {nbytes} bytes is above all expert bytes of {engine.name} "
                                  f"({total}); use at most 100% (the 'resident' strategy covers that case)")
        for name in self.config.strategies:  # each strategy's own floor (a draft it keeps), before any cell runs
            cls = self.host.strategies().get(name)
            if cls.fixed_budget_fraction is not None:
                continue
            options = dict(self.config.strategy_options.get(name, {}))
            floor = cls.min_budget(engine, options)
            for b in self.budgets:
                nbytes = b.resolve(total)
                if nbytes < floor:
                    able = [n for n in self.config.strategies if n != name
                            and self.host.strategies().get(n).min_budget(engine, {}) <= nbytes]
                    raise BudgetError(f"budget {b.text} = {nbytes} bytes is below what {name} needs on {engine.name} "
                                      f"({floor} bytes, {floor / total:.1%}: top-{engine.top_k} experts of a layer); "
                                      f"raise it, or drop {name} from this budget"
                                      + (f" ({', '.join(able)} can run it)" if able else ""))
                cls.check_budget(engine, nbytes, options)

    # ---- reference and calibration -----------------------------------------------------------------
    def _resident_pass(self, engine: Engine, prompts, tokens: int):
        strategy, nbytes = reference_strategy(engine, self.reference_budget_bytes(engine))
        engine.configure(strategy, nbytes, make_clock(dataclasses.replace(self.config, clock="measured"), self.host,
                                                      engine, self._host_pool))
        strategy.prepare(engine)
        out, traces = {}, {}
        for pid, ids in prompts:
            request = Request(pid, ids, tokens, decode=self.config.decode,
                              context_tokens=self.contexts.get(pid, 0))
            engine.begin_request(request)
            rec = engine.start_recording()
            sampler = request.sampler(record_margins=True)
            out[pid] = tuple(engine.decode(request, sampler))
            engine.stop_recording()
            traces[pid] = tuple(rec.trace)
            yield pid, out[pid], traces[pid], rec.counts, sampler.margins

    def record_reference(self, engine: Engine, prompts) -> Reference:
        """The reference of the measured ``prompts`` and of the warm-up prompt (see :meth:`warmup_prompt`)."""
        ref = Reference({}, {})
        ref.warmup = self.warmup_prompt(engine, prompts)
        for pid, toks, trace, _, margins in self._resident_pass(engine, [*prompts, ref.warmup], self.config.tokens):
            ref.tokens[pid], ref.traces[pid], ref.margins[pid] = toks, trace, margins
        return ref

    def warmup_prompt(self, engine: Engine, prompts) -> tuple[str, tuple[int, ...]]:
        """The warm-up request's prompt: the first calibration prompt that is not a measured one, under an id of
        its own (so its sampling noise is its own too). A warm-up on a measured prompt would let a learning
        strategy see that prompt before it is measured."""
        measured = {ids for _, ids in prompts}
        candidates = [(f"warmup:{self.config.calibration}:{pid}", text)
                      for pid, text in load_prompts(self.config.calibration, 10**6)] + [("warmup:text", WARMUP_TEXT)]
        for pid, ids in encode_prompts(engine, candidates, self.config.max_prompt_tokens):
            if ids not in measured:
                return pid, ids
        raise UsageError(f"every prompt of the calibration workload {self.config.calibration!r} is also measured; "
                         f"there is none left for the warm-up (run with --no-warmup)")

    def calibrate(self, engine: Engine) -> RoutingCalibration:
        """Routed-token counts per (layer, expert) over the calibration workload: prefill plus 16 new tokens."""
        cfg = self.config
        prompts = encode_prompts(engine, load_prompts(cfg.calibration, 10**6), cfg.max_prompt_tokens)
        sequences = tuple(c.clone() for _, _, _, c, _ in self._resident_pass(engine, prompts, 16))
        return RoutingCalibration(torch.stack(sequences).sum(0), tuple(ids for _, ids in prompts), sequences,
                                  cfg.decode)

    # ---- one cell ----------------------------------------------------------------------------------
    def run_cell(self, engine, key, sname, cls, budget, repeat, prompts, reference, calibration,
                 batch: int = 1, shape: prompts_axis.Shape = prompts_axis.Shape()) -> ResultRow:
        cfg = self.config
        total = engine.total_expert_bytes
        nbytes = budget.resolve(total)
        kv_priced, kv_charged = batching.charged_kv(self, engine, cls, budget, batch,
                                                     len(prompts[0][1]) + cfg.tokens)
        entry = self.host.strategies().entry(sname)
        row = ResultRow(
            run_id=run_identity(self.run_dir), cell=key, model=engine.name, geometry=engine.geometry.name,
            geometry_label=engine.geometry.label(), priced_total_expert_bytes=engine.geometry.all_expert_bytes,
            strategy=sname, strategy_version=str(cls.version),
            strategy_plugin=f"{entry.plugin.name} ({entry.plugin.distribution} {entry.plugin.version})",
            lossless_strategy=bool(cls.lossless), budget_bytes=nbytes, budget_fraction=nbytes / total,
            total_expert_bytes=total, profile=cfg.profile if cfg.clock == "modeled" else "-",
            clock=cfg.clock if (cfg.clock == "modeled" or engine.device.type == "cuda") else "host",
            workload=cfg.workload, prompts=len(prompts), new_tokens=cfg.tokens, seed=cfg.seed, repeat=repeat,
            decode=cfg.decode.to_dict(), precision=cfg.precision.label(), env=self.env)
        row.batch, row.prompt_tokens, row.depth_tokens = batch, shape.length, shape.depth
        if kv_charged:
            row.extra["kv_bytes"], row.extra["kv_bytes_priced"] = kv_charged, kv_priced
        if batching.unsupported(row, cls, batch):
            return row
        started = time.perf_counter()
        hooks = self.host.pm.hook
        measuring = False
        strategy = None
        try:
            options = cfg.strategy_options.get(sname, {})
            if options:
                row.extra["strategy_options"] = dict(options)
            if budget.plan is not None:  # a card's memory: how its bytes were spent
                row.extra["device_plan"] = budget.plan.as_dict(engine.geometry)
            strategy = cls(**options)
            engine.configure(strategy, nbytes - kv_charged, make_clock(cfg, self.host, engine, self._host_pool))
            engine.setup_graphs(cfg.cuda_graphs)
            row.strategy_device_bytes = strategy.device_bytes(engine)
            engine.cell_batch = batch  # a strategy that calibrates itself in prepare does so at the cell's batch
            strategy.prepare(engine, calibration if cls.uses_calibration else None)

            layers = int(engine.model.config.num_hidden_layers)
            temperature = cfg.decode.temperature if cfg.decode.mode == "sample" else None
            tolerance = margin_tolerance(engine.compute_dtype, layers, temperature)
            guides = {}  # per prompt: where a lossless strategy may take the reference's token at a near-tie

            def request(pid, ids):
                if cls.lossless and pid not in guides:
                    guides[pid] = NumericsGuide({len(ids) + i: t for i, t in enumerate(reference.tokens[pid])},
                                                reference.margins.get(pid) or {}, tolerance)
                return Request(pid, ids, cfg.tokens, reference.tokens[pid], reference.traces[pid], cfg.decode,
                               guides.get(pid), context_tokens=self.contexts.get(pid, 0))

            if cfg.warmup:
                pid, ids = reference.warmup  # a calibration prompt: no measured prompt is seen before it is measured
                engine.begin_warmup()
                engine.begin_request(request(pid, ids))
                strategy.generate(engine, request(pid, ids))
                row.warmup = samples_of(engine.samples)
                row.warmup["prompt"] = pid
                engine.end_warmup()  # engine counters and clock totals restart; the strategy's on_warmup_end
                if warns_warmup_metrics(cls, entry.plugin.name):
                    row.extra["metrics_include_warmup"] = True
            if engine.device.type == "cuda":  # pragma: no cover - needs CUDA
                torch.cuda.reset_peak_memory_stats(engine.device)
            hooks.specterbench_cell_start(cell=key, engine=engine)
            measuring = True
            held = drafts_allocated_bytes(engine)  # copies a strategy drops mid-cell still count at their peak
            outputs, all_samples, steps = batching.decode_cell(engine, strategy, prompts, request, batch)
            row.strategy_device_bytes_allocated = max(held, drafts_allocated_bytes(engine))
            fill_metrics(row, engine, strategy, all_samples,
                         [len(ids) - self.contexts.get(pid, 0) for pid, ids in prompts])
            batching.fill_batch_metrics(row, engine, steps, batch)
            check_tokens(row, outputs, reference, cls.lossless, TokenNumerics(
                dict(prompts), engine.compute_dtype, layers, cfg.decode,
                {pid: g.followed for pid, g in guides.items() if pid != reference.warmup[0]}))
        except KeyboardInterrupt:
            raise
        except Exception as err:  # one strategy's failure is its row's, never the run's
            row.status = "error"
            info = describe_failure(err, strategy, engine)
            message = (str(err).strip().splitlines() or [""])[0]
            located = isinstance(err, EngineViolation) or not isinstance(err, SpecterbenchError)
            row.error = f"{type(err).__name__}: {message}" + (where(info) if located else "")
            if located:  # the strategy broke a rule or raised: where (decision point, layer, the plugin's frame)
                row.extra["failure"] = {k: v for k, v in info.items() if k != "traceback"}
                row.extra["traceback"] = info["traceback"]
        finally:
            if measuring:
                row.peak_host_rss_bytes = peak_rss_bytes()
                if engine.device.type == "cuda":  # pragma: no cover - needs CUDA
                    row.peak_device_bytes = torch.cuda.max_memory_allocated(engine.device)
                hooks.specterbench_cell_end(cell=key, row=row)
            row.cuda_graphs, row.cuda_graphs_reason = engine.graphs.state.mode, engine.graphs.state.reason
            engine.end_cell()  # the draft, its scratch and the cache go with the cell
        row.duration_s = time.perf_counter() - started
        return row

    _check_tokens = staticmethod(check_tokens)  # the runner's own check, for tests that inject tokens
