"""The ``kinegen`` command line: generate, models, profile, calibrate, train, eval.

Every user error (bad size, unknown model or accelerator, unwritable output...) prints one
``error:`` paragraph saying what to do and exits with status 2; no partial output file is
left behind. Heavy imports happen inside the commands so that ``kinegen --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from . import __version__
from .errors import KinegenError

EPILOG_ACCEL = (
    "Accelerators are given as NAME[:key=value,...]; `kinegen models --accelerators` lists them with "
    "their keys and defaults."
)


# ---------------------------------------------------------------------------- argument groups


def _add_generation_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation settings (default: the model's own)")
    g.add_argument("--height", type=int, help="output height in pixels (a multiple of the model's factor, usually 16)")
    g.add_argument("--width", type=int, help="output width in pixels (a multiple of the model's factor, usually 16)")
    g.add_argument("--frames", type=int, help="frames for video models, of the form 4k+1 (e.g. 9, 17, 81)")
    g.add_argument("--steps", type=int, help="denoising steps (1-1000)")
    g.add_argument("--guidance", type=float,
                   help="guidance scale: classifier-free guidance for Wan/CogVideoX, embedded guidance for "
                        "FLUX/HunyuanVideo")
    g.add_argument("--negative-prompt", metavar="P", help="what to steer away from (CFG models; FLUX/HunyuanVideo "
                                                          "also need --true-cfg-scale above 1)")
    g.add_argument("--true-cfg-scale", type=float, metavar="S",
                   help="true classifier-free guidance for guidance-distilled models (FLUX, HunyuanVideo)")
    g.add_argument("--image", metavar="PATH", help="input image for editing models (FLUX Kontext)")


def _add_loading_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model loading")
    g.add_argument("--model", "-m", metavar="M",
                   help="registry name (see `kinegen models`), local diffusers folder or hub id (default: %(default)s)")
    g.add_argument("--device", default="auto", help="cuda, cpu, mps or auto (default: %(default)s)")
    g.add_argument("--dtype", default="auto", help="bf16, fp16, fp32 or auto: bf16 on CUDA, fp32 on CPU "
                                                   "(default: %(default)s)")
    g.add_argument("--cpu-offload", choices=["model", "sequential"],
                   help="keep weights on the CPU and move components (model) or submodules (sequential) to the "
                        "GPU only while they run")
    g.add_argument("--vae-tiling", action="store_true", help="decode the VAE in tiles to save memory")


def build_parser() -> argparse.ArgumentParser:
    from .registry import DEFAULT_MODEL

    parser = argparse.ArgumentParser(
        prog="kinegen", description="Fast video and image generation on diffusers pipelines.",
        epilog="Run `kinegen COMMAND --help` for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"kinegen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser(
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
                     help="a class name or index (repeat for several, cycled over the images; default: every "
                          "class in turn)")
    gan.add_argument("--num-images", type=int, default=16, metavar="N",
                     help="images in the grid; image i uses seed SEED+i (default: %(default)s)")
    gan.add_argument("--truncation", type=float, default=1.0, metavar="T",
                     help="latent truncation in (0, 1]; 1 = off, lower = higher fidelity, less variety "
                          "(default: %(default)s)")
    gan.add_argument("--upscale", type=int, default=4, metavar="K",
                     help="enlarge each image K times (nearest neighbour) in the grid (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    gen.add_argument("--cache", metavar="NAME[:k=v,...]",
                     help="a caching accelerator: mapguided, first-block, taylorseer, mag, pab, faster (see "
                          "`kinegen models --accelerators`)")
    gen.add_argument("--attention", metavar="NAME[:k=v,...]",
                     help="an attention accelerator: dense-attention:backend=... (see `kinegen models --accelerators`)")
    gen.add_argument("--heatmap", metavar="PNG",
                     help="with --cache mapguided: also write the run's TVMap and caching plan as a heatmap")
    gen.add_argument("--json", action="store_true", help="print the timing summary as JSON")
    _add_generation_flags(gen)
    _add_loading_flags(gen)
    gen.set_defaults(func=cmd_generate, model=DEFAULT_MODEL)

    mod = sub.add_parser("models", help="list registered models and which are available locally",
                         description="List registered models, where their weights come from and whether they are "
                                     "available on this machine (bundled, built in code, in $KINEGEN_MODELS_DIR or "
                                     "the Hugging Face cache).")
    mod.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mod.add_argument("--accelerators", action="store_true", help="list the registered accelerators and their keys")
    mod.set_defaults(func=cmd_models)

    prof = sub.add_parser(
        "profile", help="compare accelerator configurations against the dense baseline",
        description="Run the dense baseline and each --config on the same prompts and seeds (warm-up, then "
                    "interleaved repeats); report latency, transformer time, speedup, peak memory and fidelity "
                    "(PSNR, SSIM) against dense. Writes DIR/report.json, DIR/report.md, DIR/speedup_vs_psnr.png, "
                    "DIR/latency.png and a side-by-side video (or image) of the outputs.",
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
    _add_generation_flags(prof)
    _add_loading_flags(prof)
    prof.set_defaults(func=cmd_profile, model=DEFAULT_MODEL)

    cal = sub.add_parser(
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
    _add_generation_flags(cal)
    _add_loading_flags(cal)
    cal.set_defaults(func=cmd_calibrate, model=DEFAULT_MODEL)

    train = sub.add_parser("train", help="train the bundled models (resumable, time-boxed)",
                           description="Train the parts of the bundled models. Each run keeps a resumable "
                                       "checkpoint in its --run folder: the same command continues it.")
    tsub = train.add_subparsers(dest="what", metavar="WHAT", required=True)
    from .training.configs import (
        AdherenceTrainConfig,
        GANClassifierTrainConfig,
        GANTrainConfig,
        T2VTrainConfig,
        VAETrainConfig,
    )

    for name, cfg_cls, run, helptext in [
        ("vae", VAETrainConfig, "runs/vae", "the video VAE (AutoencoderKLWan) on procedural clips"),
        ("t2v", T2VTrainConfig, "runs/t2v", "the text-to-video transformer and text encoder (needs a trained VAE)"),
        ("adherence", AdherenceTrainConfig, "runs/adherence", "the prompt-adherence classifier"),
        ("gan", GANTrainConfig, "runs/gan", "the class-conditional MP-GAN (or --variant r3gan) on --data "
                                            "shapes|imagefolder:PATH"),
        ("gan-classifier", GANClassifierTrainConfig, "assets/models/gan-eval-classifier",
         "the classifier whose features `kinegen eval gan` measures (held-out procedural images)"),
    ]:
        tp = tsub.add_parser(name, help=helptext, description=f"Train {helptext}.")
        tp.add_argument("--run", default=run, metavar="DIR", help="run folder (default: %(default)s)")
        tp.add_argument("--export", metavar="DIR", help="also copy the result here when training ends")
        _add_dataclass_flags(tp, cfg_cls)
        tp.set_defaults(func=cmd_train, config_cls=cfg_cls)

    ev = sub.add_parser("eval", help="evaluate models (prompt adherence, GAN metrics)")
    esub = ev.add_subparsers(dest="what", metavar="WHAT", required=True)
    adh = esub.add_parser(
        "adherence", help="per-attribute prompt adherence of a text-to-video model",
        description="Generate prompts from the procedural caption distribution (training or held-out "
                    "attribute combinations) and report how often the adherence classifier sees the "
                    "prompted shape, colour and motion.")
    adh.add_argument("--prompts", type=int, default=100, metavar="N", help="prompts per split (default: %(default)s)")
    adh.add_argument("--split", choices=["train", "held_out", "both"], default="both",
                     help="attribute combinations to draw prompts from (default: %(default)s)")
    adh.add_argument("--seed", type=int, default=0, help="seed of the prompt set and generations (default: 0)")
    adh.add_argument("--cache", metavar="NAME[:k=v,...]", help="evaluate with a caching accelerator on")
    adh.add_argument("--attention", metavar="NAME[:k=v,...]", help="evaluate with an attention accelerator on")
    adh.add_argument("--classifier", metavar="DIR", help="adherence classifier folder (default: the bundled one)")
    adh.add_argument("--output", "-o", metavar="FILE", help="write the results (with every prompt) as JSON")
    _add_generation_flags(adh)
    _add_loading_flags(adh)
    adh.set_defaults(func=cmd_eval_adherence, model=DEFAULT_MODEL)
    evg = esub.add_parser(
        "gan", help="FD, KID, precision/recall, class accuracy and mode coverage of a GAN",
        description="Generate images of every class from an MPGANPipeline folder and compare them with held-out "
                    "procedural images in the feature space of the bundled evaluation classifier (no downloads). "
                    "With --inception-weights, the Inception FID too.")
    evg.add_argument("--model", "-m", required=True, metavar="DIR", help="an MPGANPipeline folder")
    evg.add_argument("--images", type=int, default=1200, metavar="N", help="generated and real images (default: 1200)")
    evg.add_argument("--seed", type=int, default=0, help="seed of the generated set (default: 0)")
    evg.add_argument("--classifier", metavar="DIR", help="evaluation classifier folder (default: the bundled one)")
    evg.add_argument("--inception-weights", metavar="PATH", help="local Inception weights for the FID")
    evg.add_argument("--output", "-o", metavar="FILE", help="write the metrics as JSON")
    evg.set_defaults(func=cmd_eval_gan)
    app = sub.add_parser(
        "app", help="start the web UI (Generate, GAN, Profile, History) and its API",
        description="Start the Gradio web app. Models load once and are reused; runs go through a queue with "
                    "--concurrency runs at a time and at most --max-queue waiting; outputs are written to "
                    "--output-dir, the only folder the server serves files from. The generate function is also "
                    "an API endpoint: gradio_client's Client(URL).predict(prompt=..., seed=..., "
                    "api_name=\"/generate\") returns the video file.",
        epilog="Example: kinegen app --port 7860 --auth alice:secret --rate-limit 6")
    app.add_argument("--host", default="127.0.0.1",
                     help="interface to listen on; 0.0.0.0 for every interface (default: %(default)s)")
    app.add_argument("--port", type=int, default=7860, help="port (default: %(default)s)")
    app.add_argument("--models", nargs="+", metavar="M", default=[DEFAULT_MODEL],
                     help="text-to-video/image models to offer: registry names or local diffusers folders "
                          "(default: %(default)s)")
    app.add_argument("--gan-models", nargs="*", metavar="M", default=["kinegen-shapes-gan"],
                     help="class-conditional GANs for the GAN tab (default: %(default)s; --gan-models with no "
                          "names hides the tab)")
    app.add_argument("--output-dir", default="kinegen-app-outputs", metavar="DIR",
                     help="where outputs and history.jsonl are written (default: %(default)s)")
    app.add_argument("--concurrency", type=int, default=1, metavar="N",
                     help="runs executing at once on the device (default: %(default)s)")
    app.add_argument("--max-queue", type=int, default=16, metavar="N",
                     help="runs that may wait in the queue; more are refused (default: %(default)s)")
    app.add_argument("--rate-limit", type=int, default=0, metavar="N",
                     help="runs per user per minute, 0 = unlimited (default: %(default)s)")
    app.add_argument("--auth", action="append", metavar="USER:PASSWORD",
                     help="require a login (repeat for several users); see also --auth-file")
    app.add_argument("--auth-file", metavar="FILE", help="a file of USER:PASSWORD lines")
    app.set_defaults(func=cmd_app)
    return parser


def _add_dataclass_flags(p: argparse.ArgumentParser, cfg_cls) -> None:
    import dataclasses

    g = p.add_argument_group("training settings")
    comments = _field_comments(cfg_cls)
    for f in dataclasses.fields(cfg_cls):
        typ = {"int": int, "float": float, "str": str, "bool": _parse_bool}.get(
            str(f.type).split(" |")[0].replace("'", ""), str)
        default = repr(f.default) if f.default == "" else f.default
        note = comments.get(f.name, "").replace("%", "%%")
        g.add_argument(f"--{f.name.replace('_', '-')}", type=typ, default=f.default, metavar=f.name.upper(),
                       help=f"{note} (default: {default})".strip())


def _field_comments(cfg_cls) -> dict[str, str]:
    """The comment after each field of a config dataclass (``name: type = value  # comment``), as help."""
    import inspect
    import re

    try:
        source = inspect.getsource(cfg_cls)
    except (OSError, TypeError):
        return {}
    return {m[1]: m[2].strip() for m in re.finditer(r"^\s+(\w+)\s*:[^#\n]*#(.*)$", source, re.M)}


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# ---------------------------------------------------------------------------- helpers


def _request_fields(args) -> dict:
    return dict(negative_prompt=args.negative_prompt, height=args.height, width=args.width, frames=args.frames,
                steps=args.steps, guidance=args.guidance, true_cfg_scale=args.true_cfg_scale, image=args.image)


def _load(args):
    from .loading import load_pipeline

    t0 = time.perf_counter()
    pipe = load_pipeline(args.model, device=args.device, dtype=args.dtype, cpu_offload=args.cpu_offload or False,
                         vae_tiling=args.vae_tiling)
    return pipe, time.perf_counter() - t0


def _note_for(spec) -> str | None:
    if spec.builder is not None:
        return (f"note: {spec.name} is a tiny model with random weights built in code: it tests the pipeline end to "
                "end, and its output is noise. Pass --model with a real checkpoint for real videos.")
    return None


def _default_output(prompt: str, seed: int, kind: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:48] or "output"
    return Path(f"{slug}-seed{seed}.{'mp4' if kind == 'video' else 'png'}")


def _check_spec(spec: str | None, kind: str, flag: str) -> tuple[str, ...]:
    if spec is None:
        return ()
    from .accelerate import list_accelerators, parse_spec
    from .errors import ConfigError

    acc, _ = parse_spec(spec)
    if acc.kind != kind:
        names = ", ".join(a.name for a in list_accelerators(kind))
        raise ConfigError(f"{flag} takes a {kind} accelerator ({names}); {acc.name} is a {acc.kind} accelerator.")
    return (spec,)


def _accelerator_specs(args) -> tuple[str, ...]:
    """--cache and --attention, each checked against its kind."""
    return _check_spec(args.cache, "cache", "--cache") + _check_spec(getattr(args, "attention", None), "attention",
                                                                     "--attention")


# ---------------------------------------------------------------------------- commands


_GAN_ONLY = ("class_labels", "--class"), ("num_images", "--num-images"), ("truncation", "--truncation"), \
    ("upscale", "--upscale")
_TEXT_ONLY = ("cache", "--cache"), ("attention", "--attention"), ("heatmap", "--heatmap"), \
    ("negative_prompt", "--negative-prompt"), ("height", "--height"), ("width", "--width"), \
    ("frames", "--frames"), ("steps", "--steps"), ("guidance", "--guidance"), \
    ("true_cfg_scale", "--true-cfg-scale"), ("image", "--image")


def _is_gan(spec) -> bool:
    from .registry import FAMILIES

    return spec is not None and FAMILIES[spec.family].conditioning == "class"


def _check_flags_for(spec, args) -> None:
    """Flags that do not apply to the chosen model are an error, not silently ignored."""
    from .errors import ConfigError

    gan = _is_gan(spec)
    defaults = {"num_images": 16, "truncation": 1.0, "upscale": 4}
    for dest, flag in (_TEXT_ONLY if gan else _GAN_ONLY):
        value = getattr(args, dest, None)
        if value is not None and value != defaults.get(dest):
            what = ("a class-conditional GAN (it takes --class, --num-images, --truncation)" if gan else
                    "a text-conditioned model (--class, --num-images, --truncation and --upscale are for GANs)")
            raise ConfigError(f"{flag} does not apply to {spec.name}, {what}.")
    if not gan and args.prompt is None:
        raise ConfigError(f"{spec.name} needs a prompt: kinegen generate \"a red circle moving right\".")


def cmd_generate_gan(args) -> int:
    """``kinegen generate --model <gan> --class NAME --num-images N``: one grid image."""
    from .generation import generate_class_images
    from .media import check_output_path

    labels = list(args.class_labels or ([args.prompt] if args.prompt else []))
    labels = [int(x) if x.strip().isdigit() else x for x in labels]
    name = "-".join(str(x) for x in labels) or "all-classes"
    output = Path(args.output) if args.output else _default_output(f"{name}-grid", args.seed, "image")
    output = check_output_path(output, "image")
    if not 1 <= args.upscale <= 16:
        from .errors import ConfigError

        raise ConfigError(f"--upscale must be between 1 and 16; got {args.upscale}.")
    pipe, load_s = _load(args)
    result = generate_class_images(pipe, labels or None, num_images=args.num_images, seed=args.seed,
                                   truncation=args.truncation)
    result.save(output, upscale=args.upscale)
    n, h, w = result.images.shape[:3]
    if args.json:
        print(json.dumps({"output": str(output), "model": pipe.kinegen_spec.name, "images": n, "height": h,
                          "width": w, "classes": result.class_names, "seeds": result.seeds,
                          "truncation": result.truncation, "timings_s": {"load": load_s, **result.timings}},
                         indent=2))
        return 0
    print(f"wrote {output} ({n} images of {w}x{h}: {', '.join(dict.fromkeys(result.class_names))}; seeds "
          f"{result.seeds[0]}..{result.seeds[-1]})")
    print(f"time: load {load_s:.2f} s | generator {result.timings['generator'] * 1000:.1f} ms "
          f"({result.timings['per_image'] * 1000:.2f} ms per image; one step, batched forwards)")
    return 0


def cmd_generate(args) -> int:
    from .generation import GenerationRequest, check_request_basics, generate
    from .loading import resolve_model
    from .media import check_output_path

    spec = resolve_model(args.model).spec  # None for a hub id not downloaded yet
    if spec is not None:
        _check_flags_for(spec, args)
        if _is_gan(spec):
            return cmd_generate_gan(args)
    if args.prompt is None:
        from .errors import ConfigError

        raise ConfigError("Give a prompt: kinegen generate \"a red circle moving right\".")
    request = GenerationRequest(prompt=args.prompt, seed=args.seed, **_request_fields(args))
    check_request_basics(request)
    accelerators = _accelerator_specs(args)
    if args.heatmap:
        from .errors import ConfigError

        if not (args.cache or "").startswith("mapguided"):
            raise ConfigError("--heatmap shows Map-Guided Caching's map and plan; add --cache mapguided:speedup=S.")
        if Path(args.heatmap).suffix.lower() != ".png":
            raise ConfigError(f"--heatmap writes a PNG; give a file name ending in .png, not {args.heatmap}.")
        check_output_path(args.heatmap, "image")
    if spec is not None:  # check the output before spending time on loading
        output = Path(args.output) if args.output else _default_output(args.prompt, args.seed, spec.kind)
        check_output_path(output, spec.kind)
        note = _note_for(spec)
        if note:
            print(note, file=sys.stderr)
    pipe, load_s = _load(args)
    spec = pipe.kinegen_spec
    output = Path(args.output) if args.output else _default_output(args.prompt, args.seed, spec.kind)
    output = check_output_path(output, spec.kind)
    pipe.set_progress_bar_config(leave=False, disable=None)
    result = generate(pipe, request, accelerators=accelerators)
    t0 = time.perf_counter()
    result.save(output)
    write_s = time.perf_counter() - t0
    t = result.timings
    r = result.request
    summary = {
        "output": str(output), "model": spec.name, "kind": result.kind, "frames": int(result.frames.shape[0]),
        "height": r.height, "width": r.width, "steps": r.steps, "guidance": r.guidance, "seed": r.seed,
        "timings_s": {"load": load_s, **{k: v for k, v in t.items() if k != "transformer_calls"}, "write": write_s},
        "transformer_calls": t["transformer_calls"], "accelerators": result.accelerators,
    }
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    what = f"{summary['frames']} frames, " if result.kind == "video" else ""
    print(f"wrote {output} ({what}{r.width}x{r.height}, {r.steps} steps, seed {r.seed})")
    print(f"time: load {load_s:.2f} s | text encoder {t['text_encoder']:.2f} s | transformer {t['transformer']:.2f} s "
          f"({t['transformer_calls']} calls) | VAE decode {t['vae_decode']:.2f} s | other {t['other']:.2f} s | "
          f"generation total {t['total']:.2f} s | write {write_s:.2f} s")
    for st in result.accelerators:
        extra = {k: v for k, v in st.items() if k not in ("name", "config") and not isinstance(v, list)}
        print(f"accelerator {st['name']}: {st['config']}" + (f" {extra}" if extra else ""))
        if args.heatmap and st["name"] == "mapguided" and st.get("map"):
            from .caching.tvmap import save_heatmap

            save_heatmap(args.heatmap, st["map"], st.get("plan"), st.get("groups"),
                         f"{spec.name}, {r.steps} steps: requested {st['requested_speedup']:g}x, "
                         f"{st['achieved_compute_fraction']:.0%} of block evaluations computed; map "
                         f"{st['map_source']}")
            print(f"wrote {args.heatmap} (TVMap and plan)")
    return 0


def cmd_models(args) -> int:
    if args.accelerators:
        import dataclasses

        from .accelerate import list_accelerators

        rows = []
        for acc in list_accelerators():
            keys = {f.name: f.default for f in dataclasses.fields(acc.config_cls)}
            rows.append({"name": acc.name, "kind": acc.kind, "summary": acc.summary, "keys": keys})
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
        else:
            for r in rows:
                keys = ", ".join(f"{k}={v}" for k, v in r["keys"].items())
                print(f"{r['name']:<12} {r['kind']:<9} {r['summary']}\n{'':<22}keys: {keys}")
        return 0
    from .loading import describe_models
    from .registry import DEFAULT_MODEL

    rows = describe_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<20} {'kind':<6} {'family':<14} {'local':<6} source")
    for r in rows:
        default = " (default)" if r["name"] == DEFAULT_MODEL else ""
        size = f"  [{r['size']}]" if r["size"] and not r["available"] else ""
        print(f"{r['name']:<20} {r['kind']:<6} {r['family']:<14} {'yes' if r['available'] else 'no':<6} "
              f"{r['source']}{default}{size}")
    print("\nReal checkpoints load from $KINEGEN_MODELS_DIR/<name>, the Hugging Face cache, or any folder passed "
          "to --model. Download one with `hf download <repo> --local-dir <folder>`.")
    return 0


