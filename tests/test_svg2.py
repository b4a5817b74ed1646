"""SVG2 (kinegen.sparse_attn.svg2): selection, k-means, density and config, on hand-checkable inputs."""

from __future__ import annotations

import pytest
import torch

from kinegen.sparse_attn.svg2 import (
    SVG2Attention,
    SVG2Config,
    svg2_density,
    svg2_kmeans,
    svg2_reference_attention,
    svg2_select,
)
from kinegen.sparse_attn.varlen import key_list_work


def _one_row(sizes, top_p, min_kc_ratio=0.0):
    """One query cluster over key clusters of these sizes, all with the same similarity: P_j = n_j / sum n."""
    nk = torch.tensor([sizes])
    Kk = len(sizes)
    keep = svg2_select(torch.zeros(1, 1, 4), torch.tensor([[7]]), torch.zeros(1, Kk, 4), nk, 0.5, top_p, min_kc_ratio)
    return keep[0, 0].nonzero().flatten().tolist()


# ---------------------------------------------------------------------------- selection


@pytest.mark.parametrize("top_p, kept", [
    (0.4, [1]),           # rank 0 alone carries the sum (0.5) past 0.4: that crossing cluster is kept, no more
    (0.5, [1, 3]),        # mass before rank 1 is 0.5 = top_p, "at most top_p": rank 1 kept
    (0.7, [1, 3]),        # rank 1 carries the sum past 0.7 (to 0.75) and is kept
    (0.75, [0, 1, 3]),    # mass before rank 2 is exactly 0.75: kept; before rank 3 it is 0.875
    (0.875, [0, 1, 2, 3]),
    (1.0, [0, 1, 2, 3]),
])
def test_select_top_p_boundary(top_p, kept):
    # sizes 1, 4, 1, 2 -> P = 1/8, 1/2, 1/8, 1/4 (exact in binary); by rank: clusters 1, 3, 0, 2 (ties by index)
    assert _one_row([1, 4, 1, 2], top_p) == kept


def test_select_always_keeps_the_best_cluster():
    assert _one_row([1, 4, 1, 2], 1e-9) == [1]


def test_select_min_ratio_is_a_floor_over_all_key_clusters():
    sizes = [100] + [1] * 9  # P_0 = 100/109 > 0.9: top-p alone keeps only cluster 0
    assert _one_row(sizes, 0.9) == [0]
    assert _one_row(sizes, 0.9, 0.25) == [0, 1]  # int(0.25 * 10) = 2 clusters
    assert _one_row(sizes, 0.9, 0.39) == [0, 1, 2]  # int(3.9) = 3
    assert len(_one_row(sizes, 0.9, 1.0)) == 10


def test_select_uses_similarity_and_size():
    # A near key cluster (score 2) of 1 token against a far one (score 0): mass e^2 ~ 7.39 against its size.
    # With 7 tokens the near one ranks first (0.51 of the mass, past top_p 0.5: the far one is dropped).
    cq = torch.tensor([[[1.0, 0.0]]])
    ck = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])
    keep = svg2_select(cq, torch.tensor([[3]]), ck, torch.tensor([[1, 7]]), 1.0, 0.5, 0.0)
    assert keep[0, 0].tolist() == [True, False]
    keep = svg2_select(cq, torch.tensor([[3]]), ck, torch.tensor([[1, 8]]), 1.0, 0.5, 0.0)  # 8 > e^2: far first
    assert keep[0, 0].tolist() == [False, True]


def test_select_empty_clusters_never_kept_and_keep_nothing():
    cq = torch.randn(1, 3, 8)
    ck = torch.randn(1, 5, 8)
    nq = torch.tensor([[4, 0, 6]])
    nk = torch.tensor([[3, 0, 2, 0, 5]])
    keep = svg2_select(cq, nq, ck, nk, 8 ** -0.5, 1.0, 1.0)  # min ratio 1: every non-empty key cluster
    assert not keep[0, 1].any()  # empty query cluster
    assert not keep[0, :, 1].any() and not keep[0, :, 3].any()  # empty key clusters
    assert keep[0, 0].tolist() == [True, False, True, False, True]


