#!/usr/bin/env bash
# The web app under load (benchmarks/app_load.md): within the queue, past it, and a longer run for memory.
# About 8 minutes on 2 cores; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/app_load
mkdir -p "$OUT"
PY=.venv/bin/python
$PY benchmarks/app_load.py --clients 6 --requests 3 --max-queue 16 --out "$OUT/within.json"
$PY benchmarks/app_load.py --clients 6 --requests 2 --max-queue 2 --out "$OUT/overload.json"
$PY benchmarks/app_load.py --clients 3 --requests 12 --max-queue 16 --out "$OUT/long.json"
