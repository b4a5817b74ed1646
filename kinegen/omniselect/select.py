"""Which tokens of one time group stay (../shared/reference/omniselect.md, section 2, step 5), and the peers' rules.

Each function gets the group's tokens and a count and returns sorted indices into the group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distinctive(embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """Video rule: the ``k`` tokens with the lowest mean cosine similarity to the rest of the group (the most
    distinctive), computed on the LLM-space embeddings ``[n, d]``."""
    n = embeddings.shape[0]
    if k >= n:
        return torch.arange(n, device=embeddings.device)
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=embeddings.device)
    x = F.normalize(embeddings.float(), dim=-1)
    sim = x @ x.T
    mean_to_rest = (sim.sum(-1) - sim.diagonal()) / max(n - 1, 1)
    return torch.sort(torch.topk(-mean_to_rest, k).indices).values


def most_attended(received: torch.Tensor, k: int) -> torch.Tensor:
    """Audio rule: the ``k`` tokens receiving the most attention (``received[n]``, from the audio encoder's last
    layer, averaged over heads and queries)."""
    n = received.shape[0]
    if k >= n:
        return torch.arange(n, device=received.device)
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=received.device)
    return torch.sort(torch.topk(received.float(), k).indices).values


def evenly_strided(n: int, k: int, device=None) -> torch.Tensor:
    """Uniform peer: ``k`` of ``n`` tokens at even strides (content-blind)."""
    if k >= n:
        return torch.arange(n, device=device)
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=device)
    return (torch.arange(k, device=device) * n) // k


def random_subset(n: int, k: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """Random peer: ``k`` of ``n`` tokens drawn without replacement."""
    k = max(0, min(k, n))
    return torch.sort(torch.randperm(n, generator=generator)[:k]).values.to(device)
