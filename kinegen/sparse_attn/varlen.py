"""Variable-length key-list attention: one padded key list per query cluster (SVG2's execution layout).

The tile layout of :mod:`kinegen.sparse_attn.block_sparse` pads every cluster, on both sides, to whole
tiles of ``T`` rows and executes each kept (query tile, key tile) pair, so a key cluster's partial last
tile is paid once for every query tile that keeps it. Here, as in Sparse VideoGen 2 (SVG2, which runs
FlashInfer's variable-block-sparse attention, ``VariableBlockSparseAttentionWrapper``), the keys a query
cluster keeps -- the tokens of every key cluster the selection keeps for it -- are gathered into **one
list**, padded once to a multiple of ``block`` key slots, and every query tile of that cluster walks that
list. Key padding is paid once per query cluster instead of once per (query tile, key cluster) pair.

:class:`KeyListLayout` (built by :func:`key_lists`):

* queries are permuted as before (:func:`kinegen.sparse_attn.blocks.permutation`): each query cluster
  contiguous and padded to whole tiles of ``tile`` rows (``q_slots`` / ``token_slot``, ``tile_list`` = the
  cluster of each query tile, -1 for trailing padding tiles);
* ``kv_index`` holds key token indices, the lists back to back (list ``i`` starts at ``list_start[i]``,
  has ``list_len[i]`` keys, in ascending key-cluster order, then -1 up to a multiple of ``block``).

**Executed work** (padding included) = for every non-empty query tile, ``tile`` rows x the padded length
of its list; executed density = ``executed_pairs / (G N^2)``. The tile layout's rule is kept tiles x
``T^2`` = sum over kept pairs ``ceil(n_i / T) T * ceil(n_j / T) T``; here it is sum over query clusters
``ceil(n_i / T) T * ceil(sum_j kept n_j / block) block``, never more for ``block == T`` (one partial block per
list instead of one per kept key cluster).

Backends (:func:`varlen_attention`):

* ``reference``: :func:`varlen_attention_reference`, dense masked softmax in fp32 (O(N^2) memory; tests);
* ``gather``: :func:`varlen_attention_gather`, each query cluster's queries and its gathered key list as
  one batch element of ``scaled_dot_product_attention`` with a key-padding mask, clusters bucketed by
  query tiles and list length so that each bucket pads only to its own longest list;
* ``flex``: :func:`varlen_attention_flex`, compiled FlexAttention over the permuted queries and the
  "duplicated key" sequence (keys gathered by ``kv_index``) with a ``BlockMask`` whose query tile ``t``
  keeps exactly its list's blocks (full blocks unmasked, the last partial one masked by ``kv_index >= 0``);
* ``triton``: :func:`varlen_attention_triton`, a FlashAttention-2 style kernel, one program per (group,
  query tile), looping over its list in steps of ``block`` with indirect loads of K and V rows (CUDA, or
  ``TRITON_INTERPRET=1`` on CPU for correctness runs).

``auto`` picks ``triton`` on CUDA and ``gather`` elsewhere. On attention captured from the bundled model the
gather backend now takes 0.85x dense SDPA's time (:func:`varlen_attention_gather` has the figures). The first
synthetic comparison, before ``gather`` cut its runs by list length (so its figures for ``gather`` are the older
executor's): on a 2-core x86 CPU (shared, load ~5), one thread, torch 2.13, G=4 heads, N=8192 tokens, D=64, 64
query / 256 key clusters of uneven sizes (nearest of random centres on an 8x32x32 grid: 16-304 and 1-166
tokens), 25% of key clusters kept per query cluster, fp32, T = block = 64, interleaved, median of 5 (two runs):
``gather`` 1.07 / 1.12 s, ``flex`` 1.72 / 1.78 s; the same keep through the tile layout
(``block_sparse_attention(backend="flex")``) 4.17 / 4.07 s; dense SDPA 1.90 s. Executed density 0.313 by the
key-list rule vs 0.637 by the tile rule (useful 0.251). In ``flex`` the compiled kernel alone takes ~1.2-1.3 s
(SDPA in ``gather``: ~0.7 s for about the same work) and gathering the duplicated keys (2 x Lkv x D, Lkv = 16 N
here) most of the rest. Building the layout takes ~40 ms (the tile layout ~35 ms).
Triton is imported lazily: importing this module never imports it (``TRITON_INTERPRET`` is read when
triton is first imported).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from . import blocks as B
from .block_sparse import LOG2E, TRITON_DEVICE_ERROR, _interpreting

Tensor = torch.Tensor


@dataclasses.dataclass
class KeyListLayout:
    """One padded key list per query cluster; every query tile of the cluster walks that list."""

    tile: int  # query rows per query tile (T)
    block: int  # key slots per inner-loop step; every list is padded to a multiple of it
    q_slots: Tensor  # [G, Lq] long: query token in each permuted query slot (-1 = padding); Lq % tile == 0
    token_slot: Tensor  # [G, N] long: slot of each query token (inverse of q_slots)
    tile_list: Tensor  # [G, Lq // tile] long: query cluster whose list each query tile walks (-1: padding tile)
    list_start: Tensor  # [G, Kq] long: offset of each query cluster's list in kv_index
    list_len: Tensor  # [G, Kq] long: keys in each list before padding
    kv_index: Tensor  # [G, Lkv] long: key token indices, lists back to back, each padded with -1 to a multiple of block

    def padded_len(self) -> Tensor:
        """``[G, Kq]`` each list's length padded to a multiple of ``block``."""
        return B.num_tiles(self.list_len, self.block) * self.block

    def executed_pairs(self) -> Tensor:
        """0-d: sum over non-empty query tiles of ``tile`` x padded list length (the kernel's work, padding
        included)."""
        per_tile = self.padded_len().gather(1, self.tile_list.clamp(min=0)) * (self.tile_list >= 0)
        return per_tile.sum() * self.tile

    def executed_density(self) -> Tensor:
        """0-d: ``executed_pairs / (G N^2)`` (N = query tokens; keys assumed as many)."""
        G, N = self.token_slot.shape
        return self.executed_pairs().double() / (G * N * N)

    def to(self, device) -> KeyListLayout:
        return KeyListLayout(self.tile, self.block, *(getattr(self, f.name).to(device)
                                                      for f in dataclasses.fields(self)[2:]))


