"""The chunk-by-chunk pipeline with and without its once-per-prompt text projections (``_SameInput`` in
kinegen/pipelines/causal_wan.py), side by side: interleaved dense rollouts of the same prompt and seed, transformer
seconds (denoising + commits) and whether the videos are identical.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ar_text_memo.py --frames 81 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from unittest import mock

import numpy as np
import torch


def rollout(pipe, frames: int, seed: int) -> tuple[float, np.ndarray]:
    """One streamed rollout at the model's own size, steps and guidance: transformer seconds and the video."""
    spec, seconds, parts = pipe.kinegen_spec, 0.0, []
    for chunk in pipe.stream("a red circle moving right on a white background", height=spec.height,
                             width=spec.width, num_frames=frames, num_inference_steps=spec.steps,
                             guidance_scale=spec.guidance, generator=torch.Generator().manual_seed(seed)):
        seconds += chunk.stats.denoise_s + chunk.stats.commit_s
        parts.append(chunk.frames)
    return seconds, np.concatenate(parts)


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
    out = {"command": f"python benchmarks/ar_text_memo.py --frames {args.frames} --repeats {args.repeats}",
           "date": time.strftime("%Y-%m-%d %H:%M"), "threads": torch.get_num_threads(), **times,
           "speedup": sum(times["fresh"]) / sum(times["memo"]), "identical_videos": identical}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
