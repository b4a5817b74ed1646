"""Block-sparse attention (kinegen.sparse_attn.block_sparse): layout, fp32 reference, flex and Triton backends.

Tiny shapes only: the compiled flex kernel compiles once for the module (tens of seconds on CPU), and the
Triton kernel runs in its interpreter in a subprocess (TRITON_INTERPRET must be set before triton is imported).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kinegen.sparse_attn.block_sparse import (
    block_sparse_attention,
    block_sparse_attention_flex,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
    layout_from_tile_mask,
)


def random_case(seed=0, b=1, h=2, length=128, d=16, tile=16, density=0.5, pad=0.2):
    """Random q, k, v and layout: tile mask at ``density`` with the diagonal kept, a ``pad`` share of padding keys."""
    g = torch.Generator().manual_seed(seed)
    n = length // tile
    mask = (torch.rand(b, h, n, n, generator=g) < density) | torch.eye(n, dtype=torch.bool)
    key_valid = torch.rand(b, h, length, generator=g) >= pad
    q, k, v = (torch.randn(b, h, length, d, generator=g) for _ in range(3))
    return q, k, v, layout_from_tile_mask(mask, tile, key_valid)


def rel_l2(out, ref, layout):
    """Relative L2 error over the rows of valid tokens (padding query slots are discarded upstream)."""
    rows = layout.key_valid
    return ((out - ref)[rows].norm() / ref[rows].norm()).item()


def test_layout_round_trip_and_density():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 3, 8, 8, generator=g) < 0.3
    layout = layout_from_tile_mask(mask, 16, torch.ones(2, 3, 128, dtype=torch.bool))
    assert layout.kv_num_blocks.dtype == layout.kv_indices.dtype == torch.int32
    assert layout.kv_indices.shape == (2, 3, 8, 8)
    assert torch.equal(layout.kv_num_blocks, mask.sum(-1).int())
    rows = zip(mask.flatten(0, 2), layout.kv_num_blocks.flatten(), layout.kv_indices.flatten(0, 2), strict=True)
    for row, num, idx in rows:
        assert idx[:num].tolist() == row.nonzero().flatten().tolist()  # kept tiles first, ascending
    assert torch.equal(layout.tile_mask(), mask)
    assert layout.density() == pytest.approx(mask.float().mean().item())
    with pytest.raises(ValueError, match="key_valid"):
        layout_from_tile_mask(mask, 16, torch.ones(2, 3, 64, dtype=torch.bool))


def test_reference_matches_sdpa_with_padding_keys():
    q, k, v, layout = random_case(density=0.4, pad=0.3)
    tokens = layout.tile_mask().repeat_interleave(16, -2).repeat_interleave(16, -1) & layout.key_valid[:, :, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens)
    out = block_sparse_attention_reference(q, k, v, layout)
    rows = layout.key_valid  # a valid query sees at least itself (diagonal tile kept)
    torch.testing.assert_close(out[rows], expected[rows], atol=1e-5, rtol=1e-5)
    scaled = block_sparse_attention_reference(q, k, v, layout, scale=0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens, scale=0.5)
    torch.testing.assert_close(scaled[rows], expected[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(block_sparse_attention(q, k, v, layout, backend="dense"), out)


def test_reference_rows_without_valid_keys_are_zero():
    q, k, v, _ = random_case(length=32)
    mask = torch.tensor([[True, False], [True, True]]).expand(1, 2, 2, 2)
    key_valid = torch.ones(1, 2, 32, dtype=torch.bool)
    key_valid[..., :16] = False  # query tile 0 keeps only key tile 0, all padding
    out = block_sparse_attention_reference(q, k, v, layout_from_tile_mask(mask, 16, key_valid))
    assert torch.equal(out[:, :, :16], torch.zeros_like(out[:, :, :16]))
    assert out[:, :, 16:].abs().sum() > 0


def test_flex_matches_reference():
    for seed, density in [(0, 0.5), (1, 0.25)]:  # one compile: same shapes, new layouts
        q, k, v, layout = random_case(seed, density=density)
        out = block_sparse_attention_flex(q, k, v, layout)
        assert rel_l2(out, block_sparse_attention_reference(q, k, v, layout), layout) < 1e-4
    out = block_sparse_attention_flex(q, k, v, layout, scale=0.3)
    assert rel_l2(out, block_sparse_attention_reference(q, k, v, layout, scale=0.3), layout) < 1e-4
    mask = layout.tile_mask()
    mask[..., 0, :], mask[..., 0, 0], mask[..., 1, :] = False, True, False  # tile 0: only padding; tile 1: nothing
    layout.key_valid[..., :16] = False
    out = block_sparse_attention_flex(q, k, v, layout_from_tile_mask(mask, 16, layout.key_valid))
    assert torch.equal(out[:, :, :32], torch.zeros_like(out[:, :, :32]))  # as the reference: no valid key -> 0


TRITON_SCRIPT = """
import torch
from test_block_sparse import random_case, rel_l2
from kinegen.sparse_attn.block_sparse import block_sparse_attention_reference, block_sparse_attention_triton
errors = []
for seed, scale in [(0, None), (1, 0.3)]:
    q, k, v, layout = random_case(seed, length=64, density=0.5)
    out = block_sparse_attention_triton(q, k, v, layout, scale=scale)
    errors.append(rel_l2(out, block_sparse_attention_reference(q, k, v, layout, scale=scale), layout))
layout.key_valid[..., :16] = False  # some queries may now see no valid key: both give 0 there
out = block_sparse_attention_triton(q, k, v, layout)
errors.append((out - block_sparse_attention_reference(q, k, v, layout)).abs().max().item())
print(max(errors))
"""


def test_triton_kernel_matches_reference_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(__file__), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) < 1e-4


def test_backend_errors(monkeypatch):
    q, k, v, layout = random_case(length=32)
    with pytest.raises(ValueError, match="auto, dense, flex, triton; got 'nope'"):
        block_sparse_attention(q, k, v, layout, backend="nope")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU, or TRITON_INTERPRET=1"):
        block_sparse_attention_triton(q, k, v, layout)
    with pytest.raises(ValueError, match="tiles"):
        block_sparse_attention_reference(q[:, :, :16], k, v, layout)