def key_lists(q_labels: Tensor, k_labels: Tensor, keep: Tensor, tile: int = 64, block: int = 64) -> KeyListLayout:
    """The key-list layout. ``q_labels`` / ``k_labels`` ``[G, N]`` long cluster ids; ``keep`` ``[G, Kq, Kk]`` bool
    (query cluster ``i`` attends to key cluster ``j``).

    Whole-tensor ops only: each kept (query cluster, key cluster) pair owns the range ``[start, start + n_j)``
    of ``kv_index``; a ``searchsorted`` of every slot in the pairs' (non-decreasing) end offsets finds its
    pair, and the slot's rank in the pair picks the key among the cluster's tokens (keys sorted by cluster).
    Memory is O(Kq Kk + Lkv) per group. Reads one value from the device (the longest ``kv_index``)."""
    if q_labels.dim() != 2 or k_labels.dim() != 2 or keep.dim() != 3 or keep.dtype != torch.bool:
        raise ValueError(f"q_labels, k_labels must be [G, N] and keep a [G, Kq, Kk] bool tensor; got "
                         f"{tuple(q_labels.shape)}, {tuple(k_labels.shape)}, {tuple(keep.shape)} {keep.dtype}")
    if not q_labels.shape[0] == k_labels.shape[0] == keep.shape[0]:
        raise ValueError(f"q_labels, k_labels and keep must share G; got {q_labels.shape[0]}, "
                         f"{k_labels.shape[0]}, {keep.shape[0]}")
    if tile < 1 or block < 1:
        raise ValueError(f"tile and block must be >= 1; got {tile}, {block}")
    G, Nk = k_labels.shape
    _, Kq, Kk = keep.shape
    dev = keep.device
    q_labels, k_labels = q_labels.long(), k_labels.long()
    pq = B.permutation(q_labels, Kq, tile)
    nk = torch.zeros(G, Kk, dtype=torch.long, device=dev).scatter_add_(1, k_labels, torch.ones_like(k_labels))
    kept = keep * nk.unsqueeze(1)  # [G, Kq, Kk] tokens each kept pair adds to list i
    list_len = kept.sum(-1)
    padded = B.num_tiles(list_len, block) * block
    list_start = padded.cumsum(-1) - padded
    lkv = max(int(padded.sum(-1).max()), block)
    pair_start = (list_start.unsqueeze(-1) + kept.cumsum(-1) - kept).flatten(1)  # [G, Kq * Kk]
    pair_end = pair_start + kept.flatten(1)  # non-decreasing along each row
    s = torch.arange(lkv, device=dev).expand(G, lkv).contiguous()
    pair = torch.searchsorted(pair_end, s, right=True)  # first pair ending after slot s
    in_range = pair < Kq * Kk
    pair = pair.clamp(max=Kq * Kk - 1)
    start = pair_start.gather(1, pair)
    valid = in_range & (s >= start)  # else s is list padding
    k_order = k_labels.argsort(dim=-1, stable=True)  # keys grouped by cluster
    k_first = nk.cumsum(-1) - nk
    pos = k_first.gather(1, pair % Kk) + (s - start)
    kv_index = torch.where(valid, k_order.gather(1, pos.clamp(0, Nk - 1)), -1)
    return KeyListLayout(tile, block, pq.slot_token, pq.token_slot, pq.tile_cluster, list_start, list_len, kv_index)


