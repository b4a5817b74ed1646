"""``kinegen calibrate``: record TVMaps over a prompt file, fit the Map Predictor, measure the
step-sensitivity profile, and report the predictor's rank correlation on held-out prompts."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import add_generation_flags, add_loading_flags, load, request_fields


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_MODEL

    cal = subparsers.add_parser(
        "calibrate", help="record TVMaps over prompts and train a Map Predictor (Map-Guided Caching)",
        description="Run the model densely on every prompt (and seed) with the map-recording hook, fit the Map "
                    "Predictor on the calibration prompts and report its rank correlation with the true maps on "
                    "held-out prompts. Writes OUT/model.safetensors, OUT/config.json, OUT/maps.jsonl and "
                    "OUT/calibration.json; use it with --cache mapguided:predictor=OUT.",
        epilog="Example: kinegen calibrate --model kinegen-shapes-t2v --prompts prompts.txt --output my-predictor")
    cal.add_argument("--prompts", required=True, metavar="FILE", help="text file, one prompt per line")
    cal.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for the predictor and its report")
    cal.add_argument("--seeds", type=int, default=1, metavar="N", help="seeds 0..N-1 per prompt (default: %(default)s)")
    cal.add_argument("--held-out", type=float, default=0.2, metavar="F",
                     help="fraction of prompts kept out of fitting, for evaluation (default: %(default)s)")
    cal.add_argument("--group-size", type=int, default=1, metavar="N",
                     help="contiguous blocks per planned group (default: %(default)s)")
    cal.add_argument("--maps", metavar="FILE", help="refit from an earlier maps.jsonl instead of recording")
    cal.add_argument("--train-steps", type=int, default=2000, metavar="N",
                     help="predictor optimisation steps (default: %(default)s)")
    cal.add_argument("--sensitivity-prompts", type=int, default=4, metavar="N",
                     help="prompts on which to measure how much a reuse at each step moves the output, one run "
                          "per step each (0: skip; the planner then weights every step 1) (default: %(default)s)")
    add_generation_flags(cal)
    add_loading_flags(cal)
    cal.set_defaults(func=run, model=DEFAULT_MODEL)


def run(args) -> int:
    from ..errors import ConfigError
    from ..generation import GenerationRequest
    from ..training.calibrate import calibrate, read_prompts

    prompts = read_prompts(args.prompts)
    fields = {k: v for k, v in request_fields(args).items() if v is not None}
    for p in prompts:
        GenerationRequest(prompt=p, **fields)  # the model-free checks, before loading
    if not 0 <= args.held_out < 1 or args.seeds < 1 or args.group_size < 1 or args.sensitivity_prompts < 0:
        raise ConfigError("--held-out must be in [0, 1), --seeds and --group-size at least 1, "
                          "--sensitivity-prompts at least 0.")
    if args.train_steps < 1:
        raise ConfigError("--train-steps must be at least 1.")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise ConfigError(f"--output {args.output} is a file; give a folder for the predictor.")
    if args.maps and not Path(args.maps).is_file():
        raise ConfigError(f"--maps {args.maps} does not exist; give the maps.jsonl an earlier `kinegen calibrate` "
                          "wrote, or drop --maps to record maps.")
    pipe, _ = load(args)
    pipe.set_progress_bar_config(disable=True)

    def progress(i, n):
        print(f"\rrecording maps: {i}/{n}", end="", file=sys.stderr, flush=True)

    def sensitivity_progress(i, n):
        print(f"\rmeasuring step sensitivity: {i}/{n} prompts", end="", file=sys.stderr, flush=True)

    report = calibrate(pipe, prompts, args.output, seeds=args.seeds, held_out=args.held_out,
                       group_size=args.group_size, maps=args.maps, train_steps=args.train_steps,
                       sensitivity_prompts=args.sensitivity_prompts, progress=progress,
                       sensitivity_progress=sensitivity_progress, **fields)
    print(file=sys.stderr)
    m = report["metrics"]
    print(f"{report['records']} maps ({report['calibration_prompts']} calibration / {report['held_out_prompts']} "
          f"held-out), recorded in {report['record_s']:.0f} s, fitted in {report['fit_s']:.1f} s")
    for split in ("train", "held_out"):
        if m.get(split):
            r = m[split]
            print(f"{split:<9} Spearman: predicted {r['spearman_predicted_mean']:.3f} (min "
                  f"{r['spearman_predicted_min']:.3f}), average map {r['spearman_average_mean']:.3f}")
    if report.get("sensitivity"):
        prof = report["sensitivity"]["profile"]
        print(f"step sensitivity ({report['sensitivity']['prompts']} prompts, "
              f"{report['sensitivity']['seconds']:.0f} s): " + " ".join(f"{x:.2f}" for x in prof))
    print(f"predictor written to {args.output}/")
    return 0
