"""R3GAN's objective: relativistic pairing loss with zero-centred R1 and R2 penalties (Huang et al. 2024, Eq. 6-8).

    L_D = softplus(D(x_f) - D(x_r)) + gamma/2 (||grad_x_r D(x_r)||^2 + ||grad_x_f D(x_f)||^2)
    L_G = softplus(D(x_r) - D(x_f))

The penalties are taken through a double backward (``create_graph=True``): detaching them would make
them constant in D's parameters and remove their effect (brownvc/R3GAN#20).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gradient_penalty(logits: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Per-sample ``||d logits / d inputs||^2``, differentiable w.r.t. the discriminator's parameters."""
    (grad,) = torch.autograd.grad(logits.sum(), inputs, create_graph=True)
    return grad.square().flatten(1).sum(1)


def discriminator_loss(d, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor, gamma: float):
    """Returns ``(loss, stats)``; ``fake`` must come from the generator without a graph to it."""
    real = real.detach().requires_grad_(True)
    fake = fake.detach().requires_grad_(True)
    d_real, d_fake = d(real, labels), d(fake, labels)
    adv = F.softplus(d_fake - d_real)
    r1, r2 = gradient_penalty(d_real, real), gradient_penalty(d_fake, fake)
    loss = (adv + gamma / 2 * (r1 + r2)).mean()
    return loss, {"d_adv": float(adv.detach().mean()), "r1": float(r1.detach().mean()),
                  "r2": float(r2.detach().mean()), "d_real": float(d_real.detach().mean()),
                  "d_fake": float(d_fake.detach().mean())}


def generator_loss(d, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor):
    d_real, d_fake = d(real.detach(), labels), d(fake, labels)
    loss = F.softplus(d_real - d_fake).mean()
    return loss, {"g_adv": float(loss.detach())}
