#!/usr/bin/env bash
# The figures of benchmarks/autoregressive.md: long-video adherence per 17-frame window along 241-frame videos
# (8 training and 8 held-out prompts) for the chunk-by-chunk model and for the bundled bidirectional model
# extended window by window, then the flat-cost rollout (61 chunks, rolling window and global cache).
# Two lanes of one thread each (about 40 minutes on 2 CPU cores), then the cost run alone on both cores;
# run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=benchmarks/results/autoregressive
mkdir -p "$OUT"
lane() {  # one thread per process: two processes on two cores instead of four threads fighting
  OMP_NUM_THREADS=1 "$PY" benchmarks/autoregressive_windows.py --prompts 8 --frames 241 "$@"
}
(lane --model kinegen-shapes-ar --split train --output "$OUT/windows_ar_train.json" > "$OUT/windows_ar_train.log"
 lane --model kinegen-shapes-ar --split held_out --output "$OUT/windows_ar_held_out.json" > "$OUT/windows_ar_held_out.log") &
(lane --model kinegen-shapes-t2v --method window-extend --split train \
      --output "$OUT/windows_extend_train.json" > "$OUT/windows_extend_train.log"
 lane --model kinegen-shapes-t2v --method window-extend --split held_out \
      --output "$OUT/windows_extend_held_out.json" > "$OUT/windows_extend_held_out.log") &
wait
"$PY" benchmarks/autoregressive_cost.py --model kinegen-shapes-ar --chunks 66 --output "$OUT/cost.json" \
    | tee "$OUT/cost.log"
"$PY" benchmarks/autoregressive_summary.py "$OUT"
