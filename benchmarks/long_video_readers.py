"""How well each motion reader reads the procedural long videos themselves (the ground truth), per 17-frame window.

    .venv/bin/python benchmarks/long_video_readers.py --prompts 16 \
        --output benchmarks/results/autoregressive/readers.json

For the prompts of benchmarks/autoregressive_windows.py (same seeds), the procedural video of the prompt's clip
spec (``render_long_clip``: the training clip, then the same speed, bouncing off the edges) is cut into the same
windows and read by the adherence classifier (shape, colour, motion family as the benchmark once compared it)
and by the tracking reader (motion family; exact motion in the first window), and its background colour by
:func:`kinegen.evaluation.background.read_background`. A reader that misreads the ground
truth cannot judge a model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--frames", type=int, default=241)
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    from kinegen.data.shapes import render_long_clip, sample_clip
    from kinegen.evaluation.adherence import classify, load_classifier
    from kinegen.evaluation.background import read_background
    from kinegen.evaluation.motion import FAMILY, motion_right
    from kinegen.media import atomic_write_text

    clf = load_classifier()
    out = {"command": "python benchmarks/long_video_readers.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "date": time.strftime("%Y-%m-%d %H:%M"), "frames": args.frames}
    for split in ("train", "held_out"):
        hits = {"classifier_shape": [], "classifier_colour": [], "classifier_motion": [], "tracker_motion": [],
                "background": []}
        for i in range(args.prompts):
            spec = sample_clip(1 * 1_000_003 + 7_000_000 + i, split=split, num_objects=1)  # adherence_prompts(seed=1)
            o = spec.primary
            frames = render_long_clip(spec, args.frames)
            for start in range(0, args.frames - 16, 16):
                clip = frames[start:start + 17]
                pred = classify(clf, clip)
                hits["classifier_shape"].append(pred["shape"] == o.shape)
                hits["classifier_colour"].append(pred["colour"] == o.colour)
                hits["classifier_motion"].append(pred["motion"] == o.motion if start == 0
                                                 else FAMILY[pred["motion"]] == FAMILY[o.motion])
                hits["tracker_motion"].append(motion_right(clip, o.colour, o.motion, exact=start == 0)[0])
                hits["background"].append(read_background(clip) == spec.background)
        out[split] = {k: float(np.mean(v)) for k, v in hits.items()} | {"windows": len(hits["tracker_motion"])}
        print(split, out[split], flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
