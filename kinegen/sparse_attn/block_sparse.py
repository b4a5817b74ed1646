"""Block-sparse attention over clustered, padded tokens: the execution layer of HyperVAttention.

Upstream code permutes tokens by cluster and pads each cluster to a whole number of tiles; this module
receives the permuted, padded ``q``/``k``/``v`` (``[B, H, L, D]``) and a tile-level :class:`BlockLayout`,
and computes softmax attention only on the kept (query tile, key tile) pairs, never attending to padding keys.

Backends (:func:`block_sparse_attention`):

* ``dense``: :func:`block_sparse_attention_reference`, a dense masked softmax in fp32 (the ground truth);
* ``flex``: :func:`block_sparse_attention_flex`, torch's compiled FlexAttention driven by a ``BlockMask``
  built directly from the layout (``BlockMask.from_kv_blocks``), which skips dropped tiles on CPU and GPU;
* ``triton``: :func:`block_sparse_attention_triton`, a FlashAttention-2 style Triton kernel that loops over
  each query tile's kept key tiles only (CUDA, or the Triton interpreter on CPU for correctness runs).

``auto`` picks ``triton`` on CUDA and ``flex`` elsewhere. Triton is imported lazily, so importing this
module never imports it (``TRITON_INTERPRET`` is read when triton is first imported).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

TRITON_DEVICE_ERROR = "the Triton kernel needs a CUDA GPU, or TRITON_INTERPRET=1 for a (slow) CPU correctness run"


@dataclasses.dataclass
class BlockLayout:
    """Tile-level sparsity over permuted, padded tokens of length L (a multiple of `tile`).

    The same format as FlexAttention's ``BlockMask`` (``kv_num_blocks`` / ``kv_indices``), plus the padding mask.
    """

    tile: int  # tile size T (e.g. 16, 64, 128), same for queries and keys
    kv_num_blocks: torch.Tensor  # [B, H, L//T] int32: number of kept key tiles per query tile
    kv_indices: torch.Tensor  # [B, H, L//T, L//T] int32: kept key-tile indices first (ascending), rest arbitrary
    key_valid: torch.Tensor  # [B, H, L] bool: False for padding slots (never attended to)

    def density(self) -> float:
        """Kept tiles / all tiles (mean over B, H)."""
        return self.kv_num_blocks.float().mean().item() / self.kv_indices.shape[-1]

    def tile_mask(self) -> torch.Tensor:
        """The dense ``[B, H, QT, KT]`` bool tile mask (inverse of :func:`layout_from_tile_mask`)."""
        kt = self.kv_indices.shape[-1]
        kept = torch.arange(kt, device=self.kv_indices.device) < self.kv_num_blocks[..., None]
        # Unkept slots scatter into an extra dummy column, so duplicate (arbitrary) indices cannot clear a kept tile.
        cols = torch.where(kept, self.kv_indices.long(), kt)
        mask = torch.zeros(*cols.shape[:-1], kt + 1, dtype=torch.bool, device=cols.device)
        return mask.scatter_(-1, cols, True)[..., :kt]

    def to(self, device) -> BlockLayout:
        """The same layout with its tensors on ``device``."""
        return BlockLayout(self.tile, self.kv_num_blocks.to(device), self.kv_indices.to(device),
                           self.key_valid.to(device))


def layout_from_tile_mask(mask: torch.Tensor, tile: int, key_valid: torch.Tensor) -> BlockLayout:
    """``[B, H, QT, KT]`` bool tile mask -> :class:`BlockLayout`: per query tile, the kept key tiles in
    ascending order, then the others (a running count gives each its position: the stable partition
    that a sort would give, without the sort)."""
    if mask.dim() != 4 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a [B, H, QT, KT] bool tensor; got {tuple(mask.shape)} {mask.dtype}")
    if key_valid.shape != (*mask.shape[:2], mask.shape[-1] * tile):
        raise ValueError(f"key_valid must have shape {(*mask.shape[:2], mask.shape[-1] * tile)} "
                         f"(B, H, KT * tile); got {tuple(key_valid.shape)}")
    cols = torch.arange(mask.shape[-1], dtype=torch.int32, device=mask.device).expand(mask.shape)
    kept_upto = mask.cumsum(-1, dtype=torch.int32)  # kept tiles among 0..j
    num = kept_upto[..., -1:]
    # Kept tile j goes to position kept_upto - 1, a dropped one after all the kept: num + (j - kept_upto).
    pos = torch.where(mask, kept_upto - 1, num + cols - kept_upto).long()
    indices = torch.empty_like(cols).scatter_(-1, pos, cols)
    return BlockLayout(tile, num[..., 0].contiguous(), indices, key_valid.to(torch.bool))


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: BlockLayout) -> None:
    """Shapes of q/k/v ``[B, H, L, D]`` against the layout (queries and keys may differ in length)."""
    if q.dim() != 4 or k.shape[:3] != v.shape[:3] or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v must be [B, H, L, D] with matching B, H (and D for q, k); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    qt, kt = layout.kv_indices.shape[-2:]
    if q.shape[2] != qt * layout.tile or k.shape[2] != kt * layout.tile:
        raise ValueError(f"layout covers {qt} x {kt} tiles of {layout.tile} tokens; "
                         f"got {q.shape[2]} queries and {k.shape[2]} keys")


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def block_sparse_attention_reference(q, k, v, layout: BlockLayout, scale: float | None = None) -> torch.Tensor:
    """Dense masked softmax attention in fp32: the tile mask expanded to tokens, AND ``key_valid``.

    Query rows that see no valid key return 0. Memory is O(L^2): meant for tests and small checks.
    """
    _check(q, k, v, layout)
    t = layout.tile
    allowed = layout.tile_mask().repeat_interleave(t, -2).repeat_interleave(t, -1) & layout.key_valid[:, :, None, :]
    scores = (q.float() @ k.float().transpose(-1, -2)) * _scale(q, scale)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    probs = probs.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # all -inf rows: NaN -> 0
    return (probs @ v.float()).to(q.dtype)


@functools.cache
def _compiled_flex_attention():
    """``torch.compile(flex_attention, dynamic=False)``, built once per process (the first call compiles)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(layout: BlockLayout):
    """FlexAttention ``BlockMask`` for the layout: kept tiles from ``kv_indices``, padding keys by ``mask_mod``.

    ``BlockMask.from_kv_blocks`` only transposes the index tensors (milliseconds), unlike ``create_block_mask``,
    which evaluates ``mask_mod`` over every tile.
    """
    from torch.nn.attention.flex_attention import BlockMask

    key_valid = layout.key_valid

    def mask_mod(b, h, q_idx, kv_idx):
        return key_valid[b, h, kv_idx]

    qt, kt = layout.kv_indices.shape[-2:]
    return BlockMask.from_kv_blocks(layout.kv_num_blocks, layout.kv_indices, BLOCK_SIZE=layout.tile,
                                    mask_mod=mask_mod, seq_lengths=(qt * layout.tile, kt * layout.tile))


