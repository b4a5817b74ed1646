"""What the commands share: argument groups, request fields, loading with timing, output names,
``--cache``/``--attention`` parsing, and the flags made from a training-settings dataclass."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

EPILOG_ACCEL = (
    "Accelerators are given as NAME[:key=value,...]; `kinegen models --accelerators` lists them with "
    "their keys and defaults."
)


# ---------------------------------------------------------------------------- argument groups


def add_generation_flags(p: argparse.ArgumentParser) -> None:
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
    g.add_argument("--window-frames", type=window_arg, metavar="N|global",
                   help="chunk-by-chunk models (wan_ar): latent frames the KV cache keeps, sinks included, or "
                        "'global' for every frame (memory then grows with the video)")
    g.add_argument("--sink-frames", type=int, metavar="N",
                   help="chunk-by-chunk models (wan_ar): the first latent frames, kept in the cache for ever")


def window_arg(text: str) -> int | str:
    """``--window-frames``: a number of latent frames or ``global``."""
    if text == "global":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of latent frames or 'global'; got {text!r}") from None


def add_loading_flags(p: argparse.ArgumentParser) -> None:
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


def add_dataclass_flags(p: argparse.ArgumentParser, cfg_cls) -> None:
    """One ``--field-name`` flag per field of a settings dataclass, its comment as help."""
    import dataclasses

    g = p.add_argument_group("training settings")
    comments = field_comments(cfg_cls)
    for f in dataclasses.fields(cfg_cls):
        typ = {"int": int, "float": float, "str": str, "bool": bool_arg}.get(
            str(f.type).split(" |")[0].replace("'", ""), str)
        default = repr(f.default) if f.default == "" else f.default
        note = comments.get(f.name, "").replace("%", "%%")
        g.add_argument(f"--{f.name.replace('_', '-')}", type=typ, default=f.default, metavar=f.name.upper(),
                       help=f"{note} (default: {default})".strip())


def field_comments(cfg_cls) -> dict[str, str]:
    """The comment after each field of a config dataclass (``name: type = value  # comment``), as help."""
    import inspect
    import re

    try:
        source = inspect.getsource(cfg_cls)
    except (OSError, TypeError):
        return {}
    return {m[1]: m[2].strip() for m in re.finditer(r"^\s+(\w+)\s*:[^#\n]*#(.*)$", source, re.M)}


def bool_arg(text: str) -> bool:
    """:func:`kinegen.text.parse_bool` as an argparse type."""
    from ..text import parse_bool

    try:
        return parse_bool(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---------------------------------------------------------------------------- helpers


def request_fields(args) -> dict:
    """The generation-settings flags as :class:`kinegen.generation.GenerationRequest` fields."""
    return dict(negative_prompt=args.negative_prompt, height=args.height, width=args.width, frames=args.frames,
                steps=args.steps, guidance=args.guidance, true_cfg_scale=args.true_cfg_scale, image=args.image,
                window_frames=args.window_frames, sink_frames=args.sink_frames)


def load(args, resolved=None):
    """Load ``--model`` (or the already resolved model) with the loading flags; returns ``(pipe, seconds)``."""
    from ..loading import load_pipeline

    t0 = time.perf_counter()
    pipe = load_pipeline(resolved or args.model, device=args.device, dtype=args.dtype,
                         cpu_offload=args.cpu_offload or False, vae_tiling=args.vae_tiling)
    return pipe, time.perf_counter() - t0


def tiny_model_note(spec) -> str | None:
    """A warning that a tiny in-code model's output is noise, or None for a real checkpoint."""
    if spec.builder is not None:
        return (f"note: {spec.name} is a tiny model with random weights built in code: it tests the pipeline end to "
                "end, and its output is noise. Pass --model with a real checkpoint for real videos.")
    return None


def default_output(text: str, seed: int, kind: str) -> Path:
    """``<slug of text>-seed<seed>.mp4`` (video) or ``.png``, in the current folder."""
    from ..text import slug

    return Path(f"{slug(text, 48)}-seed{seed}.{'mp4' if kind == 'video' else 'png'}")


def accelerator_flags(args) -> list:
    """``--cache`` and ``--attention``, each parsed once against its kind, as ``(accelerator, config)`` pairs."""
    from ..accelerators.catalog import parse_spec

    specs = [(args.cache, "cache"), (getattr(args, "attention", None), "attention")]
    return [parse_spec(spec, kind=kind) for spec, kind in specs if spec is not None]