def cmd_profile(args) -> int:
    from .generation import GenerationRequest, check_request_basics
    from .profiling.report import markdown_table
    from .profiling.runner import parse_config, profile

    fields = _request_fields(args)
    for p in args.prompt:
        check_request_basics(GenerationRequest(prompt=p, **fields))
    configs = [parse_config(c) for c in args.config]
    pipe, _ = _load(args)
    note = _note_for(pipe.kinegen_spec)
    if note:
        print(note, file=sys.stderr)
    pipe.set_progress_bar_config(disable=True)

    def progress(done, total, label):
        print(f"\r[{done}/{total}] {label:<40}", end="", file=sys.stderr, flush=True)

    report = profile(pipe, args.prompt, configs, seeds=args.seeds, repeats=args.repeats, warmup=args.warmup,
                     output_dir=args.output, progress=progress, **fields)
    print(file=sys.stderr)
    print(markdown_table(report))
    print(f"report written to {args.output}/ (report.json, report.md, plots, side-by-side)")
    return 0


def cmd_calibrate(args) -> int:
    from .generation import GenerationRequest, check_request_basics
    from .training.calibrate import calibrate, read_prompts

    prompts = read_prompts(args.prompts)
    fields = {k: v for k, v in _request_fields(args).items() if v is not None}
    for p in prompts:
        check_request_basics(GenerationRequest(prompt=p, **fields))
    if not 0 <= args.held_out < 1 or args.seeds < 1 or args.group_size < 1 or args.sensitivity_prompts < 0:
        from .errors import ConfigError

        raise ConfigError("--held-out must be in [0, 1), --seeds and --group-size at least 1, "
                          "--sensitivity-prompts at least 0.")
    pipe, _ = _load(args)
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


