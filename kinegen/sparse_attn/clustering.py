"""Clustering of query or key vectors for clustered sparse attention (HyperVAttention, Sec. 3.1-3.2).

Tokens live on their latent grid ``(F, H, W)`` in raster order. HVA's two clustering ideas:

* **3D local-window clustering.** The grid is cut into windows of ``window = (wf, wh, ww)`` tokens;
  each window starts with ``per_window`` centroids (the means of equal slices of its tokens), so the
  centroids begin on a regular 3D grid. A token's assignment searches only the centroids of its own
  and the neighbouring windows (3x3x3 windows, at most ``27 * per_window`` candidates), instead of all
  ``K`` centroids as global k-means does: ``N * 27c`` distance evaluations per iteration against
  ``N * K``. Then each centroid becomes the mean of its tokens (Lloyd's update); an empty cluster keeps
  its centroid.
* **Hybrid clustering.** Full clustering (``iters`` Lloyd iterations from the grid start) runs only at
  anchor steps. Between anchors, the cached centroids and labels are reused and only the tokens whose
  last assignment was least certain (smallest margin between the best and second-best candidate) are
  re-assigned, then the centroids are updated once from all tokens.

This module is the torch reference; :mod:`kinegen.sparse_attn.kernels` holds the Triton kernel of the
assignment and update, tested against it. Shapes: ``x`` is ``[B, H, N, D]`` (one clustering per batch
element and head), labels ``[B, H, N]`` int64, centroids ``[B, H, K, D]``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..parallel import mean_over_heads

# ---------------------------------------------------------------------------- window geometry


@dataclasses.dataclass(frozen=True)
class WindowGrid:
    """The windows of a token grid and, per window, its neighbouring windows (itself included).

    Attributes:
        grid: ``(F, H, W)`` tokens.
        window: ``(wf, wh, ww)`` tokens per window (border windows may be smaller).
        counts: windows along each axis.
        window_of_token: ``[N]`` window index of each raster-order token.
        order: ``[num_windows, max_tokens]`` token indices of each window, ``-1`` for padding.
        neighbours: ``[num_windows, 27]`` neighbouring window indices, ``-1`` outside the grid.
    """

    grid: tuple[int, int, int]
    window: tuple[int, int, int]
    counts: tuple[int, int, int]
    window_of_token: torch.Tensor
    order: torch.Tensor
    neighbours: torch.Tensor

    _on_device: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def num_windows(self) -> int:
        return self.counts[0] * self.counts[1] * self.counts[2]

    def on(self, device, name: str, make=None) -> torch.Tensor:
        """Tensor ``name`` (an attribute, or ``make(self)``) on ``device``, copied once and cached: a
        host-to-device copy per call would stall the GPU queue at every step and layer."""
        key = (str(device), name)
        if key not in self._on_device:
            value = make(self) if make is not None else getattr(self, name)
            self._on_device[key] = value.to(device)
        return self._on_device[key]


@functools.lru_cache(maxsize=64)
def window_grid(grid: tuple[int, int, int], window: tuple[int, int, int], lead_frames: int = 0) -> WindowGrid:
    """Windows of ``window`` tokens over ``grid`` (cached: grids repeat every step and layer).

    ``lead_frames``: the first frames form windows of their own along the frame axis (their rows and
    columns cut as usual), and the frame windows of ``wf`` frames start after them. A causal video VAE
    (Wan's) codes the first video frame alone into the first latent frame, whose tokens differ from the
    rest; ``lead_frames=1`` keeps them out of the second frame's windows.
    """
    F, H, W = grid
    wf, wh, ww = (min(w, g) for w, g in zip(window, grid, strict=True))
    lead = min(max(0, lead_frames), F - 1) if wf > 1 else 0
    f, h, w = torch.meshgrid(torch.arange(F), torch.arange(H), torch.arange(W), indexing="ij")
    frame_window = torch.where(f < lead, f, (f - lead) // wf + lead)
    counts = (lead + math.ceil((F - lead) / wf), math.ceil(H / wh), math.ceil(W / ww))
    wid = (frame_window * counts[1] + h // wh) * counts[2] + w // ww
    wid = wid.reshape(-1)
    n_win = counts[0] * counts[1] * counts[2]
    sizes = torch.bincount(wid, minlength=n_win)
    max_tokens = int(sizes.max())
    sorted_wid, token = torch.sort(wid, stable=True)
    start = torch.cumsum(sizes, 0) - sizes
    slot = torch.arange(len(wid)) - start[sorted_wid]
    order = torch.full((n_win, max_tokens), -1, dtype=torch.long)
    order[sorted_wid, slot] = token
    cf, ch, cw = torch.meshgrid(torch.arange(counts[0]), torch.arange(counts[1]), torch.arange(counts[2]),
                                indexing="ij")
    offsets = torch.tensor([(a, b, c) for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)])
    nf = cf.reshape(-1, 1) + offsets[:, 0]
    nh = ch.reshape(-1, 1) + offsets[:, 1]
    nw = cw.reshape(-1, 1) + offsets[:, 2]
    inside = (nf >= 0) & (nf < counts[0]) & (nh >= 0) & (nh < counts[1]) & (nw >= 0) & (nw < counts[2])
    neighbours = torch.where(inside, (nf * counts[1] + nh) * counts[2] + nw, -1)
    return WindowGrid((F, H, W), (wf, wh, ww), counts, wid, order, neighbours)


def candidate_centroids(wg: WindowGrid, per_window: int) -> torch.Tensor:
    """``[num_windows, 27 * per_window]`` centroid indices each window's tokens compare with (-1: none)."""
    nb = wg.neighbours.unsqueeze(-1)
    cand = nb * per_window + torch.arange(per_window)
    return torch.where(nb >= 0, cand, -1).reshape(wg.num_windows, -1)


def grid_labels(wg: WindowGrid, per_window: int) -> torch.Tensor:
    """``[N]`` the grid-start cluster of each token: window ``w``'s tokens (raster order within the window)
    cut into ``per_window`` equal, consecutive slices."""
    order = wg.order
    slot = torch.arange(order.shape[1])
    n_valid = (order >= 0).sum(1, keepdim=True)
    part = (slot.unsqueeze(0) * per_window // n_valid.clamp(min=1)).clamp(max=per_window - 1)
    label = torch.arange(order.shape[0]).unsqueeze(1) * per_window + part
    labels = torch.zeros(len(wg.window_of_token), dtype=torch.long)
    labels[order[order >= 0]] = label[order >= 0]
    return labels


# ---------------------------------------------------------------------------- assignment and update


@dataclasses.dataclass
class Assignment:
    """Labels ``[B, H, N]``, the margin to the second-best candidate ``[B, H, N]`` and evaluations done."""

    labels: torch.Tensor
    margin: torch.Tensor
    distance_evals: int | torch.Tensor  # a 0-d device tensor where counting on the host would need a sync


def assign_local(x: torch.Tensor, centroids: torch.Tensor, wg: WindowGrid, per_window: int,
                 tokens: torch.Tensor | None = None, margin: bool = True) -> Assignment:
    """Nearest candidate centroid of each token (squared Euclidean distance), searched in 3x3x3 windows.

    Args:
        x: ``[B, H, N, D]``; centroids: ``[B, H, K, D]`` with ``K = num_windows * per_window``.
        tokens: assign only these token indices (``[M]``, for hybrid steps); labels of the others are
            returned as -1 and their margins as +inf.
        margin: also compute the margin (second-best minus best distance); ``False`` leaves it +inf
            (Lloyd iterations before the last need only the labels).

    All tokens of a window share their candidates, so the assignment is one small matrix product per
    window, batched over windows, heads and batch (:func:`nearest_in_windows`).
    """
    order = wg.on(x.device, "order") if tokens is None else subset_table(wg, tokens.to(x.device))  # [nW, T]
    return nearest_in_windows(windowed(x, order), x.shape, order, centroids, wg, per_window, margin)


def windowed(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, N, D]`` gathered window by window: ``[B * H * nW, T, D]`` (float32; padding slots hold
    token 0 and are ignored). Lloyd iterations gather once and reuse it."""
    B, Hh, N, D = x.shape
    nW, T = order.shape
    return x.reshape(B * Hh, N, D).float().index_select(1, order.clamp(min=0).view(-1)).view(B * Hh * nW, T, D)


def nearest_in_windows(xw: torch.Tensor, shape: torch.Size, order: torch.Tensor, centroids: torch.Tensor,
                       wg: WindowGrid, per_window: int, margin: bool = True) -> Assignment:
    """The assignment on window-gathered tokens ``xw`` (:func:`windowed`) of a ``shape = [B, H, N, D]`` input.

    ``||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2`` and ``||x||^2`` is the same for every candidate of a token,
    so the nearest centroid and the margin come from ``||c||^2 - 2 x.c`` alone: one ``baddbmm``.
    """
    B, Hh, N, D = shape
    G = B * Hh
    cand = wg.on(xw.device, f"cand{per_window}", lambda w: candidate_centroids(w, per_window))  # [nW, C]
    nW, T, C = order.shape[0], order.shape[1], cand.shape[1]
    cw = centroids.reshape(G, -1, D).float().index_select(1, cand.clamp(min=0).view(-1)).view(G * nW, C, D)
    c2 = cw.square().sum(-1).view(G, nW, C).masked_fill(cand < 0, float("inf"))  # no candidate: never chosen
    d = torch.baddbmm(c2.view(G * nW, 1, C), xw, cw.transpose(1, 2), alpha=-2)  # [G * nW, T, C]
    best, idx = d.min(-1)
    labels_w = cand.unsqueeze(0).expand(G, -1, -1).gather(-1, idx.view(G, nW, T))  # [G, nW, T]
    keep = order >= 0
    dest = order[keep]
    labels = torch.full((G, N), -1, dtype=torch.long, device=xw.device)
    labels[:, dest] = labels_w[:, keep]
    margins = torch.full((G, N), float("inf"), dtype=torch.float32, device=xw.device)
    if margin and C > 1:
        second = d.scatter_(-1, idx.unsqueeze(-1), float("inf")).amin(-1)  # d is ours: mask the best in place
        margins[:, dest] = (second - best).view(G, nW, T)[:, keep]
    evals = int(((cand >= 0).sum(1) * keep.sum(1)).sum())
    return Assignment(labels.view(B, Hh, N), margins.view(B, Hh, N), evals * G)


def subset_table(wg: WindowGrid, tokens: torch.Tensor) -> torch.Tensor:
    """``[num_windows, max_tokens]`` holding only ``tokens``, each in its window's row (-1 padding): a subset
    is assigned window by window like the full set, at a cost proportional to its size."""
    win = wg.on(tokens.device, "window_of_token")[tokens]
    sorted_win, idx = torch.sort(win, stable=True)
    counts = torch.zeros(wg.num_windows, dtype=torch.long, device=tokens.device).scatter_add_(
        0, sorted_win, torch.ones_like(sorted_win))  # (bincount would read its maximum back from a GPU)
    first = counts.cumsum(0) - counts
    slot = torch.arange(len(tokens), device=tokens.device) - first[sorted_win]
    # On a GPU the table keeps the full window width (no device-to-host read of the largest count, which
    # would stall the queue; the kernel skips the empty slots). On the CPU the exact width is cheaper.
    width = wg.order.shape[1] if tokens.is_cuda else max(1, int(counts.max()))
    table = torch.full((wg.num_windows, width), -1, dtype=torch.long, device=tokens.device)
    table[sorted_win, slot] = tokens[idx]
    return table


def update_centroids(x: torch.Tensor, labels: torch.Tensor,
                     centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's update: each centroid becomes the mean of its tokens; empty clusters keep their centroid.

    Returns ``(centroids, sizes)``, both float32 (centroids ``[B, H, K, D]``, sizes ``[B, H, K]``), whatever
    the dtype of ``x``.
    """
    B, Hh, N, D = x.shape
    K = centroids.shape[2]
    flat = (labels + torch.arange(B * Hh, device=x.device).view(B, Hh, 1) * K).view(-1)  # one index space
    sums = torch.zeros(B * Hh * K, D, dtype=torch.float32, device=x.device).index_add_(
        0, flat, x.reshape(-1, D).float()).view(B, Hh, K, D)
    sizes = torch.zeros(B * Hh * K, dtype=torch.float32, device=x.device).index_add_(
        0, flat, torch.ones(flat.shape, dtype=torch.float32, device=x.device)).view(B, Hh, K)
    new = torch.where(sizes.unsqueeze(-1) > 0, sums / sizes.clamp(min=1).unsqueeze(-1), centroids.float())
    return new, sizes  # fp32: the state's centroids are exact means (HVAttention._merge relies on it)


def grid_init(x: torch.Tensor, wg: WindowGrid, per_window: int, update_fn=None) -> torch.Tensor:
    """Centroids on the regular 3D grid: window ``w``'s ``per_window`` centroids are the means of equal,
    consecutive slices of its tokens (raster order within the window). ``[B, H, num_windows * per_window, D]``."""
    B, Hh, N, D = x.shape
    labels = wg.on(x.device, f"grid_labels{per_window}", lambda w: grid_labels(w, per_window))
    empty = torch.zeros(B, Hh, wg.num_windows * per_window, D, dtype=x.dtype, device=x.device)
    centroids, _ = (update_fn or update_centroids)(x, labels.expand(B, Hh, N).contiguous(), empty)
    return centroids


# ---------------------------------------------------------------------------- clustering with state


@dataclasses.dataclass
class ClusterState:
    """What hybrid steps reuse: centroids ``[B, H, K, D]``, labels and margins ``[B, H, N]``, sizes."""

    centroids: torch.Tensor
    labels: torch.Tensor
    margin: torch.Tensor
    sizes: torch.Tensor


def local_kmeans(x: torch.Tensor, grid: tuple[int, int, int], window: tuple[int, int, int], per_window: int = 1,
                 iters: int = 3, assign_fn=None, update_fn=None, lead_frames: int = 0) -> tuple[ClusterState, int]:
    """Full 3D local-window clustering (an anchor step): grid start, then ``iters`` Lloyd iterations.

    ``assign_fn`` / ``update_fn`` replace :func:`assign_local` / :func:`update_centroids` (the Triton
    kernels have the same signatures); ``lead_frames`` as in :func:`window_grid`. Returns the state and
    the number of distance evaluations.
    """
    assign_fn = assign_fn or assign_local
    update_fn = update_fn or update_centroids
    wg = window_grid(tuple(grid), tuple(window), lead_frames)
    if wg.grid[0] * wg.grid[1] * wg.grid[2] != x.shape[2]:
        raise ValueError(f"grid {grid} has {math.prod(grid)} tokens but x has {x.shape[2]}.")
    centroids = grid_init(x, wg, per_window, update_fn)
    if assign_fn is assign_local:  # torch: gather the tokens window by window once, for every iteration
        order = wg.on(x.device, "order")
        xw = windowed(x, order)

        def assign_fn(x, c, wg, per_window, margin):
            return nearest_in_windows(xw, x.shape, order, c, wg, per_window, margin)
    evals = 0
    a = None
    iters = max(1, iters)
    for i in range(iters):
        a = assign_fn(x, centroids, wg, per_window, margin=i == iters - 1)  # margins only for the final state
        evals += a.distance_evals
        centroids, sizes = update_fn(x, a.labels, centroids)
    return ClusterState(centroids, a.labels, a.margin, sizes), evals


def refine(x: torch.Tensor, state: ClusterState, grid, window, per_window: int, fraction: float,
           assign_fn=None, update_fn=None, lead_frames: int = 0) -> tuple[ClusterState, int]:
    """A hybrid (non-anchor) step: re-assign the ``fraction`` of tokens with the smallest margin at their
    last assignment (the margin averaged over batch and heads, so one subset serves every head), keep the
    other labels, and update the centroids once from all tokens."""
    assign_fn = assign_fn or assign_local
    update_fn = update_fn or update_centroids
    wg = window_grid(tuple(grid), tuple(window), lead_frames)
    B, Hh, N, _ = x.shape
    m = max(1, int(round(fraction * N)))
    # One shared subset keeps the kernel's gather regular: the tokens least certain on average over heads (over
    # every rank's heads when --parallel ulysses=N split them, so that N ranks pick what one device picks).
    tokens = mean_over_heads(state.margin).topk(m, largest=False).indices.sort().values
    a = assign_fn(x, state.centroids, wg, per_window, tokens)
    labels = state.labels.clone()
    margin = state.margin.clone()
    labels[:, :, tokens] = a.labels[:, :, tokens]
    margin[:, :, tokens] = a.margin[:, :, tokens]
    centroids, sizes = update_fn(x, labels, state.centroids)
    return ClusterState(centroids, labels, margin, sizes), a.distance_evals


# ---------------------------------------------------------------------------- global k-means (SVG2 baseline)


def global_kmeans(x: torch.Tensor, k: int, iters: int, init: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> tuple[ClusterState, int]:
    """Plain k-means over all tokens (SVG2's clustering): every token against every centroid.

    Starts from ``init`` (warm start) or from ``k`` distinct random tokens per (batch, head).
    """
    B, Hh, N, D = x.shape
    k = min(k, N)
    if init is None:
        idx = torch.stack([torch.randperm(N, generator=generator)[:k] for _ in range(B * Hh)]).view(B, Hh, k)
        centroids = torch.gather(x, 2, idx.to(x.device).unsqueeze(-1).expand(-1, -1, -1, D))
    else:
        centroids = init
    evals = 0
    for _ in range(max(1, iters)):
        d2 = torch.cdist(x.float(), centroids.float()).square()  # [B, H, N, K]
        two = d2.topk(min(2, k), dim=-1, largest=False)
        labels = two.indices[..., 0]
        margin = (two.values[..., 1] - two.values[..., 0]) if k > 1 else torch.zeros_like(two.values[..., 0])
        evals += B * Hh * N * k
        centroids, sizes = update_centroids(x, labels, centroids)
    return ClusterState(centroids, labels, margin.to(x.dtype), sizes), evals
