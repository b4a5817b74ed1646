"""Timing and quality of the bundled text-to-video model at its default and benchmark sizes.

    python benchmarks/bundled_model.py [--large-frames 57 --large-size 384]

Prints a JSON summary and writes benchmarks/results/bundled_model/{summary.json, samples.png}:
- default size (17 x 128 x 128, 20 steps, CFG 4): one warm-up, then generations of several prompts, each
  timed by stage (text encoder, transformer, VAE decode) in this process;
- benchmark size (``--large-frames`` x ``--large-size``^2, 8,640 video tokens per transformer forward at
  57 x 384 x 384): the same prompts, timed, and classified by the adherence classifier;
- samples.png: first, middle and last frames of each prompt at both sizes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROMPTS = [
    ("a red circle moving to the right on a gray background", {"shape": "circle", "colour": "red", "motion": "right"}),
    ("a blue square moving up on a black background", {"shape": "square", "colour": "blue", "motion": "up"}),
    ("a yellow star moving left on a navy background", {"shape": "star", "colour": "yellow", "motion": "left"}),
    ("a green triangle moving down on a brown background", {"shape": "triangle", "colour": "green",
                                                             "motion": "down"}),
]


def main() -> None:
    import torch
    from PIL import Image

    import kinegen
    from kinegen.evaluation.adherence import classify, load_classifier

    ap = argparse.ArgumentParser()
    ap.add_argument("--large-frames", type=int, default=57)
    ap.add_argument("--large-size", type=int, default=384)
    ap.add_argument("--out", default="benchmarks/results/bundled_model")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pipe = kinegen.load_pipeline("kinegen-shapes-t2v", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    clf = load_classifier()
    kinegen.generate(pipe, "a white circle bouncing", seed=99)  # warm-up
    rows, strips = [], []
    for i, (prompt, truth) in enumerate(PROMPTS):
        row = {"prompt": prompt, "truth": truth}
        for name, fields in (("default", {}), ("large", {"frames": args.large_frames, "height": args.large_size,
                                                         "width": args.large_size})):
            t0 = time.perf_counter()
            res = kinegen.generate(pipe, prompt, seed=i, **fields)
            wall = time.perf_counter() - t0
            pred = classify(clf, res.frames)
            row[name] = {"shape": list(res.frames.shape), "wall_s": wall,
                         "timings_s": {k: v for k, v in res.timings.items() if k != "transformer_calls"},
                         "prediction": pred, "correct": {k: pred[k] == truth[k] for k in truth}}
            f = res.frames
            frames = [f[0], f[len(f) // 2], f[-1]]
            strip = np.concatenate([np.asarray(Image.fromarray((x * 255).round().astype(np.uint8)).resize((128, 128)))
                                    for x in frames], axis=1)
            strips.append(strip)
            print(json.dumps({"prompt": prompt, "size": name, "wall_s": round(wall, 2), "prediction": pred}),
                  flush=True)
        rows.append(row)
    grid = np.concatenate([np.concatenate(strips[j:j + 2], axis=1) for j in range(0, len(strips), 2)], axis=0)
    Image.fromarray(grid).save(out / "samples.png")
    summary = {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows,
               "large_tokens": (1 + (args.large_frames - 1) // 4) * (args.large_size // 16) ** 2}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name in ("default", "large"):
        walls = [r[name]["wall_s"] for r in rows]
        acc = {k: float(np.mean([r[name]["correct"][k] for r in rows])) for k in ("shape", "colour", "motion")}
        print(f"{name}: wall median {np.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}); "
              f"adherence {acc}")


if __name__ == "__main__":
    main()
