"""Does a GAN run's discriminator see the backgrounds' textures? Its checkpointed D scored on one image, retextured.

Each held-out real image (classes balanced) is drawn again with every background texture of the data (plain,
checkered, striped, noisy: ``render_image(..., texture=T)``, the same shape, colour, place and background colour)
and with a *faint blotch*, the data's noisy texture at ``--blotch`` of its amplitude (default 0.4: a median
deviation of 3-4 of 255, what the R3GAN baseline draws on every background; benchmarks/gan.md
"Backgrounds"). D scores each version at the image's class, ``D(x, y)``. Printed per run: the mean score of each
version (with, for a run trained with ``--spectral-weight`` or ``--pixel-templates``, the spectral classifier's or
the templates' part of it), and how often D scores the image with each real texture above the same image with the
faint blotch (0.5: D does not tell them apart, so its gradient does not ask G for that texture instead of the
blotch). A run trained with ``--texture-labels`` is scored once under each texture label for every version (every
image labelled plain, then every one noisy, ...): whether D, told the texture, prefers it. For a run with pixel
templates, each template's sign weight ``b`` and its cosine with the data's checkered and striped patterns (at
the data's place, and the largest over the pattern's other phases).

With ``--generated`` (runs with texture labels and an exported ``RUN/pipeline``), the run's own generator draws the
same number of images under the plain label and D scores each as drawn and with its background flattened (every
background pixel set to the background's median colour, :func:`~kinegen.evaluation.gan_backgrounds.background_mask`),
under the plain label: whether D asks G to remove the faint mottle G draws there.

    .venv/bin/python benchmarks/gan_discriminator_backgrounds.py runs/gan-long/r3gan-s0 runs/gan-long/mp-s0 \\
        [--images 600] [--blotch 0.4] [--generated]
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

VERSIONS = ("plain", "checkered", "striped", "noisy")


def retextured(n_images: int, resolution: int, blotch: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """uint8 images of every version and their labels; the blotch is added to the plain image's background only
    (the noisy texture is additive there, and the shape is drawn over it)."""
    from kinegen.data.shape_images import HELD_OUT_SEED, REFERENCE_SEEDS, render_image

    labels = np.arange(n_images) % 12
    seeds = HELD_OUT_SEED + REFERENCE_SEEDS + np.arange(n_images)
    out = {t: np.stack([render_image(int(s), int(y), resolution, texture=t)
                        for s, y in zip(seeds, labels, strict=True)]) for t in VERSIONS}
    plain, noisy = out["plain"].astype(np.float32), out["noisy"].astype(np.float32)
    out["faint blotch"] = np.clip(np.round(plain + blotch * (noisy - plain)), 0, 255).astype(np.uint8)
    return out, labels


def as_d_input(images: np.ndarray) -> torch.Tensor:
    """uint8 HWC images -> D's input: float NCHW in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


@torch.no_grad()
def texture_scores(run: Path, n_images: int, blotch: float) -> dict:
    from kinegen.training.gan import load_run_discriminator

    net, d = load_run_discriminator(run)
    step = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    images, labels = retextured(n_images, net.resolution, blotch)
    y = torch.from_numpy(labels)
    xs = {name: as_d_input(imgs) for name, imgs in images.items()}
    scores, spectral, templates = {}, {}, {}
    for name, x in xs.items():
        scores[name] = d(x, y).numpy()  # the whole logit, with SSD-GAN's spectral part when the run has one
        if d.spectral is not None:
            spectral[name] = float(d.spectral_logit(x).mean())
        if d.templates is not None:
            templates[name] = float(d.template_logit(x).mean())
    by_label = {}
    if net.num_textures:  # told the texture: every version scored under each texture label in turn
        from kinegen.data.shapes import TEXTURES

        for k, label in enumerate(TEXTURES):
            t = torch.full_like(y, k)
            got = {name: d(x, y, t).numpy() for name, x in xs.items()}
            by_label[label] = {"mean_score": {n: float(v.mean()) for n, v in got.items()},
                               "above_blotch": {v: float((got[v] > got["faint blotch"]).mean()) for v in VERSIONS}}
    return {"run": str(run), "step": step, "blotch": blotch,
            "mean_score": {k: float(v.mean()) for k, v in scores.items()},
            "mean_spectral_part": spectral or None, "mean_template_part": templates or None,
            "templates": template_patterns(d) if d.templates is not None else None,
            "above_blotch": {t: float((scores[t] > scores["faint blotch"]).mean()) for t in VERSIONS},
            "by_texture_label": by_label or None}


