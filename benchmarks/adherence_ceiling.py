"""How well can the adherence classifier read a video that went through the bundled VAE?

The adherence of a generated video can be no better than what the classifier sees in a VAE round
trip of a perfect clip. This script renders single-shape clips of the prompts `kinegen eval adherence`
uses, classifies them clean and after encode/decode with the bundled model's VAE, and prints the
accuracy per attribute and the shape confusion matrix.

    python benchmarks/adherence_ceiling.py --clips 200 -o benchmarks/results/bundled_model/ceiling.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from kinegen.adherence import ATTRIBUTES, classify, load_classifier
from kinegen.data.shapes import SHAPES, render_clip, sample_clip
from kinegen.loading import resolve_model
from kinegen.training.vae import to_tensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--clips", type=int, default=200)
    ap.add_argument("--split", default="train", choices=["train", "held_out"])
    ap.add_argument("--classifier", default=None, help="classifier folder (default: the bundled one)")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()

    from diffusers import AutoencoderKLWan

    folder = resolve_model(args.model).folder
    if folder is None:
        raise SystemExit(f"{args.model} is not a local diffusers folder")
    vae = AutoencoderKLWan.from_pretrained(folder / "vae").eval()
    classifier = load_classifier(args.classifier)
    rows = []
    with torch.no_grad():
        for i in range(args.clips):
            spec = sample_clip(7_000_000 + i, split=args.split, num_objects=1)
            clip = render_clip(spec, args.frames, args.size, args.size)
            x = to_tensor(clip[None])
            y = vae.decode(vae.encode(x).latent_dist.mode()).sample  # [1, 3, F, H, W] in [-1, 1]
            rt = ((y[0].permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
            o = spec.primary
            rows.append({"truth": {"shape": o.shape, "colour": o.colour, "motion": o.motion},
                         "clean": classify(classifier, clip), "round_trip": classify(classifier, rt)})
    result = {"clips": args.clips, "split": args.split, "model": args.model}
    for kind in ("clean", "round_trip"):
        result[kind] = {a: float(np.mean([r["truth"][a] == r[kind][a] for r in rows])) for a in ATTRIBUTES}
        conf = np.zeros((len(SHAPES), len(SHAPES)), int)
        for r in rows:
            conf[SHAPES.index(r["truth"]["shape"]), SHAPES.index(r[kind]["shape"])] += 1
        result[f"{kind}_shape_confusion"] = {"rows=truth, cols=prediction": list(SHAPES), "counts": conf.tolist()}
        acc = " ".join(f"{a} {100 * v:.1f}%" for a, v in result[kind].items())
        print(f"{kind:10s} {acc}")
        print("  shape confusion (rows truth, cols predicted: " + ", ".join(SHAPES) + ")")
        for s, line in zip(SHAPES, conf, strict=True):
            print(f"  {s:9s}" + "".join(f"{v:5d}" for v in line))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
