"""``kinegen generate``: a video (mp4) or image (png) from a prompt, optionally with accelerators;
for class-conditional GANs, a grid of images of the classes given with ``--class``."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from pathlib import Path

from ..parallel import PARALLEL_HELP
from ..text import json_safe, settings_text, stat_items
from .common import (
    EPILOG_ACCEL,
    accelerator_flags,
    add_generation_flags,
    add_loading_flags,
    default_output,
    load,
    request_fields,
    tiny_model_note,
)

_GAN_ONLY = ("class_labels", "--class"), ("num_images", "--num-images"), ("truncation", "--truncation"), \
    ("upscale", "--upscale"), ("texture", "--texture")
_TEXT_ONLY = ("cache", "--cache"), ("attention", "--attention"), ("heatmap", "--heatmap"), \
    ("negative_prompt", "--negative-prompt"), ("height", "--height"), ("width", "--width"), \
    ("frames", "--frames"), ("steps", "--steps"), ("guidance", "--guidance"), \
    ("true_cfg_scale", "--true-cfg-scale"), ("image", "--image"), ("parallel", "--parallel"), \
    ("window_frames", "--window-frames"), ("sink_frames", "--sink-frames")
_GAN_DEFAULTS = {"num_images": 16, "truncation": 1.0, "upscale": 4}

# The accelerators by kind, as `kinegen.accelerators.catalog.list_accelerators` lists them. Written out so that
# `--help` stays fast (the catalogue imports torch and diffusers); tests/test_generate.py keeps them equal.
CACHE_NAMES = ("mapguided", "first-block", "taylorseer", "mag", "pab", "faster")
ATTENTION_NAMES = ("hva", "svg2", "kmeans-sparse", "dense-attention", "dasa")


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_MODEL

    gen = subparsers.add_parser(
        "generate", help="generate a video (mp4) or image (png) from a prompt",
        description="Generate a video (mp4) or image (png) from a prompt, with optional accelerators.",
        epilog=EPILOG_ACCEL
        + ' Example: kinegen generate "a red circle moving right" --cache first-block:threshold=0.08. '
          'Class-conditional GANs take --class instead of a prompt and write an image grid: kinegen generate '
          '--model kinegen-shapes-gan --class "red circle" --num-images 16 -o grid.png',
    )
    gen.add_argument("prompt", nargs="?", help="what to generate (text-conditioned models)")
    gen.add_argument("--output", "-o", metavar="FILE",
                     help="output file: .mp4 for video models, .png/.jpg/.webp for image models and GAN grids "
                          "(default: a name made from the prompt (or class) and seed, in the current folder)")
    gan = gen.add_argument_group("class-conditional GANs (kinegen-shapes-gan or an MPGANPipeline folder)")
    gan.add_argument("--class", dest="class_labels", action="append", metavar="NAME",
                     help="a class name or index (repeat for several, cycled over the images and one grid "
                          "column each; default: every class in turn)")
    gan.add_argument("--num-images", type=int, default=_GAN_DEFAULTS["num_images"], metavar="N",
                     help="images in the grid; image i uses seed SEED+i (default: %(default)s)")
    gan.add_argument("--truncation", type=float, default=_GAN_DEFAULTS["truncation"], metavar="T",
                     help="latent truncation in (0, 1]; 1 = off, lower = higher fidelity, less variety "
                          "(default: %(default)s)")
    gan.add_argument("--texture", metavar="NAME",
                     help="the background texture of every image, for GANs trained with texture labels (the "
                          "shapes GANs: plain, checkered, striped, noisy; default: each seed draws its own)")
    gan.add_argument("--upscale", type=int, default=_GAN_DEFAULTS["upscale"], metavar="K",
                     help="enlarge each image K times (nearest neighbour) in the grid (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    gen.add_argument("--cache", metavar="NAME[:k=v,...]",
                     help=f"a caching accelerator: {', '.join(CACHE_NAMES)} (keys and defaults: "
                          "`kinegen models --accelerators`)")
    gen.add_argument("--attention", metavar="NAME[:k=v,...]",
                     help=f"an attention accelerator: {', '.join(ATTENTION_NAMES)} (keys and defaults: "
                          "`kinegen models --accelerators`)")
    gen.add_argument("--heatmap", metavar="PNG",
                     help="with --cache mapguided: also write the run's TVMap and caching plan as a heatmap")
    gen.add_argument("--json", action="store_true", help="print the timing summary as JSON")
    gen.add_argument("--parallel", metavar="ulysses=N|ring=N", help=PARALLEL_HELP)
    add_generation_flags(gen)
    add_loading_flags(gen)
    gen.set_defaults(func=run, model=DEFAULT_MODEL)


def _is_gan(spec) -> bool:
    from ..adapters import adapter_for_family

    return spec is not None and adapter_for_family(spec.family).conditioning == "class"


def _check_flags_for(spec, args) -> None:
    """Flags that do not apply to the chosen model are an error, not silently ignored."""
    from ..errors import ConfigError

    gan = _is_gan(spec)
    for dest, flag in (_TEXT_ONLY if gan else _GAN_ONLY):
        value = getattr(args, dest, None)
        if value is not None and value != _GAN_DEFAULTS.get(dest):
            what = ("a class-conditional GAN (it takes --class, --num-images, --truncation, --texture)" if gan else
                    "a text-conditioned model (--class, --num-images, --truncation, --texture and --upscale are "
                    "for GANs)")
            raise ConfigError(f"{flag} does not apply to {spec.name}, {what}.")
    if not gan and args.prompt is None:
        raise ConfigError(f"{spec.name} needs a prompt: kinegen generate \"a red circle moving right\".")


def run(args) -> int:
    with contextlib.ExitStack() as stack:  # under --parallel: leaves the process group at the end
        return _run(args, stack)


def _run(args, stack: contextlib.ExitStack) -> int:
    from ..errors import ConfigError, FidelityWarning, PromptWarning
    from ..generation import GenerationRequest, prepare, run_job
    from ..loading import resolve_model
    from ..media import check_output_path

    resolved = resolve_model(args.model)  # once: its spec (None for a hub id not downloaded yet) and folder
    spec = resolved.spec
    if spec is not None:
        _check_flags_for(spec, args)
        if _is_gan(spec):
            return run_gan(args, resolved)
    if args.prompt is None:
        raise ConfigError("Give a prompt: kinegen generate \"a red circle moving right\".")
    # Building the request runs the checks that need no model (prompt, steps, sizes, seed): before loading.
    request = GenerationRequest(prompt=args.prompt, seed=args.seed, **request_fields(args))
    accelerators = accelerator_flags(args)
    parallel = _parallel_flag(args, accelerators)
    if args.heatmap:
        if not any(acc.name == "mapguided" for acc, _ in accelerators):
            raise ConfigError("--heatmap shows Map-Guided Caching's map and plan; add --cache mapguided.")
        if Path(args.heatmap).suffix.lower() != ".png":
            raise ConfigError(f"--heatmap writes a PNG; give a file name ending in .png, not {args.heatmap}.")
        check_output_path(args.heatmap, "image")
    if spec is not None:  # check the output before spending time on loading
        check_output_path(_output(args, spec.kind), spec.kind)
    main = True
    if parallel is not None:  # every rank loads the model and runs the same call; rank 0 alone speaks and writes
        main = _start_parallel(args, parallel, stack).is_main
    if spec is not None and main:
        note = tiny_model_note(spec)
        if note:
            print(note, file=sys.stderr)
    pipe, load_s = load(args, resolved)
    if parallel is not None:
        from ..parallel import apply_parallel

        apply_parallel(pipe, parallel)
    with warnings.catch_warnings():  # said once, as a `warning:` line before the run
        warnings.simplefilter("ignore", PromptWarning)
        job = prepare(pipe, request)  # the model's defaults filled in and checked against the loaded pipeline
    if parallel is not None:
        from ..parallel import check_run

        check_run(pipe, accelerators, job.request)  # token count, backend, accelerators: before anything runs
    for note in job.warnings if main else ():
        print(f"warning: {note}", file=sys.stderr)
    spec = job.spec
    output = check_output_path(_output(args, job.kind), job.kind)
    pipe.set_progress_bar_config(leave=False, disable=None if main else True)
    with warnings.catch_warnings(), _ChunkProgress(job) as bar:  # an accelerator's warning: printed once, below
        warnings.simplefilter("ignore", FidelityWarning)
        result = run_job(job, accelerators, **bar.callbacks())
    if not main:
        return 0
    t0 = time.perf_counter()
    result.save(output)
    write_s = time.perf_counter() - t0
    t = result.timings
    r = result.request
    summary = {
        "output": str(output), "model": spec.name, "kind": result.kind, "frames": int(result.frames.shape[0]),
        "height": r.height, "width": r.width, "steps": r.steps, "guidance": r.guidance, "seed": r.seed,
        **({k: getattr(r, k) for k in ("window_frames", "sink_frames") if getattr(r, k) is not None}),
        "timings_s": {"load": load_s, **{k: v for k, v in t.items() if k != "transformer_calls"}, "write": write_s},
        "transformer_calls": t["transformer_calls"], "accelerators": result.accelerators,
        "warnings": result.warnings,
    }
    if parallel is not None:
        summary["parallel"] = {"spec": str(parallel), "processes": parallel.degree,
                               "timings": "rank 0's; every rank runs every stage, the transformer on its share"}
    if result.chunks:  # an autoregressive model: what each chunk cost
        from ..profiling.chunks import chunk_summary

        summary["chunks"] = chunk_summary([result.chunks], [t["total"]], int(result.frames.shape[0]))
        summary["chunk_stats"] = result.chunks
    planned = next((st for st in result.accelerators if st["name"] == "mapguided" and st.get("map")), None)
    if args.heatmap and planned is not None:  # with --json too
        _write_heatmap(args.heatmap, planned, spec.name, r.steps)
        summary["heatmap"] = str(args.heatmap)
    if args.json:
        print(json.dumps(json_safe(summary), indent=2, default=str))
        return 0
    what = f"{summary['frames']} frames, " if result.kind == "video" else ""
    print(f"wrote {output} ({what}{r.width}x{r.height}, {r.steps} steps, seed {r.seed})")
    if parallel is not None:
        print(f"parallel: --parallel {parallel}, {parallel.degree} processes (times below are rank 0's)")
    print(f"time: load {load_s:.2f} s | text encoder {t['text_encoder']:.2f} s | transformer {t['transformer']:.2f} s "
          f"({t['transformer_calls']} calls) | VAE decode {t['vae_decode']:.2f} s | other {t['other']:.2f} s | "
          f"generation total {t['total']:.2f} s | write {write_s:.2f} s")
    if result.chunks:
        from ..profiling.chunks import summary_line

        print(f"chunk by chunk: {summary_line(summary['chunks'])}")
    for st in result.accelerators:
        print(f"accelerator {st['name']}: {settings_text(st['config']) or 'defaults'}")
        for name, text in stat_items(st):
            print(f"  {name}: {text}")
        if st.get("warning"):
            print(f"warning: {st['warning']}", file=sys.stderr)
    if "heatmap" in summary:
        print(f"wrote {args.heatmap} (TVMap and plan)")
    return 0


def _parallel_flag(args, accelerators):
    """``--parallel`` parsed (``None`` without it); refused without torchrun or with an accelerator that does not
    work with it, before anything loads."""
    if not getattr(args, "parallel", None):
        return None
    from ..parallel import ParallelSpec, check_accelerators, require_torchrun

    spec = ParallelSpec.parse(args.parallel)
    check_accelerators(spec, accelerators)
    require_torchrun(spec, args.command)
    return spec


def _start_parallel(args, spec, stack: contextlib.ExitStack):
    """Join torchrun's process group (left when the command ends); the model loads on this rank's device."""
    from ..parallel import finish_distributed, init_distributed

    run = init_distributed(spec, args.device, command=args.command)
    stack.callback(finish_distributed)
    args.device = run.device
    if not run.is_main:
        warnings.simplefilter("ignore")  # rank 0 says it
    return run


class _ChunkProgress:
    """A progress bar per chunk for an autoregressive model (its pipeline draws none when it streams), with the
    denoising step within the chunk; nothing for other models, whose pipelines draw their own bar."""

    def __init__(self, job):
        self.on = job.streams
        self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()

    def callbacks(self) -> dict:
        """``run_job`` keyword arguments: the chunk and step callbacks (none for other models)."""
        return {"chunk_callback": self.on_chunk, "step_callback": self.on_step} if self.on else {}

    def on_chunk(self, done: int, total: int, frames) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="chunks", unit="chunk", leave=False, disable=None, file=sys.stderr)
        self.bar.set_postfix_str(f"frames: {len(frames)}", refresh=False)
        self.bar.update(done - self.bar.n)

    def on_step(self, step: int, steps: int, _latents) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"chunk {self.bar.n + 1}/{self.bar.total}, step {step + 1}/{steps}")


def _write_heatmap(path: str, st: dict, model: str, steps: int) -> None:
    from ..plotting import save_heatmap

    save_heatmap(path, st["map"], st.get("plan"), st.get("groups"),
                 f"{model}, {steps} steps: planned {st['chosen_speedup']:.2f}x, "
                 f"{st['achieved_compute_fraction']:.0%} of block evaluations computed; map {st['map_source']}")


def _output(args, kind: str) -> Path:
    return Path(args.output) if args.output else default_output(args.prompt, args.seed, kind)


def run_gan(args, resolved=None) -> int:
    """``kinegen generate --model <gan> --class NAME --num-images N``: one grid image."""
    from ..errors import ConfigError
    from ..generation import generate_class_images
    from ..media import check_output_path

    labels = list(args.class_labels or ([args.prompt] if args.prompt else []))
    labels = [int(x) if x.strip().isdigit() else x for x in labels]
    name = "-".join(str(x) for x in labels) or "all-classes"
    output = Path(args.output) if args.output else default_output(f"{name}-grid", args.seed, "image")
    output = check_output_path(output, "image")
    if not 1 <= args.upscale <= 16:
        raise ConfigError(f"--upscale must be between 1 and 16; got {args.upscale}.")
    pipe, load_s = load(args, resolved)
    result = generate_class_images(pipe, labels or None, num_images=args.num_images, seed=args.seed,
                                   truncation=args.truncation, texture=args.texture)
    result.save(output, upscale=args.upscale)
    n, h, w = result.images.shape[:3]
    if args.json:
        print(json.dumps({"output": str(output), "model": pipe.kinegen_spec.name, "images": n, "height": h,
                          "width": w, "classes": result.class_names, "seeds": result.seeds,
                          "truncation": result.truncation, "texture": result.texture,
                          "timings_s": {"load": load_s, **result.timings}},
                         indent=2))
        return 0
    texture = f"; {result.texture} backgrounds" if result.texture else ""
    print(f"wrote {output} ({n} images of {w}x{h}: {', '.join(dict.fromkeys(result.class_names))}; seeds "
          f"{result.seeds[0]}..{result.seeds[-1]}{texture})")
    print(f"time: load {load_s:.2f} s | generator {result.timings['generator'] * 1000:.1f} ms "
          f"({result.timings['per_image'] * 1000:.2f} ms per image; one step, batched forwards)")
    return 0