# ---------------------------------------------------------------------------- shared


def key_list_work(keep: torch.Tensor, nq: torch.Tensor, nk: torch.Tensor, tile: int, block: int) -> torch.Tensor:
    """``[G]`` token pairs executed when each query cluster's kept keys run as one list: its rows padded to
    whole ``tile``s times its kept keys padded to whole ``block``s; the count of
    :meth:`KeyListLayout.executed_pairs`, from the clusters alone (before any
    layout is built)."""
    rows = torch.div(nq + tile - 1, tile, rounding_mode="floor") * tile
    keys = (keep * nk.unsqueeze(1)).sum(-1)
    keys = torch.div(keys + block - 1, block, rounding_mode="floor") * block
    return (rows * keys).sum(-1)


def _check(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v must be [G, N, D] with matching G (and D for q, k); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if tuple(layout.token_slot.shape) != tuple(q.shape[:2]):
        raise ValueError(f"layout covers {tuple(layout.token_slot.shape)} (G, N) query tokens; q is {tuple(q.shape)}")


def _scale(q: Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """``x[G, M, D]``, ``index[G, L]`` (-1: padding, reads row 0) -> ``[G, L, D]``: one ``index_select`` of
    whole rows (about 2x faster on CPU than ``torch.gather`` with an expanded index)."""
    G, M, D = x.shape
    flat = index.clamp(min=0) + M * torch.arange(G, device=index.device).unsqueeze(1)
    return torch.index_select(x.reshape(G * M, D), 0, flat.flatten()).view(*index.shape, D)


def _query_clusters(layout: KeyListLayout) -> tuple[Tensor, Tensor]:
    """``[G, Kq]`` first query tile and number of query tiles of each query cluster (0 tiles: absent)."""
    G, Kq = layout.list_len.shape
    qt = layout.tile_list.shape[1]
    col = torch.where(layout.tile_list >= 0, layout.tile_list, Kq)  # padding tiles -> a dummy column
    count = torch.zeros(G, Kq + 1, dtype=torch.long, device=col.device).scatter_add_(1, col, torch.ones_like(col))
    t = torch.arange(qt, device=col.device).expand(G, qt)
    first = torch.full((G, Kq + 1), qt, dtype=torch.long, device=col.device).scatter_reduce_(1, col, t, "amin")
    return first[:, :Kq], count[:, :Kq]


# ---------------------------------------------------------------------------- reference


def varlen_attention_reference(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout,
                               scale: float | None = None) -> Tensor:
    """Dense masked softmax in fp32, the mask built from the layout: query token ``t`` (its tile walks list
    ``i``) may attend to key ``u`` iff ``u`` is in list ``i``. Rows with an empty list return 0. O(N^2)."""
    _check(q, k, v, layout)
    G, N, _ = q.shape
    Nk = k.shape[1]
    Kq = layout.list_len.shape[1]
    dev = q.device
    lay = layout.to(dev)
    lkv = lay.kv_index.shape[1]
    s = torch.arange(lkv, device=dev).expand(G, lkv).contiguous()
    which = torch.searchsorted((lay.list_start + lay.padded_len()).contiguous(), s, right=True)  # list of slot s
    ok = lay.kv_index >= 0
    member = torch.zeros(G, Kq + 1, Nk, dtype=torch.bool, device=dev)
    member[torch.arange(G, device=dev).unsqueeze(1), torch.where(ok, which, Kq), lay.kv_index.clamp(min=0)] = True
    q_cluster = lay.tile_list.gather(1, torch.div(lay.token_slot, lay.tile, rounding_mode="floor"))
    allowed = member[torch.arange(G, device=dev).unsqueeze(1), torch.where(q_cluster >= 0, q_cluster, Kq)]
    scores = (q.float() @ k.float().transpose(-1, -2)) * _scale(q, scale)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    probs = probs.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # empty list: 0, not NaN
    return (probs @ v.float()).to(q.dtype)


# ---------------------------------------------------------------------------- gather + SDPA


def _runs(q_rows: Tensor, work: Tensor, n: int, lengths: Tensor | None = None, pad: float = 0.0) -> list[Tensor]:
    """Cut a sorted sequence of batch elements into runs: wherever the query rows change (so no run pads
    its queries), at ``n - 1`` points of equal cumulative ``work`` (so long runs also split by list length)
    and, given the elements' ``lengths`` (ascending within equal query rows), wherever a length exceeds the
    run's first by more than a share ``pad`` (a run pads every list to its longest, so then at most that
    share of its keys is padding). Returns index ranges into the sequence."""
    if work.numel() == 0:
        return []
    cum = work.double().cumsum(0)
    cuts = torch.searchsorted(cum, cum[-1] * torch.arange(1, n, device=work.device, dtype=torch.double) / n)
    edges = {0, work.numel(), *cuts.tolist()}
    if lengths is None:
        edges.update(((q_rows[1:] != q_rows[:-1]).nonzero().flatten() + 1).tolist())
    else:  # one pass: a change of query rows, or a list too long for its run, starts a new run
        rows, lens, first = q_rows.tolist(), lengths.tolist(), 0
        for i in range(1, len(lens)):
            if rows[i] != rows[i - 1] or lens[i] > (1 + pad) * lens[first]:
                edges.add(i)
                first = i
    edges = sorted(edges)
    return [torch.arange(a, b, device=work.device) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


GATHER_BUCKETS = 4
GATHER_PAD = 0.1


def varlen_attention_gather(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout, scale: float | None = None,
                            buckets: int = GATHER_BUCKETS, pad: float = GATHER_PAD) -> Tensor:
    """Batched SDPA, one batch element per (group, query cluster): its query tiles and its key list gathered
    (``[P, Q, D]`` and ``[P, L, D]``), keys past the list masked out.

    The non-empty (group, cluster) pairs are sorted by query tiles, then padded list length, and cut into
    runs (:func:`_runs`): one per distinct query-tile count, split further at ``buckets - 1`` equal-work
    points and wherever a list is more than ``pad`` longer than its run's first. Each run pads only to its
    own longest list. Without the ``pad`` cut, on q, k, v captured from the bundled model at 15,360 tokens
    (4 heads, 128 query clusters, executed density 0.42), the runs' SDPA calls computed 0.62 of the dense
    pairs, 1.5x the executed ones, and the call took 1.29x dense SDPA's time on two threads; with ``pad`` 0.1,
    0.85x (0.58x on one thread, against 0.97x); 0.05 was no faster, 0.3 a little slower. Reads the run shapes
    from the device."""
    _check(q, k, v, layout)
    G, N, D = q.shape
    Nk, Dv = k.shape[1], v.shape[-1]
    dev = q.device
    lay = layout.to(dev)
    T = lay.tile
    Kq = lay.list_len.shape[1]
    lq, lkv = lay.q_slots.shape[1], lay.kv_index.shape[1]
    first, count = _query_clusters(lay)
    padded = lay.padded_len()
    live = ((count > 0) & (lay.list_len > 0)).flatten()
    q_rows, list_rows = (count * T).flatten(), padded.flatten()
    order = live.nonzero().flatten()
    order = order[(q_rows[order] * (lkv + 1) + list_rows[order]).argsort()]  # (g * Kq + i) by (tiles, list)
    g_of = torch.div(order, Kq, rounding_mode="floor")
    q_flat, k_flat, v_flat = q.reshape(G * N, D), k.reshape(G * Nk, D), v.reshape(G * Nk, Dv)
    out_slots = torch.zeros(G * lq + 1, Dv, dtype=q.dtype, device=dev)  # last row: sink for unused rows
    rows_sorted, lists_sorted = q_rows[order], list_rows[order]
    for run in _runs(rows_sorted, rows_sorted * lists_sorted, buckets, lists_sorted, pad):
        p, g = order[run], g_of[run]
        nq, nl = int(q_rows[p].max()), int(list_rows[p].max())
        r = torch.arange(nq, device=dev)
        slot = (first.flatten()[p] * T).unsqueeze(1) + r  # [P, nq] query slots (past the cluster: unused)
        in_cluster = r < q_rows[p].unsqueeze(1)
        tok = lay.q_slots.flatten()[(g * lq).unsqueeze(1) + slot.clamp(max=lq - 1)]
        in_cluster &= tok >= 0
        qb = torch.index_select(q_flat, 0, (g.unsqueeze(1) * N + tok.clamp(min=0)).flatten()).view(*tok.shape, D)
        c = torch.arange(nl, device=dev)
        pos = (lay.list_start.flatten()[p]).unsqueeze(1) + c
        key = lay.kv_index.flatten()[(g * lkv).unsqueeze(1) + pos.clamp(max=lkv - 1)]
        key_ok = (c < list_rows[p].unsqueeze(1)) & (key >= 0)
        kidx = (g.unsqueeze(1) * Nk + key.clamp(min=0)).flatten()
        kb = torch.index_select(k_flat, 0, kidx).view(*key.shape, D)
        vb = torch.index_select(v_flat, 0, kidx).view(*key.shape, Dv)
        ob = torch.nn.functional.scaled_dot_product_attention(
            qb.unsqueeze(1), kb.unsqueeze(1), vb.unsqueeze(1),
            attn_mask=key_ok[:, None, None, :], scale=_scale(q, scale)).squeeze(1)
        dest = torch.where(in_cluster, g.unsqueeze(1) * lq + slot, G * lq)
        out_slots.index_copy_(0, dest.flatten(), ob.reshape(-1, Dv))
    out_slots = out_slots[:-1].view(G, lq, Dv)
    return _rows(out_slots, lay.token_slot)


# ---------------------------------------------------------------------------- FlexAttention


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _bucket(n: int, unit: int) -> int:
    """``n`` rounded up to ``unit`` x (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ...): at most 4 sizes per
    doubling (at most 25% padding past 4 units), so that compiled kernels see few distinct shapes."""
    m = max(1, -(-n // unit))
    if m > 8:
        step = 1 << (m.bit_length() - 3)
        m = -(-m // step) * step
    return m * unit


def flex_key_list_mask(layout: KeyListLayout, q_len: int, kv_len: int):
    """``BlockMask`` (``[1, G]``, blocks of ``tile`` queries x ``block`` keys) for ``q_len`` permuted query
    slots and ``kv_len`` gathered key slots: tile ``t`` walking list ``i`` keeps that list's blocks, the
    whole blocks as full blocks (no mask), the last partial one masked by ``kv_index >= 0``. The index
    tensors are ``[1, G, q_len / tile, kv_len / block]`` (the CPU lowering wants every key block a column)."""
    from torch.nn.attention.flex_attention import BlockMask

    lay = layout
    G = lay.list_len.shape[0]
    dev = lay.list_len.device
    qt, kvt = q_len // lay.tile, kv_len // lay.block
    tl_ = torch.nn.functional.pad(lay.tile_list, (0, qt - lay.tile_list.shape[1]), value=-1)
    c = tl_.clamp(min=0)
    live = tl_ >= 0
    n_full = torch.where(live, torch.div(lay.list_len, lay.block, rounding_mode="floor").gather(1, c), 0)
    n_part = torch.where(live, (lay.list_len % lay.block > 0).long().gather(1, c), 0)
    first = torch.div(lay.list_start, lay.block, rounding_mode="floor").gather(1, c)
    full_idx = (first.unsqueeze(-1) + torch.arange(kvt, device=dev)).clamp(max=kvt - 1)
    part_idx = torch.zeros_like(full_idx)
    part_idx[..., 0] = (first + n_full).clamp(max=kvt - 1)
    valid = torch.nn.functional.pad(lay.kv_index >= 0, (0, kv_len - lay.kv_index.shape[1]), value=False)

    def mask_mod(b, h, q_idx, kv_idx):
        return valid[h, kv_idx]

    def shape(x):
        return x.to(torch.int32).view(1, G, *x.shape[1:]).contiguous()

    return BlockMask.from_kv_blocks(shape(n_part), shape(part_idx), shape(n_full), shape(full_idx),
                                    BLOCK_SIZE=(lay.tile, lay.block), mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len), compute_q_blocks=False)


def varlen_attention_flex(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout,
                          scale: float | None = None) -> Tensor:
    """Compiled FlexAttention over the permuted queries and the keys gathered by ``kv_index`` (the lists back
    to back): work ~ executed pairs. Lengths are padded to a few buckets (:func:`_bucket`) so that the static
    compile happens for a handful of shapes, not every call (each compile: tens of seconds on CPU); extra
    query tiles keep no block, extra key slots are invalid. Reads two sizes from the device."""
    _check(q, k, v, layout)
    G, N, D = q.shape
    Dv = v.shape[-1]
    lay = layout.to(q.device)
    q_len = _bucket(lay.q_slots.shape[1], -(-N // lay.tile) * lay.tile)
    kv_len = _bucket(lay.kv_index.shape[1], -(-N // lay.block) * lay.block)
    q_slots = torch.nn.functional.pad(lay.q_slots, (0, q_len - lay.q_slots.shape[1]), value=-1)
    kv_index = torch.nn.functional.pad(lay.kv_index, (0, kv_len - lay.kv_index.shape[1]), value=-1)
    qp, kp, vp = _rows(q, q_slots), _rows(k, kv_index), _rows(v, kv_index)
    out = _compiled_flex_attention()(qp.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0),
                                      block_mask=flex_key_list_mask(lay, q_len, kv_len), scale=scale)
    return _rows(out.view(G, q_len, Dv), lay.token_slot)


# ---------------------------------------------------------------------------- Triton


@functools.cache
def _triton_kernel():
    """FlashAttention-2 forward over key lists. One program per (query tile, group): it loads its query rows
    by token (``q_slots``), reads its list's offset and length, then loops over the list in steps of
    ``BLOCK`` slots: key indices, then K and V rows by those indices (indirect loads), online softmax in
    fp32 with -1 slots at score -inf; writes its rows straight back to their tokens (each token has one
    slot, so the stores never collide and no un-permute pass is needed)."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(Q, K, V, Out, QSlots, TileList, ListStart, ListLen, KvIndex, scale, n_q, n_k, q_len, kv_len,
               n_lists, TILE: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
               PRECISION: tl.constexpr):
        t = tl.program_id(0)
        g = tl.program_id(1).to(tl.int64)
        q_tiles = q_len // TILE
        toks = tl.load(QSlots + g * q_len + t * TILE + tl.arange(0, TILE))
        dims = tl.arange(0, BLOCK_D)
        dmask = dims[None, :] < D
        qmask = (toks >= 0)[:, None] & dmask
        q = tl.load(Q + g * n_q * D + toks[:, None] * D + dims[None, :], mask=qmask, other=0.0)
        c = tl.load(TileList + g * q_tiles + t)
        cs = tl.maximum(c, 0)
        start = tl.load(ListStart + g * n_lists + cs)
        length = tl.where(c >= 0, tl.load(ListLen + g * n_lists + cs), 0).to(tl.int32)
        m_i = tl.full([TILE], float("-inf"), tl.float32)
        l_i = tl.zeros([TILE], tl.float32)
        acc = tl.zeros([TILE, BLOCK_D], tl.float32)
        for j in range(tl.cdiv(length, BLOCK)):
            keys = tl.load(KvIndex + g * kv_len + start + j * BLOCK + tl.arange(0, BLOCK))
            valid = keys >= 0
            kmask = valid[:, None] & dmask
            k = tl.load(K + g * n_k * D + keys[:, None] * D + dims[None, :], mask=kmask, other=0.0)
            v = tl.load(V + g * n_k * D + keys[:, None] * D + dims[None, :], mask=kmask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # log2-scaled scores
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: p = alpha = 0
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # empty list: acc = 0, so 0
        tl.store(Out + g * n_q * D + toks[:, None] * D + dims[None, :], out.to(Out.dtype.element_ty), mask=qmask)

    return kernel


def varlen_attention_triton(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout, scale: float | None = None,
                            *, num_warps: int | None = None, num_stages: int | None = None) -> Tensor:
    """Triton key-list FlashAttention (see :func:`_triton_kernel`); the torch ground truth is
    :func:`varlen_attention_reference`. fp32 inputs use IEEE fp32 dots; accumulation is fp32. Needs a
    power-of-two ``tile`` and ``block`` >= 16 and one head size for q, k, v. Launch defaults (4 warps, 2
    stages; 8 / 3 for 128-row tiles) follow block_sparse's H200 sweep and are not tuned for this kernel."""
    _check(q, k, v, layout)
    if q.device.type != "cuda" and not _interpreting():
        raise RuntimeError(TRITON_DEVICE_ERROR)
    t, blk, d = layout.tile, layout.block, q.shape[-1]
    if any(x < 16 or x & (x - 1) for x in (t, blk)) or v.shape[-1] != d:
        raise ValueError(f"the Triton kernel needs a power-of-two tile and block >= 16 and q, k, v of one head "
                         f"size; got tile {t}, block {blk}, head sizes {d} and {v.shape[-1]}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    G, N, _ = q.shape
    lay = layout.to(q.device)
    out = torch.empty_like(q)
    q_len, kv_len = lay.q_slots.shape[1], lay.kv_index.shape[1]
    launch = {"num_warps": num_warps or (8 if t >= 128 else 4), "num_stages": num_stages or (3 if t >= 128 else 2)}
    _triton_kernel()[(q_len // t, G)](
        q, k, v, out, lay.q_slots.int().contiguous(), lay.tile_list.int().contiguous(),
        lay.list_start.contiguous(), lay.list_len.int().contiguous(), lay.kv_index.int().contiguous(),
        _scale(q, scale) * LOG2E, N, k.shape[1], q_len, kv_len, lay.list_len.shape[1], TILE=t, BLOCK=blk, D=d,
        BLOCK_D=max(16, 1 << (d - 1).bit_length()),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return out


# ---------------------------------------------------------------------------- dispatch


BACKENDS = {
    "reference": varlen_attention_reference,
    "gather": varlen_attention_gather,
    "flex": varlen_attention_flex,
    "triton": varlen_attention_triton,
}


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, layout: KeyListLayout, *, backend: str = "auto",
                     scale: float | None = None) -> Tensor:
    """``q, k, v`` ``[G, N, D]`` in token order -> ``[G, N, D]`` in token order; query token ``t`` (cluster
    ``i``) attends exactly to the keys of list ``i`` (an empty list gives zeros). ``backend``: ``auto``
    (triton on CUDA, gather elsewhere), ``reference``, ``gather``, ``flex``, ``triton``."""
    if backend == "auto":
        backend = "triton" if q.device.type == "cuda" else "gather"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")
    return BACKENDS[backend](q, k, v, layout, scale=scale)
