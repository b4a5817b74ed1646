"""Map-Guided Caching: time to plan under the fidelity bound, along the nested frontier against bisecting the speedup.

    .venv/bin/python benchmarks/planner_speed.py

Five recorded maps of the shipped predictor folder (``maps.jsonl``, 30 steps) resampled to 20, 30 and 50 steps,
the shipped step-sensitivity profile, the default bound and guards, 4% of the time outside the blocks (what the
cache measures on the bundled model). ``frontier`` is :func:`kinegen.caching.planner.fastest_within` as shipped
(one bisection on the nested planner's price); ``speedup bisection`` is the same function given the nested planner
without its frontier (one whole plan per halving of the speedup range; how it planned before). Prints the median
time and the plans' compute fractions (the same plans are expected).
"""

import json
import time
from pathlib import Path

import numpy as np

from kinegen.caching import planner as P
from kinegen.caching.map_guided_config import DEFAULT_MAX_ERROR
from kinegen.caching.tvmap import resample

FOLDER = Path(__file__).resolve().parents[1] / "assets/predictors/kinegen-shapes-t2v"


def without_frontier(*args):
    return P.nested_plan(*args)


def main() -> None:
    profile = np.asarray(json.loads((FOLDER / "config.json").read_text())["sensitivity"])
    maps = [np.asarray(json.loads(line)["map"]) for line in (FOLDER / "maps.jsonl").read_text().splitlines()[:5]]
    guards = P.Guards(1, 1, 4)
    print("| steps | search | median ms | compute fractions |\n|---|---|---|---|")
    for steps in (20, 30, 50):
        w = P.resample_profile(profile, steps)
        for name, planner in (("frontier", P.nested_plan), ("speedup bisection", without_frontier)):
            times, fractions = [], []
            for m in maps:
                t0 = time.perf_counter()
                plan, _ = P.fastest_within(planner, resample(m, steps), DEFAULT_MAX_ERROR, guards, None, 0.04, w)
                times.append(time.perf_counter() - t0)
                fractions.append(round(plan.compute_fraction, 3))
            print(f"| {steps} | {name} | {np.median(times) * 1e3:.0f} | {fractions} |")


if __name__ == "__main__":
    main()
