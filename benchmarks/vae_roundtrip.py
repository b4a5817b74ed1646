"""VAE round trips per background, frame 0 apart from frames 1-16 (the first-frame flaw of the bundled model).

    .venv/bin/python benchmarks/vae_roundtrip.py assets/models/kinegen-shapes-t2v/vae            # 64 training clips
    .venv/bin/python benchmarks/vae_roundtrip.py VAE --clip-seeds 1001,1003,1005,1009,1010       # given clips

Each clip (17 x 128 x 128, `sample_clip`) is encoded (posterior mean) and decoded. Per background it prints
PSNR and the RMS error (pixels in [-1, 1]) on object pixels and on background pixels, for frame 0 (which the
causal Wan VAE codes alone) and for frames 1-16. Average PSNR hides a missing object on a mid-gray frame;
the object-pixel error does not.
"""

import argparse

import numpy as np
import torch

from kinegen.data.shapes import render_clip, sample_clip
from kinegen.training.vae import object_pixels, to_tensor


def clip_errors(vae, spec) -> list[float]:
    """Mean squared errors: [frame 0, frames 1+, objects in frame 0, objects in 1+, background 0, background 1+]."""
    clip = render_clip(spec, 17, 128, 128)
    x = to_tensor(clip[None])
    with torch.no_grad():
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
    obj = torch.from_numpy(object_pixels(clip, spec.background))[None, None]
    e = (y - x) ** 2

    def masked(m, frames):
        return float((e[:, :, frames] * m[:, :, frames]).sum() / (3 * m[:, :, frames].sum() + 1e-6))

    first, rest = slice(0, 1), slice(1, None)
    return [float(e[:, :, first].mean()), float(e[:, :, rest].mean()), masked(obj, first), masked(obj, rest),
            masked(1 - obj, first), masked(1 - obj, rest)]


def report(label: str, v: np.ndarray) -> str:
    m = v.mean(0)
    psnr = 10 * np.log10(4 / m[:2])
    return (f"{label:6s} n={len(v):2d} | PSNR frame 0 {psnr[0]:.2f} dB, 1-16 {psnr[1]:.2f}"
            f" | object RMS 0: {np.sqrt(m[2]):.3f}, 1-16: {np.sqrt(m[3]):.3f}"
            f" | background RMS 0: {np.sqrt(m[4]):.3f}, 1-16: {np.sqrt(m[5]):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vae", help="an AutoencoderKLWan folder")
    ap.add_argument("--clip-seeds", help="comma-separated sample_clip seeds (default: 64 training clips)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(args.vae, use_safetensors=True).eval()
    if args.clip_seeds:
        specs = [sample_clip(int(s)) for s in args.clip_seeds.split(",")]
    else:
        specs = [sample_clip(9_000_000 + i, split="train") for i in range(64)]
    rows: dict[str, list] = {}
    for spec in specs:
        rows.setdefault(spec.background, []).append(clip_errors(vae, spec))
    for name in sorted(rows):
        print(report(name, np.array(rows[name])))
    print(report("all", np.concatenate([np.array(r) for r in rows.values()])))


if __name__ == "__main__":
    main()
