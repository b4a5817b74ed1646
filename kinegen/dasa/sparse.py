"""Block-sparse attention for static queries (reference note, section 4.2, option 2), on the executors of
:mod:`kinegen.sparse_attn`.

Static queries attend to their neighbourhood only: the keys within ``radius`` regions (squares of ``region`` x
``region`` tokens) of their own region, in every cached frame and in the chunk (which includes their place in every
anchor frame), plus every token of the sink frames; dynamic queries attend to the whole compressed history. Tokens
are grouped by label (queries: their region when static, one "dynamic" group otherwise; keys: their region, one
"sink" group for sink frames) with :func:`~kinegen.sparse_attn.blocks.permutation` (each group padded to whole
tiles), the pairs of groups become a tile layout (:func:`~kinegen.sparse_attn.blocks.tile_mask`,
:func:`~kinegen.sparse_attn.block_sparse.layout_from_tile_mask`), and one
:func:`~kinegen.sparse_attn.block_sparse.block_sparse_attention` call runs it (FlexAttention, Triton or the masked
reference).

The executors take no score bias, so the cache's per-token bias rides along as one more head dimension: queries get
a 1, keys ``bias / scale``, values a 0, and ``scale * q'.k' = scale * q.k + bias`` exactly (a head of 128 then pads
to 256 in the Triton kernel; a FlexAttention ``score_mod`` would avoid that).
"""

from __future__ import annotations

import dataclasses

import torch

from ..sparse_attn.block_sparse import BlockLayout, block_sparse_attention, layout_from_tile_mask
from ..sparse_attn.blocks import Permutation, permutation, tile_mask


@dataclasses.dataclass
class SparsePlan:
    """One forward's layout, shared by every layer (their caches hold the same tokens)."""

    queries: Permutation
    keys: Permutation
    layout: BlockLayout
    static_queries: int

    def density(self) -> float:
        return self.layout.density()


def region_of(places: torch.Tensor, width: int, region: int, regions_w: int) -> torch.Tensor:
    """Place in a frame (``h * width + w``) -> its region's index (row-major over the region grid)."""
    return (places // width // region) * regions_w + (places % width) // region


def sparse_plan(grid: tuple[int, int, int], static: torch.Tensor, cache_frames: torch.Tensor | None,
                cache_places: torch.Tensor | None, sink_frames: list[int], region: int, radius: int,
                tile: int) -> SparsePlan:
    """The layout of one forward.

    Args:
        grid: the chunk's token grid (frames, height, width).
        static: ``[height * width]`` bool, the static places (the same in every frame of the chunk).
        cache_frames / cache_places: per cached token its own frame and place (None: nothing cached).
        sink_frames: the cache's sink frames (every static query sees them).
    """
    f, h, w = grid
    dev = static.device
    rh, rw = -(-h // region), -(-w // region)
    n_regions = rh * rw
    places = torch.arange(h * w, device=dev)
    chunk_regions = region_of(places, w, region, rw).repeat(f)
    q_labels = torch.where(static.repeat(f), chunk_regions, n_regions)  # n_regions: the dynamic group
    k_labels = chunk_regions
    if cache_frames is not None:
        sinks = torch.tensor(sink_frames, device=dev, dtype=cache_frames.dtype)
        cached = torch.where(torch.isin(cache_frames, sinks), n_regions,
                             region_of(cache_places.to(dev), w, region, rw))  # n_regions: the sink group
        k_labels = torch.cat([cached.to(dev), k_labels])
    r = torch.arange(n_regions, device=dev)
    near = (((r[:, None] // rw) - (r[None, :] // rw)).abs() <= radius) & \
        (((r[:, None] % rw) - (r[None, :] % rw)).abs() <= radius)
    keep = torch.ones(n_regions + 1, n_regions + 1, dtype=torch.bool, device=dev)  # the dynamic row sees all
    keep[:n_regions, :n_regions] = near  # static rows: nearby regions and the sink column
    pq = permutation(q_labels[None], n_regions + 1, tile)
    pk = permutation(k_labels[None], n_regions + 1, tile)
    mask = tile_mask(keep[None], pq, pk)[:, None]  # [1, 1, QT, KT]
    layout = layout_from_tile_mask(mask, tile, (pk.slot_token >= 0)[:, None])
    return SparsePlan(pq, pk, layout, int(static.sum()) * f)


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
                     plan: SparsePlan, backend: str) -> torch.Tensor:
    """``q`` ``[B, N, heads, D]`` against ``keys``/``values`` ``[B, S, heads, D]`` (the cache's, then the chunk's)
    with the additive per-key ``bias`` ``[S]`` (or None) -> ``[B, heads, N, D]``, as SDPA returns it."""
    b, _, heads, d = q.shape
    scale = d ** -0.5
    if bias is not None:
        q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)
        keys = torch.cat([keys, (bias / scale).to(keys.dtype).view(1, -1, 1, 1).expand(b, -1, heads, 1)], dim=-1)
        values = torch.cat([values, values.new_zeros(*values.shape[:-1], 1)], dim=-1)
    qs, ks = plan.queries.slot_token[0].clamp(min=0), plan.keys.slot_token[0].clamp(min=0)
    qp, kp, vp = (t.index_select(1, i).transpose(1, 2) for t, i in ((q, qs), (keys, ks), (values, ks)))
    lay = plan.layout
    layout = BlockLayout(lay.tile, lay.kv_num_blocks.expand(b, heads, -1).contiguous(),
                         lay.kv_indices.expand(b, heads, -1, -1).contiguous(),
                         lay.key_valid.expand(b, heads, -1).contiguous())
    out = block_sparse_attention(qp.contiguous(), kp.contiguous(), vp.contiguous(), layout, backend=backend,
                                 scale=scale)
    return out[..., :d].index_select(2, plan.queries.token_slot[0])
