"""Long-video adherence of a chunk-by-chunk model: the adherence classifier on every 17-frame window.

    .venv/bin/python benchmarks/autoregressive_windows.py --model runs/ar/pipeline --prompts 8 --frames 241 \
        --output benchmarks/results/autoregressive/windows.json

Each prompt is a single-shape training (or ``--split held_out``) caption; the video is generated chunk by chunk
(the model folder's chunk and cache settings) and cut into windows of 17 frames every 16 frames. Per window:

- shape and colour must be the prompt's;
- motion: the first window must show the prompt's motion; later ones its *family*, because a shape bounces off
  the edges (docs/autoregressive.md, "Long training videos") and where it meets a wall depends on where the model
  drew it: left/right, up/down and growing/shrinking are one family each, diagonal and bouncing their own.

Reported: the share of windows right on each attribute, over all windows and over the first and the last quarter
of the video (drift), and the generation time per video.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

FAMILY = {"left": "horizontal", "right": "horizontal", "up": "vertical", "down": "vertical", "growing": "size",
          "shrinking": "size", "diagonal": "diagonal", "bouncing": "bouncing"}


def window_scores(frames: np.ndarray, truth: dict[str, str], classifier, window: int = 17, stride: int = 16):
    """[(start, {attribute: right?}), ...] for every full window of ``frames``."""
    from kinegen.evaluation.adherence import classify

    out = []
    for start in range(0, frames.shape[0] - window + 1, stride):
        pred = classify(classifier, frames[start:start + window])
        motion_ok = pred["motion"] == truth["motion"] if start == 0 else \
            FAMILY[pred["motion"]] == FAMILY[truth["motion"]]
        out.append((start, {"shape": pred["shape"] == truth["shape"], "colour": pred["colour"] == truth["colour"],
                            "motion": motion_ok, "predicted": pred}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a WanAutoregressivePipeline folder")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--frames", type=int, default=241)
    ap.add_argument("--split", default="train", choices=["train", "held_out"])
    ap.add_argument("--steps", type=int, default=None, help="denoising steps per chunk (default: the model's)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    import kinegen
    from kinegen.evaluation.adherence import adherence_prompts, load_classifier

    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    classifier = load_classifier()
    records = []
    for i, (prompt, truth) in enumerate(adherence_prompts(args.prompts, args.split, seed=1)):
        t0 = time.perf_counter()
        result = kinegen.generate(pipe, prompt, seed=i, frames=args.frames, steps=args.steps)
        seconds = time.perf_counter() - t0
        scores = window_scores(result.frames, truth, classifier)
        records.append({"prompt": prompt, "truth": truth, "seconds": seconds,
                        "windows": [{"start": s, **sc} for s, sc in scores]})
        right = {k: np.mean([sc[k] for _, sc in scores]) for k in ("shape", "colour", "motion")}
        print(f"{i + 1}/{args.prompts} {prompt!r}: {seconds:.1f} s, windows right "
              + ", ".join(f"{k} {v:.0%}" for k, v in right.items()), flush=True)

    def share(attr, part=slice(None)):
        vals = [w[attr] for r in records for w in r["windows"][part]]
        return float(np.mean(vals)) if vals else float("nan")

    n = len(records[0]["windows"])
    q = max(1, n // 4)
    summary = {
        "command": "python benchmarks/autoregressive_windows.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "frames": args.frames, "split": args.split,
        "windows_per_video": n,
        "right": {a: share(a) for a in ("shape", "colour", "motion")},
        "first_quarter": {a: share(a, slice(0, q)) for a in ("shape", "colour", "motion")},
        "last_quarter": {a: share(a, slice(n - q, n)) for a in ("shape", "colour", "motion")},
        "seconds_per_video": float(np.mean([r["seconds"] for r in records])),
        "videos": records,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out)
    print(json.dumps({k: v for k, v in summary.items() if k != "videos"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
