"""Training-step time of GAN configurations, measured side by side (to set equal CPU budgets).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gan_step_time.py

One step is what ``kinegen train gan`` does per iteration at batch 32 (a D step with R1 and R2 through the
double backward, a G step, forced weight normalisation). The configurations run in turn, round after
round, and the median per configuration is reported with its parameter count.
"""

from __future__ import annotations

import statistics
import time

import torch

from kinegen.models.mpgan import Discriminator, GANConfig, Generator, renormalize_
from kinegen.training.gan_loss import discriminator_loss, generator_loss

CONFIGS = {
    "MP-GAN (R3GAN2 transitions) 128/128/128/64": GANConfig(num_classes=12, widths=(128, 128, 128, 64)),
    "MP-GAN (learned transitions) 128/128/96/64": GANConfig(
        num_classes=12, widths=(128, 128, 96, 64), free_transitions=False, linear_extraction=False,
        shared_class_init=False),
    "R3GAN 192/176/144/96": GANConfig.baseline(num_classes=12, widths=(192, 176, 144, 96)),
}


def make_step(cfg: GANConfig, batch: int = 32):
    g, d = Generator(cfg), Discriminator(cfg)
    opt_g, opt_d = torch.optim.Adam(g.parameters(), 1e-4), torch.optim.Adam(d.parameters(), 1e-4)
    real, labels = torch.randn(batch, 3, cfg.resolution, cfg.resolution), torch.arange(batch) % cfg.num_classes

    def step():
        with torch.no_grad():
            fake = g(torch.randn(batch, cfg.latent_dim), labels)
        loss_d, _ = discriminator_loss(d, real, fake, labels, 1.0)
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        renormalize_(d)
        loss_g, _ = generator_loss(d, real, g(torch.randn(batch, cfg.latent_dim), labels), labels)
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        renormalize_(g)

    params = sum(p.numel() for p in g.parameters()) + sum(p.numel() for p in d.parameters())
    return step, params


def main(rounds: int = 7) -> None:
    steps = {name: make_step(cfg) for name, cfg in CONFIGS.items()}
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for step, _ in steps.values():
        step()  # warm-up
    for _ in range(rounds):
        for name, (step, _) in steps.items():
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times[list(CONFIGS)[-1]])
    print(f"threads {torch.get_num_threads()}, median of {rounds} interleaved rounds")
    for name, (_, params) in steps.items():
        med = statistics.median(times[name])
        print(f"{name:48s} {params:>9,d} params  {med:.2f} s/step  ({med / base:.2f} x the last)")


if __name__ == "__main__":
    main()
