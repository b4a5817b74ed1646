"""From clusters to tiles: hardware-aware merging, block selection and the permuted tile layout.

HyperVAttention Sec. 3.3 (our reading; the paper's cost model is not public, docs/sparse_attention.md):

* **Hardware-aware merging.** A cluster of ``n`` tokens occupies ``ceil(n / T)`` tiles of ``T`` rows, so
  its last tile is partly padding. Two clusters whose partial tiles fit in one tile save a tile when
  merged. Merging runs in parallel rounds, as agglomerative clustering does: every cluster picks, among
  the partners that save a tile, the one with the smallest Ward cost ``n_a n_b / (n_a + n_b) ||c_a -
  c_b||^2`` (the increase in within-cluster squared error), and mutually chosen pairs merge. A pair is
  allowed only while that increase per merged token stays below ``tau`` times the clustering's mean
  squared error, so merging fills tiles without making clusters meaningless.
* **Block selection.** A (query cluster, key cluster) pair is scored from centroids, weighted by cluster
  size: ``P_ij = n_j exp(c_i . c_j * scale) / sum_j' n_j' exp(c_i . c_j' * scale)``, the attention mass
  query cluster ``i`` is expected to put on key cluster ``j``. Pairs are kept under a top-p rule per query
  cluster, or under a global budget of executed work (``density`` of dense), greedily by expected mass per
  executed tile; every query cluster keeps at least its ``min_keys`` best key clusters.
* **Layout.** Tokens are permuted so that each cluster is contiguous and padded to whole tiles; the kept
  pairs become a tile mask over the permuted sequence (:class:`~kinegen.sparse_attn.block_sparse.BlockLayout`).

Work is counted in token pairs: *executed* = kept tiles x ``T^2`` (padding included), *useful* = sum of
``n_i n_j`` over kept pairs. ``density = executed / N^2`` (the share of dense work executed) and
``tile_efficiency = useful / executed``.
"""

from __future__ import annotations

import dataclasses

import torch


def num_tiles(sizes: torch.Tensor, tile: int) -> torch.Tensor:
    return torch.div(sizes + tile - 1, tile, rounding_mode="floor")


# ---------------------------------------------------------------------------- merging


def merge_clusters(centroids: torch.Tensor, sizes: torch.Tensor, tile: int, mse: torch.Tensor, tau: float = 1.0,
                   rounds: int = 8) -> torch.Tensor:
    """Parallel agglomerative merging of clusters into fuller tiles.

    Args:
        centroids: ``[G, K, D]`` (G = batch x heads); sizes: ``[G, K]`` tokens per cluster.
        mse: ``[G]`` the clustering's mean squared distance of tokens to their centroid.
    Returns:
        ``[G, K]`` the surviving cluster each cluster was merged into (itself if not merged).
    """
    G, K, _ = centroids.shape
    c = centroids.float().clone()
    n = sizes.float().clone()
    root = torch.arange(K, device=c.device).expand(G, K).clone()
    idx = torch.arange(K, device=c.device)
    for _ in range(rounds):
        alive = n > 0
        tiles = num_tiles(n, tile)
        saves = (tiles.unsqueeze(-1) + tiles.unsqueeze(-2)) > num_tiles(n.unsqueeze(-1) + n.unsqueeze(-2), tile)
        ward = (n.unsqueeze(-1) * n.unsqueeze(-2) / (n.unsqueeze(-1) + n.unsqueeze(-2)).clamp(min=1)
                * torch.cdist(c, c).square())
        allowed = (saves & alive.unsqueeze(-1) & alive.unsqueeze(-2) & (idx != idx.unsqueeze(-1))
                   & (ward <= tau * mse.view(G, 1, 1) * (n.unsqueeze(-1) + n.unsqueeze(-2))))
        cost = ward.masked_fill(~allowed, float("inf"))
        best_cost, best = cost.min(-1)
        has = torch.isfinite(best_cost)
        mutual = has & (torch.gather(best, 1, best) == idx) & (idx < best)
        if not mutual.any():
            break
        # Merge b into a for every mutual pair (a < b): weighted centroid, summed size.
        g, a = mutual.nonzero(as_tuple=True)
        b = best[g, a]
        na, nb = n[g, a], n[g, b]
        c[g, a] = (c[g, a] * na.unsqueeze(-1) + c[g, b] * nb.unsqueeze(-1)) / (na + nb).unsqueeze(-1)
        n[g, a] = na + nb
        n[g, b] = 0
        target = idx.expand(G, K).clone()
        target[g, b] = a
        root = torch.gather(target, 1, root)
    return root


