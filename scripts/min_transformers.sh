#!/usr/bin/env bash
# The lowest transformers pyproject.toml allows, installed beside the venv (no dependencies of its own), for
# tests/engine/test_kv_cache.py's decode under it and for scripts/gpu_check.sh on an image that lacks it:
#   scripts/min_transformers.sh [TARGET]   (default .tf-min; wheels from .wheels/ when present, else the registry)
# It also puts the wheels in .wheels/ so that a GPU machine without a network can install them (both are git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TARGET=${1:-.tf-min}
VERSION=$(sed -n 's/.*"transformers>=\([0-9.]*\),.*/\1/p' pyproject.toml)
WANT=("transformers==$VERSION" "huggingface_hub>=1.5,<2" httpx httpcore anyio h11 certifi idna)
mkdir -p .wheels
if ! ls .wheels/transformers-"$VERSION"*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps -d .wheels "${WANT[@]}"
fi
"$PY" -m pip install -q --no-deps --no-index --find-links .wheels --target "$TARGET" "${WANT[@]}"
echo "transformers $VERSION in $TARGET (PYTHONPATH=$TARGET to use it)"
