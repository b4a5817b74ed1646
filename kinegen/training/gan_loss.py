"""R3GAN's objective: relativistic pairing loss with zero-centred R1 and R2 penalties (Huang et al. 2024, Eq. 6-8).

    L_D = softplus(D(x_f) - D(x_r)) + gamma/2 (||grad_x_r D(x_r)||^2 + ||grad_x_f D(x_f)||^2)
    L_G = softplus(D(x_r) - D(x_f))

With ``class_weight`` lambda > 0, a label-matching term is added (Han et al., "Dual Projection Generative
Adversarial Networks", NeurIPS 2021, Sec. 3.2): the projection logits under every class, ``D(x, c)`` for all
``c``, are read as a classifier's logits, D learns to classify real images and G to make its images
classified as their labels:

    L_D += lambda CE(D(x_r, .), y)        L_G += lambda CE(D(x_f, .), y)

A departure from R3GAN, whose projection D is trained only by the pairing loss (docs/gan.md, "Class
conditioning"). The penalties stay on ``D(x, y)`` alone.

With ``diversity_weight`` beta > 0, G also gets the diversity-sensitive term of DSGAN (Yang et al.,
"Diversity-Sensitive Conditional Generative Adversarial Networks", ICLR 2019, Eq. 3) on two images of the same
labels from two latents, bounded by ``tau``:

    L_G -= beta min(mean|G(z1, y) - G(z2, y)| / mean|z1 - z2|, tau)

A departure from R3GAN too, made because a conditional generator whose images of a class all share one
background gets the same gradient for every z, and so no push to make z matter (docs/gan.md, "Training").

With ``spectrum_match`` mu > 0, G also matches the spread of its batch's reduced spectra (SSD-GAN's log power per
ring of spatial frequency) to the real batch's by a sliced Wasserstein distance (Deshpande et al., CVPR 2018):

    L_G += mu SW2^2({s(G(z_i, y_i))}, {s(x_i)})

The spectral regulariser of Durall et al. ("Watch your Up-Convolution", CVPR 2020, Sec. 4) pulls every image's
spectrum towards the mean real one; on data where a sixth of the images carry a strong texture and the rest none,
the mean asks every image for a faint one. Matching the batch's distribution instead asks some images for the
whole texture and the rest for none (docs/gan.md, "Training"). With ``spectrum_space="frequencies"`` the
spectra are the 2D spectrum's log powers, matched frequency by frequency (:func:`spectrum_term`). A departure
from R3GAN.

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


def _logits(d, x: torch.Tensor, labels: torch.Tensor, class_weight: float, textures: torch.Tensor | None = None):
    """``D(x, y)`` and, when the label-matching term is on, the logits under every class (else None)."""
    if not class_weight:
        return d(x, labels, textures), None
    return d.logits_for_label_matching(x, labels, textures)


def discriminator_loss(d, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor, gamma: float,
                       class_weight: float = 0.0, textures: torch.Tensor | None = None):
    """Returns ``(loss, stats)``; ``fake`` must come from the generator without a graph to it. With texture
    labels (``GANConfig.num_textures``), ``textures`` are the reals' and the fakes were drawn with them too."""
    real = real.detach().requires_grad_(True)
    fake = fake.detach().requires_grad_(True)
    (d_real, every_real), d_fake = _logits(d, real, labels, class_weight, textures), d(fake, labels, textures)
    adv = F.softplus(d_fake - d_real)
    # R1/R2 see all of D(x, y) but the pixel templates' realness (GANConfig.pixel_templates): its gradient at any
    # image is a signed sum of unit templates, whose norm a penalty could only lower by making the templates cancel
    # one another, whatever they see. Computed once here, for the penalties and the log.
    templates = getattr(d, "templates", None) is not None
    t_real, t_fake = (d.template_logit(real, textures), d.template_logit(fake, textures)) if templates else (0.0, 0.0)
    r1, r2 = gradient_penalty(d_real - t_real, real), gradient_penalty(d_fake - t_fake, fake)
    loss = (adv + gamma / 2 * (r1 + r2)).mean()
    stats = {"d_adv": float(adv.detach().mean()), "r1": float(r1.detach().mean()),
             "r2": float(r2.detach().mean()), "d_real": float(d_real.detach().mean()),
             "d_fake": float(d_fake.detach().mean())}
    if getattr(d, "spectral", None) is not None:  # SSD-GAN's spectral part of D(real) and D(fake), for the log
        with torch.no_grad():
            stats["d_spec_real"] = float(d.spectral_logit(real).mean())
            stats["d_spec_fake"] = float(d.spectral_logit(fake).mean())
    if templates:  # the pixel templates' part of D(real) and D(fake), for the log
        stats["d_tmpl_real"], stats["d_tmpl_fake"] = float(t_real.detach().mean()), float(t_fake.detach().mean())
    if every_real is not None:
        cls = F.cross_entropy(every_real, labels)
        loss = loss + class_weight * cls
        stats["d_cls"] = float(cls.detach())
    return loss, stats


