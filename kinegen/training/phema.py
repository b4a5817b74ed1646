"""Post-hoc EMA with power-function profiles (Karras et al., EDM2, CVPR 2024, Sec. 3.1 and App. C).

A power-function EMA with exponent ``gamma`` averages the weights seen up to step ``t`` with the
profile ``p(tau) = (gamma + 1) tau^gamma / t^(gamma + 1)`` on ``[0, t]``; it is updated with
``beta_t = (1 - 1/t)^(gamma + 1)``. Its relative width is
``sigma_rel = sqrt((gamma + 1) / ((gamma + 2)^2 (gamma + 3)))`` (EDM2 Eq. 3).

Training keeps two such EMAs (``sigma_rel`` 0.05 and 0.10 by default) and saves snapshots of both
now and then. Afterwards, the EMA of any other ``sigma_rel`` (at the last step) is approximated by
the linear combination of snapshots whose profiles are closest to its profile in L2: the weights
solve ``A x = b`` with ``A_ij = <p_i, p_j>`` and ``b_i = <p_i, p_target>`` (closed-form inner
products of power functions).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def sigma_rel_to_gamma(sigma_rel: float) -> float:
    """Invert EDM2 Eq. 3 (monotone in gamma) by bisection."""
    if not 0 < sigma_rel < 0.28:  # gamma -> 0 gives sigma_rel = sqrt(1/12) ~ 0.2887
        raise ValueError(f"sigma_rel must be in (0, 0.28), got {sigma_rel}")
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        s = math.sqrt((mid + 1) / ((mid + 2) ** 2 * (mid + 3)))
        lo, hi = (mid, hi) if s > sigma_rel else (lo, mid)
    return 0.5 * (lo + hi)


class PowerEMA:
    """Power-function EMAs of a module (frozen copies in eval mode), one per ``sigma_rel``."""

    def __init__(self, module: torch.nn.Module, sigma_rels=(0.05, 0.10)):
        import copy

        self.sigma_rels = tuple(float(s) for s in sigma_rels)
        self.gammas = [sigma_rel_to_gamma(s) for s in self.sigma_rels]
        self.modules = [copy.deepcopy(module).eval().requires_grad_(False) for _ in self.sigma_rels]

    @torch.no_grad()
    def update(self, module: torch.nn.Module, step: int) -> None:
        """After training step ``step`` (1-based): ``ema = beta ema + (1 - beta) w``."""
        current = module.state_dict()
        for gamma, ema in zip(self.gammas, self.modules, strict=True):
            beta = (1 - 1 / step) ** (gamma + 1) if step > 0 else 0.0
            for k, v in ema.state_dict().items():
                if v.is_floating_point():
                    v.lerp_(current[k].detach().to(v.dtype), 1 - beta)
                else:
                    v.copy_(current[k])


def _inner(t1: float, g1: float, t2: float, g2: float) -> float:
    """<p1, p2> for p(tau) = (g+1) tau^g / t^(g+1) on [0, t] (computed in logs for large exponents)."""
    m = min(t1, t2)
    log = (math.log(g1 + 1) + math.log(g2 + 1) + (g1 + g2 + 1) * math.log(m) - math.log(g1 + g2 + 1)
           - (g1 + 1) * math.log(t1) - (g2 + 1) * math.log(t2))
    return math.exp(log)


def solve_weights(snapshots: list[tuple[int, float]], target_step: int, target_sigma_rel: float) -> np.ndarray:
    """Coefficients over ``snapshots`` (each ``(step, gamma)``) approximating the target EMA profile."""
    g_t = sigma_rel_to_gamma(target_sigma_rel)
    a = np.array([[_inner(ti, gi, tj, gj) for tj, gj in snapshots] for ti, gi in snapshots])
    b = np.array([_inner(ti, gi, target_step, g_t) for ti, gi in snapshots])
    return np.linalg.lstsq(a, b, rcond=None)[0]


def reconstruct(snapshots: list[tuple[int, float, dict[str, torch.Tensor]]], target_sigma_rel: float,
                target_step: int | None = None) -> dict[str, torch.Tensor]:
    """The state dict of the EMA with ``target_sigma_rel`` at ``target_step`` (default: the last snapshot)."""
    if not snapshots:
        raise ValueError("no EMA snapshots to reconstruct from")
    target_step = target_step or max(s for s, _, _ in snapshots)
    x = solve_weights([(s, g) for s, g, _ in snapshots], target_step, target_sigma_rel)
    keys = snapshots[0][2].keys()
    return {k: sum(float(w) * sd[k].float() for w, (_, _, sd) in zip(x, snapshots, strict=True)) for k in keys}
