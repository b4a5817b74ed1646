"""Long-video adherence: every 17-frame window of long videos read for shape, colour and motion, for the
chunk-by-chunk model and for a bidirectional model extended window by window (SkyReels-V2 DF style).

    .venv/bin/python benchmarks/autoregressive_windows.py --model kinegen-shapes-ar --prompts 8 --frames 241 \
        --split train --output benchmarks/results/autoregressive/windows_ar_train.json
    .venv/bin/python benchmarks/autoregressive_windows.py --model kinegen-shapes-t2v --method window-extend \
        --prompts 8 --frames 241 --split train --output benchmarks/results/autoregressive/windows_extend_train.json

Each prompt is a single-shape caption of the split (``adherence_prompts(n, split, seed=1)``, never used in
training: training captions come from other seeds); video ``i`` uses seed ``i``. The video is cut into windows
of 17 frames every 16 frames. Per window:

- shape and colour: the adherence classifier (100% on the procedural long videos themselves);
- motion: read by tracking the shape (:mod:`kinegen.evaluation.motion`, 100% on the procedural long videos,
  where the classifier reads 70-76%): the first window must show the prompt's motion, later ones its family
  (a shape bounces off the edges, so a shape "moving right" later moves left; where it meets a wall depends on
  where the model drew it). Windows with a bounce in them are read too: a family survives a bounce;
- background: the colour the prompt names, read by :mod:`kinegen.evaluation.background` (100% on the procedural
  long videos; not scored for prompts that name no background). The classifier does not read it, so without
  this a video whose background changes colour halfway through reads right.

Reported: the share of windows right on each attribute, over all windows and over the first and the last
quarter of the video (drift), windows where the shape stands still or is lost, seams (the frame-to-frame change
at chunk or window boundaries over the median change inside them; for a model with VAE segments also at segment
boundaries alone), and seconds per video.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ATTRIBUTES = ("shape", "colour", "motion", "background")


def window_scores(frames: np.ndarray, truth: dict[str, str], classifier, window: int = 17, stride: int = 16,
                  background: str | None = None):
    """[{start, shape, colour, motion, background, reading, predicted}, ...] for every full window of ``frames``;
    ``background`` (the colour the prompt names) is None in every window when the prompt names none."""
    from kinegen.evaluation.adherence import classify
    from kinegen.evaluation.background import read_background
    from kinegen.evaluation.motion import motion_right

    out = []
    for start in range(0, frames.shape[0] - window + 1, stride):
        clip = frames[start:start + window]
        pred = classify(classifier, clip) | {"background": read_background(clip)}
        ok, reading = motion_right(clip, pred["colour"], truth["motion"], exact=start == 0)
        out.append({"start": start, "shape": pred["shape"] == truth["shape"],
                    "colour": pred["colour"] == truth["colour"], "motion": ok,
                    "background": None if background is None else pred["background"] == background,
                    "reading": reading, "predicted": pred})
    return out


def seam_ratio(frames: np.ndarray, boundaries: list[int]) -> float:
    """Mean absolute change between frames ``b - 1`` and ``b`` at the ``boundaries``, over the median change
    between consecutive frames elsewhere (1: seams invisible)."""
    x = np.asarray(frames, np.float32)
    change = np.abs(np.diff(x, axis=0)).mean(axis=(1, 2, 3))  # change[i]: frame i -> i + 1
    at = [b - 1 for b in boundaries if 0 < b < len(x)]
    inside = np.delete(change, at)
    return float(change[at].mean() / max(np.median(inside), 1e-8)) if at else float("nan")


def _generate_ar(pipe, prompt, seed, frames, steps, guidance=None):
    """Frames, the first video frame of every later chunk, and of every later VAE segment (empty without)."""
    import kinegen
    from kinegen.pipelines.wan_ar import segment_latent_frames

    result = kinegen.generate(pipe, prompt, seed=seed, frames=frames, steps=steps, guidance=guidance)
    starts = np.cumsum([c["frames"] for c in result.chunks])[:-1]
    seg = segment_latent_frames(pipe.segment_frames) if pipe.segment_frames else None
    later = zip(starts, result.chunks[1:], strict=True)
    segments = sorted({int(b) for b, c in later if seg and c["latent_frames"][0] % seg == 0})
    return result.frames, sorted({int(b) for b in starts}), segments  # (overlapping: a segment's image chunk has 0)


def _generate_extend(pipe, prompt, seed, frames, steps, history, overlap):
    import torch

    from kinegen.pipelines.window_extend import extend_window_by_window

    spec = pipe.kinegen_spec
    video, stats = extend_window_by_window(
        pipe, prompt, num_frames=frames, height=spec.height, width=spec.width,
        num_inference_steps=steps or spec.steps, guidance_scale=spec.guidance, window_frames=spec.frames,
        overlap_frames=overlap, history=history, generator=torch.Generator().manual_seed(seed))
    # a window's new frames start where its prefix ends: latent frame start + prefix -> video frame
    starts = [4 * (s.frames[0] + s.prefix_frames - 1) + 1 for s in stats[1:]]
    return video, starts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a WanAutoregressivePipeline folder or name (--method ar), or "
                                                   "a bidirectional Wan model (--method window-extend)")
    ap.add_argument("--method", default="ar", choices=["ar", "window-extend"])
    ap.add_argument("--history", default="noised", choices=["clean", "noised"],
                    help="window-extend: how the overlap conditions the next window (kinegen.pipelines.window_extend)")
    ap.add_argument("--overlap-frames", type=int, default=5, help="window-extend: video frames of history")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--frames", type=int, default=241)
    ap.add_argument("--split", default="train", choices=["train", "held_out"])
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (per chunk; default: the model's)")
    ap.add_argument("--guidance", type=float, default=None, help="--method ar: guidance scale (default: the model's)")
    ap.add_argument("--context-noise", type=float, default=None,
                    help="--method ar: the noise level chunks are committed at (default: the model's)")
    ap.add_argument("--window-frames", type=int, default=None,
                    help="--method ar: the KV cache's rolling window in latent frames (default: the model's)")
    ap.add_argument("--sink-frames", type=int, default=None,
                    help="--method ar: the KV cache's frame sink in latent frames (default: the model's)")
    ap.add_argument("--segment-overlap", default=None, choices=["true", "false"],
                    help="--method ar, a model with VAE segments: start each later segment from the previous one's "
                         "last frame, re-encoded (default: the model's)")
    ap.add_argument("--prompt-seed", type=int, default=1,
                    help="prompts: adherence_prompts(n, split, seed=this); 1 = the benchmark's, others for tuning")
    ap.add_argument("--vae", default=None, help="decode with this VAE folder instead of the model's (one with the "
                                                "same encoder and latent statistics, e.g. a decoder-only fine-tune)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--videos", default=None, help="also save each video here (uint8 .npz), to read it again")
    args = ap.parse_args(argv)

    import kinegen
    from kinegen.evaluation.adherence import adherence_prompts, load_classifier
    from kinegen.evaluation.background import prompt_background
    from kinegen.media import atomic_write_text

    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    for key in ("context_noise", "window_frames", "sink_frames"):
        if getattr(args, key) is not None:
            if args.method != "ar":
                raise SystemExit(f"--{key.replace('_', '-')} is a setting of chunk-by-chunk models (--method ar)")
            pipe.register_to_config(**{key: getattr(args, key)})
    if args.segment_overlap is not None:
        if args.method != "ar" or not pipe.segment_frames:
            raise SystemExit("--segment-overlap is a setting of chunk-by-chunk models with VAE segments")
        pipe.register_to_config(segment_overlap=args.segment_overlap == "true")
    if args.vae:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(args.vae, use_safetensors=True).eval()
        stats = ("latents_mean", "latents_std")
        if any(list(getattr(vae.config, k)) != list(getattr(pipe.vae.config, k)) for k in stats):
            raise SystemExit(f"--vae {args.vae}: its latent statistics differ from the model's VAE; it would decode "
                             "other latents")
        pipe.vae = vae
    classifier = load_classifier()
    records = []
    for i, (prompt, truth) in enumerate(adherence_prompts(args.prompts, args.split, seed=args.prompt_seed)):
        t0 = time.perf_counter()
        segments = []
        if args.method == "ar":
            frames, boundaries, segments = _generate_ar(pipe, prompt, i, args.frames, args.steps, args.guidance)
        else:
            frames, boundaries = _generate_extend(pipe, prompt, i, args.frames, args.steps, args.history,
                                                  args.overlap_frames)
        seconds = time.perf_counter() - t0
        if args.videos:
            Path(args.videos).mkdir(parents=True, exist_ok=True)
            np.savez_compressed(Path(args.videos) / f"{args.split}_{i}.npz",
                                frames=(np.clip(frames, 0, 1) * 255).round().astype(np.uint8))
        windows = window_scores(frames, truth, classifier, background=prompt_background(prompt))
        records.append({"prompt": prompt, "truth": truth, "seed": i, "seconds": seconds,
                        "seam_ratio": seam_ratio(frames, boundaries),
                        "segment_seam_ratio": seam_ratio(frames, segments) if segments else None, "windows": windows})
        right = {k: np.mean([w[k] for w in windows]) for k in ATTRIBUTES if windows[0][k] is not None}
        print(f"{i + 1}/{args.prompts} {prompt!r}: {seconds:.1f} s, windows right "
              + ", ".join(f"{k} {v:.0%}" for k, v in right.items())
              + f", motion read {[w['reading'] for w in windows]}", flush=True)

    def share(attr, part=slice(None)):  # over the windows that have the attribute (a background only if named)
        vals = [w[attr] for r in records for w in r["windows"][part] if w.get(attr) is not None]
        return float(np.mean(vals)) if vals else float("nan")

    n = len(records[0]["windows"])
    q = max(1, n // 4)
    readings = [w["reading"] for r in records for w in r["windows"]]
    summary = {
        "command": "python benchmarks/autoregressive_windows.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "vae": args.vae, "method": args.method,
        "history": args.history if args.method == "window-extend" else None, "frames": args.frames,
        "guidance": args.guidance, "prompt_seed": args.prompt_seed,
        "context_noise": pipe.config.get("context_noise") if args.method == "ar" else None,
        **({k: pipe.config.get(k) for k in ("sink_frames", "window_frames", "segment_frames", "segment_overlap")}
           if args.method == "ar" else {}),
        "split": args.split, "prompts": args.prompts, "windows_per_video": n,
        "right": {a: share(a) for a in ATTRIBUTES},
        "first_quarter": {a: share(a, slice(0, q)) for a in ATTRIBUTES},
        "last_quarter": {a: share(a, slice(n - q, n)) for a in ATTRIBUTES},
        "still_windows": readings.count("still") / len(readings),
        "lost_windows": readings.count("lost") / len(readings),
        "seam_ratio": float(np.nanmean([r["seam_ratio"] for r in records])),
        "segment_seam_ratio": (float(np.mean([r["segment_seam_ratio"] for r in records]))
                               if records[0]["segment_seam_ratio"] is not None else None),
        "seconds_per_video": float(np.mean([r["seconds"] for r in records])),
        "videos": records,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "videos"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
