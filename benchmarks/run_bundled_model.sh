#!/usr/bin/env bash
# The figures of benchmarks/bundled_model.md: generation time and samples at the default and benchmark
# sizes, prompt adherence over 100 prompts per split (and 100 more training-combination prompts on each of
# prompt seeds 1 and 2), the adherence ceiling the VAE allows, and the first-frame check.
# About 25 minutes on 2 CPU cores; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=benchmarks/results/bundled_model
mkdir -p "$OUT"
"$PY" benchmarks/bundled_model.py --out "$OUT" | tee "$OUT/bundled_model.log"
"${KINEGEN:-.venv/bin/kinegen}" eval adherence --model kinegen-shapes-t2v --prompts 100 -o "$OUT/adherence.json" \
    | tee "$OUT/adherence.log"
mkdir -p "$OUT/adherence_seeds"
for seed in 1 2; do
  "${KINEGEN:-.venv/bin/kinegen}" eval adherence --model kinegen-shapes-t2v --split train --prompts 100 --seed $seed \
      -o "$OUT/adherence_seeds/train_seed$seed.json" | tee "$OUT/adherence_seeds/train_seed$seed.log"
done
"$PY" benchmarks/adherence_ceiling.py --clips 200 -o "$OUT/ceiling.json" | tee "$OUT/ceiling.log"
"$PY" benchmarks/first_frame.py --model kinegen-shapes-t2v --grid "$OUT/first_frame.png" --output "$OUT/first_frame.json" \
    | tee "$OUT/first_frame.log"
