"""``kinegen train WHAT``: train a part of the bundled models (vae, t2v, ar, dasa, adherence, gan,
gan-classifier, omni, relevance). Each run keeps a resumable checkpoint in its ``--run`` folder; ``--export``
copies the result into place when training ends."""

from __future__ import annotations

import json
from pathlib import Path

from .common import add_dataclass_flags


def add_parser(subparsers) -> None:
    from ..training.configs import (
        AdherenceTrainConfig,
        ARTrainConfig,
        DASATrainConfig,
        GANClassifierTrainConfig,
        GANTrainConfig,
        OmniTrainConfig,
        RelevanceTrainConfig,
        T2VTrainConfig,
        VAETrainConfig,
    )

    train = subparsers.add_parser("train", help="train the bundled models (resumable, time-boxed)",
                                  description="Train the parts of the bundled models. Each run keeps a resumable "
                                              "checkpoint in its --run folder: the same command continues it.")
    tsub = train.add_subparsers(dest="what", metavar="WHAT", required=True)
    for name, cfg_cls, run_dir, helptext in [
        ("vae", VAETrainConfig, "runs/vae", "the video VAE (AutoencoderKLWan) on procedural clips"),
        ("t2v", T2VTrainConfig, "runs/t2v", "the text-to-video transformer and text encoder (needs a trained VAE)"),
        ("ar", ARTrainConfig, "runs/ar", "the chunk-by-chunk model: diffusion forcing of the text-to-video model on "
                                         "long videos (docs/autoregressive.md)"),
        ("dasa", DASATrainConfig, "runs/dasa", "dynamics-guided distillation of a chunk-by-chunk model for the DASA "
                                               "accelerator (docs/dasa.md)"),
        ("adherence", AdherenceTrainConfig, "runs/adherence", "the prompt-adherence classifier"),
        ("gan", GANTrainConfig, "runs/gan", "the class-conditional MP-GAN (or --variant r3gan) on --data "
                                            "shapes|imagefolder:PATH"),
        ("gan-classifier", GANClassifierTrainConfig, "assets/models/gan-eval-classifier",
         "the classifier whose features `kinegen eval gan` measures (held-out procedural images)"),
        ("omni", OmniTrainConfig, "runs/omni", "the small omni model (a Qwen2.5-Omni thinker) on procedural clips "
                                               "with sound and questions about them (docs/omniselect.md)"),
        ("relevance", RelevanceTrainConfig, "runs/relevance", "the tri-modal relevance scorer OmniSelect reads "
                                                              "(words, frames and sounds in one space)"),
    ]:
        tp = tsub.add_parser(name, help=helptext, description=f"Train {helptext}.")
        tp.add_argument("--run", default=run_dir, metavar="DIR", help="run folder (default: %(default)s)")
        tp.add_argument("--export", metavar="DIR", help="also copy the result here when training ends")
        add_dataclass_flags(tp, cfg_cls)
        tp.set_defaults(func=run, config_cls=cfg_cls)


def run(args) -> int:
    import dataclasses

    cfg = args.config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args.config_cls)})
    check_settings(args, cfg)
    if args.what == "gan-classifier":
        from ..training.gan_classifier import train_classifier

        meta = train_classifier(args.run, **dataclasses.asdict(cfg), progress=lambda i, n, loss: print(
            f"step {i}/{n} loss {loss:.4f}", flush=True))
        print(f"saved to {args.run} (held-out accuracy {meta['test_accuracy']:.1%})")
        return 0
    if args.what == "vae":
        from ..training.vae import train_vae as train
    elif args.what == "t2v":
        from ..training.t2v import train_t2v as train
    elif args.what == "ar":
        from ..training.ar import train_ar as train
    elif args.what == "dasa":
        from ..training.dasa import train_dasa as train
    elif args.what == "gan":
        from ..training.gan import train_gan as train
    elif args.what == "omni":
        from ..training.omni import train_omni as train
    elif args.what == "relevance":
        from ..training.trimodal import train_relevance as train
    else:
        from ..training.adherence import train_adherence as train
    result = Path(train(args.run, cfg))
    if args.export:
        _export(result, Path(args.export), cfg)
    return 0


