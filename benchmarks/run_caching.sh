#!/usr/bin/env bash
# Map-Guided Caching benchmark on the bundled model (2 CPU cores: about 55 minutes, on an otherwise idle machine).
#   ./benchmarks/run_caching.sh            -> benchmarks/results/caching/, then caching_summary.py
set -euo pipefail
K=${KINEGEN:-.venv/bin/kinegen}
PY=${PYTHON:-.venv/bin/python}
OUT=benchmarks/results/caching
STEPS=${STEPS:-30}
mkdir -p "$OUT"

# 1. Calibrate: dense runs of 160 prompts record TVMaps (RECORD=1; about 7 minutes; otherwise the shipped
#    maps.jsonl is refitted); the predictor is fitted on 80%, tested on 20%; then the step-sensitivity
#    profile is measured on 4 calibration prompts (one probe run per step, about 2.5 minutes).
PRED=assets/predictors/kinegen-shapes-t2v
if [ "${RECORD:-0}" = 1 ]; then MAPS=(); else TMP_MAPS=$(mktemp); cp "$PRED/maps.jsonl" "$TMP_MAPS"; MAPS=(--maps "$TMP_MAPS"); fi
$K calibrate --model kinegen-shapes-t2v --prompts benchmarks/prompts/calibration.txt --steps "$STEPS" \
    "${MAPS[@]}" --output "$PRED"

mapfile -t SIMPLE < benchmarks/prompts/simple.txt
mapfile -t COMPLEX < benchmarks/prompts/complex.txt
P=(); for p in "${SIMPLE[@]:0:2}" "${COMPLEX[@]:0:2}"; do P+=(-p "$p"); done

# 2. Requested against achieved speedup, and the diffusers caches at several settings, in one run. Map-Guided
#    Caching runs with its fidelity bound off (max_error=inf) throughout: these tables compare planners at the
#    speeds asked for (the bound itself is measured by benchmarks/caching_bound.py).
$K profile --model kinegen-shapes-t2v "${P[@]}" --steps "$STEPS" --repeats 4 --output "$OUT/main" \
    -c mapguided:speedup=1.5,max_error=inf -c mapguided:speedup=2,max_error=inf -c mapguided:speedup=2.5,max_error=inf -c mapguided:speedup=3,max_error=inf \
    -c mapguided:speedup=3.3,max_error=inf \
    -c first-block:threshold=0.05 -c first-block:threshold=0.1 -c first-block:threshold=0.15 \
    -c first-block:threshold=0.3 \
    -c taylorseer:cache_interval=2,disable_cache_before_step=1 -c taylorseer:cache_interval=3,disable_cache_before_step=1 \
    -c taylorseer:cache_interval=4,disable_cache_before_step=1 \
    -c mag:threshold=0.1,max_skip_steps=4 -c mag:threshold=0.25,max_skip_steps=4 \
    -c mag:threshold=0.5,max_skip_steps=4 -c mag:threshold=1,max_skip_steps=4

# 3. Ablations: predicted vs average vs oracle map, DP vs greedy planner; simple vs complex prompts.
for kind in simple complex; do
  if [ $kind = simple ]; then L=("${SIMPLE[@]:3:3}"); else L=("${COMPLEX[@]:3:3}"); fi
  A=(); for p in "${L[@]}"; do A+=(-p "$p"); done
  $K profile --model kinegen-shapes-t2v "${A[@]}" --steps "$STEPS" --repeats 1 --output "$OUT/ablation_$kind" \
      -c mapguided:speedup=3,max_error=inf -c mapguided:speedup=3,max_error=inf,map=average -c mapguided:speedup=3,max_error=inf,map=oracle \
      -c mapguided:speedup=3,max_error=inf,planner=dp -c mapguided:speedup=3,max_error=inf,sensitivity=false \
      -c mapguided:speedup=3,max_error=inf,planner=threshold
done

# 4. Prompt adherence (100 training-combination prompts each): each peer at a moderate and at its most
#    aggressive setting of step 2, and mapguided requested at the transformer speedup each of them measured.
mkdir -p "$OUT/adherence"
N=${ADHERENCE_PROMPTS:-100}
PEERS=(first-block:threshold=0.15 taylorseer:cache_interval=3,disable_cache_before_step=1 mag:threshold=0.5,max_skip_steps=4
       first-block:threshold=0.3 taylorseer:cache_interval=4,disable_cache_before_step=1 mag:threshold=1,max_skip_steps=4)
CONFIGS=("${PEERS[@]}")
for c in "${PEERS[@]}"; do CONFIGS+=("mapguided:speedup=$($PY benchmarks/caching_summary.py "$OUT" --speedup-of "$c"),max_error=inf"); done
$K eval adherence --model kinegen-shapes-t2v --split train --prompts "$N" --steps "$STEPS" -o "$OUT/adherence/dense.json"
for c in "${CONFIGS[@]}"; do
  $K eval adherence --model kinegen-shapes-t2v --split train --prompts "$N" --steps "$STEPS" --cache "$c" \
      -o "$OUT/adherence/${c//[:=,]/_}.json"
done
$PY benchmarks/caching_summary.py "$OUT"
