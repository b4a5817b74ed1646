"""``kinegen train WHAT``: train a part of the bundled models (vae, t2v, adherence, gan,
gan-classifier). Each run keeps a resumable checkpoint in its ``--run`` folder; ``--export``
copies the result into place when training ends."""

from __future__ import annotations

import json
from pathlib import Path

from .common import add_dataclass_flags


def add_parser(subparsers) -> None:
    from ..training.configs import (
        AdherenceTrainConfig,
        GANClassifierTrainConfig,
        GANTrainConfig,
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
        ("adherence", AdherenceTrainConfig, "runs/adherence", "the prompt-adherence classifier"),
        ("gan", GANTrainConfig, "runs/gan", "the class-conditional MP-GAN (or --variant r3gan) on --data "
                                            "shapes|imagefolder:PATH"),
        ("gan-classifier", GANClassifierTrainConfig, "assets/models/gan-eval-classifier",
         "the classifier whose features `kinegen eval gan` measures (held-out procedural images)"),
    ]:
        tp = tsub.add_parser(name, help=helptext, description=f"Train {helptext}.")
        tp.add_argument("--run", default=run_dir, metavar="DIR", help="run folder (default: %(default)s)")
        tp.add_argument("--export", metavar="DIR", help="also copy the result here when training ends")
        add_dataclass_flags(tp, cfg_cls)
        tp.set_defaults(func=run, config_cls=cfg_cls)


def run(args) -> int:
    import dataclasses

    cfg = args.config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args.config_cls)})
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
    elif args.what == "gan":
        from ..training.gan import train_gan as train
    else:
        from ..training.adherence import train_adherence as train
    result = Path(train(args.run, cfg))
    if args.export:
        _export(result, Path(args.export), cfg)
    return 0


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
