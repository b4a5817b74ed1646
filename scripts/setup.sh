#!/usr/bin/env bash
# Set up Kinegen in ./.venv: torch first (so pip does not pull a torch of its own choosing),
# then Kinegen with its test tools. Safe to re-run.
#
#   TORCH_SPEC   torch requirement to install first (default: torch==2.13.0; on a machine
#                without a GPU this is the CPU build where a local wheel exists, elsewhere
#                PyPI's default build for the platform, CUDA on Linux)
#   KINEGEN_EXTRAS  extras to install (default: dev; add gpu for xformers: "dev,gpu")
#   PYTHON       interpreter to build the venv with (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
KINEGEN_EXTRAS="${KINEGEN_EXTRAS:-dev}"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "$TORCH_SPEC"
fi
.venv/bin/python -m pip install --quiet -e ".[${KINEGEN_EXTRAS}]"
.venv/bin/python -c "import torch, diffusers, kinegen; print(f'kinegen {kinegen.__version__}: torch {torch.__version__} (CUDA: {torch.cuda.is_available()}), diffusers {diffusers.__version__}')"
