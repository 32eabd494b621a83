#!/usr/bin/env bash
# One prepared GPU check, nothing from the network, at most ~8 minutes on one GPU:
#   1. the CUDA tests (device memory within the budget, prefetching stalls less than on-demand, NVML / ledger in
#      0.9-1.3, pinned store, packed 4-bit draft, host experts) and the host-memory test on a 1 GB checkpoint;
#   2. `calibrate` on the GPU -> $OUT/profile.toml;
#   3. `validate` with that profile on an embedded model in bf16 for lru, specter, oracle and cpu-experts.
# Every step writes $OUT/<step>.txt; a failing step stops the script with its exit status.
# Python: $PY, else the venv of `make install` when its torch sees a GPU, else `python3` (a GPU image's own torch);
# when specterbench is not importable there it is installed offline (--no-deps --no-index) into a scratch folder.
# Without bitsandbytes (not in every GPU image) Specter's draft uses the project's own int4 quantizer, said so.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SPECTERBENCH_SLOW_TESTS=1
export PYTHONUNBUFFERED=1
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
      2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import specterbench, specterbench_specter' 2>/dev/null; then
  SITE=${SPECTERBENCH_SITE:-/tmp/specterbench-site}
  echo "== installing specterbench offline into $SITE (no dependencies)"
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" . ./plugins/specter \
    >"$OUT/install.txt" 2>&1 || { tail -n 20 "$OUT/install.txt"; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1  # the installed copy, not ./specterbench
fi
SPECTER_SET=()
if ! "$PY" -c 'import bitsandbytes' 2>/dev/null; then
  echo "== note: no bitsandbytes here: Specter's draft uses the int4 g128 quantizer; packed-kernel test skipped"
  SPECTER_SET=(--set specter.quantizer=int --set specter.blocksize=128)
fi

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

step environment 30 bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, \
  torch.cuda.get_device_name(0)); assert torch.cuda.is_available()'"
step cuda-tests 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_nvml.py \
  tests/test_memory.py tests/test_gpu_numerics.py
step calibrate 60 "$PY" -m specterbench.bench.calibrate --device cuda --shape 256,160 \
  --out "$OUT/profile.toml"  # tiny-mixtral's hidden and expert sizes: the decode shapes validate runs
step validate 120 "$PY" -m specterbench.bench.validate --profile "$OUT/profile.toml" --model tiny-mixtral \
  --strategies lru,specter,oracle,cpu-experts --budgets 50% --prompts 4 --tokens 32 --device cuda \
  --dtype bfloat16 --out "$OUT/validate" --quiet ${SPECTER_SET[@]+"${SPECTER_SET[@]}"}
cat "$OUT/calibrate.txt" "$OUT/validate/validate.md"
echo "gpu check passed; everything is under $OUT"
