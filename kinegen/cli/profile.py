"""``kinegen profile``: the dense baseline and each ``--config`` on the same prompts and seeds, with
latency, transformer time, speedup, peak memory and fidelity against dense (and per-chunk figures for an
autoregressive model), written as a report."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from ..parallel import PARALLEL_HELP
from .common import EPILOG_ACCEL, add_generation_flags, add_loading_flags, load, request_fields, tiny_model_note


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_MODEL

    prof = subparsers.add_parser(
        "profile", help="compare accelerator configurations against the dense baseline",
        description="Run the dense baseline and each --config on the same prompts and seeds (warm-up, then "
                    "interleaved repeats); report latency, transformer time, speedup, peak memory and fidelity "
                    "(PSNR, SSIM) against dense; for an autoregressive (chunk-by-chunk) model also transformer time "
                    "and KV cache per chunk, time to first frame and frames per second. A configuration the model's "
                    "family refuses is reported with the reason, not run. Writes DIR/report.json, DIR/report.md, "
                    "DIR/speedup_vs_psnr.png, DIR/latency.png, DIR/side_by_side.mp4 (the first request's outputs "
                    "tiled) and DIR/stills.png (their first, middle and last frames, a row per configuration); an "
                    "image model gets DIR/side_by_side.png instead of both.",
        epilog=EPILOG_ACCEL + " Join accelerators with '+' to combine them in one configuration; 'dense' times "
               "the baseline against itself.",
    )
    prof.add_argument("--prompt", "-p", action="append", required=True, metavar="P",
                      help="a prompt (repeat for several)")
    prof.add_argument("--config", "-c", action="append", required=True, metavar="NAME[:k=v,...]",
                      help="a configuration to compare (repeat for several)")
    prof.add_argument("--seeds", type=int, default=1, metavar="N",
                      help="seeds 0..N-1 per prompt (default: %(default)s)")
    prof.add_argument("--repeats", type=int, default=3, metavar="N",
                      help="timed runs per configuration and request (default: %(default)s)")
    prof.add_argument("--warmup", type=int, default=1, metavar="N",
                      help="untimed runs per configuration first (default: %(default)s)")
    prof.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for the report")
    prof.add_argument("--parallel", metavar="ulysses=N|ring=N",
                      help=PARALLEL_HELP + " Every configuration then runs split, and the report adds each rank's "
                           "time per step and its share of time in communication (all-to-all, all-gather).")
    add_generation_flags(prof)
    add_loading_flags(prof)
    prof.set_defaults(func=run, model=DEFAULT_MODEL)


def run(args) -> int:
    with contextlib.ExitStack() as stack:  # under --parallel: leaves the process group at the end
        return _run(args, stack)


def _run(args, stack: contextlib.ExitStack) -> int:
    from ..errors import ConfigError
    from ..generation import GenerationRequest
    from ..profiling.report import markdown_table
    from ..profiling.runner import parse_config, profile

    fields = request_fields(args)
    for p in args.prompt:
        GenerationRequest(prompt=p, **fields)  # the model-free checks, before loading
    configs = [parse_config(c) for c in args.config]
    if args.seeds < 1 or args.repeats < 1 or args.warmup < 0:
        raise ConfigError("--seeds and --repeats must be at least 1 and --warmup at least 0.")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise ConfigError(f"--output {args.output} is a file; give a folder for the report.")
    main, parallel = True, None
    if args.parallel:  # every rank runs every configuration in the same order; rank 0 alone prints and writes
        from ..parallel import ParallelSpec, check_accelerators, finish_distributed, init_distributed, require_torchrun

        parallel = ParallelSpec.parse(args.parallel)
        for c in configs:
            check_accelerators(parallel, c.parsed)
        require_torchrun(parallel, args.command)
        joined = init_distributed(parallel, args.device, command=args.command)
        stack.callback(finish_distributed)
        args.device, main = joined.device, joined.is_main
    pipe, _ = load(args)
    if parallel is not None:
        from ..parallel import apply_parallel

        apply_parallel(pipe, parallel)
    note = tiny_model_note(pipe.kinegen_spec)
    if note and main:
        print(note, file=sys.stderr)
    pipe.set_progress_bar_config(disable=True)

    def progress(done, total, label):
        if main:
            print(f"\r[{done}/{total}] {label:<40}", end="", file=sys.stderr, flush=True)

    report = profile(pipe, args.prompt, configs, seeds=args.seeds, repeats=args.repeats, warmup=args.warmup,
                     output_dir=args.output, progress=progress, **fields)
    if not main:
        return 0
    print(file=sys.stderr)
    print(markdown_table(report))
    print(f"report written to {args.output}/ (report.json, report.md, plots, side-by-side)")
    return 0
