#!/usr/bin/env bash
# One prepared GPU check, nothing from the network, at most ~8 minutes on one GPU:
#   1. the CUDA tests (device memory within the budget, prefetching stalls less than on-demand, NVML / ledger in
#      0.9-1.3, pinned store, packed 4-bit draft, host experts) and the host-memory test on a 1 GB checkpoint;
#   2. `calibrate` on the GPU -> $OUT/profile.toml;
#   3. `validate` with that profile on an embedded model in bf16 for lru, specter, oracle and cpu-experts.
# Every step writes $OUT/<step>.txt; a failing step stops the script with its exit status.
# Expects the venv made by `make install` (BIN=... to use another); OUT defaults to results/gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
BIN=${BIN:-.venv/bin}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SPECTERBENCH_SLOW_TESTS=1
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep the output, stop the script on failure
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s)"
  if timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1; then
    echo "   ok in $((SECONDS - start)) s"
  else
    local rc=$?
    echo "   FAILED with exit status $rc after $((SECONDS - start)) s; last lines of $OUT/$name.txt:"
    tail -n 40 "$OUT/$name.txt"
    exit "$rc"
  fi
}

step environment 30 bash -c "nvidia-smi; $BIN/python -c 'import torch; print(torch.__version__, torch.version.cuda, \
  torch.cuda.get_device_name(0)); assert torch.cuda.is_available()'"
step cuda-tests 240 "$BIN/python" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_nvml.py \
  tests/test_memory.py tests/test_gpu_numerics.py
step calibrate 60 "$BIN/python" -m specterbench.bench.calibrate --device cuda --shape 256,160 \
  --out "$OUT/profile.toml"  # tiny-mixtral's hidden and expert sizes: the decode shapes validate runs
step validate 120 "$BIN/python" -m specterbench.bench.validate --profile "$OUT/profile.toml" --model tiny-mixtral \
  --strategies lru,specter,oracle,cpu-experts --budgets 50% --prompts 4 --tokens 32 --device cuda \
  --dtype bfloat16 --out "$OUT/validate" --quiet
cat "$OUT/calibrate.txt" "$OUT/validate/validate.md"
echo "gpu check passed; everything is under $OUT"
