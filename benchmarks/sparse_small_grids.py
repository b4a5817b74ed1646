"""Where sparse attention starts to pay: one attention call, dense SDPA against HVA (key lists, its CPU default,
and tiles) and SVG2 at their defaults, on q, k, v captured from the bundled model at several sizes (the
evidence for ``min_tokens``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_small_grids.py [--sizes 17x128,33x256,41x320,57x384]

Per size: capture layers 1 and 3 of the conditional branch at step 8 of 20 (the default step count), then per
layer, interleaved, ``--repeats`` rounds of: dense SDPA, each sparse method's anchor call (cold clustering) and
its next call (warm). Reported: the median wall time of each against dense, and the relative L2 error. The
sparse modules run with ``min_tokens=0`` here (the setting under test).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sparse_attention import capture, rel_l2  # noqa: E402

from kinegen.sparse_attn.hva import HVAConfig, HVAttention  # noqa: E402
from kinegen.sparse_attn.svg2 import SVG2Attention, SVG2Config  # noqa: E402

SDPA = torch.nn.functional.scaled_dot_product_attention
METHODS = {
    "hva": lambda: HVAttention(HVAConfig(min_tokens=0)),
    "hva-tiles": lambda: HVAttention(HVAConfig(min_tokens=0, layout="tiles")),
    "svg2": lambda: SVG2Attention(SVG2Config(min_tokens=0)),
}


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="17x128,33x256,41x320,57x384", help="FRAMESxSIDE, comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"some of {', '.join(METHODS)}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", default="benchmarks/results/sparse_small_grids.json")
    args = ap.parse_args()
    methods = {name: METHODS[name] for name in args.methods.split(",")}
    rows = []
    for size in args.sizes.split(","):
        frames, side = (int(x) for x in size.split("x"))
        data = capture(argparse.Namespace(layers="1,3", capture_step=8, hybrid_steps=1, steps=20, frames=frames,
                                          size=side))
        for layer in (1, 3):
            (q0, k0, v0, grid), (q1, k1, v1, _) = data[(layer, 8)], data[(layer, 9)]
            n = q0.shape[2]
            ref0 = torch.nn.functional.scaled_dot_product_attention(q0, k0, v0)
            ref1 = torch.nn.functional.scaled_dot_product_attention(q1, k1, v1)
            for make in methods.values():  # warm-up: FlexAttention compiles per shape
                m = make()
                m(q0, k0, v0, grid=grid), m(q1, k1, v1, grid=grid)
            times = {"dense": []}
            errors = {}
            for _ in range(args.repeats):
                times["dense"].append(_timed(lambda a=(q0, k0, v0): SDPA(*a))[1])
                for name, make in methods.items():
                    m = make()
                    out0, t0 = _timed(lambda m=m, a=(q0, k0, v0), g=grid: m(*a, grid=g))
                    out1, t1 = _timed(lambda m=m, a=(q1, k1, v1), g=grid: m(*a, grid=g))
                    times.setdefault(f"{name} anchor", []).append(t0)
                    times.setdefault(f"{name} warm", []).append(t1)
                    errors[f"{name} anchor"], errors[f"{name} warm"] = rel_l2(out0, ref0), rel_l2(out1, ref1)
            dense_ms = statistics.median(times["dense"]) * 1e3
            for key, ts in times.items():
                ms = statistics.median(ts) * 1e3
                rows.append({"size": size, "tokens": n, "layer": layer, "call": key, "ms": ms,
                             "speedup": dense_ms / ms, "rel_l2": errors.get(key, 0.0)})
                print(f"{size} ({n} tokens) layer {layer} {key:20s} {ms:8.2f} ms  {dense_ms / ms:5.2f}x  "
                      f"err {errors.get(key, 0.0):.3f}", flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