def block_sparse_attention_flex(q, k, v, layout: BlockLayout, scale: float | None = None) -> torch.Tensor:
    """Compiled FlexAttention over the kept tiles only (work ~ density); padding keys masked by ``mask_mod``.

    Shapes are compiled statically: each new (B, H, L, D, tile, dtype) compiles once (tens of seconds on CPU).
    """
    _check(q, k, v, layout)
    return _compiled_flex_attention()(q, k, v, block_mask=flex_block_mask(layout.to(q.device)), scale=scale)


def _interpreting() -> bool:
    """Whether Triton runs in its interpreter (``TRITON_INTERPRET``, parsed as triton's ``getenv_bool``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on", "y")


@functools.cache
def _triton_kernel():
    """The Triton kernel (FlashAttention-2 forward, as in Triton's fused-attention tutorial, with a tile list).

    One program per (query tile, b * h): it loads its query tile once, then loops only over that tile's kept
    key tiles ``kv_indices[:kv_num_blocks]`` with an online softmax in fp32; padding keys get score -inf.
    """
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(Q, K, V, Out, NumBlocks, Indices, KeyValid, scale, q_len, k_len, q_tiles, k_tiles,
               TILE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        qt = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        rows = qt * TILE + tl.arange(0, TILE)
        dims = tl.arange(0, BLOCK_D)
        dmask = dims[None, :] < D
        q = tl.load(Q + bh * q_len * D + rows[:, None] * D + dims[None, :], mask=dmask, other=0.0)
        m_i = tl.full([TILE], float("-inf"), tl.float32)
        l_i = tl.zeros([TILE], tl.float32)
        acc = tl.zeros([TILE, BLOCK_D], tl.float32)
        row = bh * q_tiles + qt
        for j in range(tl.load(NumBlocks + row)):
            keys = tl.load(Indices + row * k_tiles + j) * TILE + tl.arange(0, TILE)
            k = tl.load(K + bh * k_len * D + keys[:, None] * D + dims[None, :], mask=dmask, other=0.0)
            v = tl.load(V + bh * k_len * D + keys[:, None] * D + dims[None, :], mask=dmask, other=0.0)
            valid = tl.load(KeyValid + bh * k_len + keys) != 0
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # log2-scaled scores
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: keep p = alpha = 0
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        # Rows with no valid key (l = 0, acc = 0) give 0; dividing by 1 there, not by 0, computes no inf/NaN.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + bh * q_len * D + rows[:, None] * D + dims[None, :], out.to(Out.dtype.element_ty), mask=dmask)

    return kernel


LOG2E = 1.4426950408889634


def block_sparse_attention_triton(q, k, v, layout: BlockLayout, scale: float | None = None, *,
                                  num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """Triton block-sparse FlashAttention (see :func:`_triton_kernel`); the torch reference is
    :func:`block_sparse_attention_reference`. fp32 inputs use IEEE fp32 dots (no TF32); accumulation is fp32.

    ``num_warps`` / ``num_stages`` default to 8 / 3 for 128-row tiles and 4 / 2 below: the best or within
    2% of it in the sweep on an H200 (benchmarks/gpu_sparse_attention.md), and within shared memory on
    smaller GPUs.
    """
    _check(q, k, v, layout)
    if q.device.type != "cuda" and not _interpreting():
        raise RuntimeError(TRITON_DEVICE_ERROR)
    t, d = layout.tile, q.shape[-1]
    if t < 16 or t & (t - 1) or v.shape[-1] != d:
        raise ValueError(f"the Triton kernel needs a power-of-two tile >= 16 and q, k, v of one head size; "
                         f"got tile {t}, head sizes {d} and {v.shape[-1]}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    qt, kt = layout.kv_indices.shape[-2:]
    lay = layout.to(q.device)
    out = torch.empty_like(q)
    launch = {"num_warps": num_warps or (8 if t >= 128 else 4), "num_stages": num_stages or (3 if t >= 128 else 2)}
    _triton_kernel()[(qt, b * h)](
        q, k, v, out, lay.kv_num_blocks.int().contiguous(),
        lay.kv_indices.int().contiguous(), lay.key_valid.to(torch.uint8).contiguous(), _scale(q, scale) * LOG2E,
        q_len, k_len, qt, kt, TILE=t, D=d, BLOCK_D=max(16, 1 << (d - 1).bit_length()),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return out


BACKENDS = {
    "dense": block_sparse_attention_reference,
    "flex": block_sparse_attention_flex,
    "triton": block_sparse_attention_triton,
}


def block_sparse_attention(q, k, v, layout: BlockLayout, backend: str = "auto",
                           scale: float | None = None) -> torch.Tensor:
    """Block-sparse attention by backend name: ``auto`` (triton on CUDA, flex elsewhere), ``flex``, ``triton``,
    ``dense`` (the fp32 reference)."""
    if backend == "auto":
        backend = "triton" if q.device.type == "cuda" else "flex"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}; got {backend!r}")
    return BACKENDS[backend](q, k, v, layout, scale=scale)
