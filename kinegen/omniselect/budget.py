"""The regime and the per-group budgets (../shared/reference/omniselect.md, section 2, steps 2 and 4).

Pure tensor functions: no model, no hooks. ``keep`` ratios throughout (the paper speaks of prune ratios,
``1 - keep``).
"""

from __future__ import annotations

import torch

REGIMES = ("audio", "video", "uniform")


def choose_regime(audio_score: float, video_score: float, theta: float, has_query: bool = True) -> str:
    """Step 2: ``uniform`` when the question names nothing to look or listen for, or when the mean relevance of
    the two modalities differs by at most ``theta``; otherwise the modality with the higher relevance dominates.

    The public code truncates both scores to integers before comparing; we compare the floats (docs/omniselect.md).
    """
    if not has_query or abs(video_score - audio_score) <= theta:
        return "uniform"
    return "video" if video_score > audio_score else "audio"


def group_keep_ratios(scores: torch.Tensor, sizes: torch.Tensor, keep: float, iterations: int = 5) -> torch.Tensor:
    """Step 4: keep ratio per time group from the dominant modality's relevance per group.

    z-score the scores, prune ratio ``p_g = sigmoid(-z_g)`` (a more relevant group is pruned less), then
    ``iterations`` rounds of: rescale so that the token-weighted mean prune ratio is ``1 - keep``, clamp to [0, 1].
    Weighting by the group's token count (``sizes``) makes the kept total hit the budget when groups differ in size
    (the last one usually does).
    """
    scores = scores.double()
    w = sizes.double().clamp_min(0)
    if w.sum() == 0:
        return torch.full_like(scores, keep)
    target = 1.0 - keep
    if target == 0.0:
        return torch.ones_like(scores)
    mean = (scores * w).sum() / w.sum()
    std = (((scores - mean) ** 2 * w).sum() / w.sum()).sqrt()
    if len(scores) < 2 or std < 1e-12:
        return torch.full_like(scores, keep)
    p = torch.sigmoid(-(scores - mean) / std)
    for _ in range(iterations):
        mean_p = (p * w).sum() / w.sum()
        if mean_p <= 0:
            break
        p = (p * (target / mean_p)).clamp(0.0, 1.0)
    return 1.0 - p


def counts_from_ratios(ratios: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """Whole token counts per group: ``ratios * sizes`` rounded so that they sum to ``total`` (largest remainder),
    never above a group's size, and at least one token in every non-empty group while the total allows it."""
    sizes = sizes.long()
    total = int(max(0, min(total, int(sizes.sum()))))
    want = (ratios.double().clamp(0, 1) * sizes.double())
    counts = torch.minimum(want.floor().long(), sizes)
    floor1 = (sizes > 0) & (counts == 0)
    if int(floor1.sum()) + int(counts.sum()) <= total:
        counts = torch.where(floor1, torch.ones_like(counts), counts)
    left = total - int(counts.sum())
    if left > 0:
        rem = (want - counts.double()).masked_fill(counts >= sizes, -1.0)
        for g in torch.argsort(rem, descending=True, stable=True).tolist():
            if left == 0:
                break
            if counts[g] < sizes[g]:
                counts[g] += 1
                left -= 1
        while left > 0:  # every group with room, in order (rounding pushed the remainders below zero)
            room = (counts < sizes).nonzero().flatten()
            counts[room[:left]] += 1
            left = total - int(counts.sum())
    elif left < 0:
        over = (counts.double() - want).masked_fill(counts <= 1, -1e9)
        for g in torch.argsort(over, descending=True, stable=True).tolist():
            if left == 0:
                break
            if counts[g] > 0:
                counts[g] -= 1
                left += 1
    return counts
