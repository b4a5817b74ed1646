"""Map-Guided Caching: predicted error against what users see, per step count (the fidelity bound's data).

    .venv/bin/python benchmarks/caching_bound.py --steps 20 --prompts 12 --seed 5 \
        --speedups 1.5,2,2.5,3,3.5 --output benchmarks/results/caching_bound/steps20_seed5.json
    .venv/bin/python benchmarks/caching_bound.py --steps 20 --prompts 16 --seed 6 \
        --configs "mapguided|mapguided:speedup=2.5" --output benchmarks/results/caching_bound/default_steps20_seed6.json
    .venv/bin/python benchmarks/caching_bound.py --steps 20 --guidance 6 --prompts 12 --seed 5 --speedups 1.5,2,2.5 \
        --configs "mapguided|mapguided:max_error=0.08" \
        --output benchmarks/results/caching_bound/steps20_guidance6_seed5.json
    .venv/bin/python benchmarks/caching_bound.py --table benchmarks/results/caching_bound/steps*.json   # tables again

For each held-out adherence prompt (``kinegen.evaluation.adherence.adherence_prompts(n, "held_out", seed)``:
attribute combinations never trained on, with their true shape, colour and motion), one dense run and one
run per configuration at the same seed. Per run: the plan's predicted error per step (the unit of
``mapguided:max_error``), the planned compute fraction and the speedup the plan stands for, PSNR against
the dense video, and what the shipped adherence classifier reads (shape, colour, motion) against the
prompt's truth and against the dense video's reading. Prints one row per configuration; writes every run.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    ap.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the model's)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--seed", type=int, default=5, help="prompt set (0-2 are the adherence tables' sets)")
    ap.add_argument("--speedups", default="", help="comma-separated mapguided speedups run with the bound off "
                                                   "(max_error=inf), e.g. 1.5,2,3")
    ap.add_argument("--configs", default="", help="'|'-separated accelerator specs run as they are")
    ap.add_argument("--output", help="JSON file for every run")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="only print the tables of earlier outputs")
    args = ap.parse_args()
    if args.table:
        for path in args.table:
            out = json.loads(Path(path).read_text())
            guidance = f", guidance {out['guidance']:g}" if "guidance" in out else ""
            print(f"\n{path}: {out['model']}, {out['steps']} steps{guidance}, prompt set {out['seed']}, "
                  f"{out['prompts']} prompts\n\n{table(out)}")
        return
    if not args.output:
        ap.error("give --output (or --table)")

    import kinegen
    from kinegen.evaluation.adherence import adherence_prompts, classify, load_classifier
    from kinegen.media import atomic_write_text
    from kinegen.profiling.metrics import psnr

    # The raw planner at each speedup: the bound switched off, so that the data can place it.
    configs = [f"mapguided:speedup={s},max_error=inf" for s in args.speedups.split(",") if s]
    configs += [c for c in args.configs.split("|") if c]
    if not configs:
        ap.error("give --speedups or --configs")
    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    clf = load_classifier()
    fields = {"steps": args.steps} if args.steps else {}
    if args.guidance is not None:
        fields["guidance"] = args.guidance
    runs = []
    t0 = time.perf_counter()
    for i, (prompt, truth) in enumerate(adherence_prompts(args.prompts, "held_out", args.seed)):
        seed = args.seed * 10_000 + i
        dense = kinegen.generate(pipe, prompt, seed=seed, **fields)
        dense_read = classify(clf, dense.frames)
        runs.append({"prompt": prompt, "seed": seed, "config": "dense", "truth": truth, "read": dense_read,
                     "psnr_db": None, "transformer_s": dense.timings["transformer"]})
        for spec in configs:
            res = kinegen.generate(pipe, prompt, seed=seed, accelerators=[spec], **fields)
            st = res.accelerators[0]
            runs.append({
                "prompt": prompt, "seed": seed, "config": spec, "truth": truth, "read": classify(clf, res.frames),
                "dense_read": dense_read, "psnr_db": float(psnr(dense.frames, res.frames)),
                "transformer_s": res.timings["transformer"], "steps": st.get("steps"),
                "error_per_step": st.get("predicted_error_per_step"),
                "chosen_speedup": st.get("chosen_speedup", st.get("requested_speedup")),
                "planned_compute_fraction": st.get("planned_compute_fraction"),
                "warning": st.get("warning"),
            })
        print(f"[{i + 1}/{args.prompts}] {time.perf_counter() - t0:.0f} s", flush=True)
    out = {"model": args.model, "steps": args.steps or pipe.kinegen_spec.steps, "seed": args.seed,
           "guidance": pipe.kinegen_spec.guidance if args.guidance is None else args.guidance,
           "prompts": args.prompts, "configs": configs, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(out, indent=1) + "\n")
    print(table(out))


def table(out: dict) -> str:
    """One row per configuration: error per step, PSNR, attribute flips against dense and against the truth."""
    rows = ["| config | block speedup (plan) | error/step mean (max) | PSNR min / median dB | colour flips vs dense | "
            "shape flips vs dense | motion flips vs dense | colour / shape / motion correct |", "|---" * 8 + "|"]
    by = {}
    for r in out["runs"]:
        by.setdefault(r["config"], []).append(r)
    for cfg, rs in by.items():
        def correct(attr, rs=rs):
            return np.mean([r["read"][attr] == r["truth"][attr] for r in rs])

        if cfg == "dense":
            rows.append(f"| dense | 1.00 | 0 | - | - | - | - | {correct('colour'):.0%} / {correct('shape'):.0%} / "
                        f"{correct('motion'):.0%} |")
            continue
        err = [r["error_per_step"] or 0.0 for r in rs]
        ps = [r["psnr_db"] for r in rs]
        flips = {a: sum(r["read"][a] != r["dense_read"][a] for r in rs) for a in ("colour", "shape", "motion")}
        speed = np.mean([1.0 / r["planned_compute_fraction"] for r in rs if r["planned_compute_fraction"]])
        rows.append(f"| {cfg} | {speed:.2f} | {np.mean(err):.4f} ({max(err):.4f}) | {min(ps):.1f} / "
                    f"{np.median(ps):.1f} | {flips['colour']}/{len(rs)} | {flips['shape']}/{len(rs)} | "
                    f"{flips['motion']}/{len(rs)} | {correct('colour'):.0%} / {correct('shape'):.0%} / "
                    f"{correct('motion'):.0%} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
