"""How well a model's VAE reconstructs long videos: mean absolute error (0-255) of encode + decode by frame range.

    .venv/bin/python benchmarks/vae_long_roundtrip.py --model kinegen-shapes-ar --clips 4 --frames 97 \
        --output benchmarks/results/autoregressive/vae_long_roundtrip.json

Clips are procedural long videos (:func:`kinegen.data.shapes.render_long_clip`: a clip of the training
combinations, then the same speed bouncing off the edges; seeds not used in training), encoded and decoded whole,
as the pipelines decode a generated video. A VAE trained on short clips only may hold up for as many frames as it
was trained on and no further; this shows where.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def roundtrip_errors(vae, clip: np.ndarray, segment_frames: int = 0) -> np.ndarray:
    """Per-frame mean absolute error (0-255) of ``vae.decode(vae.encode(clip))`` for a uint8 ``[F, H, W, 3]``;
    with ``segment_frames``, every segment of that many frames coded alone (the last one may be shorter), as
    ``WanAutoregressivePipeline(segment_frames=...)`` decodes and ``kinegen train ar --segment-frames`` encodes."""
    import torch

    from kinegen.training.vae import to_tensor

    def roundtrip(part):  # a part of 4k + 1 frames (a last segment padded with its last frame, then cut)
        pad = -(len(part) - 1) % 4
        z = vae.encode(to_tensor(np.concatenate([part, part[-1:].repeat(pad, 0)])[None])).latent_dist.mode()
        return vae.decode(z).sample[0][:, :len(part)]

    step = segment_frames or len(clip)
    with torch.no_grad():
        x = torch.cat([roundtrip(clip[lo:lo + step]) for lo in range(0, len(clip), step)], dim=1)
    x = ((x.permute(1, 2, 3, 0).clamp(-1, 1) + 1) / 2 * 255).round().numpy()
    return np.abs(x - clip.astype(np.float64)).mean(axis=(1, 2, 3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-ar", help="a model name or folder whose VAE is measured")
    ap.add_argument("--vae", default=None, help="a VAE folder to measure instead of the model's")
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--frames", type=int, default=97, help="frames per clip (4k + 1)")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--segment-frames", type=int, default=0,
                    help="code every segment of this many frames alone (4k + 1; 0: each clip whole)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    import kinegen
    from kinegen.data.shapes import render_long_clip, sample_clip
    from kinegen.media import atomic_write_text

    if args.vae:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(args.vae, use_safetensors=True).eval()
    else:
        vae = kinegen.load_pipeline(args.model).vae.eval()
    errors = np.stack([roundtrip_errors(vae, render_long_clip(sample_clip(9_100_000 + i, split="train"),
                                                               args.frames, args.size, args.size),
                                        args.segment_frames)
                       for i in range(args.clips)]).mean(axis=0)
    edges = [0, 17, 33, 65, 129, 241, 100_000]
    ranges = {f"{a}-{min(b, args.frames) - 1}": float(errors[a:b].mean())
              for a, b in zip(edges, edges[1:], strict=False) if a < args.frames}
    result = {"command": "python benchmarks/vae_long_roundtrip.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.vae or args.model, "clips": args.clips,
              "frames": args.frames, "segment_frames": args.segment_frames, "mean_abs_error_by_frames": ranges,
              "per_frame": errors.round(2).tolist()}
    print(json.dumps({k: v for k, v in result.items() if k != "per_frame"}, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.output, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