def test_select_is_batched_per_group():
    torch.manual_seed(0)
    cq, ck = torch.randn(3, 4, 8), torch.randn(3, 6, 8)
    nq, nk = torch.randint(1, 9, (3, 4)), torch.randint(1, 9, (3, 6))
    whole = svg2_select(cq, nq, ck, nk, 0.3, 0.8, 0.2)
    for g in range(3):
        one = svg2_select(cq[g:g + 1], nq[g:g + 1], ck[g:g + 1], nk[g:g + 1], 0.3, 0.8, 0.2)
        assert torch.equal(whole[g:g + 1], one)


# ---------------------------------------------------------------------------- density and work


def test_density_counts_kept_token_pairs():
    keep = torch.tensor([[[True, False], [False, True]]])
    nq, nk = torch.tensor([[2, 3]]), torch.tensor([[1, 4]])
    # kept: 2*1 + 3*4 = 14 of 5*5 = 25
    assert svg2_density(keep, nq, nk).tolist() == [pytest.approx(14 / 25)]
    # query cluster 0: 2 rows -> 1 tile of 4, 1 key -> 1 block of 4: 16; cluster 1: 3 rows -> 4, 4 keys -> 4: 16
    assert key_list_work(keep, nq, nk, 4, 4).tolist() == [32]


# ---------------------------------------------------------------------------- k-means


def _blobs(groups=2, per_blob=30, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.eye(dim)[:4] * 20.0
    x = (centers.repeat_interleave(per_blob, 0) + 0.1 * torch.randn(4 * per_blob, dim, generator=g))
    truth = torch.arange(4).repeat_interleave(per_blob)
    return x.expand(groups, -1, -1).contiguous(), truth, centers


def test_kmeans_converges_to_blobs_and_stops_early():
    x, truth, _ = _blobs()
    perm = torch.tensor([2, 0, 3, 1])
    init = x[:, perm * 30 + 5] + 0.5  # one (shifted) point of every blob, in another order
    labels, cents, sizes, ran = svg2_kmeans(x, 4, 50, init=init, tol=1e-4)
    # iteration 1 moves the centroids to the blob means, iteration 2 finds no move and stops
    assert ran == 2
    for g in range(2):
        assert torch.equal(labels[g], perm.argsort()[truth])
        assert sizes[g].tolist() == [30] * 4
        means = torch.stack([x[g][labels[g] == c].mean(0) for c in range(4)])
        assert torch.allclose(cents[g], means, atol=1e-5)


def test_kmeans_cold_start_draws_tokens_with_replacement():
    x, _, _ = _blobs(groups=3)
    gen = torch.Generator().manual_seed(7)
    # tol = inf stops after the first assignment and returns the centroids it was made against: the draw
    _, cents, _, ran = svg2_kmeans(x, 50, 10, generator=gen, tol=float("inf"))
    picks = torch.randint(0, x.shape[1], (3, 50), generator=torch.Generator().manual_seed(7))
    assert ran == 1
    assert torch.equal(cents, torch.gather(x, 1, picks.unsqueeze(-1).expand(-1, -1, x.shape[2])))


def test_kmeans_tolerance_and_iteration_count():
    x, _, _ = _blobs()
    init = x[:, [0, 1, 2, 3]]  # all in blob 0: many iterations before nothing moves
    assert svg2_kmeans(x, 4, 5, init=init, tol=0.0)[3] == 5  # tol 0 never stops early
    _, c1, _, ran = svg2_kmeans(x, 4, 5, init=init, tol=1e9)
    assert ran == 1 and torch.equal(c1, init)  # stopped at once: the update is not adopted
    _, c2, _, ran = svg2_kmeans(x, 4, 1, init=init, tol=0.0)
    assert ran == 1 and not torch.equal(c2, init)  # out of iterations: the update is adopted


def test_kmeans_early_stop_is_one_decision_for_the_batch():
    x, _, _ = _blobs()
    settled = svg2_kmeans(x[:1], 4, 50, init=x[:1, [5, 35, 65, 95]])[1]  # group 0 at its fixed point
    init = torch.cat([settled, x[1:, [0, 1, 2, 3]]])  # group 1 far from it
    assert svg2_kmeans(x[:1], 4, 50, init=settled, tol=1e-4)[3] == 1  # group 0 alone: stops at once
    assert svg2_kmeans(x, 4, 50, init=init, tol=1e-4)[3] == 4  # with group 1: runs as long as group 1 needs
    assert svg2_kmeans(x[1:], 4, 50, init=init[1:], tol=1e-4)[3] == 4


def test_kmeans_empty_cluster_keeps_its_centroid():
    x, _, _ = _blobs(groups=1)
    init = torch.cat([x[:, [5, 35, 65, 95]], torch.full((1, 1, 8), 1e3)], 1)  # a fifth centroid far away
    labels, cents, sizes, _ = svg2_kmeans(x, 5, 3, init=init, tol=0.0)
    assert sizes[0, 4] == 0 and not (labels == 4).any()
    assert torch.equal(cents[0, 4], init[0, 4])


def test_kmeans_warm_start_keeps_labels_on_a_small_perturbation():
    torch.manual_seed(0)
    x = torch.randn(2, 300, 16)  # no cluster structure: many tokens sit near a boundary
    labels, cents, _, _ = svg2_kmeans(x, 12, 100, generator=torch.Generator().manual_seed(1), tol=0.0)
    nudged = x + 1e-3 * torch.randn_like(x)  # the next denoising step, roughly
    warm_labels, _, _, ran = svg2_kmeans(nudged, 12, 2, init=cents, tol=1e-4)
    assert ran == 2 and torch.equal(warm_labels, labels)
    # Nothing moved at all: the first iteration's move is 0 < tol, it stops there
    assert svg2_kmeans(x, 12, 2, init=cents, tol=1e-4)[3] == 1


def test_kmeans_takes_a_strided_view():
    x = torch.randn(3, 70, 8)
    view = x[:, 5:65]  # the video part of a [video, text] sequence
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    a, b = svg2_kmeans(view, 6, 5, generator=gen()), svg2_kmeans(view.contiguous(), 6, 5, generator=gen())
    assert all(torch.equal(p, q) for p, q in zip(a[:3], b[:3], strict=True)) and a[3] == b[3]


def test_kmeans_keeps_the_input_dtype_for_centroids():
    x = torch.randn(1, 64, 8).bfloat16()
    labels, cents, sizes, _ = svg2_kmeans(x, 4, 3, generator=torch.Generator().manual_seed(0))
    assert cents.dtype == torch.bfloat16 and labels.dtype == torch.int64 and int(sizes.sum()) == 64


# ---------------------------------------------------------------------------- reference attention


def test_reference_attention_keeping_everything_is_dense():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 20, 8).unbind(0)
    lq, lk = torch.randint(0, 3, (2, 20)), torch.randint(0, 4, (2, 20))
    out = svg2_reference_attention(q, k, v, lq, lk, torch.ones(2, 3, 4, dtype=torch.bool))
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5)


