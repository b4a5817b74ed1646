#!/usr/bin/env bash
# MP-GAN against the R3GAN baseline at equal parameters (1.68M, G+D) and equal CPU time, 2 seeds each,
# then two ablations; each run single-threaded so that two run side by side on a 2-core machine.
# Equal time: at equal parameters the R3GAN baseline's wider high-resolution stages take 1.6x longer per
# step (2.7 s against 1.7 s, measured side by side), so it gets 0.625x the steps, on its own full schedule.
# Usage: benchmarks/run_gan.sh [STEPS]   (runs under runs/gan-bench, metrics in benchmarks/results/gan)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1000}
K=.venv/bin/kinegen
OUT=benchmarks/results/gan
mkdir -p runs/gan-bench "$OUT"
export OMP_NUM_THREADS=1
run() {  # name, extra train flags...
  local name=$1; shift
  /usr/bin/time -f "%e s wall, %U s user" -o "runs/gan-bench/$name.time" \
    $K train gan --run "runs/gan-bench/$name" --steps "$STEPS" "$@" > "runs/gan-bench/$name.log" 2>&1
  $K eval gan --model "runs/gan-bench/$name/pipeline" --images 1200 -o "$OUT/$name.json" >> "runs/gan-bench/$name.log" 2>&1
  cp "runs/gan-bench/$name/log.jsonl" "$OUT/$name.log.jsonl"
  cp "runs/gan-bench/$name.time" "$OUT/$name.time"
}
R3=(--variant r3gan --widths 192,176,144,96 --steps $((STEPS * 5 / 8)))   # 1,676,515 parameters; the MP default has 1,676,164
lane_a() { run mp-s0 --seed 0; run r3gan-s1 --seed 1 "${R3[@]}"; run mp-no-mp_residual --seed 0 --ablate mp_residual; }
lane_b() { run r3gan-s0 --seed 0 "${R3[@]}"; run mp-s1 --seed 1; run mp-no-weight_norm --seed 0 --ablate weight_norm,centering; }
lane_a & lane_b & wait
echo done
