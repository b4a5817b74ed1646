"""What does a GAN run's discriminator ask its generator for, at the generator's own images? (issue 26,
benchmarks/gan.md "Backgrounds").

``gan_discriminator_backgrounds.py`` compares D's scores of finished images; G moves by D's *gradient* at the images
G draws. Here, for images from the run's generator (the one being trained, not its EMA; classes balanced, the latents
of seed 7), the input gradient ``g = d D(x, y) / d x`` is projected on the data's background patterns
(``texture_mask``: checkered, striped), each zero-mean, in all three channels alike (the textures shift brightness)
and scaled to the data's amplitude:

- ``at the data's place``: the pattern where the data draw it. ``<g, delta>`` is the first-order change of D's score
  if G added the data's texture to the image: positive when D's gradient asks for it;
- ``other phases``: the same pattern shifted by every other offset within one period (the shift by half a period is
  the opposite pattern), the RMS of their projections: what a pattern D does not prefer gets;
- ``random``: random +-1 pixel patterns of the same norm, the RMS of their projections (the gradient's size in an
  arbitrary direction).

D asks for the data's texture where ``at the data's place`` is clearly positive and above both controls.

    .venv/bin/python benchmarks/gan_discriminator_gradient.py runs/gan-long/r3gan-s0 [--images 300]

A run folder needs ``checkpoint/discriminator.safetensors`` and ``checkpoint/generator.safetensors``.
Single-threaded, a minute a run.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from kinegen.data.shapes import texture_mask

# the data's texture amplitudes on a [-1, 1] image (kinegen.data.shapes._background): the checker lifts its cells
# by a quarter of 60/255 (15/255), the stripes by 28/255
AMPLITUDE = {"checkered": 2 * 15 / 255, "striped": 2 * 28 / 255}


def pattern(texture: str, size: int, dy: int = 0, dx: int = 0) -> torch.Tensor:
    """``[3, size, size]``: the texture's zero-mean pattern at the data's amplitude (peak to peak), shifted."""
    p = torch.from_numpy(texture_mask(texture, size, size, dy, dx))
    return (AMPLITUDE[texture] * (p - p.mean())).expand(3, size, size)


def period(texture: str, size: int) -> int:
    """The pattern's period in pixels, read off ``texture_mask`` itself (the smallest shift that repeats it)."""
    base = texture_mask(texture, size, size)
    return next(n for n in range(1, size) if np.array_equal(texture_mask(texture, size, size, 0, n), base))


def load_run(run: Path):
    from safetensors.torch import load_model

    from kinegen.models.mpgan import Generator
    from kinegen.training.gan import load_run_discriminator

    net, d = load_run_discriminator(run)
    g = Generator(net).eval()
    load_model(g, str(run / "checkpoint" / "generator.safetensors"))
    step = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    return g, d, net, step


def gradient_projections(run: Path, n_images: int, texture: str | None = None) -> dict:
    """With texture labels, G draws and D scores every image under ``texture`` (a name of
    ``kinegen.data.shapes.TEXTURES``), or under each latent's own texture where None."""
    from kinegen.data.shapes import TEXTURES

    g, d, net, step = load_run(run)
    size = net.resolution
    labels = torch.arange(n_images) % net.num_classes
    from kinegen.models.mpgan import draw_latents

    z = draw_latents(n_images, net, torch.Generator().manual_seed(7))
    if not net.num_textures:
        texture = None  # a run without texture labels: G draws and D scores as trained
    forced = None if texture is None else torch.full((n_images,), TEXTURES.index(texture))
    textures = g.texture_labels(z, forced)
    with torch.no_grad():
        x = g(z, labels, textures).clamp(-1, 1)
    x.requires_grad_(True)
    d(x, labels, textures).sum().backward()
    grad = x.grad.detach()  # [N, 3, H, W]: each image's own gradient (D scores images independently)
    out = {"run": str(run), "step": step, "images": n_images, "texture_label": texture,
           "gradient_rms": float(grad.square().mean().sqrt())}
    rng = torch.Generator().manual_seed(0)
    for texture in AMPLITUDE:
        p0 = pattern(texture, size)
        at_place = (grad * p0).sum((1, 2, 3))
        n = period(texture, size)
        shifts = [(dy, dx) for dy in range(n) for dx in range(n) if (dy, dx) != (0, 0)]
        others = torch.stack([(grad * pattern(texture, size, dy, dx)).sum((1, 2, 3)) for dy, dx in shifts])
        signs = torch.randint(0, 2, (32, 3, size, size), generator=rng).float() * 2 - 1
        signs = signs * p0.norm() / signs.flatten(1).norm(dim=1)[:, None, None, None]
        random = torch.einsum("nchw,kchw->kn", grad, signs)
        out[texture] = {"at_place_mean": float(at_place.mean()), "at_place_share_positive":
                        float((at_place > 0).float().mean()), "other_phases_rms": float(others.square().mean().sqrt()),
                        "random_rms": float(random.square().mean().sqrt())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--texture", action="append", default=None,
                        help="runs with texture labels: draw and score every image labelled with this texture "
                             "(repeat for several; default: each latent's own)")
    args = parser.parse_args()
    from kinegen.training.gan import load_run_config

    torch.set_num_threads(1)
    print("| run | step | texture label | pattern | <g, delta> at the data's place: mean (share > 0) | "
          "other phases, RMS | random patterns, RMS |")
    print("|---|---|---|---|---|---|---|")
    for run in args.runs:
        for label in dict.fromkeys(args.texture or [None]) if load_run_config(run).num_textures else [None]:
            r = gradient_projections(run, args.images, label)
            for t in AMPLITUDE:
                s = r[t]
                print(f"| {run.name} | {r['step']} | {label or 'own'} | {t} | {s['at_place_mean']:+.3f} "
                      f"({s['at_place_share_positive']:.2f}) | {s['other_phases_rms']:.3f} | {s['random_rms']:.3f} |")


if __name__ == "__main__":
    main()