# ---------------------------------------------------------------------------- config and module


def test_config_defaults_give_svg2s_wan_720p_counts():
    cfg = SVG2Config()
    assert cfg.num_clusters(75_600) == (300, 1000)
    assert cfg.num_clusters(32_760) == (130, 434)
    assert cfg.num_clusters(50) == (1, 1)  # at least 1
    assert SVG2Config(q_tokens_per_cluster=0.5).num_clusters(50) == (50, 1)  # at most the tokens
    assert (cfg.top_p, cfg.min_kc_ratio, cfg.iters, cfg.warm_iters, cfg.tol) == (0.9, 0.1, 50, 2, 1e-4)
    assert (cfg.dense_warmup, cfg.dense_layers, cfg.tile, cfg.block, cfg.backend) == (0.2, 1, 64, 64, "auto")


@pytest.mark.parametrize("kwargs, message", [
    ({"q_tokens_per_cluster": 0}, "q_tokens_per_cluster must be a finite number > 0"),
    ({"k_tokens_per_cluster": float("nan")}, "k_tokens_per_cluster must be a finite number > 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"min_kc_ratio": 1.5}, r"min_kc_ratio must be in \[0, 1\]"),
    ({"iters": 0}, "iters must be an integer >= 1"),
    ({"warm_iters": 0}, "warm_iters must be an integer >= 1"),
    ({"block": 0}, "block must be an integer >= 1"),
    ({"tol": -1.0}, "tol must be a finite number >= 0"),
    ({"dense_warmup": 1.0}, r"dense_warmup must be in \[0, 1\)"),
    ({"dense_layers": -1}, "dense_layers must be >= 0"),
    ({"backend": "cuda-magic"}, "backend must be one of auto, "),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SVG2Config(**kwargs)


def test_module_clusters_cold_then_warm_from_its_own_centroids():
    cfg = SVG2Config(q_tokens_per_cluster=40, k_tokens_per_cluster=20, iters=30, warm_iters=2)
    attn = SVG2Attention(cfg)
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 2, 160, 16).unbind(0)
    qs, ks, info = attn._cluster(q, k, (1, 10, 16))
    assert info["anchor"] and qs.centroids.shape == (1, 2, 4, 16) and ks.centroids.shape == (1, 2, 8, 16)
    attn.q_state, attn.k_state = qs, ks
    q2, k2 = q + 0.01 * torch.randn_like(q), k + 0.01 * torch.randn_like(k)
    qs2, ks2, info2 = attn._cluster(q2, k2, (1, 10, 16))
    assert not info2["anchor"] and max(info2["kmeans_iters"]) <= 2
    expected = svg2_kmeans(k2.reshape(2, 160, 16), 8, 2, init=ks.centroids.reshape(2, 8, 16), tol=cfg.tol)
    assert torch.equal(ks2.labels.reshape(2, 160), expected[0])
    assert torch.equal(ks2.centroids.reshape(2, 8, 16), expected[1])
    attn.reset()
    assert attn._cluster(q, k, (1, 10, 16))[2]["anchor"]


def test_module_select_hook_is_svg2_select():
    attn = SVG2Attention(SVG2Config(top_p=0.5, min_kc_ratio=0.0))
    torch.manual_seed(0)
    cq, ck = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    nq, nk = torch.randint(1, 5, (2, 3)), torch.randint(1, 5, (2, 5))
    assert torch.equal(attn._select(cq, nq, ck, nk, 0.35), svg2_select(cq, nq, ck, nk, 0.35, 0.5, 0.0))


def test_module_hooks_compose_to_the_reference():
    """cluster -> select -> key lists -> attention equals the dense masked reference, and the density the
    module reports before building the layout is the layout's executed density."""
    cfg = SVG2Config(q_tokens_per_cluster=24, k_tokens_per_cluster=8, tile=16, block=16, top_p=0.7)
    attn = SVG2Attention(cfg)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 192, 16).unbind(0)
    qs, ks, _ = attn._cluster(q, k, (3, 8, 8))
    (lq, cq, nq), (lk, ck, nk) = attn._flat(q, qs), attn._flat(k, ks)
    keep = attn._select(cq, nq, ck, nk, 0.25)
    layout = attn._layout(lq, lk, keep, nq, nk, "gather")
    out = attn._attend(q[0], k[0], v[0], layout, "gather", 0.25)
    ref = svg2_reference_attention(q[0], k[0], v[0], lq, lk, keep, 0.25)
    assert torch.allclose(out, ref, atol=1e-5)
    stats = attn._work_stats(keep, nq, nk, 192)
    assert float(stats["density"]) == pytest.approx(float(layout.executed_density()))
    assert float(stats["useful_density"]) == pytest.approx(float(svg2_density(keep, nq, nk).mean()))


def test_module_forward_end_to_end_with_text_tokens():
    attn = SVG2Attention(SVG2Config(q_tokens_per_cluster=24, k_tokens_per_cluster=8, tile=16, block=16))
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 192 + 5, 16).unbind(0)  # 192 video tokens, then 5 text tokens
    valid = torch.ones(1, 197, dtype=torch.bool)
    valid[:, -2:] = False  # two padded text keys
    # SVG2's computation end to end, text as one extra cluster on each side.
    from kinegen.sparse_attn.hva import _add_text_cluster

    for call in range(2):
        out = attn(q, k, v, grid=(3, 8, 8), text_tokens=5, key_valid=valid)
        assert attn.last_stats["anchor"] == (call == 0) and attn.last_stats["call"] == call + 1
    lq, lk = attn.q_state.labels.reshape(2, 192), attn.k_state.labels.reshape(2, 192)
    nq, nk = attn.q_state.sizes.reshape(2, -1), attn.k_state.sizes.reshape(2, -1)
    keep = svg2_select(attn.q_state.centroids.reshape(2, -1, 16), nq, attn.k_state.centroids.reshape(2, -1, 16), nk,
                       0.25, attn.config.top_p, attn.config.min_kc_ratio)
    lq, lk, keep, _, _ = _add_text_cluster(lq, lk, keep, nq, nk, 5, valid[:, -5:].expand(2, -1))
    ref = svg2_reference_attention(q[0], k[0], v[0], lq, lk, keep)
    assert torch.allclose(out[0], ref, atol=1e-5)
