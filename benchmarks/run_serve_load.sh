#!/usr/bin/env bash
# kinegen serve under load (benchmarks/serve_load.md): 1 and 2 replicas, past the bounded queue, and a replica killed
# mid-run. About 12 minutes on 2 cores; needs Ray (pip install "kinegen[serve]"). Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/serve
mkdir -p "$OUT"
PY=.venv/bin/python
$PY benchmarks/serve_load.py --replicas 1 --clients 4 --requests 2 --out "$OUT/replicas1.json"
$PY benchmarks/serve_load.py --replicas 2 --clients 4 --requests 2 --out "$OUT/replicas2.json"
$PY benchmarks/serve_load.py --replicas 2 --clients 8 --requests 1 --max-queue 1 --backend-burst 6 \
    --out "$OUT/overload.json"
$PY benchmarks/serve_load.py --replicas 2 --clients 4 --requests 2 --kill-at 12 --out "$OUT/kill.json"
