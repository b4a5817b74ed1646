"""Two sets of long-video readings (files of ``autoregressive_windows.py``) compared video by video.

    python benchmarks/autoregressive_compare.py \
        --base benchmarks/results/autoregressive/segments/windows_seg3o_ctx0_{train,held_out}.json \
        --new benchmarks/results/autoregressive/segments/windows_seg3rw2_ctx0_{train,held_out}.json

Videos are paired by split, prompt and seed (each file's videos must all have a partner in the other set). Per
attribute: the mean over the videos of the new share of windows right minus the base's, in points, with its
standard error, and how many videos went up, down or stayed (benchmarks/autoregressive.md reads its fine-tunes
this way).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

ATTRIBUTES = ("shape", "colour", "motion", "background")


def per_video(paths: list[str]) -> dict[tuple, dict[str, float]]:
    """``(split, prompt, seed)`` -> the share of the video's windows right on each attribute it is read for."""
    out = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for video in run["videos"]:
            key = (run["split"], video["prompt"], video["seed"])
            if key in out:
                raise SystemExit(f"{path}: video {key} appears twice in the set; give each split's file once")
            out[key] = {a: float(np.mean([w[a] for w in video["windows"]])) for a in ATTRIBUTES
                        if video["windows"][0].get(a) is not None}
    return out


def paired(base: dict, new: dict) -> dict:
    """Per attribute over the paired videos: mean and standard error of new minus base (points), and counts."""
    if base.keys() != new.keys():
        missing = sorted(set(base) ^ set(new))[:3]
        raise SystemExit(f"the two sets hold different videos (for example {missing}); compare files made with the "
                         "same --split, --prompts and --prompt-seed")
    out = {"videos": len(base)}
    for a in ATTRIBUTES:
        d = np.array([100 * (new[k][a] - base[k][a]) for k in base if a in base[k]])
        if len(d) == 0:
            continue
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
        out[a] = {"mean": float(d.mean()), "se": se, "up": int((d > 0).sum()), "down": int((d < 0).sum()),
                  "same": int((d == 0).sum())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", nargs="+", required=True, help="the reference's files (one per split)")
    ap.add_argument("--new", nargs="+", required=True, help="the files to compare with it, the same splits")
    ap.add_argument("--output", default=None, help="also write the result here as JSON")
    args = ap.parse_args(argv)
    result = paired(per_video(args.base), per_video(args.new))
    result["command"] = "python benchmarks/autoregressive_compare.py " + " ".join(sys.argv[1:] if argv is None
                                                                                 else argv)
    print(f"{result['videos']} videos, new minus base, points (mean +- s.e.; videos up / down / same):")
    for a in ATTRIBUTES:
        if a in result:
            r = result[a]
            print(f"  {a:10s} {r['mean']:+6.1f} +- {r['se']:4.1f}   {r['up']} / {r['down']} / {r['same']}")
    if args.output:
        from kinegen.media import atomic_write_text

        atomic_write_text(args.output, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
