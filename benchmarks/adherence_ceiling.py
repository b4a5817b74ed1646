"""How well can the adherence classifier read a video that went through the bundled VAE?

The adherence of a generated video can be no better than what the classifier sees in a VAE round
trip of a perfect clip. This script renders single-shape clips of the prompts `kinegen eval adherence`
uses, classifies them clean and after encode/decode with one or more VAEs (the same clips for each), and
prints the accuracy per attribute, the shape confusion matrix and the round trip's PSNR/SSIM.

    python benchmarks/adherence_ceiling.py --clips 200 -o benchmarks/results/bundled_model/ceiling.json
    python benchmarks/adherence_ceiling.py --clips 200 --vae assets/models/kinegen-shapes-t2v/vae --vae runs/x/vae
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from kinegen.data.shapes import SHAPES, render_clip, sample_clip
from kinegen.evaluation.adherence import ATTRIBUTES, classify, load_classifier
from kinegen.loading import resolve_model
from kinegen.profiling.metrics import psnr, ssim
from kinegen.training.vae import to_tensor


def _summary(rows: list[dict], kind: str) -> dict:
    out = {a: float(np.mean([r["truth"][a] == r[kind][a] for r in rows])) for a in ATTRIBUTES}
    conf = np.zeros((len(SHAPES), len(SHAPES)), int)
    for r in rows:
        conf[SHAPES.index(r["truth"]["shape"]), SHAPES.index(r[kind]["shape"])] += 1
    print(f"{kind:12s} " + " ".join(f"{a} {100 * v:.1f}%" for a, v in out.items()))
    print("  shape confusion (rows truth, cols predicted: " + ", ".join(SHAPES) + ")")
    for s, line in zip(SHAPES, conf, strict=True):
        print(f"  {s:9s}" + "".join(f"{v:5d}" for v in line))
    out["shape_confusion"] = {"rows=truth, cols=prediction": list(SHAPES), "counts": conf.tolist()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--vae", action="append", metavar="FOLDER",
                    help="VAE folder to round-trip through (repeatable; default: the model's vae/)")
    ap.add_argument("--clips", type=int, default=200)
    ap.add_argument("--split", default="train", choices=["train", "held_out"])
    ap.add_argument("--classifier", default=None, help="classifier folder (default: the bundled one)")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()

    from diffusers import AutoencoderKLWan

    if not args.vae:
        folder = resolve_model(args.model).folder
        if folder is None:
            raise SystemExit(f"{args.model} is not a local diffusers folder")
        args.vae = [str(folder / "vae")]
    vaes = {name: AutoencoderKLWan.from_pretrained(name, use_safetensors=True).eval() for name in args.vae}
    classifier = load_classifier(args.classifier)
    rows = []
    with torch.no_grad():
        for i in range(args.clips):
            spec = sample_clip(7_000_000 + i, split=args.split, num_objects=1)
            clip = render_clip(spec, args.frames, args.size, args.size)
            o = spec.primary
            row = {"truth": {"shape": o.shape, "colour": o.colour, "motion": o.motion},
                   "clean": classify(classifier, clip)}
            x = to_tensor(clip[None])
            for name, vae in vaes.items():
                y = vae.decode(vae.encode(x).latent_dist.mode()).sample  # [1, 3, F, H, W] in [-1, 1]
                rt = ((y[0].permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
                row[name] = classify(classifier, rt)
                row[name + ":psnr"], row[name + ":ssim"] = psnr(clip / 255, rt / 255), ssim(clip / 255, rt / 255)
            rows.append(row)
    result = {"clips": args.clips, "split": args.split, "model": args.model, "clean": _summary(rows, "clean"),
              "round_trip": {}}
    for name in vaes:
        print(f"round trip through {name}:")
        summary = _summary(rows, name)
        summary["psnr"] = float(np.mean([r[name + ":psnr"] for r in rows]))
        summary["ssim"] = float(np.mean([r[name + ":ssim"] for r in rows]))
        print(f"  PSNR {summary['psnr']:.2f} dB, SSIM {summary['ssim']:.4f}")
        result["round_trip"][name] = summary
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