# ---------------------------------------------------------------------------- selection


def cluster_scores(cq: torch.Tensor, nq: torch.Tensor, ck: torch.Tensor, nk: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """``P[g, i, j]``: expected attention mass of query cluster i on key cluster j (rows sum to 1)."""
    logits = torch.einsum("gid,gjd->gij", cq.float(), ck.float()) * scale
    logits = logits + torch.log(nk.float().clamp(min=0)).unsqueeze(1)  # size weighting; empty -> -inf
    return torch.softmax(logits, dim=-1).nan_to_num(0.0)


def select_blocks(P: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor, tile: int, *, density: float | None = None,
                  top_p: float | None = None, min_keys: int = 1) -> torch.Tensor:
    """Kept (query cluster, key cluster) pairs ``[G, Kq, Kk]`` bool, by ``top_p`` or a ``density`` budget."""
    G, Kq, Kk = P.shape
    q_alive, k_alive = nq > 0, nk > 0
    order = P.argsort(-1, descending=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(Kk, device=P.device).expand_as(order))
    keep = (rank < min_keys) & k_alive.unsqueeze(1)
    if top_p is not None:
        sorted_p = torch.gather(P, -1, order)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the better pairs
        keep |= torch.gather(before < top_p, -1, rank)
    if density is not None:
        cost = (num_tiles(nq, tile).unsqueeze(-1) * num_tiles(nk, tile).unsqueeze(1)).float() * tile * tile
        value = P * nq.unsqueeze(-1).float()
        ratio = (value / cost.clamp(min=1)).masked_fill(~(q_alive.unsqueeze(-1) & k_alive.unsqueeze(1)), -1.0)
        n_total = nq.float().sum(-1)  # tokens per group
        budget = density * n_total.square() - (cost * keep).sum((-1, -2))
        flat_cost = cost.flatten(1)
        for _ in range(4):  # greedy by mass per executed tile; later passes fill what a too-big pair left
            flat_ratio = ratio.masked_fill(keep, -1.0).flatten(1)
            fits = (flat_ratio > 0) & (flat_cost <= budget.unsqueeze(-1))
            order2 = flat_ratio.masked_fill(~fits, -2.0).argsort(-1, descending=True)
            spent = torch.gather(flat_cost * fits, 1, order2).cumsum(-1)
            take = (spent <= budget.unsqueeze(-1)) & torch.gather(fits, 1, order2)
            if not take.any():
                break
            extra = torch.zeros_like(take)
            extra.scatter_(1, order2, take)
            keep |= extra.view(G, Kq, Kk)
            budget = budget - (flat_cost * extra).sum(-1)
    return keep & q_alive.unsqueeze(-1) & k_alive.unsqueeze(1)


# ---------------------------------------------------------------------------- layout


@dataclasses.dataclass
class Permutation:
    """Cluster-contiguous, tile-padded order of one side (queries or keys).

    ``slot_token[g, s]`` is the token in slot ``s`` (-1: padding); ``tile_cluster[g, t]`` the cluster
    of tile ``t`` (-1: trailing padding tiles); ``length`` the padded length (a multiple of the tile).
    """

    slot_token: torch.Tensor
    tile_cluster: torch.Tensor
    length: int


def permutation(labels: torch.Tensor, num_clusters: int, tile: int, length: int | None = None) -> Permutation:
    """Sort tokens by cluster and give every cluster whole tiles. ``labels``: ``[G, N]``."""
    G, N = labels.shape
    dev = labels.device
    sizes = torch.zeros(G, num_clusters, dtype=torch.long, device=dev)
    sizes.scatter_add_(1, labels, torch.ones_like(labels))
    tiles = num_tiles(sizes, tile)
    tile_start = tiles.cumsum(-1) - tiles  # [G, K] first tile of each cluster
    total_tiles = int(tiles.sum(-1).max())
    if length is None:
        length = max(total_tiles, 1) * tile
    order = labels.argsort(dim=-1, stable=True)  # tokens grouped by cluster
    sorted_labels = torch.gather(labels, 1, order)
    first = sizes.cumsum(-1) - sizes  # position of each cluster's first token in `order`
    rank = torch.arange(N, device=dev).expand(G, N) - torch.gather(first, 1, sorted_labels)
    slot = torch.gather(tile_start, 1, sorted_labels) * tile + rank
    slot_token = torch.full((G, length), -1, dtype=torch.long, device=dev)
    slot_token.scatter_(1, slot, order)
    n_tiles = length // tile
    tile_cluster = torch.full((G, n_tiles), -1, dtype=torch.long, device=dev)
    t = torch.arange(n_tiles, device=dev)
    # Tile t belongs to cluster k when tile_start[k] <= t < tile_start[k] + tiles[k].
    inside = (t.view(1, 1, -1) >= tile_start.unsqueeze(-1)) & (t.view(1, 1, -1) < (tile_start + tiles).unsqueeze(-1))
    has = inside.any(1)
    tile_cluster[has] = inside.float().argmax(1)[has]
    return Permutation(slot_token, tile_cluster, length)


def tile_mask(keep: torch.Tensor, pq: Permutation, pk: Permutation) -> torch.Tensor:
    """``[G, QT, KT]`` bool: tile (t, u) is executed when its clusters' pair is kept."""
    G = keep.shape[0]
    qc, kc = pq.tile_cluster, pk.tile_cluster
    m = keep[torch.arange(G, device=keep.device).view(G, 1, 1), qc.clamp(min=0).unsqueeze(-1),
             kc.clamp(min=0).unsqueeze(1)]
    return m & (qc >= 0).unsqueeze(-1) & (kc >= 0).unsqueeze(1)


def gather_slots(x: torch.Tensor, slot_token: torch.Tensor) -> torch.Tensor:
    """``x[G, N, D]`` -> ``[G, L, D]`` in slot order (padding slots zero)."""
    out = torch.gather(x, 1, slot_token.clamp(min=0).unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return out.masked_fill((slot_token < 0).unsqueeze(-1), 0)


def scatter_slots(y: torch.Tensor, slot_token: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`gather_slots` for the valid slots: ``[G, L, D]`` -> ``[G, N, D]``."""
    G, L, D = y.shape
    out = torch.zeros(G, n + 1, D, dtype=y.dtype, device=y.device)  # row n collects the padding
    idx = torch.where(slot_token < 0, n, slot_token)
    out.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, D), y)
    return out[:, :n]


def work_stats(keep: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor, tile: int, n_tokens: int) -> dict[str, float]:
    """Executed density (share of dense work, padding included) and tile efficiency (useful / executed)."""
    useful = (keep * (nq.unsqueeze(-1) * nk.unsqueeze(1)).float()).sum()
    executed = (keep * (num_tiles(nq, tile).unsqueeze(-1) * num_tiles(nk, tile).unsqueeze(1)).float()).sum() * tile ** 2
    groups = keep.shape[0]
    return {"density": float(executed / (groups * n_tokens ** 2)),
            "useful_density": float(useful / (groups * n_tokens ** 2)),
            "tile_efficiency": float(useful / executed.clamp(min=1))}
