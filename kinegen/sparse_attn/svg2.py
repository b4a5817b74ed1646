"""Sparse VideoGen 2 (SVG2, "semantic-aware permutation") as its public code runs it.

Our own implementation, written from a reading of ``svg-project/Sparse-VideoGen`` (files cited below as
``svg/kmeans_utils.py``, ``svg/models/wan/attention.py``, ``svg/models/hyvideo/attention.py``,
``wan_t2v_inference.py`` and ``scripts/wan/wan_t2v_720p_sap.sh``). Per attention call at a sparse step:

1. **k-means** on the queries and, separately, on the keys of every (batch, head): Euclidean Lloyd
   iterations, ``iters`` of them from random tokens on the first call of a layer (SVG2's
   ``kmeans_iter_init``), ``warm_iters`` from the centroids the previous call of that layer returned on
   every later call (``kmeans_iter_step``); the whole batch stops early once no centroid moved ``tol`` or
   more. :func:`svg2_kmeans`.
2. **Block map** from the centroids: the softmax of centroid similarities weighted by key-cluster sizes,
   and per query cluster the best key clusters until their mass passes ``top_p``, never fewer than
   ``floor(min_kc_ratio x key clusters)`` and never none. :func:`svg2_select`.
3. **Execution**: tokens sorted by cluster, and each query cluster attends to the keys of its kept key
   clusters as one list (SVG2 runs FlashInfer's variable-block sparse wrapper). Here
   :mod:`kinegen.sparse_attn.varlen` executes it; :func:`svg2_reference_attention` is the dense, masked
   ground truth of the same computation.
4. **Density** as SVG2 logs it: kept token pairs over all token pairs. :func:`svg2_density`.

Numerics: SVG2 runs in the model's dtype (bf16 in its scripts): centroids are stored in it between
iterations, and its kernels take bf16 operands (float32 accumulation); the centroid similarities and the
block-map probabilities are rounded to it. Here the centroids are stored in the input's dtype too (so the
warm start sees what SVG2's does), but distances, similarities and probabilities are computed in float32.
On float32 inputs, SVG2's own functions run on a CPU (its Triton kernels in interpreter mode) give the same
labels, centroids to 4e-6, the same iteration counts and the same block maps, except where its random start
draws a token twice (see :func:`svg2_kmeans`).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .clustering import ClusterState
from .hva import MIN_TOKENS, _check_dense, _ClusteredSparseAttention
from .varlen import BACKENDS

# SVG2's Wan 2.1 720p text-to-video defaults (scripts/wan/wan_t2v_720p_sap.sh): 1280x720, 81 frames ->
# 21 latent frames of 45 x 80 patches = 75,600 tokens, clustered into 300 query and 1000 key clusters.
SVG2_WAN720P_TOKENS = 75_600
SVG2_WAN720P_Q_CLUSTERS = 300
SVG2_WAN720P_K_CLUSTERS = 1000


@dataclasses.dataclass
class SVG2Config:
    """SVG2's settings, with its Wan 2.1 720p text-to-video defaults (``scripts/wan/wan_t2v_720p_sap.sh``).

    Attributes:
        q_tokens_per_cluster / k_tokens_per_cluster: tokens per query / key cluster; a call with ``N`` video
            tokens uses ``ceil(N / q_tokens_per_cluster)`` query clusters (at least 1, at most ``N``), and the
            same for keys. SVG2 fixes the counts instead (``num_q_centroids=300``, ``num_k_centroids=1000`` at
            Wan 720p); as a share of its 75,600 tokens that is 75,600 / 300 = 252 tokens per query cluster and
            75,600 / 1000 = 75.6 per key cluster, so at 75,600 tokens these defaults give exactly 300 and 1000.
            (SVG2's other scripts do not keep this share: Wan 480p uses 200 / 1000 on 32,760 tokens, 163.8 /
            32.8 tokens each; HunyuanVideo 720p 400 / 1000 on 118,800, 297 / 118.8.)
        top_p: per query cluster, key clusters are kept in order of expected mass while the mass of the ones
            before is at most ``top_p`` (SVG2's ``top_p_kmeans``, 0.9 in every script).
        min_kc_ratio: every query cluster keeps at least ``floor(min_kc_ratio x key clusters)`` key clusters
            (SVG2's ``min_kc_ratio``, 0.10 in every script; its argparse default is 0).
        iters: Lloyd iterations on the first call of a layer (SVG2's ``kmeans_iter_init``, 50).
        warm_iters: Lloyd iterations on later calls, from the centroids of the call before (SVG2's
            ``kmeans_iter_step``, 2).
        tol: early stop once the largest centroid move in an iteration is below this (SVG2's
            ``batch_kmeans_Euclid`` default, 1e-4, which its attention processors do not override).
        seed: seed of this module's generator for the random initial centroids (SVG2 draws from torch's
            global generator).
        dense_warmup: the share of denoising steps, the first ones, that run dense attention (SVG2's
            ``first_times_fp``, 0.2 at Wan 720p: SVG2 runs ``floor(0.2 x 50) = 10`` steps dense).
        dense_layers: leading transformer layers that always run dense. SVG2 gives a share,
            ``first_layers_fp = 0.03``, and keeps ``floor(0.03 x layers)`` dense: 1 on Wan 14B's 40 layers
            (and on 34 to 66 layers; 0 below 34, e.g. Wan 1.3B's 30).
        tile: query rows per tile of the execution (64).
        block: key rows per block of a query cluster's key list (64).
        backend: execution backend of :func:`kinegen.sparse_attn.varlen.varlen_attention`: ``auto`` (``triton``
            on CUDA, ``gather`` elsewhere), ``reference``, ``gather``, ``flex`` or ``triton``.
        min_tokens: in pipelines, calls with fewer video tokens run dense (as in :class:`~.hva.HVAConfig`;
            SVG2 has no such floor).
    """

    q_tokens_per_cluster: float = SVG2_WAN720P_TOKENS / SVG2_WAN720P_Q_CLUSTERS  # 252.0
    k_tokens_per_cluster: float = SVG2_WAN720P_TOKENS / SVG2_WAN720P_K_CLUSTERS  # 75.6
    top_p: float = 0.9
    min_kc_ratio: float = 0.10
    iters: int = 50
    warm_iters: int = 2
    tol: float = 1e-4
    seed: int = 0
    dense_warmup: float = 0.2
    dense_layers: int = 1
    tile: int = 64
    block: int = 64
    backend: str = "auto"
    min_tokens: int = MIN_TOKENS

    def __post_init__(self):
        for name in ("q_tokens_per_cluster", "k_tokens_per_cluster"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 (tokens per cluster); got {value!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if not 0 <= self.min_kc_ratio <= 1:
            raise ValueError(f"min_kc_ratio must be in [0, 1] (a share of the key clusters); got {self.min_kc_ratio}")
        for name in ("iters", "warm_iters", "tile", "block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not (math.isfinite(self.tol) and self.tol >= 0):
            raise ValueError(f"tol must be a finite number >= 0 (0: never stop early); got {self.tol}")
        _check_dense(self.dense_warmup, self.dense_layers, self.min_tokens)
        if self.backend != "auto" and self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {self.backend!r}")

    def num_clusters(self, tokens: int) -> tuple[int, int]:
        """(query clusters, key clusters) for ``tokens`` video tokens."""
        return (_count(tokens, self.q_tokens_per_cluster), _count(tokens, self.k_tokens_per_cluster))


def _count(tokens: int, per_cluster: float) -> int:
    # Rounded before the ceiling, so that 75,600 / 75.6 (1000.0000000000001 in floating point) gives 1000.
    return max(1, min(tokens, math.ceil(round(tokens / per_cluster, 6))))


# ---------------------------------------------------------------------------- k-means


def svg2_kmeans(x: torch.Tensor, num_clusters: int, iters: int, init: torch.Tensor | None = None,
                generator: torch.Generator | None = None,
                tol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Batched Euclidean k-means as SVG2's ``batch_kmeans_Euclid`` (``svg/kmeans_utils.py``) runs it.

    Args:
        x: ``[G, N, D]`` points (G = batch x heads), any float dtype.
        num_clusters: ``K``. May exceed ``N`` (the extra clusters stay empty).
        iters: at most this many Lloyd iterations (SVG2's ``max_iters``), at least 1.
        init: ``[G, K, D]`` starting centroids (a warm start from the previous call's centroids), or
            ``None``: ``K`` tokens drawn uniformly **with replacement** per group (SVG2's ``torch.randint``;
            a token drawn twice leaves one of its two clusters empty at first).
        generator: the random generator of the cold start (``None``: torch's global one, as SVG2).
        tol: stop once the largest centroid move of an iteration, over all groups, is below ``tol``.

    Returns:
        ``(labels [G, N] int64, centroids [G, K, D] in x's dtype, sizes [G, K] int64, iterations run)``.

    One iteration, as in SVG2: every point goes to the nearest centroid by squared distance
    ``||x||^2 + ||c||^2 - 2 x.c`` clamped at 0 (the lowest index on ties); each centroid becomes the mean of
    its points, an empty cluster keeps its centroid; the new centroids are rounded to x's dtype. Then the
    move ``max ||c_new - c_old||`` over every cluster of every group is compared with ``tol`` (one decision
    for the whole batch, a device-to-host read per iteration as in SVG2):

    * below ``tol``: stop, and return the centroids *before* this update (those the labels were assigned
      to; SVG2 does not adopt the last, sub-``tol`` update);
    * otherwise adopt the update; after ``iters`` iterations the updated centroids are returned, so the
      labels and sizes belong to the assignment one update earlier (SVG2's behaviour).

    ``sizes`` always count ``labels``. Distances and sums are float32 (SVG2's Triton kernels also accumulate
    in float32, from bf16 inputs).

    A token drawn twice at a cold start gives two identical centroids, an exact tie for every point near
    them. Here the lower index always wins (its twin stays empty until the two separate, if ever); SVG2's
    assignment kernel decides such ties by rounding differences between its tiles, so it may split those
    points between the twins, and a cold start can end with a partly different partition. Warm starts and
    cold starts without a repeated draw agree with SVG2's.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [groups, tokens, dim]; got {tuple(x.shape)}")
    G, N, D = x.shape
    K = int(num_clusters)
    if K < 1 or N < 1:
        raise ValueError(f"need at least one cluster and one token; got {K} clusters, {N} tokens")
    if iters < 1:
        raise ValueError(f"iters must be >= 1; got {iters}")
    if init is None:
        where = generator.device if generator is not None else x.device
        picks = torch.randint(0, N, (G, K), generator=generator, device=where).to(x.device)
        centroids = torch.gather(x, 1, picks.unsqueeze(-1).expand(G, K, D))
    else:
        if init.shape != (G, K, D):
            raise ValueError(f"init must be [{G}, {K}, {D}]; got {tuple(init.shape)}")
        centroids = init.to(x.dtype)
    xf = x.float()
    x_sq = xf.square().sum(-1)
    group_offset = (torch.arange(G, device=x.device) * K).unsqueeze(-1)
    ran = 0
    while ran < iters:
        ran += 1
        cf = centroids.float()
        labels = _nearest(xf, x_sq, cf)
        flat = (labels + group_offset).view(-1)
        sums = torch.zeros(G * K, D, dtype=torch.float32, device=x.device).index_add_(0, flat, xf.reshape(-1, D))
        sizes = torch.zeros(G * K, dtype=torch.int64, device=x.device).index_add_(
            0, flat, torch.ones_like(flat)).view(G, K)
        means = sums.view(G, K, D) / sizes.clamp(min=1).unsqueeze(-1)
        updated = torch.where((sizes > 0).unsqueeze(-1), means, cf).to(x.dtype)
        move = torch.linalg.vector_norm(updated.float() - cf, dim=-1).max()
        if move < tol:
            break
        centroids = updated
    return labels, centroids, sizes, ran


def _nearest(xf: torch.Tensor, x_sq: torch.Tensor, cf: torch.Tensor, budget: int = 1 << 25) -> torch.Tensor:
    """Index of the nearest centroid (float32 ``[G, N, D]`` points, ``[G, K, D]`` centroids), computed over
    slices of the points so that the ``[G, n, K]`` distance block stays under ``budget`` elements."""
    G, N, _ = xf.shape
    K = cf.shape[1]
    c_sq = cf.square().sum(-1).unsqueeze(1)  # [G, 1, K]
    rows = max(1, budget // max(1, G * K))
    out = []
    for start in range(0, N, rows):
        part = slice(start, min(N, start + rows))
        cross = torch.bmm(xf[:, part], cf.transpose(1, 2))
        dist = (x_sq[:, part].unsqueeze(-1) + c_sq - 2.0 * cross).clamp_(min=0.0)
        out.append(dist.argmin(-1))
    return torch.cat(out, 1) if len(out) > 1 else out[0]


# ---------------------------------------------------------------------------- block map


def svg2_select(cq: torch.Tensor, nq: torch.Tensor, ck: torch.Tensor, nk: torch.Tensor, scale: float,
                top_p: float, min_kc_ratio: float) -> torch.Tensor:
    """The (query cluster, key cluster) pairs SVG2 keeps: ``keep [G, Kq, Kk]`` bool.

    SVG2's ``identify_dynamic_map`` with its ``weighted_softmax`` (``svg/kmeans_utils.py``):

    * expected mass ``P[i, j] = n_j exp(s_ij) / sum_j' n_j' exp(s_ij')`` with ``s = scale x cq . ck`` and
      ``n_j`` the key-cluster sizes (an empty key cluster gets 0); SVG2's scale is ``1 / sqrt(head_dim)``,
      the attention's;
    * per query cluster, key clusters sorted by ``P`` (descending) and the running sum taken in that order;
      the cluster at rank ``r`` is kept when the running sum up to rank ``r - 1`` is at most ``top_p``. So
      the cluster that carries the sum past ``top_p`` is kept, and at a sum exactly equal to ``top_p`` the
      next one is kept too; rank 0 is always kept;
    * if ``min_kc_ratio > 0``: the first ``int(min_kc_ratio x Kk)`` ranks (a floor, over all ``Kk`` key
      clusters, empty ones included) are kept whatever their mass.

    Unlike SVG2, empty clusters are dropped from the result (an empty query cluster keeps nothing, an empty
    key cluster is never kept): SVG2 may mark them, but they hold no tokens, so execution and density are
    the same. Ties in ``P`` are ordered by index (a stable sort; SVG2's sort is not stable, which can only
    matter among exactly equal masses under the minimum count). Everything is float32.
    """
    G, Kq, _ = cq.shape
    Kk = ck.shape[1]
    scores = torch.einsum("gid,gjd->gij", cq.float(), ck.float()) * scale
    weights = nk.float().unsqueeze(1)
    mass = weights * torch.exp(scores - scores.amax(-1, keepdim=True))
    prob = mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)
    sorted_prob, order = torch.sort(prob, dim=-1, descending=True, stable=True)
    running = sorted_prob.cumsum(-1)
    # Running sum of the better-ranked clusters, taken from the inclusive sum shifted by one rank (the same
    # additions as SVG2's, so the comparison with top_p rounds alike).
    before = torch.cat([torch.zeros_like(running[..., :1]), running[..., :-1]], -1)
    keep_sorted = before <= top_p
    keep_sorted[..., 0] = True
    if min_kc_ratio > 0:
        keep_sorted[..., : int(min_kc_ratio * Kk)] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return keep & (nq > 0).unsqueeze(-1) & (nk > 0).unsqueeze(1)


def svg2_density(keep: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor) -> torch.Tensor:
    """``[G]`` the density SVG2 logs (``density_calculation``, ``svg/kmeans_utils.py``): per group, the token
    pairs of kept cluster pairs, ``sum_kept n_i n_j``, over all token pairs, ``sum_all n_i n_j`` (= N^2).
    Useful pairs only: the padding an execution adds is not counted. SVG2 logs every (batch, head) value
    and their mean."""
    pairs = nq.double().unsqueeze(-1) * nk.double().unsqueeze(1)
    return (pairs * keep).sum((-1, -2)) / pairs.sum((-1, -2)).clamp(min=1)


def svg2_reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_labels: torch.Tensor,
                             k_labels: torch.Tensor, keep: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Dense, masked float32 ground truth of SVG2's sparse attention: query ``i`` attends to key ``j`` when
    ``keep[q_labels[i], k_labels[j]]``. ``q, k, v``: ``[G, N, D]``; labels ``[G, N]``; ``keep [G, Kq, Kk]``.
    A query that keeps no key gets 0 (as SVG2's kernels write). Memory ``G x N^2``: for tests only."""
    G, N, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    g = torch.arange(G, device=q.device).view(G, 1, 1)
    allowed = keep[g, q_labels.unsqueeze(-1), k_labels.unsqueeze(1)]  # [G, N, N]
    logits = torch.einsum("gid,gjd->gij", q.float(), k.float()) * scale
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return torch.einsum("gij,gjd->gid", weights, v.float()).to(q.dtype)


# ---------------------------------------------------------------------------- attention module


class SVG2Attention(_ClusteredSparseAttention):
    """SVG2 as a stateful attention module: ``attn(q, k, v, grid=(F, H, W))``, one module per layer (and per
    guidance branch in our pipelines; see the notes on state below).

    State, as SVG2's attention processor keeps it (``WanAttn_SAPAttn_Processor``, ``svg/models/wan/attention.py``):
    the first call clusters cold (``config.iters`` iterations from random tokens), every later call warm
    (``config.warm_iters`` iterations from the centroids the previous call returned). A call whose shape
    differs from the cached one (other batch, heads, tokens or cluster counts) starts cold again; SVG2 has
    no such case (one resolution per run). :meth:`reset` forgets the centroids (SVG2 never does: a second
    video in the same process warm-starts from the first one's last centroids). SVG2 keeps one cache per
    layer, and runs classifier-free guidance as two batch-1 passes through it (it asserts batch 1), so its
    conditional and unconditional passes warm-start from each other's centroids; our pipelines give each
    guidance branch its own module, hence its own cache.

    Of ``_ClusteredSparseAttention``'s steps it replaces ``_cluster`` (SVG2's k-means) and ``_select`` (SVG2's
    block map), and always takes the key-list layout (one padded list per query cluster,
    :mod:`kinegen.sparse_attn.varlen`; executed work counted as that layout executes it).
    """

    def __init__(self, config: SVG2Config | None = None):
        super().__init__(config or SVG2Config())
        self._gen = torch.Generator().manual_seed(self.config.seed)

    # -- clustering (SVG2's kmeans_init / kmeans_step)

    def _cluster(self, q, k, grid):
        cfg = self.config
        Bb, H, N, D = q.shape
        kq, kk = cfg.num_clusters(N)
        warm = (self.q_state is not None and self.q_state.labels.shape == q.shape[:3]
                and self.q_state.centroids.shape[2] == kq and self.k_state.centroids.shape[2] == kk)
        iters = cfg.warm_iters if warm else cfg.iters
        states, evals, runs = [], 0, []
        for x, count, old in ((q, kq, self.q_state), (k, kk, self.k_state)):
            init = old.centroids.reshape(Bb * H, count, D) if warm else None
            labels, centroids, sizes, ran = svg2_kmeans(x.reshape(Bb * H, N, D), count, iters, init=init,
                                                        generator=self._gen, tol=cfg.tol)
            states.append(ClusterState(centroids.view(Bb, H, count, D), labels.view(Bb, H, N),
                                       x.new_zeros(0),  # (margins: unused by SVG2)
                                       sizes.view(Bb, H, count)))
            evals += ran * Bb * H * N * count
            runs.append(ran)
        return states[0], states[1], {"anchor": not warm, "distance_evals": evals, "kmeans_iters": tuple(runs)}

    # -- the hooks of _ClusteredSparseAttention.forward

    def _select(self, cq, nq, ck, nk, scale):
        return svg2_select(cq, nq, ck, nk, scale, self.config.top_p, self.config.min_kc_ratio)

    @property
    def _lists(self) -> bool:
        """Always one key list per query cluster (the base class's key-list layout, stats and execution)."""
        return True
