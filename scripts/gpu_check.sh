#!/usr/bin/env bash
# One prepared GPU check: the CUDA tests, then a short measured benchmark beside the modeled one, results in $OUT.
# Installs nothing from the network; expects `make install` to have been done (or the venv carried along).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
mkdir -p "$OUT"
BIN=.venv/bin
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
$BIN/python -m pytest -q tests/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.txt"
for clock in measured modeled; do
  $BIN/specterbench run --model tiny-qwen-moe --strategies lru,specter,spec-decode,cpu-experts,oracle \
    --budgets 50%,70% --prompts 8 --tokens 32 --clock $clock --device cuda --out "$OUT" --run-id $clock --quiet \
    2>&1 | tee "$OUT/bench-$clock.txt"
done
