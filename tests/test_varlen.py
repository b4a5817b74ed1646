"""Key-list (variable-length) sparse attention (kinegen.sparse_attn.varlen): layout, reference, gather, flex, Triton.

Small shapes: the compiled flex kernel compiles once for the module (about 10-20 s on CPU, one shape), and
the Triton kernel runs in its interpreter in a subprocess (TRITON_INTERPRET must be set before triton is
imported, and this process may already have imported it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kinegen.sparse_attn import blocks as B
from kinegen.sparse_attn.varlen import (
    KeyListLayout,
    _runs,
    key_lists,
    varlen_attention,
    varlen_attention_gather,
    varlen_attention_reference,
    varlen_attention_triton,
)


def random_case(seed=0, G=2, N=150, D=16, Kq=7, Kk=11, tile=16, block=16):
    """Random q, k, v, labels and keep with the corner cases: query cluster Kq-2 is one token and Kq-1 is empty,
    key cluster Kk-2 is one token and Kk-1 is empty; query cluster 0 keeps one key cluster, 1 keeps all,
    2 keeps none (an empty list), the others ~35% (the empty key cluster included at random)."""
    g = torch.Generator().manual_seed(seed)
    q_labels = torch.randint(0, Kq - 2, (G, N), generator=g)
    q_labels[:, 7] = Kq - 2
    k_labels = torch.randint(0, Kk - 2, (G, N), generator=g)
    k_labels[:, 11] = Kk - 2
    keep = torch.rand(G, Kq, Kk, generator=g) < 0.35
    keep[:, 0] = False
    keep[:, 0, 3] = True
    keep[:, 1] = True
    keep[:, 2] = False
    q, k, v = (torch.randn(G, N, D, generator=g) for _ in range(3))
    return q, k, v, q_labels, k_labels, keep, key_lists(q_labels, k_labels, keep, tile, block)


def brute_force(q, k, v, q_labels, k_labels, keep, scale=None):
    """Per-token loop: token t attends to the keys whose cluster its cluster keeps (none: zeros)."""
    G, N, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros_like(q)
    for g in range(G):
        for t in range(N):
            keys = keep[g, q_labels[g, t], k_labels[g]]
            if keys.any():
                out[g, t] = torch.softmax(q[g, t] @ k[g, keys].T * scale, -1) @ v[g, keys]
    return out


def test_layout_hand_example():
    q_labels = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2]])  # 5, 3, 2 tokens: 2, 1, 1 tiles of 4
    k_labels = torch.tensor([[1, 0, 1, 1, 0, 2, 1, 1, 0, 1]])  # k0 = {1, 4, 8}, k1 = {0, 2, 3, 6, 7, 9}, k2 = {5}
    keep = torch.tensor([[[True, False, True], [False, True, False], [True, True, True]]])
    lay = key_lists(q_labels, k_labels, keep, tile=4, block=4)
    assert lay.list_len.tolist() == [[4, 6, 10]]
    assert lay.list_start.tolist() == [[0, 4, 12]]
    assert lay.kv_index.tolist() == [[1, 4, 8, 5, 0, 2, 3, 6, 7, 9, -1, -1, 1, 4, 8, 0, 2, 3, 6, 7, 9, 5, -1, -1]]
    assert lay.tile_list.tolist() == [[0, 0, 1, 2]]
    assert lay.q_slots.tolist() == [[0, 1, 2, 3, 4, -1, -1, -1, 5, 6, 7, -1, 8, 9, -1, -1]]
    assert torch.equal(lay.q_slots.gather(1, lay.token_slot), torch.arange(10).unsqueeze(0))
    # 2 tiles x 4 rows x 4 + 1 x 4 x 8 + 1 x 4 x 12 = 112 executed pairs; the tile layout executes
    # (2 x 2 + 1 x 2 + 1 x 4) tiles of 4 x 4 = 160.
    assert lay.executed_pairs().item() == 112
    assert lay.executed_density().item() == pytest.approx(112 / 100)
    nq, nk = torch.tensor([[5, 3, 2]]), torch.tensor([[3, 6, 1]])
    assert B.work_stats(keep, nq, nk, 4, 10)["density"].item() * 100 == pytest.approx(160)


def test_layout_numbers_random():
    _, _, _, q_labels, k_labels, keep, lay = random_case()
    G, Kq, Kk = keep.shape
    nk = torch.zeros(G, Kk, dtype=torch.long).scatter_add_(1, k_labels, torch.ones_like(k_labels))
    assert torch.equal(lay.list_len, (keep * nk.unsqueeze(1)).sum(-1))
    padded = lay.padded_len()
    assert torch.equal(padded % lay.block, torch.zeros_like(padded))
    assert torch.equal(lay.list_start, padded.cumsum(-1) - padded)
    assert lay.kv_index.shape[1] == padded.sum(-1).max()
    for g in range(G):
        for i in range(Kq):
            a, n = lay.list_start[g, i].item(), lay.list_len[g, i].item()
            expected = keep[g, i, k_labels[g]].nonzero().flatten()
            assert sorted(lay.kv_index[g, a: a + n].tolist()) == expected.tolist()
            assert (lay.kv_index[g, a + n: a + padded[g, i]] == -1).all()
    assert (lay.list_len[:, 2] == 0).all() and (lay.list_len[:, 1] == 150).all()
    live = lay.tile_list >= 0
    hand = sum(lay.tile * padded[g, lay.tile_list[g, t]].item() for g in range(G) for t in range(live.shape[1])
               if live[g, t])
    assert lay.executed_pairs().item() == hand
    moved = lay.to("cpu")
    assert isinstance(moved, KeyListLayout) and torch.equal(moved.kv_index, lay.kv_index)


def test_backends_match_reference_and_brute_force():
    q, k, v, q_labels, k_labels, keep, lay = random_case()
    ref = varlen_attention_reference(q, k, v, lay)
    torch.testing.assert_close(ref, brute_force(q, k, v, q_labels, k_labels, keep), atol=1e-5, rtol=1e-5)
    empty = q_labels == 2  # query cluster 2 keeps nothing: zeros, no NaN
    assert empty.any() and torch.equal(ref[empty], torch.zeros_like(ref[empty]))
    for backend in ("gather", "flex"):
        out = varlen_attention(q, k, v, lay, backend=backend)
        assert not out.isnan().any()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, msg=backend)
    assert torch.equal(varlen_attention(q, k, v, lay), varlen_attention(q, k, v, lay, backend="gather"))  # auto, CPU
    ref = varlen_attention_reference(q, k, v, lay, scale=0.3)
    torch.testing.assert_close(ref, brute_force(q, k, v, q_labels, k_labels, keep, 0.3), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(varlen_attention(q, k, v, lay, backend="gather", scale=0.3), ref, atol=1e-5, rtol=1e-5)


def test_gather_runs_bound_their_padding_and_give_the_same_output():
    """The gather backend cuts its batches where a list is more than ``pad`` longer than the run's first (each run
    pads to its longest list), besides query-row changes; any cut gives the same output."""
    rows = torch.tensor([64, 64, 64, 64, 64, 128, 128])
    lens = torch.tensor([100, 105, 130, 140, 300, 50, 200])
    spans = [r.tolist() for r in _runs(rows, rows * lens, 1, lens, pad=0.1)]
    assert spans == [[0, 1], [2, 3], [4], [5], [6]]  # 130 > 1.1 x 100, 300 > 1.1 x 130; 128 rows start anew
    assert [r.tolist() for r in _runs(rows, rows * lens, 1)] == [[0, 1, 2, 3, 4], [5, 6]]  # query rows only
    for span in spans:  # no run pads more than 10% of its first list
        assert max(lens[span]) <= 1.1 * lens[span[0]]
    q, k, v, q_labels, k_labels, keep, lay = random_case(seed=3, N=300, Kq=12, Kk=15)
    one = varlen_attention_gather(q, k, v, lay, buckets=1, pad=1e9)
    for pad in (0.0, 0.1, 0.5):
        torch.testing.assert_close(varlen_attention_gather(q, k, v, lay, pad=pad), one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one, varlen_attention_reference(q, k, v, lay), atol=1e-5, rtol=1e-5)


def test_padding_and_other_clusters_are_never_attended():
    """Padding slots read key row 0 in gather / flex: make key 0 huge; tokens whose lists lack it must not move."""
    q, k, v, q_labels, k_labels, keep, lay = random_case()
    assert (lay.kv_index == -1).any()
    G = q.shape[0]
    sees_0 = keep[torch.arange(G).unsqueeze(1), q_labels, k_labels[:, :1]]  # [G, N]
    assert (~sees_0).any() and sees_0.any()
    k2, v2 = k.clone(), v.clone()
    k2[:, 0], v2[:, 0] = 1e4, 1e4
    for backend in ("reference", "gather", "flex"):
        before = varlen_attention(q, k, v, lay, backend=backend)
        after = varlen_attention(q, k2, v2, lay, backend=backend)
        torch.testing.assert_close(after[~sees_0], before[~sees_0], atol=1e-6, rtol=0, msg=backend)
        assert (after[sees_0] - before[sees_0]).abs().max() > 1  # the huge key is attended where kept


def test_keep_all_equals_dense_sdpa():
    g = torch.Generator().manual_seed(3)
    G, N, D = 2, 100, 16
    q_labels, k_labels = torch.randint(0, 5, (G, N), generator=g), torch.randint(0, 9, (G, N), generator=g)
    q, k, v = (torch.randn(G, N, D, generator=g) for _ in range(3))
    lay = key_lists(q_labels, k_labels, torch.ones(G, 5, 9, dtype=torch.bool), tile=16, block=16)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for backend in ("reference", "gather"):
        torch.testing.assert_close(varlen_attention(q, k, v, lay, backend=backend), dense, atol=1e-5, rtol=1e-5)


def test_backend_errors(monkeypatch):
    q, k, v, *_, lay = random_case()
    with pytest.raises(ValueError, match="auto, reference, gather, flex, triton; got 'nope'"):
        varlen_attention(q, k, v, lay, backend="nope")
    with pytest.raises(ValueError, match="layout covers"):
        varlen_attention(q[:, :100], k, v, lay, backend="gather")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU, or TRITON_INTERPRET=1"):
        varlen_attention_triton(q, k, v, lay)


TRITON_SCRIPT = """
import sys
import torch
from test_varlen import random_case
from kinegen.sparse_attn.varlen import varlen_attention, varlen_attention_reference
q, k, v, *_, lay = random_case(N=70, Kq=5, Kk=7)
errors = []
for scale in (None, 0.3):
    out = varlen_attention(q, k, v, lay, backend="triton", scale=scale)
    errors.append((out - varlen_attention_reference(q, k, v, lay, scale=scale)).abs().max().item())
assert not out.isnan().any()
print(max(errors))
"""


def test_triton_kernel_matches_reference_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(__file__), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) < 1e-5


def test_import_does_not_import_triton():
    code = "import sys, kinegen.sparse_attn.varlen; print('triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "False"
