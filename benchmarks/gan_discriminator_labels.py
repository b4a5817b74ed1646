"""Does a GAN run's discriminator tell its classes apart? Its checkpointed D scored on held-out real images.

For each real image ``x`` of class ``y``: how often ``D(x, y) > D(x, y')``, with ``y'`` every other class
(``class``) or every other shape of the same colour (``shape``); 0.5 is chance. A projection discriminator that
does not prefer an image's true shape cannot teach the generator to draw shapes by class. The same quantity as
``d_win_*`` in a run's log.jsonl, on more images and all alternatives instead of one random one per image.

    .venv/bin/python benchmarks/gan_discriminator_labels.py runs/gan-long/mp-s0 runs/gan-long/r3gan-s0 [--images 600]
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch


@torch.no_grad()
def label_preference(run: Path, n_images: int) -> dict:
    from kinegen.data.shape_images import DEFAULT_CLASSES
    from kinegen.evaluation.gan_metrics import reference_images
    from kinegen.training.gan import load_run_discriminator

    net, d = load_run_discriminator(run)
    step = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    images, labels = reference_images(n_images, net.resolution)
    if net.mbstd_group:  # score each class on its own, whole groups only: D's groups hold one class, as in training
        keep = np.concatenate([np.flatnonzero(labels == y)[: (labels == y).sum() // net.mbstd_group * net.mbstd_group]
                               for y in np.unique(labels)])
        images, labels = images[keep], labels[keep]
    real = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    if net.mbstd_group:
        scores = torch.empty(len(labels), net.num_classes)
        for y in np.unique(labels):
            rows = torch.from_numpy(np.flatnonzero(labels == y))
            scores[rows] = d.class_logits(real[rows])
    else:
        scores = d.class_logits(real)  # [N, K]: D(x, c) for every class c
    own = scores[torch.arange(len(labels)), torch.from_numpy(labels)]
    wins = {"class": [], "shape": []}
    for i, y in enumerate(labels):
        colour = DEFAULT_CLASSES[y][0]
        for c, (col, _) in enumerate(DEFAULT_CLASSES):
            if c != y:
                won = float(own[i] > scores[i, c])
                wins["class"].append(won)
                if col == colour:
                    wins["shape"].append(won)
    return {"run": str(run), "step": step, **{f"d_win_{k}": float(np.mean(v)) for k, v in wins.items()},
            "score_spread": float(scores.std())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--images", type=int, default=600)
    args = parser.parse_args()
    print("| run | step | D prefers the true class | D prefers the true shape (same colour) |")
    print("|---|---|---|---|")
    for run in args.runs:
        r = label_preference(run, args.images)
        print(f"| {run.name} | {r['step']} | {r['d_win_class']:.2f} | {r['d_win_shape']:.2f} |")


if __name__ == "__main__":
    main()
