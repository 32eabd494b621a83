#!/usr/bin/env bash
# The one prepared check for a lent GPU: nothing from the network, at most 10 minutes, a failing step fails it, at most
# 8 files under $OUT. Steps (each writes one file; the first failing one stops the script with its exit status):
#   env.txt        GPU, driver, torch, transformers (the image's; a carried lowest-supported one if it is older)
#   tests.txt      the CUDA tests (device memory within the budget, lossless measured cells, pinned store, host
#                  experts, NVML / ledger) and the KV-cache tests under this transformers
#   probe.md       figures: KV growth, pinned H2D at 17 MB and 352 MB, copy/compute overlap, the slot race with and
#                  without the eviction event, NVML counter width over 13.75 GiB, packed drafts on CUDA
#   profile.toml   `calibrate` at Mixtral's real expert shape (back-to-back calls; launch cost measured apart)
#   calibrate.txt  its output
#   validate.md    `validate` with that profile on random-init checkpoints at real expert sizes (2 layers of
#                  Mixtral, 4 of Qwen1.5-MoE) for lru, cpu-experts, specter and oracle: measured and modeled TPOT,
#                  error per strategy, lossless or not
#   graphs.md      host ms per decode token with --cuda-graphs off and auto (tiny-qwen-moe, every expert resident)
#                  beside the modeled resident TPOT at Qwen1.5-MoE geometry; the graph state and its reason
#   summary.txt    the step times and the verdict
# What the image lacks comes from the git-ignored folder $WHEELS (default .wheels/, filled on a machine with a network
# by scripts/min_transformers.sh and `pip download --no-deps -d .wheels <package>`), installed --no-deps --no-index.
# bitsandbytes' CUDA wheel is too large to carry (the device tool moves 64 MiB): the bnb tests skip, Specter's
# default draft (int4/g128 on torch's int4 kernel, int3/g128 where the budget cannot hold it) does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
WORK=${WORK:-/tmp/specterbench-gpu-check}  # checkpoints and run folders: never under $OUT
WHEELS=${WHEELS:-.wheels}
mkdir -p "$OUT" "$WORK"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
      2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
fi
SITE=${SPECTERBENCH_SITE:-$WORK/site}

note() { echo "$*" | tee -a "$SUMMARY"; }

step() {  # step NAME FILE SECONDS COMMAND...: run with a time limit into $OUT/FILE; stop the script on failure
  local name=$1 file=$2 limit=$3
  shift 3
  local start=$SECONDS
  echo "== $name (limit ${limit}s) -> $OUT/$file"
  if timeout "$limit" bash -c '"$@"' _ "$@" >"$OUT/$file" 2>&1; then
    note "$name: ok in $((SECONDS - start)) s"
  else
    local rc=$?
    note "$name: FAILED with exit status $rc after $((SECONDS - start)) s"
    tail -n 40 "$OUT/$file"
    exit "$rc"
  fi
}

setup() {  # specterbench and what the image lacks, offline, into $SITE
  set -euo pipefail
  local need=()
  "$PY" -c 'import specterbench, specterbench_specter' 2>/dev/null || need+=(. ./plugins/specter)
  for mod in pluggy tabulate pynvml safetensors pandas; do
    "$PY" -c "import $mod" 2>/dev/null || echo "missing in the image: $mod (looked for in $WHEELS)"
  done
  if [ ${#need[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" "${need[@]}"
  fi
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then  # carried wheels fill in what the image lacks (never replace)
    for whl in "$WHEELS"/*.whl; do
      local mod
      mod=$(basename "$whl" | cut -d- -f1 | tr 'A-Z' 'a-z')
      [ "$mod" = nvidia_ml_py ] && mod=pynvml
      "$PY" -c "import $mod" 2>/dev/null || "$PY" -m pip install -q --no-deps --no-index --target "$SITE" "$whl"
    done
  fi
  # the image's transformers when it is supported, else the carried lowest-supported one
  if ! PYTHONPATH="$SITE:$PWD" "$PY" -c 'from specterbench.engine.engine import check_transformers as c; c()'; then
    "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" --target "$SITE/tf" \
      "transformers==$(sed -n 's/.*"transformers>=\([0-9.]*\),.*/\1/p' pyproject.toml)" "huggingface_hub>=1.5,<2"
    export PYTHONPATH="$SITE/tf:$PYTHONPATH"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv
  "$PY" -c 'import torch, transformers; assert torch.cuda.is_available(), "no CUDA device"; print("torch", \
torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0)); print("transformers", \
transformers.__version__, transformers.__file__)'
}
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
validate_both() {
  set -euo pipefail
  "$PY" scripts/gpu_validate.py mixtral "$OUT/profile.toml" "$WORK" 2>"$WORK/validate-mixtral.log"
  "$PY" scripts/gpu_validate.py qwen-moe "$OUT/profile.toml" "$WORK" 2>"$WORK/validate-qwen.log"
}
export PY SITE WHEELS OUT WORK
export -f setup validate_both

step environment env.txt 90 setup
if [ -d "$SITE/tf" ]; then export PYTHONPATH="$SITE/tf:$PYTHONPATH"; fi  # the carried transformers, if set up
step cuda-tests tests.txt 180 "$PY" -m pytest -q -rs -p no:cacheprovider tests/engine/test_cuda.py tests/bench/test_nvml.py \
  tests/engine/test_kv_cache.py tests/engine/test_clock_cuda_fake.py tests/engine/test_gpu_numerics.py
step probe probe.md 60 "$PY" scripts/gpu_probe.py
step calibrate calibrate.txt 45 "$PY" -m specterbench calibrate --device cuda --shape 4096,14336 \
  --out "$OUT/profile.toml"
step validate validate.md 150 validate_both
step graphs graphs.md 45 "$PY" scripts/gpu_graphs.py
cat "$OUT/probe.md" "$OUT/validate.md" "$OUT/graphs.md"
note "gpu check passed; the files are under $OUT"
