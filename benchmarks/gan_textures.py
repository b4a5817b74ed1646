"""What a GAN draws as background texture, beyond the reader's four names (issue 26, benchmarks/gan.md "Backgrounds").

The reader (:mod:`kinegen.evaluation.gan_backgrounds`) calls a background checkered or striped when its
brightness correlates with the data's pattern at the data's place, and noisy when its brightness spreads (median
absolute deviation, MAD) by more than 2.5 of 255 without a pattern. Two questions it leaves open, answered here
for held-out real images and for each generator, on the same images as the training eval (the latents of seed 7,
classes balanced):

- **patterns at another phase**: the best correlation with the checkered or striped pattern over every shift of
  it (``texture_mask(..., dy, dx)``, one period in each direction); a generator that draws the pattern but not at
  the pixel-grid place the data fix it to scores here and not in the reader;
- **how much the background spreads**: percentiles of the MAD (the data's plain backgrounds 0, noisy 5 to 13),
  which tell a faint blotch from real noise;
- **a pattern on its way**: the mean correlation with each pattern at the data's place over all images (a flat
  background counts 0), which moves before any image passes the reader's threshold;
- **the grain of the noise**: over the backgrounds read as noisy, the correlation of the brightness of background
  pixels 1, 2 and 4 apart (along rows): the data's noise is blotches on an 8x8 grid, bilinearly enlarged, so at
  32x32 it stays correlated over 2 pixels; a finer noise falls off sooner.

    .venv/bin/python benchmarks/gan_textures.py runs/gan-long/r3gan-s0/snapshots/0003000_0.100.safetensors \\
        assets/models/kinegen-shapes-gan [--images 600]

With ``--texture`` (generators with texture labels) every image is also drawn under each given label, from the same
latents, and a last table says how often an image keeps the background colour it has under the plain label: the
data draw colour and texture independently, so a latent should keep its colour whatever the texture.

With ``--grid PNG`` (one generator with texture labels) it also saves what the tables count: a row per texture
label (plain, checkered, striped, noisy), the first eight classes, one latent per column (seed 1), 4x upscaled.

With ``--without-noise 16,32`` (generators with noise inputs; repeatable) each generator is also read with its noise
inputs at those sides switched off (weights 0, every label): which stage's noise draws the noisy texture.

Each argument is an ``MPGANPipeline`` folder, a run's EMA snapshot (``RUN/snapshots/STEP_SIGMA.safetensors``)
or a run folder (its reconstructed ``RUN/pipeline``). Single-threaded.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

PATTERN_CORRELATION = 0.6  # as the reader's threshold


def load_generator(path: Path):
    from safetensors.torch import load_file

    from kinegen.models.mpgan import Generator
    from kinegen.training.gan import load_run_config

    if path.suffix == ".safetensors":
        g = Generator(load_run_config(path.parent.parent)).eval()
        g.load_state_dict(load_file(str(path)))
        return g
    from kinegen.pipelines import MPGANPipeline

    folder = path / "pipeline" if (path / "run.json").is_file() else path
    return MPGANPipeline.from_pretrained(str(folder), use_safetensors=True).gan.net.eval()


@torch.no_grad()
def without_noise(g, sides: set[int]):
    """A copy of ``g`` whose noise inputs at these sides (8, 16, 32) are off: their weights 0 for every label."""
    missing = sides - set(g.cfg.noise_resolutions)
    if missing:
        raise SystemExit(f"--without-noise: this generator has no noise input at {sorted(missing)}; its noise inputs: "
                         f"{', '.join(map(str, g.cfg.noise_resolutions)) or 'none'}")
    g = copy.deepcopy(g)
    for side, m in zip(g.cfg.noise_resolutions, g.noise, strict=True):
        if side in sides:
            m.weight.zero_()
    return g


@torch.no_grad()
def generated_images(g, labels: np.ndarray, texture: str | None = None) -> np.ndarray:
    """The generator's images of ``labels`` from the training eval's latents; ``texture``: every image drawn with
    that texture label (generators trained with ``--texture-labels``; else each latent's own)."""
    from kinegen.models.mpgan import draw_latents

    z = draw_latents(len(labels), g.cfg, torch.Generator().manual_seed(7))  # the training eval's
    y = torch.from_numpy(labels).long()
    t = None
    if texture is not None:
        from kinegen.data.shapes import TEXTURES

        t = torch.full((len(labels),), TEXTURES.index(texture), dtype=torch.long)
    x = torch.cat([g(z[i:i + 200], y[i:i + 200], None if t is None else t[i:i + 200])
                   for i in range(0, len(y), 200)])
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def texture_probe(images: np.ndarray) -> dict:
    """Reader's textures, patterns at the data's phase and at any phase, MAD percentiles, for uint8 images."""
    from kinegen.data.shapes import BACKGROUNDS, texture_mask
    from kinegen.evaluation.gan_backgrounds import (
        OTHER,
        background_brightness,
        background_mask,
        read_background,
        read_base,
    )

    h, w = images.shape[1:3]
    period = {"checkered": 2 * max(2, min(h, w) // 8), "striped": 2 * max(2, min(h, w) // 10)}
    shifts = {p: [texture_mask(p, h, w, dy, dx) for dy in range(n) for dx in range(n)] for p, n in period.items()}
    reads, at_phase, any_phase, mads = [], {p: 0 for p in period}, {p: 0 for p in period}, []
    corr_sum = {p: 0.0 for p in period}
    bases, grain = [], {lag: [] for lag in GRAIN_LAGS}
    for img in images:
        reads.append(read_background(img)[1])
        base = read_base(img)
        bases.append(base)
        if base == OTHER:
            continue
        background = background_mask(img, base)
        b = background_brightness(img, base, background)
        mads.append(float(np.median(np.abs(b - np.median(b)))))
        if reads[-1] == "noisy":
            for lag, values in grain.items():
                values.extend(lag_correlation(img, background, lag))
        if b.std() < 1e-3:
            continue
        for p, masks in shifts.items():
            corr = [np.corrcoef(b, m[background])[0, 1] if m[background].std() > 0 else 0.0 for m in masks]
            at_phase[p] += corr[0] > PATTERN_CORRELATION
            corr_sum[p] += float(corr[0])
            any_phase[p] += max(corr) > PATTERN_CORRELATION
    n = len(images)
    return {"textures": {t: reads.count(t) / n for t in ("plain", "checkered", "striped", "noisy", OTHER)},
            "colours": {c: bases.count(c) / n for c in (*BACKGROUNDS, OTHER)},
            "at_phase": {p: v / n for p, v in at_phase.items()}, "any_phase": {p: v / n for p, v in any_phase.items()},
            "mean_correlation": {p: v / n for p, v in corr_sum.items()},
            "mad_percentiles": np.percentile(mads, [10, 50, 90]).tolist() if mads else [float("nan")] * 3,
            "grain": {lag: float(np.mean(v)) if v else float("nan") for lag, v in grain.items()}}


GRAIN_LAGS = (1, 2, 4)


def lag_correlation(img: np.ndarray, background: np.ndarray, lag: int) -> list[float]:
    """The correlation of the brightness of background pixels ``lag`` apart along rows (one value, or none when
    too few pairs or no spread)."""
    b = img.astype(np.float32).mean(-1)
    both = background[:, :-lag] & background[:, lag:]
    x, y = b[:, :-lag][both], b[:, lag:][both]
    if len(x) < 16 or x.std() < 0.5 or y.std() < 0.5:
        return []
    return [float(np.corrcoef(x, y)[0, 1])]


@torch.no_grad()
def texture_grid(g, path: Path, classes: int = 8, scale: int = 4) -> None:
    """Save a PNG: a row per texture label, a column per class (the first ``classes``), one latent per column."""
    from PIL import Image

    from kinegen.data.shapes import TEXTURES
    from kinegen.media import atomic_path
    from kinegen.models.mpgan import draw_latents

    z = draw_latents(classes, g.cfg, torch.Generator().manual_seed(1))
    y = torch.arange(classes)
    rows = [g(z, y, torch.full((classes,), k, dtype=torch.long)) for k in range(len(TEXTURES))]
    x = torch.cat(rows)  # [rows * classes, 3, H, W]
    img = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    h, w = img.shape[1:3]
    sheet = img.reshape(len(TEXTURES), classes, h, w, 3).transpose(0, 2, 1, 3, 4).reshape(len(TEXTURES) * h,
                                                                                          classes * w, 3)
    sheet = sheet.repeat(scale, 0).repeat(scale, 1)
    with atomic_path(path) as tmp:
        Image.fromarray(sheet).save(tmp, format="PNG")


def row(name: str, m: dict) -> str:
    t, a, p = m["textures"], m["at_phase"], m["any_phase"]
    return (f"| {name} | {' / '.join(f'{t[k]:.0%}' for k in ('plain', 'checkered', 'striped', 'noisy', 'other'))} "
            f"| {a['checkered']:.0%} / {a['striped']:.0%} | {p['checkered']:.0%} / {p['striped']:.0%} "
            f"| {' / '.join(f'{v:.1f}' for v in m['mad_percentiles'])} "
            f"| {m['mean_correlation']['checkered']:.3f} / {m['mean_correlation']['striped']:.3f} "
            f"| {' / '.join(f'{v:.0%}' for v in m['colours'].values())} "
            f"| {' / '.join(f'{v:.2f}' for v in m['grain'].values())} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("generators", type=Path, nargs="+", help="pipeline folders, EMA snapshots or run folders")
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--texture", action="append", default=None, choices=["plain", "checkered", "striped", "noisy"],
                        help="generators with texture labels: also read every image drawn with this label "
                             "(repeatable)")
    parser.add_argument("--without-noise", action="append", default=[], metavar="SIDES",
                        help="generators with noise inputs: also read each with its noise inputs at these sides off "
                             "(comma-separated, e.g. 16,32; repeatable, one variant each)")
    parser.add_argument("--grid", type=Path, default=None,
                        help="save a PNG of the (one) generator: a row per texture label, a column per class")
    args = parser.parse_args()
    for spec in args.without_noise:
        if not all(s.strip().isdigit() for s in spec.split(",")):
            parser.error(f"--without-noise takes sides such as 16,32; got {spec!r}")
    if args.grid is not None and len(args.generators) != 1:
        parser.error(f"--grid takes one generator; got {len(args.generators)}")
    torch.set_num_threads(1)
    from kinegen.data.shapes import BACKGROUNDS
    from kinegen.evaluation.gan_metrics import reference_images

    real, labels = reference_images(args.images, 32)
    print("| images | read as plain / checkered / striped / noisy / other | checkered / striped at the data's "
          "place | at any phase | background MAD, 10th / 50th / 90th percentile (0-255) | mean correlation at the "
          "data's place: checkered / striped | background colour: " + " / ".join(BACKGROUNDS) + " / other "
          "| noisy backgrounds' grain: correlation 1 / 2 / 4 px apart |")
    print("|---|---|---|---|---|---|---|---|")
    print(row(f"held-out real ({args.images})", texture_probe(real)))
    kept = []  # (generator, label, share of latents keeping their colour under plain)
    for path in args.generators:
        g = load_generator(path)
        if args.grid is not None:
            if not g.cfg.num_textures:
                raise SystemExit(f"--grid: {path} has no texture labels; the grid's rows are texture labels")
            texture_grid(g, args.grid)
            print(f"saved {args.grid}", flush=True)
        variants = [(str(path), g)]
        for spec in args.without_noise:
            sides = {int(s) for s in spec.split(",")}
            variants.append((f"{path} without the noise at {', '.join(f'{s}x{s}' for s in sorted(sides))}",
                             without_noise(g, sides)))
        for name, net in variants:
            print(row(name, texture_probe(generated_images(net, labels))), flush=True)
            if net.cfg.num_textures and args.texture:
                from kinegen.evaluation.gan_backgrounds import read_base

                drawn = {t: generated_images(net, labels, t) for t in dict.fromkeys(["plain", *args.texture])}
                under_plain = [read_base(img) for img in drawn["plain"]]
                for texture in args.texture:
                    images = drawn[texture]
                    print(row(f"{name}, every image labelled {texture}", texture_probe(images)), flush=True)
                    same = np.mean([read_base(img) == c for img, c in zip(images, under_plain, strict=True)])
                    kept.append((name, texture, float(same)))
    if kept:
        print("\n| generator | label | images with the background colour they have under the plain label |\n"
              "|---|---|---|")
        for path, texture, same in kept:
            print(f"| {path} | {texture} | {same:.0%} |")


if __name__ == "__main__":
    main()