def cmd_train(args) -> int:
    import dataclasses
    import shutil

    cfg = args.config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args.config_cls)})
    if args.what == "vae":
        from .training.vae import train_vae as run
    elif args.what == "t2v":
        from .training.t2v import train_t2v as run
    elif args.what == "gan":
        from .training.gan import train_gan as run
    elif args.what == "gan-classifier":
        from .gan_eval import train_classifier

        meta = train_classifier(args.run, **dataclasses.asdict(cfg), progress=lambda i, n, loss: print(
            f"step {i}/{n} loss {loss:.4f}", flush=True))
        print(f"saved to {args.run} (held-out accuracy {meta['test_accuracy']:.1%})")
        return 0
    else:
        from .training.adherence import train_adherence as run
    result = Path(run(args.run, cfg))
    if args.export:
        from .media import swap_in_dir

        # Build the export beside its destination, then swap it in: an interrupted export never leaves
        # a half-written model where the old one was.
        dest = Path(args.export)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        if result.is_dir():
            shutil.copytree(result, tmp)
        else:
            tmp.mkdir()
            shutil.copy2(result, tmp / "model.safetensors")
            recipe = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("max_minutes", "checkpoint_every")}
            (tmp / "config.json").write_text(json.dumps({"width": 16, **recipe, "trained_steps": cfg.steps},
                                                        indent=2))
        swap_in_dir(tmp, dest)
        print(f"exported to {dest}")
    return 0


