"""How far a T2V model's first frame is from its second (the bundled model's first-frame flaw).

    .venv/bin/python benchmarks/first_frame.py                        # the default model
    .venv/bin/python benchmarks/first_frame.py --model FOLDER --grid first_frames.png --output first_frame.json

Generates 14 prompts (12 training captions, `sample_clip(1000 + i)`, and two fixed ones) at the model's
default settings, seed 0, and prints the mean absolute difference between frames 0 and 1 and between
frames 1 and 2 (out of 255). On a clean video both are small; the shipped model's first frame on gray
backgrounds makes the first one about 1.6x the second (6.13 against 3.75; the stage-3 model's was 2.6x).
``--grid`` writes frames 0, 1, 8 and 16 of the first 8 videos, one row each; ``--output`` the raw figures
as JSON (every prompt's two differences, the means, the settings and the environment).
"""

import argparse

import numpy as np

PROMPTS_FIXED = ["a green star moving upward on a plain gray background",
                 "a red circle moving to the right on a gray background"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-t2v")
    ap.add_argument("--grid", help="write a PNG of frames 0, 1, 8, 16 of the first 8 videos")
    ap.add_argument("--output", help="write the per-prompt and mean figures as JSON")
    args = ap.parse_args()
    import kinegen
    from kinegen.data.shapes import sample_clip
    from kinegen.generation import generate

    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    prompts = [sample_clip(1000 + i).caption for i in range(12)] + PROMPTS_FIXED
    results = [generate(pipe, p, seed=0) for p in prompts]
    videos = [r.frames for r in results]  # [F, H, W, 3] in [0, 1]
    per01 = [float(np.abs(v[0] - v[1]).mean() * 255) for v in videos]
    per12 = [float(np.abs(v[1] - v[2]).mean() * 255) for v in videos]
    d01, d12 = float(np.mean(per01)), float(np.mean(per12))
    print(f"{args.model}: mean |frame 0 - frame 1| {d01:.2f}, |frame 1 - frame 2| {d12:.2f} "
          f"(/255, {len(videos)} prompts)")
    if args.output:
        import datetime
        import json
        import os
        import platform

        import diffusers
        import torch

        from kinegen.media import atomic_write_text

        r = results[0].request
        report = {
            "model": args.model, "date": datetime.date.today().isoformat(),
            "settings": {"seed": 0, "steps": r.steps, "frames": r.frames, "height": r.height, "width": r.width,
                         "guidance": r.guidance, "prompts": len(prompts)},
            "mean_abs_frame0_frame1": d01, "mean_abs_frame1_frame2": d12, "unit": "mean absolute difference, /255",
            "per_prompt": [{"prompt": p, "frame0_frame1": a, "frame1_frame2": b}
                           for p, a, b in zip(prompts, per01, per12, strict=True)],
            "environment": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                            "python": platform.python_version(), "cpu_count": os.cpu_count()},
            "command": "python benchmarks/first_frame.py " + " ".join(
                f"--{k} {v}" for k, v in vars(args).items() if v is not None),
        }
        atomic_write_text(args.output, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}")
    if args.grid:
        from kinegen.media import write_image

        rows = [np.concatenate([v[f] for f in (0, 1, 8, min(16, len(v) - 1))], 1) for v in videos[:8]]
        write_image(args.grid, np.concatenate(rows, 0))
        print(f"wrote {args.grid}")


if __name__ == "__main__":
    main()
