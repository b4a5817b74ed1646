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
        centroids: ``[G, K, D]`` (G = batch x heads; queries and keys may be stacked along G, padded
            with empty clusters); sizes: ``[G, K]`` tokens per cluster (0: empty, never merged).
        mse: ``[G]`` the clustering's mean squared distance of tokens to their centroid.
    Returns:
        ``[G, K]`` the surviving cluster each cluster was merged into (itself if not merged).

    Each round is a fixed set of whole-tensor operations (no count of pairs is read back), so a GPU runs
    the rounds without waiting on the host.
    """
    G, K, _ = centroids.shape
    c = centroids.float()
    n = sizes.float()
    idx = torch.arange(K, device=c.device)
    root = idx.expand(G, K)
    off_diagonal = idx.unsqueeze(-1) != idx
    limit = tau * mse.float().view(G, 1, 1)
    for _ in range(rounds):
        n_ab = n.unsqueeze(-1) + n.unsqueeze(-2)
        tiles = num_tiles(n, tile)
        # Saves a tile (never true with an empty cluster: it occupies no tile).
        saves = (tiles.unsqueeze(-1) + tiles.unsqueeze(-2)) > num_tiles(n_ab, tile)
        sq = c.square().sum(-1)
        dist2 = (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2 * c @ c.transpose(1, 2)).clamp(min=0)
        ward = n.unsqueeze(-1) * n.unsqueeze(-2) / n_ab.clamp(min=1) * dist2  # increase in squared error
        allowed = saves & off_diagonal & (ward <= limit * n_ab)
        best_cost, best = ward.masked_fill(~allowed, float("inf")).min(-1)
        pair = torch.isfinite(best_cost) & (torch.gather(best, 1, best) == idx)  # mutually chosen
        keeper, absorbed = pair & (idx < best), pair & (idx > best)  # b merges into a for a < b
        if not c.is_cuda and not keeper.any():  # (on a GPU the check would stall the queue; rounds are cheap)
            break
        nb = torch.gather(n, 1, best)
        cb = torch.gather(c, 1, best.unsqueeze(-1).expand_as(c))
        c = torch.where(keeper.unsqueeze(-1), (c * n.unsqueeze(-1) + cb * nb.unsqueeze(-1))
                        / (n + nb).clamp(min=1).unsqueeze(-1), c)
        n = torch.where(absorbed, 0.0, torch.where(keeper, n + nb, n))
        root = torch.gather(torch.where(absorbed, best, idx), 1, root)
    return root


# ---------------------------------------------------------------------------- selection


def cluster_scores(cq: torch.Tensor, nq: torch.Tensor, ck: torch.Tensor, nk: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """``P[g, i, j]``: expected attention mass of query cluster i on key cluster j (rows sum to 1)."""
    logits = torch.einsum("gid,gjd->gij", cq.float(), ck.float()) * scale
    logits = logits + torch.log(nk.float().clamp(min=0)).unsqueeze(1)  # size weighting; empty -> -inf
    return torch.softmax(logits, dim=-1).nan_to_num(0.0)


SELECTIONS = ("coverage", "greedy")


def select_blocks(P: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor, tile: int, *, density: float | None = None,
                  top_p: float | None = None, min_keys: int = 1, min_key_share: float = 0.0,
                  key_unit: int | None = None, selection: str = "greedy") -> torch.Tensor:
    """Kept (query cluster, key cluster) pairs ``[G, Kq, Kk]`` bool, by ``top_p`` or a ``density`` budget.

    Every query cluster keeps at least its ``max(min_keys, floor(min_key_share x live key clusters))`` best
    key clusters (SVG2's floor, ``min_kc_ratio``, is the share form; it counts all its key clusters, which are
    all live there).

    A ``density`` budget caps the executed work, counted in token pairs (integers, so totals are exact) the
    way the layout executes them: a query cluster's rows padded to whole ``tile``s times a key cluster's keys
    padded to whole ``key_unit``s. ``key_unit`` is the tile for the tile layout (the default); key lists
    gather the kept keys of a query cluster into one list, so a key cluster costs its tokens (``key_unit=1``;
    the one padding per list is left out of the pair cost). The budget is spent one of two ways:

    * ``coverage``: every query cluster keeps its best key clusters until they hold a share ``p`` of its
      expected mass (the ``top_p`` rule), with one ``p`` for all heads, the largest whose work fits the
      budget (found by bisection). A row's output error grows faster than linearly with the mass it misses, so
      spreading the missed mass evenly over the query clusters costs less error than the greedy order,
      which starves the query clusters whose attention is spread out (benchmarks/sparse_attention.md).
    * ``greedy``: by expected mass per unit of work over all pairs: the pairs are sorted once, then each
      pass takes, in that order, every pair that still fits; later passes fill what a too-big pair left.
      A ``top_p`` given with it is kept first.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}; got {selection!r}")
    G, Kq, Kk = P.shape
    q_alive, k_alive = nq > 0, nk > 0
    live = q_alive.unsqueeze(-1) & k_alive.unsqueeze(1)
    floor = torch.clamp(torch.floor(min_key_share * k_alive.sum(-1)).long(), min=min_keys).view(G, 1, 1)
    unit = tile if key_unit is None else key_unit
    work = ((num_tiles(nq, tile) * tile).unsqueeze(-1)  # executed token pairs per pair of clusters
            * (num_tiles(nk, unit) * unit).unsqueeze(1))
    budget = None if density is None else torch.floor(density * nq.sum(-1).double().square()).long()
    if density is not None and selection == "coverage":
        return _coverage(P, live, floor, work, budget, top_p)
    if top_p is None and min_key_share == 0:
        keep = torch.zeros_like(live).scatter_(-1, P.topk(min(min_keys, Kk), dim=-1).indices, True) & live
    else:
        rows = _SortedRows(P, live, floor)
        keep = rows.keep(-1.0 if top_p is None else top_p)  # (no mass is below -1: the floor alone)
    if density is not None:
        ratio = (P * nq.unsqueeze(-1).float() / work.clamp(min=1)).masked_fill(~live, -1.0)
        budget = budget - (work * keep).sum((-1, -2))
        order = ratio.flatten(1).argsort(-1, descending=True)
        s_work, s_ratio = work.flatten(1).gather(1, order), ratio.flatten(1).gather(1, order)
        s_keep = keep.flatten(1).gather(1, order)
        for _ in range(4):
            fits = (s_ratio > 0) & ~s_keep & (s_work <= budget.unsqueeze(-1))
            spent = _row_cumsum(s_work * fits)
            take = fits & (spent <= budget.unsqueeze(-1))
            if not P.is_cuda and not take.any():  # (a GPU runs the passes rather than wait for the check)
                break
            s_keep |= take
            budget = budget - (s_work * take).sum(-1)
        keep = torch.zeros_like(s_keep).scatter_(1, order, s_keep).view(G, Kq, Kk)
    return keep & live


