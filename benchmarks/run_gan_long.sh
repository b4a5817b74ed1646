#!/usr/bin/env bash
# Issue 26: the MP-GAN against the R3GAN baseline at five times the images of the first comparison
# (benchmarks/gan.md): 5,000 steps of batch 32 (160,000 images) for both, equal parameters (MP-GAN default
# form 1.70M, R3GAN at 192/176/144/96 1.68M), 3 seeds each. Every 250 steps each run measures its EMA against
# held-out images (class accuracy, FD, KID, precision, recall: RUN/eval.jsonl) and logs D's class margins.
#
# Resumable: run it again and every unfinished run continues from RUN/checkpoint (finished runs are skipped).
# Each run is single-threaded so that two run side by side on a 2-core machine.
# Usage: benchmarks/run_gan_long.sh [RUN_NAME ...]    (default: the six runs of the comparison, two at a time)
#        MAX_MINUTES=100 benchmarks/run_gan_long.sh mp-s0 r3gan-s0    (stop cleanly after 100 minutes)
# Results: benchmarks/results/gan_long/ (NAME.json: kinegen eval gan on 1,200 images; NAME.eval.jsonl; NAME.log.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
K=.venv/bin/kinegen
OUT=benchmarks/results/gan_long
RUNS=runs/gan-long
mkdir -p "$RUNS" "$OUT"
export OMP_NUM_THREADS=1
COMMON=(--steps 5000 --eval-every 250 --eval-images 600 --snapshot-every 1000 --checkpoint-every 250)
[ -n "${MAX_MINUTES:-}" ] && COMMON+=(--max-minutes "$MAX_MINUTES")
flags() {  # the settings of a run name: mp-sN or r3gan-sN; mp-peC-sN or r3gan-peC-sN add G's C-channel
  local pe=""  # positional maps (--positional-channels C; benchmarks/gan.md, "Backgrounds")
  case $1 in *-pe*-s*) pe=${1#*-pe}; pe="--positional-channels ${pe%%-s*}" ;; esac
  case $1 in
    mp-s* | mp-pe*-s*) echo --variant mp --seed "${1##*-s}" $pe ;;                                # lr 3e-3 (its default)
    r3gan-s* | r3gan-pe*-s*) echo --variant r3gan --widths 192,176,144,96 --lr 0.0006 --seed "${1##*-s}" $pe ;;
    *) echo "unknown run $1 (mp-sN, r3gan-sN, mp-peC-sN or r3gan-peC-sN)" >&2; return 1 ;;
  esac
}
run() {
  local name=$1 f
  f=$(flags "$name")
  [ -f "$OUT/$name.json" ] && { echo "$name: done"; return; }
  # shellcheck disable=SC2086
  $K train gan --run "$RUNS/$name" "${COMMON[@]}" $f >> "$RUNS/$name.log" 2>&1
  cp "$RUNS/$name/log.jsonl" "$OUT/$name.log.jsonl"
  cp "$RUNS/$name/eval.jsonl" "$OUT/$name.eval.jsonl"
  if [ "$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" \
        "$RUNS/$name/checkpoint/state.json")" -ge 5000 ]; then
    $K eval gan --model "$RUNS/$name/pipeline" --images 1200 -o "$OUT/$name.json" >> "$RUNS/$name.log" 2>&1
  fi
}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(mp-s0 r3gan-s0 mp-s1 r3gan-s1 mp-s2 r3gan-s2)
for ((i = 0; i < ${#names[@]}; i += 2)); do
  run "${names[i]}" &
  [ -n "${names[i + 1]:-}" ] && run "${names[i + 1]}" &
  wait
done
