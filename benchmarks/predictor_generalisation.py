"""Map-Guided Caching: does the Map Predictor (calibrated at one step count and guidance) hold at others?

    .venv/bin/python benchmarks/predictor_generalisation.py --prompts 8 --seed 9 \
        --settings 10x4,20x4,30x4,50x4,20x2,20x6 --output benchmarks/results/caching_bound/predictor_generalisation.json

For each held-out adherence prompt (``adherence_prompts(n, "held_out", seed)``; never used for calibration)
and each setting ``STEPSxGUIDANCE``: one dense run that records the true TVMap, and the predictor's map for the
same call. Per run:

- Spearman rank correlation of the predicted and the true map (steps 1..T-1 x blocks), and of the
  predictor's average map (the same for every prompt) against the true one;
- the scale: the predicted map's sum over the true map's (the planner's error is linear in the map, so a
  scale off by ``x`` makes the predicted error per step off by ``x``);
- for the plan the default bound picks on the predicted map, its error per step under the predicted map and
  under the true map (what the bound promised against what the run's own map says it spent).

Prints one row per setting (means, and the worst prompt) and writes every run.
"""

import argparse
import json
import time
import types
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=9, help="prompt set (0-8 are used by other tables)")
    ap.add_argument("--settings", default="10x4,20x4,30x4,50x4,20x2,20x6",
                    help="comma-separated STEPSxGUIDANCE settings")
    ap.add_argument("--output", help="JSON file for every run")
    ap.add_argument("--table", metavar="JSON", help="only print the table of an earlier output")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    if not args.output:
        ap.error("give --output (or --table)")

    import kinegen
    from kinegen.caching import planner as P
    from kinegen.caching.map_guided_config import DEFAULT_MAX_ERROR, MapGuidedCacheConfig
    from kinegen.caching.map_guided_controller import BlockGroups
    from kinegen.caching.map_guided_sources import AverageMap, PredictedMap, SourceContext, record_map
    from kinegen.caching.tvmap import spearman
    from kinegen.evaluation.adherence import adherence_prompts
    from kinegen.generation import GenerationRequest, prepare
    from kinegen.media import atomic_write_text

    settings = [tuple(float(x) for x in s.split("x")) for s in args.settings.split(",") if s]
    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    config = MapGuidedCacheConfig()
    names = BlockGroups.of(pipe.transformer, 1).names
    runs, t0 = [], time.perf_counter()
    for i, (prompt, _) in enumerate(adherence_prompts(args.prompts, "held_out", args.seed)):
        for steps, guidance in settings:
            steps = int(steps)
            job = prepare(pipe, GenerationRequest(prompt, seed=args.seed * 10_000 + i, steps=steps, guidance=guidance))
            run = job.run_info()
            rec = record_map(pipe, run)
            true = rec["map"].values
            ctx = SourceContext(config, run, pipe.transformer, names)
            call = types.SimpleNamespace(steps=steps, features=rec["features"], text_dim=rec["text_dim"],
                                         grid=rec["grid"])
            predicted_source = PredictedMap.create(ctx)
            pred = predicted_source.map_for(call).values
            avg = AverageMap.create(ctx).map_for(call).values
            weights = P.resample_profile(predicted_source.sensitivity, steps)
            plan, _ = P.fastest_within(P.nested_plan, pred, DEFAULT_MAX_ERROR, config.guards, weights=weights)
            runs.append({
                "prompt": prompt, "steps": steps, "guidance": guidance,
                "spearman_predicted": spearman(pred, true), "spearman_average": spearman(avg, true),
                "scale": float(pred[1:].sum() / true[1:].sum()),
                "plan_compute_fraction": plan.compute_fraction,
                "error_per_step_predicted": P.error_per_step(plan),
                "error_per_step_true": P.plan_error(true, plan.compute, weights) / steps,
                "true_map": true.round(6).tolist(),
            })
        print(f"[{i + 1}/{args.prompts}] {time.perf_counter() - t0:.0f} s", flush=True)
    out = {"model": args.model, "seed": args.seed, "prompts": args.prompts, "settings": args.settings,
           "default_max_error": DEFAULT_MAX_ERROR, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(out, indent=1) + "\n")
    print(table(out))


def table(out: dict) -> str:
    rows = ["| steps | guidance | Spearman predicted, mean (min) | Spearman average map, mean (min) | "
            "scale predicted/true, mean (min-max) | default plan: block speedup | its error/step predicted | "
            "its error/step under the true map, mean (max) |", "|---" * 8 + "|"]
    by: dict = {}
    for r in out["runs"]:
        by.setdefault((r["steps"], r["guidance"]), []).append(r)
    for (steps, guidance), rs in by.items():
        def col(key, rs=rs):
            return np.array([r[key] for r in rs])

        sp, sa, sc = col("spearman_predicted"), col("spearman_average"), col("scale")
        rows.append(f"| {steps} | {guidance:g} | {sp.mean():.3f} ({sp.min():.3f}) | {sa.mean():.3f} ({sa.min():.3f}) | "
                    f"{sc.mean():.2f} ({sc.min():.2f}-{sc.max():.2f}) | "
                    f"{np.mean(1 / col('plan_compute_fraction')):.2f} | {col('error_per_step_predicted').mean():.4f} | "
                    f"{col('error_per_step_true').mean():.4f} ({col('error_per_step_true').max():.4f}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