def cmd_eval_adherence(args) -> int:
    from .adherence import evaluate_adherence, load_classifier
    from .media import atomic_path

    accelerators = _accelerator_specs(args)
    classifier = load_classifier(args.classifier)
    pipe, _ = _load(args)
    pipe.set_progress_bar_config(disable=True)
    fields = {k: v for k, v in _request_fields(args).items() if v is not None}
    splits = ["train", "held_out"] if args.split == "both" else [args.split]
    results = {}
    for split in splits:
        def progress(i, n, split=split):
            print(f"\r{split}: {i}/{n}", end="", file=sys.stderr, flush=True)

        results[split] = evaluate_adherence(pipe, args.prompts, split, seed=args.seed, classifier=classifier,
                                            accelerators=accelerators, progress=progress, **fields)
        print(file=sys.stderr)
    print(f"prompt adherence of {pipe.kinegen_spec.name} ({args.prompts} prompts per split)")
    print(f"{'split':<10} {'shape':>7} {'colour':>7} {'motion':>7}")
    for split, r in results.items():
        a = r["accuracy"]
        print(f"{split:<10} {a['shape']:>7.1%} {a['colour']:>7.1%} {a['motion']:>7.1%}")
    if args.output:
        with atomic_path(Path(args.output)) as tmp:
            tmp.write_text(json.dumps({"model": pipe.kinegen_spec.name, "results": results}, indent=2))
        print(f"wrote {args.output}")
    return 0