def diversity_term(fake: torch.Tensor, fake2: torch.Tensor, z: torch.Tensor, z2: torch.Tensor,
                   bound: float) -> torch.Tensor:
    """DSGAN's per-pair ``min(mean|G(z1, y) - G(z2, y)| / mean|z1 - z2|, tau)``, averaged (to be maximised)."""
    ratio = (fake - fake2).abs().flatten(1).mean(1) / (z - z2).abs().mean(1).clamp_min(1e-8)
    return ratio.clamp(max=bound).mean()


def generator_loss(d, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor, class_weight: float = 0.0,
                   textures: torch.Tensor | None = None):
    """Returns ``(loss, stats)``. ``D(x_r)`` is a constant for G, so it is taken without a graph; the caller
    freezes D's parameters for the backward (their gradients would be thrown away)."""
    with torch.no_grad():
        d_real = d(real, labels, textures)
    d_fake, every_fake = _logits(d, fake, labels, class_weight, textures)
    adv = F.softplus(d_real - d_fake).mean()
    stats = {"g_adv": float(adv.detach())}
    if every_fake is None:
        return adv, stats
    cls = F.cross_entropy(every_fake, labels)
    stats["g_cls"] = float(cls.detach())
    return adv + class_weight * cls, stats


def sliced_wasserstein(a: torch.Tensor, b: torch.Tensor, projections: int, gen: torch.Generator) -> torch.Tensor:
    """Squared sliced 2-Wasserstein distance between the rows of ``a`` and ``b`` (``[N, d]`` each, same ``N``):
    both sets projected on ``projections`` random unit directions, sorted, and compared rank by rank."""
    dirs = F.normalize(torch.randn(a.shape[1], projections, generator=gen).to(a), dim=0)
    pa, _ = (a @ dirs).sort(0)
    pb, _ = (b @ dirs).sort(0)
    return (pa - pb).square().mean()


SPECTRUM_SPACES = ("rings", "frequencies")


def spectrum_term(fake: torch.Tensor, real: torch.Tensor, gen: torch.Generator, projections: int = 64,
                  space: str = "rings") -> torch.Tensor:
    """How far the batch ``fake``'s spectra are from the batch ``real``'s, as a distribution over images.

    ``rings``: the sliced Wasserstein distance between their reduced spectra (log power per ring). The spectra
    are log powers, so rings of very different power weigh alike; they are not standardised per ring, which
    would blow the sampling noise of rings where every image is alike up to the size of a texture's peak.
    ``frequencies``: the log power of every frequency of the 2D spectrum (:func:`frequency_spectrum`), matched
    frequency by frequency: each one's values over the batch sorted and compared rank by rank (the 1D
    Wasserstein distance per frequency, i.e. slicing along the axes). A texture's peak is then one coordinate
    of its own, not diluted by a ring's mean or mixed with other frequencies by a random direction: where a
    sixth of the reals carry the checker, the top sixth of the fakes at the checker's frequency are asked for it.
    """
    from ..models.mpgan import frequency_spectrum, reduced_spectrum

    if space == "rings":
        return sliced_wasserstein(reduced_spectrum(fake).float(), reduced_spectrum(real.detach()).float(),
                                  projections, gen)
    if space == "frequencies":
        a, _ = frequency_spectrum(fake).float().sort(0)
        b, _ = frequency_spectrum(real.detach()).float().sort(0)
        return (a - b).square().mean()
    raise ValueError(f"spectrum space must be one of {', '.join(SPECTRUM_SPACES)}; got {space!r}")