@torch.no_grad()
def flattened_scores(run: Path, n_images: int) -> dict:
    """D on G's plain-labelled images, as drawn and with the background flattened; split by the reader's texture."""
    from kinegen.data.shapes import TEXTURES
    from kinegen.evaluation.gan_backgrounds import OTHER, background_mask, read_base, read_texture
    from kinegen.models.mpgan import draw_latents
    from kinegen.pipelines import MPGANPipeline
    from kinegen.training.gan import load_run_discriminator

    net, d = load_run_discriminator(run)
    if not net.num_textures or not (run / "pipeline").is_dir():
        raise SystemExit(f"--generated: {run} needs texture labels and an exported pipeline (RUN/pipeline)")
    g = MPGANPipeline.from_pretrained(str(run / "pipeline"), use_safetensors=True).gan.net.eval()
    y = torch.arange(n_images) % net.num_classes
    plain = torch.full_like(y, TEXTURES.index("plain"))
    z = draw_latents(n_images, g.cfg, torch.Generator().manual_seed(7))  # the training eval's latents
    drawn = ((g(z, y, plain).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    flat, reads = drawn.copy(), []
    for img, out in zip(drawn, flat, strict=True):
        base = read_base(img)
        if base == OTHER:
            reads.append(OTHER)
            continue
        mask = background_mask(img, base)
        reads.append(read_texture(img, base, mask))
        out[mask] = np.median(img[mask].astype(np.float32), axis=0).round().astype(np.uint8)

    def score(images: np.ndarray) -> np.ndarray:
        return d(as_d_input(images), y, plain).numpy()

    as_drawn, flattened, reads = score(drawn), score(flat), np.array(reads)
    rows = {}
    for name, keep in (("all but other", reads != OTHER), ("read noisy", reads == "noisy"),
                       ("read plain", reads == "plain")):
        if keep.any():
            rows[name] = {"images": int(keep.sum()), "as_drawn": float(as_drawn[keep].mean()),
                          "flattened": float(flattened[keep].mean()),
                          "flattened_above": float((flattened[keep] > as_drawn[keep]).mean())}
    return rows


def template_patterns(d) -> list[dict]:
    """Per pixel template: ``b`` and its cosine with each patterned texture (the same in every channel, less
    its mean) at the data's place and the largest |cosine| over the pattern's other phases (one period)."""
    from kinegen.data.shapes import texture_mask
    from kinegen.models.mpgan import TEMPLATE_GAIN

    t = d.templates.templates.detach().float()
    t = (t / t.flatten(1).norm(dim=1).view(-1, 1, 1, 1)).flatten(1)
    b = (TEMPLATE_GAIN * d.templates.weight.detach().float()).tolist()
    h = t.shape[-1] // 3
    res = int(round(h ** 0.5))

    def cosines(texture: str, dy: int, dx: int) -> torch.Tensor:
        m = torch.from_numpy(texture_mask(texture, res, res, dy, dx))
        m = (m - m.mean()).expand(3, res, res).flatten()
        return t @ (m / m.norm())

    out = [{"b": b[k]} for k in range(t.shape[0])]
    for texture, period in (("checkered", 2 * max(2, res // 8)), ("striped", 2 * max(2, res // 10))):
        own = cosines(texture, 0, 0)
        others = torch.stack([cosines(texture, dy, dx).abs() for dy in range(period) for dx in range(period)
                              if (dy, dx) != (0, 0)]).amax(0)
        for k in range(t.shape[0]):
            out[k][texture] = float(own[k])
            out[k][texture + "_other_phases"] = float(others[k])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--blotch", type=float, default=0.4, help="the faint blotch's share of the noisy amplitude")
    parser.add_argument("--generated", action="store_true",
                        help="also score the run's own plain-labelled images, as drawn and flattened")
    args = parser.parse_args()
    if not 0 < args.blotch < 1:
        parser.error("--blotch must be between 0 and 1 (a share of the noisy texture's amplitude)")
    names = (*VERSIONS, "faint blotch")
    print("| run | step | mean D(x, y): " + " / ".join(names) + " | D scores it above the faint blotch: "
          + " / ".join(VERSIONS) + " |")
    print("|---|---|---|---|")
    results = [texture_scores(run, args.images, args.blotch) for run in args.runs]
    for run, r in zip(args.runs, results, strict=True):
        print(f"| {run.name} | {r['step']} | " + " / ".join(f"{r['mean_score'][k]:.2f}" for k in names) + " | "
              + " / ".join(f"{r['above_blotch'][t]:.2f}" for t in VERSIONS) + " |")
        for label, got in (r["by_texture_label"] or {}).items():
            print(f"| (every image labelled {label}) | | " + " / ".join(f"{got['mean_score'][k]:.2f}" for k in names)
                  + " | " + " / ".join(f"{got['above_blotch'][t]:.2f}" for t in VERSIONS) + " |")
        if r["mean_spectral_part"]:
            print("| (of which the spectral classifier, `--spectral-weight`) | | "
                  + " / ".join(f"{r['mean_spectral_part'][k]:.2f}" for k in names) + " | |")
        if r["mean_template_part"]:
            print("| (of which the pixel templates, `--pixel-templates`) | | "
                  + " / ".join(f"{r['mean_template_part'][k]:.2f}" for k in names) + " | |")
    for run, r in zip(args.runs, results, strict=True):
        if r["templates"]:
            print(f"\n{run.name}, step {r['step']}: pixel templates\n\n| template | b | cosine with checkered: "
                  "data's place / best other phase | with striped: data's place / best other phase |\n"
                  "|---|---|---|---|")
            for k, tm in enumerate(r["templates"]):
                print(f"| {k} | {tm['b']:.3f} | {tm['checkered']:.3f} / "
                      f"{tm['checkered_other_phases']:.3f} | {tm['striped']:.3f} / {tm['striped_other_phases']:.3f} |")
    if args.generated:
        print("\n| run | G's images under the plain label | images | mean D, plain label: as drawn / background "
              "flattened | D scores it higher flattened |\n|---|---|---|---|---|")
        for run in args.runs:
            for name, r in flattened_scores(run, args.images).items():
                print(f"| {run.name} | {name} | {r['images']} | {r['as_drawn']:.2f} / {r['flattened']:.2f} "
                      f"| {r['flattened_above']:.0%} |")


if __name__ == "__main__":
    main()