def cmd_eval_gan(args) -> int:
    from .gan_eval import evaluate_pipeline, load_classifier
    from .media import atomic_write_text
    from .pipelines import MPGANPipeline

    if args.images < 24:
        from .errors import ConfigError

        raise ConfigError("--images must be at least 24 (two per class); 1000 or more for stable FD/KID.")
    clf = load_classifier(args.classifier)
    pipe = MPGANPipeline.from_pretrained(args.model)
    m = evaluate_pipeline(pipe, args.images, clf, seed=args.seed, fid_weights=args.inception_weights)
    print(f"{args.model}: FD {m['fd']:.4f} | KID {m['kid']:.5f} +- {m['kid_std']:.5f} | precision "
          f"{m['precision']:.3f} recall {m['recall']:.3f} | class accuracy {m['class_accuracy']:.1%} | modes "
          f"{m['modes_covered']}/{m['modes']}" + (f" | Inception FID {m['inception_fid']:.2f}"
                                                   if "inception_fid" in m else ""))
    if args.output:
        atomic_write_text(args.output, json.dumps(m, indent=2) + "\n")
    return 0


def _read_auth(args) -> list[tuple[str, str]] | None:
    from .errors import ConfigError

    lines = list(args.auth or [])
    if args.auth_file:
        path = Path(args.auth_file)
        if not path.is_file():
            raise ConfigError(f"--auth-file {path} does not exist.")
        lines += [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    pairs = []
    for line in lines:
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ConfigError("--auth takes USER:PASSWORD with both parts non-empty.")
        pairs.append((user, password))
    return pairs or None


def cmd_app(args) -> int:
    from .apps.service import AppConfig
    from .apps.web import launch_app
    from .loading import resolve_model

    for m in list(args.models) + list(args.gan_models):
        resolve_model(m)  # unknown names and incomplete folders fail here, before the server starts
    config = AppConfig(models=list(args.models), gan_models=list(args.gan_models), output_dir=Path(args.output_dir),
                       concurrency=args.concurrency, max_queue=args.max_queue, rate_limit=args.rate_limit,
                       auth=_read_auth(args))
    print(f"Kinegen app on http://{args.host}:{args.port}/ (outputs in {config.output_dir.resolve()}); Ctrl+C stops it",
          flush=True)
    launch_app(config, host=args.host, port=args.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except KinegenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
