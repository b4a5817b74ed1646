#!/usr/bin/env bash
# Build the sdist and the wheel, install the wheel into a fresh venv outside the repository, and generate a video
# with the bundled model from there, offline (no model hub): what a user of `pip install kinegen` gets.
#
#   TORCH_SPEC  torch requirement installed first (default: torch==2.13.0, as scripts/setup.sh)
#   PYTHON      interpreter for the fresh venv (default: python3)
#   KEEP=1      keep the temporary folder (printed) for inspection
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
work=$(mktemp -d "${TMPDIR:-/tmp}/kinegen-wheel.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

.venv/bin/python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/kinegen-*.whl)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) and $(cd "$work/dist" && ls ./*.tar.gz | xargs -n1 basename)"

"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet "$TORCH_SPEC"
"$work/venv/bin/python" -m pip install --quiet "$wheel"

# From a folder that is not the repository, with the hub switched off: only what the wheel installed is used.
cd "$work"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$work/venv/bin/kinegen" generate "a red circle moving right" --output "$work/out.mp4"
test -s "$work/out.mp4"
"$work/venv/bin/python" - <<'PY'
import kinegen.loading as loading
from pathlib import Path
assert Path(loading.ASSETS_DIR).is_relative_to(Path(loading.__file__).parent), loading.ASSETS_DIR
print(f"bundled models from {loading.ASSETS_DIR}")
PY
echo "wheel check passed"