class _SortedRows:
    """Each query cluster's key clusters in order of expected mass, for the top-p rule: ``before`` is the
    mass of the better ones; the first ``floor`` are kept whatever the mass."""

    def __init__(self, P, live, floor):
        G, Kq, Kk = P.shape
        self.order = P.argsort(-1, descending=True)
        sorted_p = torch.gather(P, -1, self.order)
        self.before = sorted_p.cumsum(-1) - sorted_p
        self.live = torch.gather(live, -1, self.order)
        self.floored = torch.arange(Kk, device=P.device).view(1, 1, Kk) < floor

    def kept(self, p) -> torch.Tensor:
        """The top-p rule at ``p`` (a number or a 0-d tensor), in sorted order."""
        return (self.floored | (self.before < p)) & self.live

    def keep(self, p) -> torch.Tensor:
        """The same in the key clusters' own order."""
        kept = self.kept(p)
        return torch.zeros_like(kept).scatter_(-1, self.order, kept)


def _coverage(P, live, floor, work, budget, top_p: float | None = None, steps: int = 16) -> torch.Tensor:
    """The ``coverage`` rule of :func:`select_blocks`: the largest ``p`` (to ``2^-steps``, at most ``top_p``)
    whose top-p selection (floor included) fits the budget of all heads together; the floor alone where even
    ``p = 0`` does not fit. One ``p`` for every head, not one budget per head: a head whose attention is spread
    out needs more work for the same coverage, and a budget per head would starve it. Whole-tensor steps, no
    value read back (a GPU runs the bisection without waiting on the host)."""
    rows = _SortedRows(P, live, floor)
    s_work = torch.gather(work.expand(P.shape), -1, rows.order)
    total = budget.sum()

    def spent(p):  # work of the top-p selection at p, all heads
        return (rows.kept(p) * s_work).sum()

    lo = torch.zeros((), dtype=P.dtype, device=P.device)  # fits (or nothing does: the floor alone)
    hi = torch.full_like(lo, 1.0 + 1e-6 if top_p is None else top_p)  # the cap: top_p, or all the mass
    cap = hi.clone()
    for _ in range(steps):
        mid = (lo + hi) / 2
        fits = spent(mid) <= total
        lo, hi = torch.where(fits, mid, lo), torch.where(fits, hi, mid)
    return rows.keep(torch.where(spent(cap) <= total, cap, lo))  # the cap itself where it fits


