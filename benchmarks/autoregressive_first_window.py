"""Adherence of the first 17 frames only, model beside model: where along a long video an attribute is lost.

The long-video benchmark (``autoregressive_windows.py``) reads every window of a 241-frame video; this one
generates only the first VAE segment's worth (17 frames, one window) for several seeds per prompt, so a chunk-by-chunk
model can be compared with the bidirectional model it was trained from where both are in their own setting::

    python benchmarks/autoregressive_first_window.py --models kinegen-shapes-t2v,kinegen-shapes-ar \\
        --prompts 6 --prompt-seed 3 --seeds 4 --output benchmarks/results/autoregressive/first_window.json

Each model runs at its own defaults (steps, guidance, context noise). Reported per model: the share of videos
whose window reads right on shape and colour, and each video's colour reading.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated model names or folders")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--split", default="train", choices=["train", "held_out"])
    ap.add_argument("--prompt-seed", type=int, default=3, help="prompts: adherence_prompts(n, split, seed=this)")
    ap.add_argument("--seeds", type=int, default=4, help="videos per prompt (seeds 100, 101, ...)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    from autoregressive_windows import window_scores

    import kinegen
    from kinegen.evaluation.adherence import adherence_prompts, load_classifier
    from kinegen.media import atomic_write_text

    classifier = load_classifier()
    prompts = adherence_prompts(args.prompts, args.split, seed=args.prompt_seed)
    results = {}
    for model in args.models.split(","):
        pipe = kinegen.load_pipeline(model)
        pipe.set_progress_bar_config(disable=True)
        videos = []
        for prompt, truth in prompts:
            for seed in range(100, 100 + args.seeds):
                frames = kinegen.generate(pipe, prompt, seed=seed, frames=17).frames
                w = window_scores(frames, truth, classifier)[0]
                videos.append({"prompt": prompt, "seed": seed, "shape": bool(w["shape"]), "colour": bool(w["colour"]),
                               "colour_read": w["predicted"].get("colour")})
        results[model] = {"shape": float(np.mean([v["shape"] for v in videos])),
                          "colour": float(np.mean([v["colour"] for v in videos])), "videos": videos}
        print(f"{model}: shape {results[model]['shape']:.0%}, colour {results[model]['colour']:.0%}", flush=True)
    out = {"command": "python benchmarks/autoregressive_first_window.py " + " ".join(sys.argv[1:] if argv is None
                                                                                   else argv),
           "date": time.strftime("%Y-%m-%d %H:%M"), "split": args.split, "prompt_seed": args.prompt_seed,
           "seeds": args.seeds, "models": results}
    atomic_write_text(Path(args.output), json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