# Settings whose range is not the default (an integer >= 1, a number >= 0): inclusive bounds, None = open.
_RANGES = {"seed": (0, None), "crop": (8, 64), "size": (8, None), "resolution": (8, None), "cfg_dropout": (0, 1),
           "ema": (0, 1), "out_gain_init": (None, None), "offset_prob": (0, 1), "clean_prob": (0, 1),
           "sink_frames": (0, None), "max_start": (0, None), "segment_frames": (0, None),
           "recycle_prob": (0, 1), "recycle_sigma": (0, 1), "relink_recycle": (0, 1), "context_noise": (0, 0.99),
           "rollout_prob": (0, 1), "relink_weight": (0, None),
           "later_history_segments": (0, None), "later_share": (0, 1),
           "describe_share": (0, 1), "both_weight": (0, None),
           "eval_every": (0, None), "eval_images": (24, None), "class_weight": (0, None),
           "g_class_share": (0, None),
           "diversity_weight": (0, None), "diversity_bound": (0, None), "mbstd_group": (0, None),
           "positional_channels": (0, None), "spectral_weight": (0, None), "pixel_templates": (0, None),
           "template_curvature": (0, None), "positional_gain": (1e-3, None),
           "noise_weight_init": (None, None), "noise_max_resolution": (0, None),
           "spectrum_match": (0, None)}


def check_settings(args, cfg) -> None:
    """Every setting in range and every folder usable, before a run folder is made or any work starts."""
    import dataclasses
    import math

    from ..errors import ConfigError

    for flag, path, what in (("--run", args.run, "a new one, or an earlier run's to continue it"),
                             ("--export", args.export, "for the exported model")):
        if path and Path(path).exists() and not Path(path).is_dir():
            raise ConfigError(f"{flag} {path} is a file; give a folder ({what}).")
    for f in dataclasses.fields(cfg):
        value, flag = getattr(cfg, f.name), f"--{f.name.replace('_', '-')}"
        if f.name == "max_minutes":
            if value is not None and not 0 < value < math.inf:
                raise ConfigError(f"{flag} must be a number of minutes above 0 (or unset: no time limit); got {value}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = _RANGES.get(f.name, (1 if isinstance(value, int) else 0, None))
            if not -math.inf < value < math.inf or (lo is not None and value < lo) or (hi is not None and value > hi):
                want = "a finite number" if lo is None else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
                raise ConfigError(f"{flag} must be {want}; got {value}.")
        elif f.name in ("vae", "init") and value and not Path(value).is_dir():
            hint = "train one with `kinegen train vae`" if f.name == "vae" else "give a folder an earlier run exported"
            raise ConfigError(f"{flag} {value} is not a folder; {hint}.")
    if args.what == "dasa":
        _check_dasa(cfg)
    if args.what == "ar":
        from ..training.ar import check_config

        check_config(cfg)
    if getattr(cfg, "decoder_only", False) and not cfg.init:
        raise ConfigError("--decoder-only fine-tunes a trained VAE's decoder: pass --init VAE_FOLDER.")
    if args.what == "t2v":  # what train_t2v checks first, as errors rather than tracebacks
        from ..training.t2v import _init_files, parse_shape_weights, parse_sizes

        try:
            parse_shape_weights(cfg.shape_weights)
            parse_sizes(cfg.sizes, cfg)
            if cfg.init:
                _init_files(Path(cfg.init))
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None


def _check_dasa(cfg) -> None:
    from ..errors import ConfigError
    from ..training.dasa import _dasa_config

    if cfg.train not in ("all", "attention"):
        raise ConfigError(f"--train must be all or attention; got {cfg.train!r}.")
    if cfg.frames % 4 != 1 or cfg.frames < 9:
        raise ConfigError(f"--frames must be 4k + 1 and at least 9 (two chunks: DASA acts from the second); "
                          f"got {cfg.frames}.")
    if cfg.loss_steps > cfg.sample_steps:
        raise ConfigError(f"--loss-steps ({cfg.loss_steps}) cannot exceed --sample-steps ({cfg.sample_steps}).")
    if cfg.guidance is not None and not 0 <= cfg.guidance < float("inf"):
        raise ConfigError(f"--guidance must be a number >= 0; got {cfg.guidance}.")
    from ..dasa.config import DASAConfig

    _dasa_config(cfg.dasa, DASAConfig)  # a bad setting fails here, naming the valid ones


def _export(result: Path, dest: Path, cfg) -> None:
    """Build the export beside its destination, then swap it in: an interrupted export never leaves
    a half-written model where the old one was."""
    import dataclasses
    import shutil

    from ..media import swap_in_dir

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
        (tmp / "config.json").write_text(json.dumps({"width": 16, **recipe, "trained_steps": cfg.steps}, indent=2))
    swap_in_dir(tmp, dest)
    print(f"exported to {dest}")
