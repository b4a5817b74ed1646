"""Can the GAN's networks learn the shapes at all, outside the game? Two probes on the procedural shapes (issue 26).

``classify``: the discriminator's trunk and projection head trained as a plain 12-way classifier (cross-entropy on
``Discriminator.class_logits``, no adversarial loss, no penalties), beside the evaluation classifier's own
architecture; accuracy on 600 held-out images every 100 steps, and how often the colour alone is right.
A discriminator that learns shapes slowly as a classifier cannot teach them quickly in the game.

``fit``: the generator fitted directly to 512 real images (GLO, Bojanowski et al. 2018: one learned latent per
image, kept on the sphere of radius sqrt(z_dim), L1 to the image), beside a plain convolutional decoder
(nearest upsampling, dense 3x3 convolutions, GroupNorm, SiLU); every 200 steps the L1 error and how often the
evaluation classifier sees the right class in the fits. A generator that cannot reproduce a shape it is shown
pixel by pixel will not draw it from a discriminator's gradient either. ``--texture checkered`` (or striped,
noisy, plain) fits only images of that background texture and reports how often the fits' backgrounds read as it
(:mod:`kinegen.evaluation.gan_backgrounds`): can G place a pattern fixed to the pixel grid?

    .venv/bin/python benchmarks/gan_capacity.py classify mp:3e-3 r3gan:6e-4 reference:1e-3 --steps 400
    .venv/bin/python benchmarks/gan_capacity.py fit mp:3e-3 mp-alpha0.5:3e-3 r3gan:6e-4 plain:1e-3 --steps 800
    .venv/bin/python benchmarks/gan_capacity.py fit r3gan:6e-4 r3gan-pe8:6e-4 --texture checkered --steps 800

Network names: ``mp`` (the MP-GAN's default networks), ``r3gan`` (the baseline at 192,176,144,96, its equal-
parameter width), ``r3gan-mpwidths`` (the baseline at the MP-GAN's widths 128,128,128,64), ``mp-alpha<a>`` (MP
with every residual gain starting at ``a`` instead of 0), ``mp-no-<switch>`` (one MP switch off), ``r3gan-pe<C>``
and ``mp-pe<C>`` (G with ``C`` channels of positional maps), ``reference`` (classify: the evaluation
classifier's architecture) and ``plain`` (fit: the plain decoder). Single-threaded; batch 32; Adam with beta1 0
for the GAN networks (as in training), 0.9 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kinegen.data.shapes import TEXTURES
from kinegen.evaluation.gan_backgrounds import read_background
from kinegen.evaluation.gan_metrics import load_classifier, reference_images
from kinegen.models.gan_classifier import FeatureClassifier
from kinegen.models.mpgan import Discriminator, Generator, renormalize_
from kinegen.models.mpgan_config import MP_SWITCHES, GANConfig
from kinegen.training.gan import ShapesData

R3GAN_WIDTHS = (192, 176, 144, 96)  # equal parameters to the MP-GAN's default (benchmarks/run_gan_long.sh)


def gan_config(name: str) -> GANConfig:
    if name == "mp" or name.startswith("mp-alpha"):
        return GANConfig()
    if name == "r3gan":
        return GANConfig.baseline(widths=R3GAN_WIDTHS)
    if name == "r3gan-mpwidths":  # the R3GAN networks at the MP-GAN's widths: widths or MP switches?
        return GANConfig.baseline(widths=GANConfig().widths)
    if name.startswith(("r3gan-pe", "mp-pe")) and name.rpartition("-pe")[2].isdigit():
        base = gan_config(name.rpartition("-pe")[0])
        return dataclasses.replace(base, positional_channels=int(name.rpartition("-pe")[2]))
    if name.startswith("mp-no-") and name[6:] in MP_SWITCHES:
        return GANConfig(**{name[6:]: False})
    raise SystemExit(f"unknown network {name!r}: mp, r3gan, mp-alpha<a>, mp-no-<{'|'.join(MP_SWITCHES)}>, "
                     "r3gan-mpwidths, r3gan-pe<C>, mp-pe<C>, reference (classify) or plain (fit)")


def start_residual_gains(net: nn.Module, name: str) -> None:
    if name.startswith("mp-alpha"):
        with torch.no_grad():
            for p_name, p in net.named_parameters():
                if "alpha_logit" in p_name:
                    p.fill_(math.atanh(float(name[len("mp-alpha"):])))


class PlainDecoder(nn.Module):
    """A conventional decoder for comparison: 4x4 from a linear layer, then (nearest 2x, two 3x3 conv-GN-SiLU)."""

    def __init__(self, z_dim: int = 64, num_classes: int = 12, widths=(128, 128, 96, 64)):
        super().__init__()
        self.embed = nn.Embedding(num_classes, 64)
        self.fc = nn.Linear(z_dim + 64, widths[0] * 16)
        layers = []
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Upsample(scale_factor=2), nn.Conv2d(a, b, 3, padding=1), nn.GroupNorm(8, b), nn.SiLU(),
                       nn.Conv2d(b, b, 3, padding=1), nn.GroupNorm(8, b), nn.SiLU()]
        self.body = nn.Sequential(*layers, nn.Conv2d(widths[-1], 3, 3, padding=1))
        self.width0 = widths[0]

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.body(self.fc(torch.cat([z, self.embed(labels)], 1)).view(-1, self.width0, 4, 4))


def classify(name: str, lr: float, steps: int) -> list[dict]:
    torch.manual_seed(0)
    if name == "reference":
        net, logits, gan = FeatureClassifier(12), None, False
        logits = net
    else:
        net = Discriminator(gan_config(name))
        start_residual_gains(net, name)
        logits, gan = net.class_logits, True
    opt = torch.optim.Adam(net.parameters(), lr=lr, betas=(0.0 if gan else 0.9, 0.99))
    data = ShapesData(32, 20000)
    images, labels = reference_images(600, 32)
    test_x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    test_y = torch.from_numpy(labels).long()
    rows, t0 = [], time.time()
    for step in range(steps + 1):
        if step % 100 == 0:
            with torch.no_grad():
                pred = logits(test_x).argmax(1)
            rows.append({"probe": "classify", "network": name, "lr": lr, "step": step,
                         "accuracy": round(float((pred == test_y).float().mean()), 3),
                         "colour_right": round(float((pred // 4 == test_y // 4).float().mean()), 3),
                         "seconds": round(time.time() - t0)})
            print(json.dumps(rows[-1]), flush=True)
        if step == steps:
            break
        x, y = data.batch(np.random.default_rng([0, step]).integers(0, 2**31 - 1, 32))
        loss = F.cross_entropy(logits(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if gan:
            renormalize_(net)
    return rows


def training_images(n: int, texture: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training images of the pool, or the first ``n`` whose background has ``texture``."""
    data = ShapesData(32, 20000)
    if texture is None:
        return data.batch(np.arange(n))
    keep, i = [], 0
    while len(keep) < n:
        x, _ = data.batch(np.arange(i, i + 256))
        pixels = ((x.permute(0, 2, 3, 1) + 1) * 127.5).round().numpy()
        keep += [i + j for j, img in enumerate(pixels) if read_background(img)[1] == texture]
        i += 256
    return data.batch(np.array(keep[:n]))


