"""HyperVAttention (HVA) and the SVG2-style baseline as standalone, stateful attention modules.

    attn = HVAttention(HVAConfig(density=0.25))
    out = attn(q, k, v, grid=(F, H, W))      # q, k, v: [batch, heads, tokens, head_dim], raster order
    attn.last_stats                          # density, tile_efficiency, clustering_s, merging_s, ...

One call = one attention layer at one denoising step. The module keeps the clustering state between
calls (per batch element and head; one module per layer and guidance branch in a pipeline), so the
hybrid schedule works: full 3D local-window clustering at anchor calls, a partial re-assignment
between them (:mod:`kinegen.sparse_attn.clustering`). Then clusters are merged into fuller tiles,
(query cluster, key cluster) pairs are selected, tokens are permuted by cluster and the attention runs
block-sparse (:mod:`kinegen.sparse_attn.blocks`, :mod:`kinegen.sparse_attn.block_sparse`).

``KMeansSparseAttention`` is the SVG2-style baseline with the same call: global k-means on queries and
keys (warm-started after the first call), no merging, centroid top-p (or the same density budget), the
same permutation and execution, so that the two are compared on equal terms.

Extra tokens that are not on the grid (text tokens in joint attention) are passed as
``text_tokens=n`` with ``text_position="end"`` (HunyuanVideo) or ``"start"`` (CogVideoX): they are one
extra key cluster every query attends to, and their own queries attend to every key (SVG2's treatment).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import torch

from . import blocks as B
from .block_sparse import BACKENDS
from .clustering import ClusterState, global_kmeans, local_kmeans, refine

# Video tokens per call below which pipelines run dense (see HVAConfig.min_tokens): above the bundled model's sizes
# (at most 8,640 tokens, where HVA gained 1.15x on two CPU cores but the prompt was at risk), below 15,360 tokens
# (1.29x). docs/sparse_attention.md, "Small grids run dense".
MIN_TOKENS = 12288


@dataclasses.dataclass
class HVAConfig:
    """HyperVAttention settings (our defaults; the paper's are not public, see docs/sparse_attention.md).

    Attributes:
        top_p: every query cluster keeps its best key clusters until they hold this share of its expected
            attention mass (the default rule; ``None`` to select by ``density`` alone).
        density: a cap on the executed work as a share of dense (padding included); ``None`` (default): no
            cap. With both, the tighter binds (``selection`` says how the budget is spent).
        selection: how a ``density`` budget is spent: ``coverage`` (default: the top-p rule with the largest
            ``p`` whose work fits, one ``p`` for all heads) or ``greedy`` (by expected mass per unit of work
            over all pairs, the ``top_p`` pairs first). Measured: benchmarks/sparse_attention.md.
        min_keys: key clusters every query cluster keeps, whatever the budget.
        min_key_share: and at least this share of the (non-empty) key clusters (SVG2's ``min_kc_ratio``
            floor, 0.1 there; 0.15 here).
        q_window / k_window: 3D window ``(frames, rows, cols)`` of the query / key clustering (one window
            holds ``per_window`` centroids at the start). Queries: 2x8x8 (two tiles of 64 rows). Keys,
            ``None`` (default): by layout, 1x8x8 (one tile) for ``tiles``, 1x4x4 for ``lists``, where a key
            cluster costs its tokens rather than whole tiles and finer clusters select more precisely.
        lead_frames: latent frames at the start clustered in windows of their own (one frame deep) instead
            of sharing the first window with the frames after them; it changes the query windows (the key
            windows are one frame deep by default, where it changes nothing). Wan's causal
            VAE codes the first video frame alone into the first latent frame, so its tokens differ from
            the next frame's; measured in benchmarks/sparse_attention.md.
        per_window: centroids per window.
        iters: Lloyd iterations at anchor calls.
        anchor_every: full clustering every this many calls (the first call is always an anchor).
        reassign: share of tokens re-assigned at calls between anchors.
        tile: tile rows (64 or 128 on GPUs; 64 default).
        merge: hardware-aware merging of clusters into fuller tiles; ``merge_tau`` bounds how much
            within-cluster error a merge may add (in units of the clustering's mean squared error).
        layout: how the kept pairs execute: ``tiles`` (each cluster padded to whole tiles on both sides, the
            kept (query tile, key tile) pairs run block-sparse; :mod:`~kinegen.sparse_attn.block_sparse`),
            ``lists`` (each query cluster's kept keys gathered into one list, padded once, SVG2's layout;
            :mod:`~kinegen.sparse_attn.varlen`) or ``auto``: ``lists`` on CPU (at equal error 2.2x faster
            than tiles on the bundled model's q, k, v at 8,640 tokens, benchmarks/sparse_attention.md),
            ``tiles`` on CUDA (the list kernel has not been measured on a GPU yet), or whichever the
            ``backend`` names. ``density`` counts executed work the way the layout executes it.
        backend: execution: ``auto`` (Triton on CUDA; FlexAttention for tiles and batched SDPA over gathered
            keys for lists on CPU), ``triton``, ``flex``, ``dense`` (tiles: the masked reference) or ``gather``
            / ``reference`` (lists).
        kernel: clustering kernel: ``auto`` (Triton on CUDA, torch elsewhere), ``torch`` or ``triton``.
        compile: run cluster merging through ``torch.compile`` (on a GPU this fuses its few hundred small
            operations per call into a few kernels; compiles once per shape, so past torch's recompile
            limit of distinct shapes, 8 by default, it runs eagerly).
        dense_warmup: in pipelines, the share of denoising steps (the first ones) run with dense attention.
        dense_layers: in pipelines, leading transformer layers that stay dense.
        min_tokens: in pipelines, calls with fewer video tokens run dense, and the stats warn (0: always sparse).
            Below it HVA gains little (clustering, layout and the sparse executor cost most of what the skipped
            attention saves: at most 1.15x on two CPU cores at the bundled model's sizes) while the prompt is at
            risk (docs/sparse_attention.md, "Small grids run dense").
    """

    top_p: float | None = 0.7
    density: float | None = None
    selection: str = "coverage"
    min_keys: int = 1
    min_key_share: float = 0.15
    q_window: tuple[int, int, int] = (2, 8, 8)
    k_window: tuple[int, int, int] | None = None
    lead_frames: int = 0
    per_window: int = 1
    iters: int = 3
    anchor_every: int = 5
    reassign: float = 0.25
    tile: int = 64
    layout: str = "auto"
    merge: bool = True
    merge_tau: float = 1.0
    merge_rounds: int = 8
    backend: str = "auto"
    kernel: str = "auto"
    compile: bool = False
    dense_warmup: float = 0.2
    dense_layers: int = 1
    min_tokens: int = MIN_TOKENS

    def __post_init__(self):
        _check_budget(self.density, self.top_p, self.min_keys)
        _check_dense(self.dense_warmup, self.dense_layers, self.min_tokens)
        if not 0 <= self.min_key_share <= 1:
            raise ValueError(f"min_key_share must be in [0, 1] (a share of the key clusters); got {self.min_key_share}")
        for name in ("q_window", "k_window"):
            if getattr(self, name) is None and name == "k_window":
                continue
            w = tuple(int(x) for x in getattr(self, name))
            if len(w) != 3 or min(w) < 1:
                raise ValueError(f"{name} must be three positive integers (frames, rows, cols); got {w}")
            setattr(self, name, w)
        if self.selection not in B.SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(B.SELECTIONS)}; got {self.selection!r}")
        if self.lead_frames < 0:
            raise ValueError(f"lead_frames must be 0 or more (latent frames in query windows of their own); "
                             f"got {self.lead_frames}")
        if self.per_window < 1 or self.iters < 1 or self.anchor_every < 1 or self.tile < 1:
            raise ValueError("per_window, iters, anchor_every and tile must be at least 1")
        if not 0 < self.reassign <= 1:
            raise ValueError(f"reassign must be in (0, 1]; got {self.reassign}")
        _check_backend(self.backend, self.layout)
        if self.kernel not in ("auto", "torch", "triton"):
            raise ValueError(f"kernel must be auto, torch or triton; got {self.kernel!r}")


@dataclasses.dataclass
class KMeansSparseConfig:
    """SVG2-style baseline: global k-means with ``q_clusters`` / ``k_clusters`` centroids per head,
    ``iters`` Lloyd iterations on the first call and ``warm_iters`` warm-started ones after; ``min_tokens`` as
    in :class:`HVAConfig`."""

    density: float | None = None
    top_p: float | None = 0.9
    min_keys: int = 1
    q_clusters: int = 64
    k_clusters: int = 256
    iters: int = 10
    warm_iters: int = 2
    tile: int = 64
    backend: str = "auto"
    seed: int = 0
    dense_warmup: float = 0.2
    dense_layers: int = 1
    min_tokens: int = MIN_TOKENS

    def __post_init__(self):
        _check_budget(self.density, self.top_p, self.min_keys)
        _check_dense(self.dense_warmup, self.dense_layers, self.min_tokens)
        _check_backend(self.backend)
        if min(self.q_clusters, self.k_clusters, self.iters, self.warm_iters, self.tile) < 1:
            raise ValueError("cluster counts, iterations and tile must be at least 1")


def _backends(layout: str) -> list[str]:
    from .varlen import BACKENDS as LIST_BACKENDS

    if layout == "tiles":
        return list(BACKENDS)
    if layout == "lists":
        return list(LIST_BACKENDS)
    return list(dict.fromkeys([*BACKENDS, *LIST_BACKENDS]))


def _check_backend(backend: str, layout: str = "tiles") -> None:
    """Fail when the config is built, not at the first sparse call after the dense warm-up."""
    if layout not in ("auto", "tiles", "lists"):
        raise ValueError(f"layout must be auto, tiles or lists; got {layout!r}")
    if backend != "auto" and backend not in _backends(layout):
        raise ValueError(f"backend must be one of auto, {', '.join(_backends(layout))} (layout={layout}); "
                         f"got {backend!r}")


def resolve_layout(layout: str, backend: str, device_type: str) -> str:
    """``tiles`` or ``lists`` for ``layout=auto``: the one the backend names, else lists on CPU, tiles on CUDA."""
    if layout != "auto":
        return layout
    if backend != "auto" and backend not in _backends("lists"):  # dense
        return "tiles"
    if backend != "auto" and backend not in _backends("tiles"):  # gather, reference
        return "lists"
    return "tiles" if device_type == "cuda" else "lists"


def _check_budget(density, top_p, min_keys):
    if density is None and top_p is None:
        raise ValueError("set density (share of dense work) or top_p (expected attention mass), or both")
    if density is not None and not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1]; got {density}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1]; got {top_p}")
    if min_keys < 1:
        raise ValueError(f"min_keys must be at least 1; got {min_keys}")


def _check_dense(warmup, layers, min_tokens=0):
    if not 0 <= warmup < 1:
        raise ValueError(f"dense_warmup must be in [0, 1); got {warmup}")
    if layers < 0:
        raise ValueError(f"dense_layers must be >= 0; got {layers}")
    if min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0 (0: sparse at every size); got {min_tokens}")


class _Timer:
    """Stage times of one call without stalling a GPU: CUDA events, read only when the stats are read
    (``time.perf_counter`` on the CPU)."""

    def __init__(self, x: torch.Tensor):
        self.cuda = x.is_cuda
        self.device = x.device
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks[:-1], self.marks[1:], strict=True)]
        return [b - a for a, b in zip(self.marks[:-1], self.marks[1:], strict=True)]


@functools.cache
def _compiled(fn):
    """``torch.compile(fn)`` with static shapes, built once per function and process."""
    return torch.compile(fn, dynamic=False)


def _host_value(key: str, value):
    """A stats entry as a Python number (0-d tensors are read here, once, when the stats are asked for)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    return int(value) if key in ("distance_evals", "q_clusters", "k_clusters") else value


class _ClusteredSparseAttention(torch.nn.Module):
    """What both methods share: clusters -> (merge) -> selection -> permutation -> block-sparse -> unpermute."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.calls = 0
        self.q_state: ClusterState | None = None
        self.k_state: ClusterState | None = None
        self._stats: dict[str, Any] = {}
        self._pending: tuple[dict[str, Any], _Timer] | None = None
        self._device_type = "cpu"  # of the current call (layout=auto resolves by it)

    @property
    def last_stats(self) -> dict[str, Any]:
        """The last call's statistics: ``density`` (executed share of dense work, padding included),
        ``useful_density``, ``tile_efficiency``, ``clustering_s`` (the q and k clusterings), ``merging_s``
        (hardware-aware merging; 0 without it), ``layout_s``, ``attention_s``,
        ``distance_evals``, ``anchor``, ``q_clusters``, ``k_clusters``, ``block_pattern`` (the first
        head's tile mask), ``call``. Computed on the device during the call and read here, so that a
        GPU is not stalled at every layer (reading them waits for the call to finish)."""
        if self._pending is not None:
            raw, timer = self._pending
            self._pending = None
            clustering_s, merging_s, layout_s, attention_s = timer.seconds()
            self._stats = {**{k: _host_value(k, v) for k, v in raw.items()}, "clustering_s": clustering_s,
                           "merging_s": merging_s, "layout_s": layout_s, "attention_s": attention_s}
        return self._stats

    def reset(self) -> None:
        """Forget the clustering state (a new generation)."""
        self.calls = 0
        self.q_state = self.k_state = None

    def _cluster(self, q, k, grid) -> tuple[ClusterState, ClusterState, dict[str, Any]]:
        raise NotImplementedError

    @staticmethod
    def _flat(x, state: ClusterState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Labels ``[G, N]``, centroids ``[G, K, D]`` and sizes ``[G, K]`` (G = batch x heads)."""
        Bb, H, N, D = x.shape
        return (state.labels.reshape(Bb * H, N), state.centroids.reshape(Bb * H, -1, D),
                state.sizes.reshape(Bb * H, -1).long())

    def _merge(self, q, q_state: ClusterState, k, k_state: ClusterState):
        """The clusters the layout is built from, ``(labels, centroids, sizes)`` per side (none merged here)."""
        return self._flat(q, q_state), self._flat(k, k_state)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int, int], *,
                scale: float | None = None, text_tokens: int = 0, text_position: str = "end",
                key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Sparse attention over ``q, k, v`` ``[batch, heads, tokens, head_dim]``.

        ``key_valid`` (``[batch, tokens]`` bool) marks padded text keys to ignore (HunyuanVideo's prompt
        padding); video keys are always attended to as the selection decides.
        """
        if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
            raise ValueError(f"q, k, v must all be [batch, heads, tokens, head_dim]; got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        n_video = math.prod(grid)
        if q.shape[2] != n_video + text_tokens:
            raise ValueError(f"grid {tuple(grid)} has {n_video} tokens (+ {text_tokens} text) but q has "
                             f"{q.shape[2]}; video tokens must be in raster (frame, row, column) order.")
        if text_position not in ("start", "end"):
            raise ValueError(f"text_position must be 'start' or 'end'; got {text_position!r}")
        cfg = self.config
        Bb, H, N, D = q.shape
        G = Bb * H
        scale = D ** -0.5 if scale is None else scale
        vid = slice(text_tokens, N) if text_position == "start" else slice(0, n_video)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # once (attention processors pass views)
        self._device_type = q.device.type
        qv, kv_ = q[:, :, vid], k[:, :, vid]
        timer = _Timer(q)
        timer.mark()
        qs, ks, info = self._cluster(qv, kv_, tuple(grid))
        self.q_state, self.k_state = qs, ks
        timer.mark()
        (lq, cq, nq), (lk, ck, nk) = self._merge(qv, qs, kv_, ks)
        timer.mark()
        keep = self._select(cq, nq, ck, nk, scale)
        stats = self._work_stats(keep, nq, nk, n_video)
        if text_tokens:  # one extra cluster on each side: text keys for every query, every key for text queries
            text_valid = None
            if key_valid is not None:
                tv = key_valid[:, : text_tokens] if text_position == "start" else key_valid[:, n_video:]
                text_valid = tv.to(torch.bool).repeat_interleave(H, 0)  # [G, n_text]
            lq, lk, keep, nq, nk = _add_text_cluster(lq, lk, keep, nq, nk, text_tokens, text_valid)
        layout = self._layout(lq, lk, keep, nq, nk, cfg.backend)
        qo = q if not text_tokens else torch.cat([q[:, :, vid], _text(q, vid, text_position)], 2)
        ko = k if not text_tokens else torch.cat([k[:, :, vid], _text(k, vid, text_position)], 2)
        vo = v if not text_tokens else torch.cat([v[:, :, vid], _text(v, vid, text_position)], 2)
        timer.mark()
        out = self._attend(qo.reshape(G, N, D), ko.reshape(G, N, D), vo.reshape(G, N, D), layout, cfg.backend,
                           scale).view(Bb, H, N, D)
        timer.mark()
        if text_tokens and text_position == "start":  # back from [video, text] to [text, video]
            out = torch.cat([out[:, :, n_video:], out[:, :, :n_video]], 2)
        self.calls += 1
        self._pending = ({**stats, **info, "q_clusters": (nq > 0).sum(-1).float().mean(),
                          "k_clusters": (nk > 0).sum(-1).float().mean(), "tile": cfg.tile,
                          "block_pattern": self._pattern(keep, layout), "call": self.calls}, timer)
        return out

    # ---- the steps a method may replace (defaults: HVA's tile layout, B.select_blocks)

    def _select(self, cq, nq, ck, nk, scale: float) -> torch.Tensor:
        """Kept (query cluster, key cluster) pairs ``[G, Kq, Kk]`` bool, from centroids and sizes (video only)."""
        cfg = self.config
        P = B.cluster_scores(cq, nq, ck, nk, scale)
        return B.select_blocks(P, nq, nk, cfg.tile, density=cfg.density, top_p=cfg.top_p, min_keys=cfg.min_keys,
                               min_key_share=getattr(cfg, "min_key_share", 0.0), key_unit=1 if self._lists else None,
                               selection=getattr(cfg, "selection", "greedy"))

    @property
    def _lists(self) -> bool:
        """This call executes by key lists (:mod:`~kinegen.sparse_attn.varlen`), not tiles."""
        cfg = self.config
        return resolve_layout(getattr(cfg, "layout", "tiles"), cfg.backend, self._device_type) == "lists"

    @property
    def _block(self) -> int:
        """Key-list padding unit: the config's ``block`` where it has one, else the tile."""
        return getattr(self.config, "block", self.config.tile)

    def _work_stats(self, keep, nq, nk, n_tokens: int) -> dict[str, Any]:
        """``density``, ``useful_density``, ``tile_efficiency`` of the video clusters (0-d device tensors),
        executed work counted as the layout executes it (padding included)."""
        if not self._lists:
            return B.work_stats(keep, nq, nk, self.config.tile, n_tokens)
        from .varlen import key_list_work

        G = keep.shape[0]
        useful = (keep * (nq.unsqueeze(-1) * nk.unsqueeze(1)).float()).sum() / (G * n_tokens ** 2)
        executed = key_list_work(keep, nq, nk, self.config.tile, self._block).sum().float() / (G * n_tokens ** 2)
        return {"density": executed, "useful_density": useful, "tile_efficiency": useful / executed.clamp(min=1e-12)}

    def _layout(self, lq, lk, keep, nq, nk, backend: str):
        """The execution layout from labels ``[G, N]`` and ``keep`` (text clusters included)."""
        from .block_sparse import layout_from_tile_mask

        cfg = self.config
        if self._lists:
            from .varlen import key_lists

            return key_lists(lq, lk, keep, cfg.tile, self._block)
        G, N = lq.shape
        Kq, Kk = keep.shape[1], keep.shape[2]
        # The one value read back from the device in a call: the padded length (a bound known on the host
        # would be up to 3x longer, and every layout step scales with it).
        needed = cfg.tile * int(torch.maximum(B.num_tiles(nq, cfg.tile).sum(-1).max(),
                                              B.num_tiles(nk, cfg.tile).sum(-1).max()))
        backend = _tile_backend(backend, lq)
        L = _padded_length(needed, N, cfg.tile) if backend == "flex" else needed
        pq = B.permutation(lq, Kq, cfg.tile, L)
        pk = B.permutation(lk, Kk, cfg.tile, L)
        mask = B.tile_mask(keep, pq, pk)
        layout = layout_from_tile_mask(mask.view(1, G, L // cfg.tile, L // cfg.tile), cfg.tile,
                                       (pk.slot_token >= 0).view(1, G, L))
        return _TileLayout(pq, pk, mask, layout)

    def _attend(self, q, k, v, layout, backend: str, scale: float) -> torch.Tensor:
        """``q, k, v`` ``[G, N, D]`` (video tokens first) -> ``[G, N, D]`` in the same order."""
        from .block_sparse import block_sparse_attention

        if self._lists:
            from .varlen import varlen_attention

            return varlen_attention(q, k, v, layout, backend=backend, scale=scale)
        G, N, D = q.shape
        L = layout.pq.length
        qp, kp, vp = (B.gather_slots(x, p.slot_token).view(1, G, L, D)
                      for x, p in ((q, layout.pq), (k, layout.pk), (v, layout.pk)))
        op = block_sparse_attention(qp, kp, vp, layout.blocks, backend=_tile_backend(backend, q), scale=scale)
        return B.scatter_slots(op.view(G, L, D), layout.pq.token_slot)

    def _pattern(self, keep, layout) -> torch.Tensor:
        """The first head's pattern for the stats (``block_pattern``): its tile mask, or with key lists
        (no tile mask) its cluster-level map."""
        return keep[0] if self._lists else layout.mask[0]


@dataclasses.dataclass
class _TileLayout:
    pq: B.Permutation
    pk: B.Permutation
    mask: torch.Tensor  # [G, QT, KT] bool
    blocks: Any  # block_sparse.BlockLayout


def _tile_backend(backend: str, x: torch.Tensor) -> str:
    return backend if backend != "auto" else ("triton" if x.is_cuda else "flex")


def _padded_length(needed: int, n_tokens: int, tile: int) -> int:
    """The permuted length for compiled FlexAttention, from a few fixed buckets (twice the tokens, then
    multiples): it compiles for a handful of shapes instead of a new one per call. Empty tiles past the
    clusters cost no attention work. (The Triton kernel takes any length: it gets exactly ``needed``.)"""
    unit = -(-n_tokens // tile) * tile
    return max(2, -(-needed // unit)) * unit


def _text(x, vid: slice, position: str) -> torch.Tensor:
    return x[:, :, : vid.start] if position == "start" else x[:, :, vid.stop:]


def _add_text_cluster(lq, lk, keep, nq, nk, n_text, text_valid=None):
    """Append the text tokens (placed after the video tokens) as cluster ``K`` on both sides; padded text
    keys (``text_valid`` False) go to a further key cluster that nothing attends to."""
    G, Kq, Kk = keep.shape
    text_q = torch.full((G, n_text), Kq, dtype=lq.dtype, device=lq.device)
    text_k = torch.full((G, n_text), Kk, dtype=lk.dtype, device=lk.device)
    if text_valid is not None:
        text_k = torch.where(text_valid, text_k, Kk + 1)
    lq, lk = torch.cat([lq, text_q], 1), torch.cat([lk, text_k], 1)
    keep = torch.nn.functional.pad(keep, (0, 2, 0, 1))
    keep[:, :, Kk] = True  # every query attends to the (valid) text keys
    keep[:, Kq, : Kk + 1] = True  # text queries attend to every valid key
    nq = torch.cat([nq, torch.full((G, 1), n_text, dtype=nq.dtype, device=nq.device)], 1)
    n_valid = (text_valid.sum(1, keepdim=True) if text_valid is not None else
               torch.full((G, 1), n_text, dtype=nk.dtype, device=nk.device))
    nk = torch.cat([nk, n_valid.to(nk), (n_text - n_valid).to(nk)], 1)
    keep &= (nq > 0).unsqueeze(-1) & (nk > 0).unsqueeze(1)
    return lq, lk, keep, nq, nk


class HVAttention(_ClusteredSparseAttention):
    """HyperVAttention: 3D local-window clustering with a hybrid schedule, hardware-aware merging,
    block selection, block-sparse execution. ``attn(q, k, v, grid=(F, H, W))``."""

    def __init__(self, config: HVAConfig | None = None):
        super().__init__(config or HVAConfig())

    def _kernels(self, x):
        """(assign, update) functions: the Triton kernels, or None for the torch reference."""
        kernel = self.config.kernel
        if kernel == "triton" or (kernel == "auto" and x.is_cuda):
            from .kernels import assign_local_triton, update_centroids_triton

            return assign_local_triton, update_centroids_triton
        return None, None

    @property
    def k_window(self) -> tuple[int, int, int]:
        """The key window of this call: the config's, or by layout (``k_window=None``)."""
        if self.config.k_window is not None:
            return self.config.k_window
        return (1, 4, 4) if self._lists else (1, 8, 8)

    def _cluster(self, q, k, grid):
        cfg = self.config
        anchor = self.q_state is None or self.calls % cfg.anchor_every == 0
        if self.q_state is not None and self.q_state.labels.shape != q.shape[:3]:
            anchor = True  # a new size or batch: start over
        fa, fu = self._kernels(q)
        k_window = self.k_window
        if anchor:
            qs, eq = local_kmeans(q, grid, cfg.q_window, cfg.per_window, cfg.iters, fa, fu, cfg.lead_frames)
            ks, ek = local_kmeans(k, grid, k_window, cfg.per_window, cfg.iters, fa, fu, cfg.lead_frames)
        else:
            qs, eq = refine(q, self.q_state, grid, cfg.q_window, cfg.per_window, cfg.reassign, fa, fu,
                            cfg.lead_frames)
            ks, ek = refine(k, self.k_state, grid, k_window, cfg.per_window, cfg.reassign, fa, fu, cfg.lead_frames)
        return qs, ks, {"anchor": anchor, "distance_evals": eq + ek}

    def _merge(self, q, q_state, k, k_state):
        """Merge every call: re-merging the refined clusters keeps tiles full (reusing the anchor's merge
        between anchors let tile efficiency fall from 0.89 to 0.81 and the error rise, benchmarks/).

        The tile layout pads every cluster to whole tiles on both sides, so queries and keys are merged,
        in one call stacked along the group axis (half the operations). Key lists pad once per query
        cluster's list, not per key cluster: merging keys would save no work and coarsen the selection, so
        with ``layout=lists`` only the queries are merged."""
        sides = [self._flat(q, q_state), self._flat(k, k_state)]
        if not self.config.merge:
            return sides
        if self._lists:
            return [*self._merge_sides([q], sides[:1]), sides[1]]
        return self._merge_sides([q, k], sides)

    def _merge_sides(self, xs, sides):
        """:func:`B.merge_clusters` on each side's ``(labels, centroids, sizes)``, all sides stacked.

        All of it works on the K clusters, not the N tokens: the state's centroids are the means of their
        tokens, so the clustering's squared error is ``sum ||x||^2 - sum_k n_k ||c_k||^2`` and a merged
        cluster's centroid is the size-weighted mean of its parts."""
        G = sides[0][0].shape[0]
        K = max(c.shape[1] for _, c, _ in sides)
        cents, sizes, mses = [], [], []
        for x, (_, centroids, n) in zip(xs, sides, strict=True):
            c, nf = centroids.float(), n.float()
            sum_x2 = torch.linalg.vector_norm(x.reshape(G, -1), dim=-1, dtype=torch.float32).square()
            sse = sum_x2 - (nf * c.square().sum(-1)).sum(-1)
            mses.append(sse.clamp(min=0) / x.shape[2])
            cents.append(torch.nn.functional.pad(c, (0, 0, 0, K - c.shape[1])))  # empty clusters never merge
            sizes.append(torch.nn.functional.pad(n, (0, K - c.shape[1])))
        merge = _compiled(B.merge_clusters) if self.config.compile else B.merge_clusters
        root = merge(torch.cat(cents), torch.cat(sizes), self.config.tile, torch.cat(mses), self.config.merge_tau,
                     self.config.merge_rounds)
        out = []
        for (labels, centroids, n), r in zip(sides, root.split(G), strict=True):
            r = r[:, : centroids.shape[1]]
            merged_n = torch.zeros_like(n).scatter_add_(1, r, n)
            sums = torch.zeros_like(centroids, dtype=torch.float32).scatter_add_(
                1, r.unsqueeze(-1).expand(-1, -1, centroids.shape[-1]), centroids.float() * n.unsqueeze(-1))
            merged_c = torch.where(merged_n.unsqueeze(-1) > 0, sums / merged_n.clamp(min=1).unsqueeze(-1),
                                   centroids.float()).to(centroids.dtype)
            out.append((torch.gather(r, 1, labels), merged_c, merged_n))
        return out


class KMeansSparseAttention(_ClusteredSparseAttention):
    """SVG2-style baseline: global k-means on queries and keys, centroid top-p, the same execution."""

    def __init__(self, config: KMeansSparseConfig | None = None):
        super().__init__(config or KMeansSparseConfig())
        self._gen = torch.Generator().manual_seed(self.config.seed)

    def _cluster(self, q, k, grid):
        cfg = self.config
        warm = self.q_state is not None and self.q_state.labels.shape == q.shape[:3]
        qs, eq = global_kmeans(q, cfg.q_clusters, cfg.warm_iters if warm else cfg.iters,
                               self.q_state.centroids if warm else None, self._gen)
        ks, ek = global_kmeans(k, cfg.k_clusters, cfg.warm_iters if warm else cfg.iters,
                               self.k_state.centroids if warm else None, self._gen)
        return qs, ks, {"anchor": not warm, "distance_evals": eq + ek}

