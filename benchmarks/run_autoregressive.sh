#!/usr/bin/env bash
# The figures of benchmarks/autoregressive.md: long-video adherence per 17-frame window along 241-frame videos
# (8 training and 8 held-out prompts) for the chunk-by-chunk model and for the bundled bidirectional model extended
# window by window, and the flat-cost rollout (66 chunks, rolling window and global cache).
# Two lanes of one thread each (about 40 minutes on 2 CPU cores); run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=benchmarks/results/autoregressive
VIDEOS=${VIDEOS:-/tmp/kinegen-ar-videos}   # the generated videos (uint8 .npz), to look at or read again
mkdir -p "$OUT"
export OMP_NUM_THREADS=1  # one thread per process: two processes on two cores instead of four threads fighting
windows() { "$PY" benchmarks/autoregressive_windows.py --prompts 8 --frames 241 "$@"; }
(windows --model kinegen-shapes-ar --split train --videos "$VIDEOS/ar" --output "$OUT/windows_ar_stage2_train.json" \
     > "$OUT/windows_ar_stage2_train.log"
 windows --model kinegen-shapes-ar --split held_out --videos "$VIDEOS/ar" --output "$OUT/windows_ar_stage2_held_out.json" \
     > "$OUT/windows_ar_stage2_held_out.log") &
(windows --model kinegen-shapes-t2v --method window-extend --split train --videos "$VIDEOS/extend" \
     --output "$OUT/windows_extend_train.json" > "$OUT/windows_extend_train.log"
 "$PY" benchmarks/autoregressive_cost.py --model kinegen-shapes-ar --chunks 66 --output "$OUT/cost.json" \
     > "$OUT/cost.log"
 windows --model kinegen-shapes-t2v --method window-extend --split held_out --videos "$VIDEOS/extend" \
     --output "$OUT/windows_extend_held_out.json" > "$OUT/windows_extend_held_out.log") &
wait
"$PY" benchmarks/long_video_readers.py --prompts 16 --output "$OUT/readers.json"
"$PY" benchmarks/autoregressive_summary.py "$OUT"