def texture_share(images: torch.Tensor, texture: str) -> float:
    pixels = ((images.clamp(-1, 1).permute(0, 2, 3, 1) + 1) * 127.5).round().numpy()
    return float(np.mean([read_background(img)[1] == texture for img in pixels]))


def fit(name: str, lr: float, steps: int, n: int = 512, texture: str | None = None) -> list[dict]:
    torch.manual_seed(0)
    if name == "plain":
        g, gan, z_dim = PlainDecoder(), False, 64
    else:
        cfg = gan_config(name)
        g, gan, z_dim = Generator(cfg), True, cfg.z_dim
        start_residual_gains(g, name)
    x, y = training_images(n, texture)
    z = nn.Parameter(torch.randn(n, z_dim))
    opt = torch.optim.Adam([*g.parameters(), z], lr=lr, betas=(0.0 if gan else 0.9, 0.99))
    clf = load_classifier()
    rows, t0 = [], time.time()
    for step in range(steps + 1):
        if step % 200 == 0:
            with torch.no_grad():
                out = torch.cat([g(z[i:i + 128], y[i:i + 128]) for i in range(0, n, 128)])
                seen = ((out.clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1  # as saved to uint8
                acc = float((clf(seen).argmax(1) == y).float().mean())
            gains = [round(float(torch.tanh(p.detach()).abs().mean()), 2) for p_name, p in g.named_parameters()
                     if "alpha_logit" in p_name]
            rows.append({"probe": "fit", "network": name, "lr": lr, "step": step,
                         "l1": round(float((out - x).abs().mean()), 4), "class_accuracy_of_fits": round(acc, 3),
                         "mean_residual_gain_per_stage": gains, "seconds": round(time.time() - t0)})
            if texture:
                rows[-1].update(texture=texture, texture_read_share=round(texture_share(out, texture), 3))
            print(json.dumps(rows[-1]), flush=True)
        if step == steps:
            break
        idx = torch.randint(0, n, (32,))
        loss = (g(z[idx], y[idx]) - x[idx]).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if gan:
            renormalize_(g)
        with torch.no_grad():
            z.copy_(z / z.norm(dim=1, keepdim=True) * math.sqrt(z_dim))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe", choices=["classify", "fit"])
    ap.add_argument("networks", nargs="+", help="NAME:LR, e.g. mp:3e-3 r3gan:6e-4")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--texture", choices=TEXTURES, help="fit: only images with this background texture")
    ap.add_argument("-o", "--output", help="append the rows to this JSON-lines file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for spec in args.networks:
        name, _, lr = spec.partition(":")
        if args.probe == "classify":
            rows = classify(name, float(lr or 3e-3), args.steps)
        else:
            rows = fit(name, float(lr or 3e-3), args.steps, texture=args.texture)
        if args.output:
            with open(args.output, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
