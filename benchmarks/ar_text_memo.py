"""The chunk-by-chunk pipeline with and without its once-per-prompt text projections (``_SameInput`` in
kinegen/pipelines/causal_wan.py), side by side: interleaved dense rollouts of the same prompt and seed, transformer
seconds (denoising + commits) and whether the videos are identical.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ar_text_memo.py --frames 81 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def rollout(pipe, frames: int, seed: int) -> tuple[float, np.ndarray]:
    """One streamed rollout at the model's own size, steps and guidance (``benchmarks/dasa.py``'s): transformer
    seconds (denoising + commits) and the video."""
    from dasa import rollout as streamed

    spec = pipe.kinegen_spec
    run = streamed(pipe, "a red circle moving right on a white background", seed, frames, spec.steps, spec.guidance,
                   spec.height)
    return sum(c["transformer_s"] for c in run["chunks"]), run["frames"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-ar")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import kinegen

    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    times = {"memo": [], "fresh": []}
    identical = True
    for r in range(args.repeats):
        videos = {}
        for name in (["memo", "fresh"] if r % 2 == 0 else ["fresh", "memo"]):
            off = mock.patch("kinegen.pipelines.causal_wan._memoise_text", lambda *a: None)
            with off if name == "fresh" else contextlib.nullcontext():
                t, videos[name] = rollout(pipe, args.frames, seed=r)
            times[name].append(t)
        identical &= bool(np.array_equal(videos["memo"], videos["fresh"]))
    out = {"command": f"python benchmarks/ar_text_memo.py --model {args.model} --frames {args.frames} "
                      f"--repeats {args.repeats}",
           "date": time.strftime("%Y-%m-%d %H:%M"), "threads": torch.get_num_threads(), **times,
           "speedup": sum(times["fresh"]) / sum(times["memo"]), "identical_videos": identical}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
