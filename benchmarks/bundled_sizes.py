"""The bundled text-to-video model at each size it serves: prompt adherence and generation time.

    python benchmarks/bundled_sizes.py [--model M] [--sizes 128x17,256x33,384x57] [--prompts 20] \
        [--baseline FOLDER --rounds 8] [--out benchmarks/results/bundled_sizes]

For each size (``SIZExFRAMES``, square), ``--prompts`` prompts from the training combinations and as many from
the held-out ones (``kinegen.evaluation.adherence``: the classifier reads every video resampled to 17 frames
at 64 x 64), at the model's default steps and guidance; the wall time of each generation. With
``--baseline``, the default-size generation of the baseline model and of ``--model`` timed alternately
(``--rounds`` pairs, after one warm-up each), so that the ratio is measured side by side. Writes
``summary.json`` (with every prompt's prediction) and ``samples.png`` (first, middle and last frame of four
prompts at each size) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

SAMPLES = [
    "a red circle moving to the right on a gray background",
    "a blue square moving up on a black background",
    "a yellow star moving left on a navy background",
    "a green triangle moving down on a brown background",
]


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        size, _, frames = item.strip().partition("x")
        out.append((int(size), int(frames)))
    return out


class _Clock:
    """Lap times between calls of :meth:`tick` (one lap per generated and classified video)."""

    def __init__(self):
        self.laps: list[float] = []
        self.last = time.perf_counter()

    def tick(self, *_):
        now = time.perf_counter()
        self.laps.append(now - self.last)
        self.last = now


def adherence_at(pipe, clf, size: int, frames: int, n: int, seed: int) -> dict:
    from kinegen.evaluation.adherence import ATTRIBUTES, evaluate_adherence

    result = {}
    for split in ("train", "held_out"):
        clock = _Clock()
        r = evaluate_adherence(pipe, n, split, seed=seed, classifier=clf, progress=clock.tick,
                               height=size, width=size, frames=frames)
        times = clock.laps
        result[split] = {"accuracy": r["accuracy"], "n": r["n"], "median_wall_s": statistics.median(times),
                         "records": r["records"]}
        acc = " ".join(f"{a} {r['accuracy'][a]:.0%}" for a in ATTRIBUTES)
        print(f"{frames}x{size}x{size} {split}: {acc} ({statistics.median(times):.1f} s a video)", flush=True)
    return result


def default_time_ab(model: str, baseline: str, rounds: int) -> dict:
    """Default-size generation of ``baseline`` and ``model``, alternately; the median of per-pair ratios."""
    import kinegen

    pipes = {name: kinegen.load_pipeline(name, cache=False) for name in (baseline, model)}
    for pipe in pipes.values():
        pipe.set_progress_bar_config(disable=True)
        kinegen.generate(pipe, "a white circle bouncing", seed=99)  # warm-up
    walls = {name: [] for name in pipes}
    for r in range(rounds):
        order = list(pipes) if r % 2 == 0 else list(pipes)[::-1]
        for name in order:
            t0 = time.perf_counter()
            kinegen.generate(pipes[name], SAMPLES[r % len(SAMPLES)], seed=r)
            walls[name].append(time.perf_counter() - t0)
    ratios = [m / b for m, b in zip(walls[model], walls[baseline], strict=True)]
    out = {"baseline": baseline, "model": model, "rounds": rounds,
           "baseline_median_s": statistics.median(walls[baseline]), "model_median_s": statistics.median(walls[model]),
           "median_ratio": statistics.median(ratios), "ratios": ratios}
    print(f"default size: {out['model_median_s']:.2f} s against {out['baseline_median_s']:.2f} s "
          f"(median ratio {out['median_ratio']:.3f} over {rounds} alternating pairs)", flush=True)
    return out


def main() -> None:
    import kinegen
    from kinegen.evaluation.adherence import load_classifier
    from kinegen.media import atomic_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--sizes", default="128x17,256x33,384x57")
    ap.add_argument("--prompts", type=int, default=20, help="prompts per split and size (default: 20)")
    ap.add_argument("--seed", type=int, default=0, help="prompt seed (default: 0)")
    ap.add_argument("--baseline", help="a model folder to time against at the default size")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--samples", type=int, default=len(SAMPLES), help="prompts drawn in samples.png (0: none)")
    ap.add_argument("--out", default="benchmarks/results/bundled_sizes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    summary = {"model": args.model, "prompts_per_split": args.prompts, "seed": args.seed, "sizes": {}}
    if args.baseline:
        summary["default_time"] = default_time_ab(args.model, args.baseline, args.rounds)
    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    clf = load_classifier()
    strips = []
    for size, frames in parse_sizes(args.sizes):
        summary["sizes"][f"{frames}x{size}x{size}"] = adherence_at(pipe, clf, size, frames, args.prompts, args.seed)
        with atomic_path(out / "summary.json") as tmp:
            tmp.write_text(json.dumps(summary, indent=1))
        if not args.samples:
            continue
        row = []
        for i, prompt in enumerate(SAMPLES[:args.samples]):
            v = kinegen.generate(pipe, prompt, seed=i, height=size, width=size, frames=frames).frames
            frames_u8 = (np.clip(v, 0, 1) * 255).astype(np.uint8) if v.dtype != np.uint8 else v
            picked = [frames_u8[j] for j in (0, len(frames_u8) // 2, len(frames_u8) - 1)]
            row.append(np.concatenate([_resize(f, 128) for f in picked], axis=1))
        strips.append(np.concatenate(row, axis=0))
    if not strips:
        return
    from PIL import Image

    gap = np.full((strips[0].shape[0], 8, 3), 255, np.uint8)
    grid = np.concatenate([x for s in strips for x in (s, gap)][:-1], axis=1)
    with atomic_path(out / "samples.png") as tmp:
        Image.fromarray(grid).save(tmp, format="PNG")
    print(f"wrote {out / 'summary.json'} and {out / 'samples.png'}")


def _resize(frame: np.ndarray, side: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((side, side), Image.BILINEAR))


if __name__ == "__main__":
    main()
