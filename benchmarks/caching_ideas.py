"""Map-Guided Caching, issue 25 item 4: ideas that are not shipped options, measured on the tuning prompts.

    .venv/bin/python benchmarks/caching_ideas.py \
        --output benchmarks/results/caching_bound/ideas_damped_guards_steps20_seed5.json

Held-out prompt set 5 (the set that placed the bound), 20 steps, every plan at ``speedup=2,max_error=inf`` (2.2x of
the blocks). Rows: the shipped residual reuse; extrapolation of the cached residual damped by ``lam``
(``h = x + r^s + lam (t-s)/(s-s') (r^s - r^s')``; ``lam=1`` is ``reuse=extrapolate``, measured by
``caching_bound.py``), patched in here because it is not a shipped mode; and the guards ``max_reuse`` 2 and 6 and
``warmup`` 3 (shipped options) against the defaults (4 and 1). PSNR against the dense video of the same seed;
flips: the adherence classifier reads another colour or shape than in the dense video.
"""

import argparse
import json
from pathlib import Path

import numpy as np

import kinegen
from kinegen.caching import map_guided_reuse as R
from kinegen.evaluation.adherence import adherence_prompts, classify, load_classifier
from kinegen.media import atomic_write_text
from kinegen.profiling.metrics import psnr

LAM = {"lam": 1.0}


def damped_extrapolate(cache, t, inp):
    """``reuse=extrapolate`` with the first-order term scaled by ``LAM["lam"]``."""
    rh, re_ = cache.res
    if cache.prev is not None:
        a = LAM["lam"] * (t - cache.res_step) / (cache.res_step - cache.prev_step)
        rh = rh + a * (rh - cache.prev[0])
        re_ = None if re_ is None else re_ + a * (re_ - cache.prev[1])
    return R._add(inp, (rh, re_))


CONFIGS = [("residual (shipped)", "mapguided:speedup=2,max_error=inf", None),
           ("extrapolate, lam 0.25", "mapguided:speedup=2,max_error=inf,reuse=extrapolate", 0.25),
           ("extrapolate, lam 0.5", "mapguided:speedup=2,max_error=inf,reuse=extrapolate", 0.5),
           ("max_reuse=2", "mapguided:speedup=2,max_error=inf,max_reuse=2", None),
           ("max_reuse=6", "mapguided:speedup=2,max_error=inf,max_reuse=6", None),
           ("warmup=3", "mapguided:speedup=2,max_error=inf,warmup=3", None)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    R.REUSE["extrapolate"] = damped_extrapolate
    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    clf = load_classifier()
    out = {name: [] for name, _, _ in CONFIGS}
    for i, (prompt, _) in enumerate(adherence_prompts(args.prompts, "held_out", args.seed)):
        seed = args.seed * 10_000 + i
        dense = kinegen.generate(pipe, prompt, seed=seed)
        read = classify(clf, dense.frames)
        for name, spec, lam in CONFIGS:
            if lam is not None:
                LAM["lam"] = lam
            res = kinegen.generate(pipe, prompt, seed=seed, accelerators=[spec])
            got, st = classify(clf, res.frames), res.accelerators[0]
            out[name].append({"psnr": float(psnr(dense.frames, res.frames)),
                              "colour_flip": got["colour"] != read["colour"],
                              "shape_flip": got["shape"] != read["shape"],
                              "frac": st["planned_compute_fraction"], "err": st["predicted_error_per_step"]})
        print(i, flush=True)
    print("| config | block speedup | error/step | PSNR min / median dB | colour flips | shape flips |")
    print("|---" * 6 + "|")
    for name, rows in out.items():
        p = [x["psnr"] for x in rows]
        print(f"| {name} | {np.mean([1 / x['frac'] for x in rows]):.2f} | {np.mean([x['err'] for x in rows]):.4f} | "
              f"{min(p):.1f} / {np.median(p):.1f} | {sum(x['colour_flip'] for x in rows)}/{len(rows)} | "
              f"{sum(x['shape_flip'] for x in rows)}/{len(rows)} |")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