def _row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Cumulative sum along each row of an integer ``[G, M]`` tensor, as one scan over the flattened rows
    (a GPU scans a few long rows slowly, one block per row)."""
    flat = x.flatten().cumsum(0).view_as(x)
    offset = torch.cat([flat.new_zeros(1), flat[:-1, -1]])
    return flat - offset.unsqueeze(-1)


# ---------------------------------------------------------------------------- layout


@dataclasses.dataclass
class Permutation:
    """Cluster-contiguous, tile-padded order of one side (queries or keys).

    ``slot_token[g, s]`` is the token in slot ``s`` (-1: padding); ``token_slot[g, i]`` the slot of token
    ``i`` (the inverse); ``tile_cluster[g, t]`` the cluster of tile ``t`` (-1: trailing padding tiles);
    ``length`` the padded length (a multiple of the tile).
    """

    slot_token: torch.Tensor
    tile_cluster: torch.Tensor
    length: int
    token_slot: torch.Tensor


def permutation(labels: torch.Tensor, num_clusters: int, tile: int, length: int | None = None) -> Permutation:
    """Sort tokens by cluster and give every cluster whole tiles. ``labels``: ``[G, N]``."""
    G, N = labels.shape
    dev = labels.device
    sizes = torch.zeros(G, num_clusters, dtype=torch.long, device=dev)
    sizes.scatter_add_(1, labels, torch.ones_like(labels))
    tiles = num_tiles(sizes, tile)
    tile_start = tiles.cumsum(-1) - tiles  # [G, K] first tile of each cluster
    if length is None:  # (reads the device; callers on a GPU pass a length)
        length = max(int(tiles.sum(-1).max()), 1) * tile
    order = labels.argsort(dim=-1, stable=True)  # tokens grouped by cluster
    sorted_labels = torch.gather(labels, 1, order)
    first = sizes.cumsum(-1) - sizes  # position of each cluster's first token in `order`
    rank = torch.arange(N, device=dev).expand(G, N) - torch.gather(first, 1, sorted_labels)
    slot = torch.gather(tile_start, 1, sorted_labels) * tile + rank
    slot_token = torch.full((G, length), -1, dtype=torch.long, device=dev)
    slot_token.scatter_(1, slot, order)
    token_slot = torch.empty_like(slot).scatter_(1, order, slot)
    n_tiles = length // tile
    t = torch.arange(n_tiles, device=dev)
    # Tile t belongs to cluster k when tile_start[k] <= t < tile_start[k] + tiles[k].
    inside = (t.view(1, 1, -1) >= tile_start.unsqueeze(-1)) & (t.view(1, 1, -1) < (tile_start + tiles).unsqueeze(-1))
    tile_cluster = torch.where(inside.any(1), inside.float().argmax(1), -1)
    return Permutation(slot_token, tile_cluster, length, token_slot)


def tile_mask(keep: torch.Tensor, pq: Permutation, pk: Permutation) -> torch.Tensor:
    """``[G, QT, KT]`` bool: tile (t, u) is executed when its clusters' pair is kept."""
    G = keep.shape[0]
    qc, kc = pq.tile_cluster, pk.tile_cluster
    m = keep[torch.arange(G, device=keep.device).view(G, 1, 1), qc.clamp(min=0).unsqueeze(-1),
             kc.clamp(min=0).unsqueeze(1)]
    return m & (qc >= 0).unsqueeze(-1) & (kc >= 0).unsqueeze(1)


def gather_slots(x: torch.Tensor, slot_token: torch.Tensor) -> torch.Tensor:
    """``x[G, N, D]`` -> ``[G, L, D]`` in slot order. Padding slots hold a copy of token 0: the layout's
    ``key_valid`` keeps them out of every softmax and their query rows are dropped on the way back, so
    they need not be zeroed (a pass over the whole padded tensor)."""
    return torch.gather(x, 1, slot_token.clamp(min=0).unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def scatter_slots(y: torch.Tensor, token_slot: torch.Tensor) -> torch.Tensor:
    """Back from slot order: ``y[G, L, D]`` -> ``[G, N, D]``, a gather by each token's slot (a scatter
    would send every padding slot to one place, which serialises on a GPU)."""
    return torch.gather(y, 1, token_slot.unsqueeze(-1).expand(-1, -1, y.shape[-1]))


def work_stats(keep: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor, tile: int,
               n_tokens: int) -> dict[str, torch.Tensor]:
    """Executed density (share of dense work, padding included) and tile efficiency (useful / executed),
    as 0-d tensors on the device (read them when needed; reading forces a GPU sync)."""
    useful = (keep * (nq.unsqueeze(-1) * nk.unsqueeze(1)).float()).sum()
    executed = (keep * (num_tiles(nq, tile).unsqueeze(-1) * num_tiles(nk, tile).unsqueeze(1)).float()).sum() * tile ** 2
    groups = keep.shape[0]
    return {"density": executed / (groups * n_tokens ** 2),
            "useful_density": useful / (groups * n_tokens ** 2),
            "tile_efficiency": useful / executed.clamp(min=1)}
