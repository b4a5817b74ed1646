#!/usr/bin/env bash
# The figures of benchmarks/dasa.md: DASA (each compute allocation), the distilled model and the peers at equal KV
# budget against the dense chunk-by-chunk model, side by side on 241-frame videos (held-out and training prompts,
# one lane each), and the dynamics masks against the moving objects. About 60 minutes on 2 idle CPU cores.
# Needs the distilled model: `kinegen train dasa --run runs/dasa` (docs/dasa.md), or DISTILLED= to leave it out.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=benchmarks/results/dasa
PROMPTS=${PROMPTS:-2}
DISTILLED=${DISTILLED-runs/dasa/pipeline}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1  # one thread per process: two lanes on two cores
extra=()
[ -n "$DISTILLED" ] && extra=(--distilled "$DISTILLED")
"$PY" benchmarks/dasa.py masks --clips 8 --output "$OUT/masks.json" > "$OUT/masks.log"
for split in held_out train; do
  "$PY" benchmarks/dasa.py rollouts --split "$split" --prompts "$PROMPTS" --frames 241 "${extra[@]}" \
      --output "$OUT/rollouts_$split.json" > "$OUT/rollouts_$split.log" &
done
wait
