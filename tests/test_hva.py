"""HyperVAttention pieces on tiny grids: local-window clustering, hybrid steps, merging, selection, layout,
and the whole module against dense attention (and the SVG2-style baseline beside it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from kinegen.sparse_attn import blocks as B
from kinegen.sparse_attn.clustering import (
    assign_local,
    candidate_centroids,
    global_kmeans,
    grid_init,
    local_kmeans,
    refine,
    update_centroids,
    window_grid,
)
from kinegen.sparse_attn.hva import MIN_TOKENS, HVAConfig, HVAttention, KMeansSparseAttention, KMeansSparseConfig

GRID = (4, 8, 8)


def _structured(n_heads=2, d=16, seed=0, grid=GRID):
    """q, k with spatial structure (smooth over the grid, as video tokens are) plus noise."""
    g = torch.Generator().manual_seed(seed)
    F, H, W = grid
    base = torch.randn(1, n_heads, F // 2 + 1, H // 2 + 1, W // 2 + 1, d, generator=g)
    smooth = base.repeat_interleave(2, 2).repeat_interleave(2, 3).repeat_interleave(2, 4)[:, :, :F, :H, :W]
    x = smooth.reshape(1, n_heads, F * H * W, d)
    return (x * 2 + 0.3 * torch.randn(x.shape, generator=g)), (x * 2 + 0.3 * torch.randn(x.shape, generator=g))


def _values(q, seed=1):
    """Values drawn from their own generator, so results do not depend on which tests ran before."""
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(seed))


def _sse(x, state):
    c = torch.gather(state.centroids, 2, state.labels.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))
    return float((x - c).square().sum())


def test_windows_cover_the_grid_and_neighbours_are_3x3x3():
    wg = window_grid((5, 6, 7), (2, 4, 4))
    assert wg.counts == (3, 2, 2)
    tokens = wg.order[wg.order >= 0]
    assert sorted(tokens.tolist()) == list(range(5 * 6 * 7))  # every token in exactly one window
    assert ((wg.neighbours >= 0).sum(1) <= 27).all() and (wg.neighbours[:, 13] == torch.arange(12)).all()
    big = window_grid((6, 12, 12), (2, 4, 4))
    assert int((big.neighbours >= 0).sum(1).max()) == 27  # an interior window sees 27 windows


def test_lead_frames_get_windows_of_their_own():
    wg = window_grid((5, 6, 7), (2, 4, 4), lead_frames=1)  # frame windows {0}, {1, 2}, {3, 4}
    assert wg.counts == (3, 2, 2)
    assert sorted(wg.order[wg.order >= 0].tolist()) == list(range(5 * 6 * 7))
    frame_of = wg.window_of_token.view(5, 6, 7) // (2 * 2)
    assert frame_of[:, 0, 0].tolist() == [0, 1, 1, 2, 2]
    plain = window_grid((5, 6, 7), (2, 4, 4))
    assert (plain.window_of_token.view(5, 6, 7) // 4)[:, 0, 0].tolist() == [0, 0, 1, 1, 2]
    assert window_grid((5, 6, 7), (1, 4, 4), lead_frames=1).counts == (5, 2, 2)  # one frame per window anyway


def test_local_assignment_is_the_nearest_candidate_and_costs_far_less_than_global():
    q, _ = _structured()
    wg = window_grid(GRID, (1, 2, 2))
    c = grid_init(q, wg, 1)
    a = assign_local(q, c, wg, 1)
    cand = candidate_centroids(wg, 1)
    for t in [0, 37, 100, 255]:
        cs = cand[wg.window_of_token[t]]
        cs = cs[cs >= 0]
        d = (c[0, 1, cs] - q[0, 1, t]).square().sum(-1)
        assert cs[d.argmin()] == a.labels[0, 1, t]
        best, second = d.sort().values[:2]
        torch.testing.assert_close(a.margin[0, 1, t], second - best, rtol=1e-4, atol=1e-4)
    assert torch.isinf(assign_local(q, c, wg, 1, margin=False).margin).all()  # labels only
    n, k = q.shape[2], c.shape[2]
    assert a.distance_evals <= 27 * n * 2 and a.distance_evals * 2 < n * k * 2  # 64 windows, <= 27 candidates
    sub = torch.tensor([1, 99, 200])
    s = assign_local(q, c, wg, 1, sub)
    assert torch.equal(s.labels[:, :, sub], a.labels[:, :, sub]) and (s.labels[:, :, 0] == -1).all()


def test_lloyd_iterations_never_increase_the_error_and_grid_start_is_window_means():
    q, _ = _structured()
    wg = window_grid(GRID, (2, 4, 4))
    c0 = grid_init(q, wg, 1)
    torch.testing.assert_close(c0[0, 0, 0], q[0, 0, wg.order[0]].mean(0))
    errs = [_sse(q, local_kmeans(q, GRID, (2, 4, 4), 2, iters)[0]) for iters in (1, 2, 4)]
    assert errs[0] >= errs[1] - 1e-3 >= errs[2] - 2e-3


def test_hybrid_step_reassigns_only_the_least_certain_tokens():
    q, _ = _structured()
    state, full_evals = local_kmeans(q, GRID, (2, 4, 4), 1, 3)
    moved = q + 0.05 * _values(q)
    new, evals = refine(moved, state, GRID, (2, 4, 4), 1, 0.25)
    changed = (new.labels != state.labels).any(dim=(0, 1))
    least = state.margin.mean(dim=(0, 1)).topk(64, largest=False).indices
    assert set(changed.nonzero().flatten().tolist()) <= set(least.tolist())
    assert evals < full_evals / 3 / 3  # a quarter of the tokens, one pass instead of three


def test_global_kmeans_baseline_runs_and_warm_starts():
    q, _ = _structured()
    s, e = global_kmeans(q, 16, 5, generator=torch.Generator().manual_seed(0))
    assert e == 2 * 256 * 16 * 5 and s.sizes.sum() == 2 * 256
    s2, _ = global_kmeans(q, 16, 1, init=s.centroids)
    assert (s2.labels == s.labels).float().mean() > 0.9


def test_triton_clustering_kernels_match_the_torch_reference_under_the_interpreter():
    code = """
import torch
from kinegen.sparse_attn.clustering import window_grid, grid_init, assign_local, update_centroids
from kinegen.sparse_attn.kernels import assign_local_triton, update_centroids_triton
torch.manual_seed(0)
x = torch.randn(1, 2, 4 * 6 * 8, 16)
wg = window_grid((4, 6, 8), (2, 3, 4))
c = grid_init(x, wg, 2) + 0.1 * torch.randn(1, 2, wg.num_windows * 2, 16)
a, b = assign_local(x, c, wg, 2), assign_local_triton(x, c, wg, 2)
assert torch.equal(a.labels, b.labels) and a.distance_evals == b.distance_evals
assert (a.margin - b.margin).abs().max() < 1e-4
sub = torch.tensor([0, 5, 17, 100, 191])
assert torch.equal(assign_local(x, c, wg, 2, sub).labels, assign_local_triton(x, c, wg, 2, sub).labels)
c1, n1 = update_centroids(x, a.labels, c)
c2, n2 = update_centroids_triton(x, a.labels, c)
assert (c1 - c2).abs().max() < 1e-5 and torch.equal(n1, n2)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_merging_fills_tiles_conserves_tokens_and_respects_the_error_bound():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(2, 24, 8, generator=g)
    n = torch.randint(1, 40, (2, 24), generator=g)
    root = B.merge_clusters(c, n, 16, mse=torch.full((2,), 1e3))
    merged = torch.zeros_like(n).scatter_add_(1, root, n)
    assert torch.equal(merged.sum(1), n.sum(1))
    assert (B.num_tiles(merged, 16).sum(1) < B.num_tiles(n, 16).sum(1)).all()
    assert torch.equal(B.merge_clusters(c, n, 16, mse=torch.zeros(2)), torch.arange(24).expand(2, 24))  # tau * 0
    full = torch.full((1, 4), 16)  # whole tiles already: nothing to save
    assert torch.equal(B.merge_clusters(torch.randn(1, 4, 8), full, 16, mse=torch.ones(1) * 1e3),
                       torch.arange(4).expand(1, 4))


def test_selection_by_top_p_and_by_density_budget():
    g = torch.Generator().manual_seed(0)
    cq, ck = torch.randn(1, 6, 8, generator=g), torch.randn(1, 10, 8, generator=g)
    nq, nk = torch.full((1, 6), 32), torch.full((1, 10), 32)
    P = B.cluster_scores(cq, nq, ck, nk, 8 ** -0.5)
    torch.testing.assert_close(P.sum(-1), torch.ones(1, 6))
    keep = B.select_blocks(P, nq, nk, 32, top_p=0.5, min_keys=2)
    assert (keep.sum(-1) >= 2).all()
    for i in range(6):  # the kept set is the smallest prefix reaching the mass (or min_keys)
        kept_mass = P[0, i][keep[0, i]].sum()
        assert kept_mass >= 0.5 and (keep[0, i].sum() == 2 or kept_mass - P[0, i][keep[0, i]].min() < 0.5)
    dens = B.select_blocks(P, nq, nk, 32, density=0.3, min_keys=1)
    stats = B.work_stats(dens, nq, nk, 32, 6 * 32)
    assert 0.2 < stats["density"] <= 0.3 + 1e-6 and stats["tile_efficiency"] == 1  # whole tiles: no padding


def test_permutation_puts_clusters_on_whole_tiles_and_round_trips():
    labels = torch.randint(0, 5, (2, 50), generator=torch.Generator().manual_seed(0))
    p = B.permutation(labels, 5, 8)
    assert p.length % 8 == 0
    for t, cl in enumerate(p.tile_cluster[0].tolist()):
        toks = p.slot_token[0, t * 8:(t + 1) * 8]
        toks = toks[toks >= 0]
        assert cl == -1 and len(toks) == 0 or (labels[0, toks] == cl).all()
    x = torch.randn(2, 50, 3)
    assert torch.equal(p.slot_token.gather(1, p.token_slot), torch.arange(50).expand(2, 50))  # inverse
    assert torch.equal(B.scatter_slots(B.gather_slots(x, p.slot_token), p.token_slot), x)


def _dense(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("text", [(0, "end"), (5, "end"), (7, "start")])
def test_full_density_equals_dense_attention(text):
    n_text, pos = text
    q, k = _structured()
    v = _values(q)
    if n_text:
        extra = [torch.randn(1, 2, n_text, 16) for _ in range(3)]
        q, k, v = ((torch.cat([e, x], 2) if pos == "start" else torch.cat([x, e], 2)) for x, e in
                   zip((q, k, v), extra, strict=True))
    attn = HVAttention(HVAConfig(density=None, top_p=1.0, min_keys=10**6, tile=16, backend="dense"))  # all pairs
    out = attn(q, k, v, grid=GRID, text_tokens=n_text, text_position=pos)
    assert _rel(out, _dense(q, k, v)) < 1e-5
    s = attn.last_stats
    assert {"density", "tile_efficiency", "clustering_s", "merging_s", "distance_evals", "anchor"} <= set(s)
    assert min(s["clustering_s"], s["merging_s"], s["layout_s"], s["attention_s"]) >= 0


def _random_blocks_error(q, k, v, density, tile, seed=0):
    """Error of keeping random tiles of the raster order at the same density (a floor to beat)."""
    n = q.shape[2] // tile
    g = torch.Generator().manual_seed(seed)
    tiles = (torch.rand(n, n, generator=g) < density) | torch.eye(n, dtype=torch.bool)
    mask = tiles.repeat_interleave(tile, 0).repeat_interleave(tile, 1)
    return _rel(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask), _dense(q, k, v))


def test_hva_beats_random_blocks_at_equal_density_and_tracks_its_schedule():
    q, k = _structured()
    q, k = q / 2, k / 2  # milder logits, closer to a DiT's
    v = _values(q)
    cfg = HVAConfig(density=0.3, tile=16, anchor_every=2, backend="dense", q_window=(2, 4, 4), k_window=(1, 4, 4))
    attn = HVAttention(cfg)
    ref = _dense(q, k, v)
    err = _rel(attn(q, k, v, grid=GRID), ref)
    s0 = attn.last_stats
    assert s0["anchor"] and s0["density"] <= 0.3 + 1e-6 and 0.3 < s0["tile_efficiency"] <= 1
    assert err < 0.8 * _random_blocks_error(q, k, v, s0["density"], 16)
    attn(q * 1.01, k, v, grid=GRID)
    assert not attn.last_stats["anchor"] and attn.last_stats["distance_evals"] < s0["distance_evals"]
    attn(q, k, v, grid=GRID)
    assert attn.last_stats["anchor"]
    base = KMeansSparseAttention(KMeansSparseConfig(density=0.3, top_p=None, q_clusters=8, k_clusters=16, tile=16,
                                                    backend="dense"))
    assert _rel(base(q, k, v, grid=GRID), ref) < _random_blocks_error(q, k, v, 0.3, 16)
    assert base.last_stats["density"] <= 0.3 + 1e-6


def test_merging_raises_tile_efficiency():
    q, k = _structured()
    v = _values(q)
    common = dict(density=None, top_p=0.9, tile=16, backend="dense", q_window=(1, 2, 4), k_window=(1, 2, 4))
    plain = HVAttention(HVAConfig(merge=False, **common))
    merged = HVAttention(HVAConfig(merge=True, merge_tau=1e6, **common))  # any tile-saving merge allowed
    plain(q, k, v, grid=GRID)
    merged(q, k, v, grid=GRID)
    assert merged.last_stats["tile_efficiency"] > plain.last_stats["tile_efficiency"] + 0.2
    assert merged.last_stats["k_clusters"] < plain.last_stats["k_clusters"]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="set density"):
        HVAConfig(density=None, top_p=None)
    with pytest.raises(ValueError, match="three positive"):
        HVAConfig(q_window=(2, 2))
    with pytest.raises(ValueError, match="lead_frames"):
        HVAConfig(lead_frames=-1)
    q = torch.randn(1, 2, 100, 16)
    with pytest.raises(ValueError, match="raster"):
        HVAttention()(q, q, q, grid=GRID)
    with pytest.raises(ValueError, match=r"\[batch, heads, tokens, head_dim\]"):
        HVAttention()(q[0], q[0], q[0], grid=GRID)


def test_update_centroids_keeps_empty_clusters():
    x = torch.randn(1, 1, 6, 4)
    c = torch.randn(1, 1, 3, 4)
    new, n = update_centroids(x, torch.tensor([[[0, 0, 0, 1, 1, 1]]]), c)
    torch.testing.assert_close(new[0, 0, 2], c[0, 0, 2])
    assert n.tolist() == [[[3.0, 3.0, 0.0]]]


# ---------------------------------------------------------------------------- in pipelines

ALL_PAIRS = "density=none,top_p=1.0,min_keys=100000,dense_warmup=0,dense_layers=0,tile=16,backend=dense,min_tokens=0"


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox"])
def test_hva_keeping_every_block_reproduces_the_dense_pipeline(load_tiny, name):
    """Interception, permutation, text tokens (none / last / first) and un-permutation are exact."""
    import numpy as np

    import kinegen

    pipe = load_tiny(name)
    dense = kinegen.generate(pipe, "a red circle", seed=0)
    full = kinegen.generate(pipe, "a red circle", seed=0, accelerators=[f"hva:{ALL_PAIRS}"])
    np.testing.assert_allclose(full.frames, dense.frames, atol=1e-4)
    st = full.accelerators[0]
    assert st["sparse_calls"] > 0 and st["dense_calls"] == 0
    base = kinegen.generate(pipe, "a red circle", seed=0, accelerators=[
        "kmeans-sparse:density=none,top_p=1.0,min_keys=100000,dense_warmup=0,dense_layers=0,tile=16,backend=dense,"
        "min_tokens=0"])
    np.testing.assert_allclose(base.frames, dense.frames, atol=1e-4)
    for spec in ("svg2:top_p=1.0,min_kc_ratio=1.0,dense_warmup=0,dense_layers=0,tile=16,block=16,min_tokens=0",
                 "hva:" + ALL_PAIRS.replace("backend=dense", "layout=lists")):
        lists = kinegen.generate(pipe, "a red circle", seed=0, accelerators=[spec])
        np.testing.assert_allclose(lists.frames, dense.frames, atol=1e-4)
        assert lists.accelerators[0]["sparse_calls"] > 0


def test_hva_schedule_branches_removal_and_composition(wan):
    import kinegen

    before = [type(m.processor) for m in (b.attn1 for b in wan.transformer.blocks)]
    res = kinegen.generate(wan, "a red circle", seed=0, steps=4, accelerators=[
        "hva:density=0.5,dense_warmup=0.5,dense_layers=1,tile=16,backend=dense,q_window=1-2-2,k_window=1-2-2,"
        "min_tokens=0"])
    st = res.accelerators[0]
    n_layers = len(wan.transformer.blocks)
    # 4 steps x 2 guidance branches: the first 2 steps dense, then every layer but the first sparse.
    assert st["sparse_calls"] == 2 * 2 * (n_layers - 1) and st["dense_calls"] == 2 * (4 * n_layers) - st["sparse_calls"]
    assert 0 < st["density"] and 0 < st["tile_efficiency"] <= 1 and st["block_pattern"]
    assert [type(m.processor) for m in (b.attn1 for b in wan.transformer.blocks)] == before  # removed
    both = kinegen.generate(wan, "a red circle", seed=0, steps=4, accelerators=[
        "mapguided:speedup=1.5,max_error=inf,map=recorded",
        "hva:density=0.5,dense_warmup=0,tile=16,backend=dense,min_tokens=0"])
    assert [a["name"] for a in both.accelerators] == ["mapguided", "hva"] and both.accelerators[1]["sparse_calls"] > 0


def test_min_key_share_is_a_floor_over_live_key_clusters():
    P = torch.tensor([[[0.7, 0.2, 0.06, 0.04, 0.0]]])  # one query cluster; key cluster 4 is empty
    nq, nk = torch.tensor([[5]]), torch.tensor([[3, 3, 3, 3, 0]])
    assert B.select_blocks(P, nq, nk, 4, top_p=0.5)[0, 0].tolist() == [True, False, False, False, False]
    # floor(0.5 x 4 live) = 2 kept whatever the mass; the empty cluster never
    assert B.select_blocks(P, nq, nk, 4, top_p=0.5, min_key_share=0.5)[0, 0].tolist() == [True, True, False, False,
                                                                                          False]
    assert B.select_blocks(P, nq, nk, 4, top_p=None, min_key_share=1.0)[0, 0].tolist() == [True] * 4 + [False]
    with pytest.raises(ValueError, match="min_key_share must be in"):
        HVAConfig(min_key_share=1.5)


def test_hva_key_lists_execute_the_same_pairs_with_less_padding():
    """``layout=lists``: with the same kept pairs (top-p selection, no budget) the output is the tile
    layout's, and the executed density, counted as each layout executes, is never higher."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 4 * 8 * 8, 16).unbind(0)
    # merge=False: the layouts merge differently (key lists merge only queries), so the same clusters and kept
    # pairs need both unmerged.
    common = dict(density=None, top_p=0.6, tile=16, q_window=(2, 4, 4), k_window=(1, 4, 4), merge=False)
    tiles = HVAttention(HVAConfig(**common, backend="dense"))
    lists = HVAttention(HVAConfig(**common, layout="lists", backend="gather"))
    for _ in range(2):  # an anchor call, then a re-assigning one
        a, b = tiles(q, k, v, grid=(4, 8, 8)), lists(q, k, v, grid=(4, 8, 8))
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        st, sl = tiles.last_stats, lists.last_stats
        assert sl["useful_density"] == pytest.approx(st["useful_density"])
        assert sl["density"] <= st["density"] + 1e-9 and sl["tile_efficiency"] >= st["tile_efficiency"] - 1e-9


@pytest.mark.parametrize("spec, forced", [
    ("hva", "hva:min_tokens=0,tile=16"),
    ("kmeans-sparse:density=0.3", "kmeans-sparse:density=0.3,min_tokens=0,tile=16"),
    ("svg2", "svg2:min_tokens=0,tile=16,block=16"),
])
def test_grids_too_small_to_pay_run_dense_and_say_so(wan, spec, forced):
    """Below ``min_tokens`` video tokens per call the sparse methods step aside: the output is the dense one,
    bit for bit, and the stats carry a warning that the CLI, the app and the profiler print."""
    import numpy as np

    import kinegen

    dense = kinegen.generate(wan, "a red circle", seed=0, steps=4).frames
    res = kinegen.generate(wan, "a red circle", seed=0, steps=4, accelerators=[spec])
    np.testing.assert_array_equal(res.frames, dense)
    st = res.accelerators[0]
    n_layers = len(wan.transformer.blocks)
    assert st["sparse_calls"] == 0 and st["small_calls"] == 2 * (4 - 1) * (n_layers - 1)  # past warm-up and layer 0
    assert re.search(rf"^\S+: \d+ video tokens per attention call is below min_tokens={MIN_TOKENS}", st["warning"])
    assert "ran dense" in st["warning"] and "min_tokens=0" in st["warning"]
    forced = kinegen.generate(wan, "a red circle", seed=0, steps=4, accelerators=[forced])
    assert forced.accelerators[0]["sparse_calls"] > 0 and "warning" not in forced.accelerators[0]


def test_hva_refuses_image_models(flux):
    import kinegen
    from kinegen.errors import KinegenError

    with pytest.raises(KinegenError, match="supports the families wan, hunyuan_video, cogvideox"):
        kinegen.generate(flux, "a red circle", seed=0, accelerators=["hva"])


def test_compiled_merge_gives_the_same_attention():
    g = torch.Generator().manual_seed(7)
    grid = (2, 8, 8)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
    cfg = dict(density=0.5, tile=16, q_window=(1, 4, 4), k_window=(1, 4, 4), backend="dense")
    eager, compiled = HVAttention(HVAConfig(**cfg)), HVAttention(HVAConfig(**cfg, compile=True))
    for _ in range(2):  # an anchor call, then a hybrid one
        torch.testing.assert_close(compiled(q, k, v, grid=grid), eager(q, k, v, grid=grid))
    assert compiled.last_stats["tile_efficiency"] == eager.last_stats["tile_efficiency"]


def _top_p_sets(P, p, floor=1):
    """Reference top-p rule, row by row: keep the best key clusters while the mass before them is below p."""
    out = torch.zeros_like(P, dtype=torch.bool)
    for g in range(P.shape[0]):
        for i in range(P.shape[1]):
            before = 0.0
            for rank, j in enumerate(P[g, i].argsort(descending=True).tolist()):
                if rank < floor or before < p:
                    out[g, i, j] = True
                before += P[g, i, j].item()
    return out


def test_coverage_selection_is_the_top_p_rule_at_the_largest_p_the_budget_allows():
    """``selection=coverage``: one p for all heads (found by bisection), the work within the budget of all
    heads together, and a spread-out head given more work than a concentrated one."""
    g = torch.Generator().manual_seed(0)
    cq, ck = torch.randn(2, 6, 8, generator=g), torch.randn(2, 12, 8, generator=g)
    ck[1] *= 0.1  # head 1: keys alike, attention spread out
    nq, nk = torch.full((2, 6), 16), torch.full((2, 12), 8)
    P = B.cluster_scores(cq, nq, ck, nk, 1.0)
    work = lambda keep: (keep * (nq.unsqueeze(-1) * nk.unsqueeze(1))).sum().item()  # noqa: E731 (key_unit=1)
    budget = 0.3 * 2 * 96 ** 2
    keep = B.select_blocks(P, nq, nk, 16, density=0.3, top_p=None, key_unit=1, selection="coverage")
    assert work(keep) <= budget
    ps = [p / 200 for p in range(201)]
    fitting = [p for p in ps if work(_top_p_sets(P, p)) <= budget]
    assert torch.equal(keep, _top_p_sets(P, max(fitting)))  # the largest fitting p on this grid
    assert keep[1].sum() > keep[0].sum()  # the spread-out head keeps more
    capped = B.select_blocks(P, nq, nk, 16, density=1.0, top_p=0.5, key_unit=1, selection="coverage")
    assert torch.equal(capped, _top_p_sets(P, 0.5))  # a loose budget: top_p binds
    floor_only = B.select_blocks(P, nq, nk, 16, density=1e-4, top_p=None, min_keys=2, selection="coverage")
    assert (floor_only.sum(-1) == 2).all()  # nothing fits: the floor stays
    with pytest.raises(ValueError, match="coverage, greedy"):
        B.select_blocks(P, nq, nk, 16, density=0.3, selection="best")
    with pytest.raises(ValueError, match="coverage, greedy"):
        HVAConfig(selection="best")


def test_key_lists_count_keys_by_token_and_merge_only_queries():
    """With ``layout=lists`` a key cluster costs its tokens (the budget lands near the density asked), keys
    are not merged (no tile to fill) and the key window defaults to 1x4x4; the tile layout keeps 1x8x8."""
    grid = (4, 16, 16)
    q, k = _structured(n_heads=2, d=16, grid=grid)
    v = _values(q)
    lists = HVAttention(HVAConfig(top_p=None, density=0.3, layout="lists", backend="gather", tile=16))
    lists(q, k, v, grid=grid)
    st = lists.last_stats
    assert lists.k_window == (1, 4, 4) and lists.k_state.centroids.shape[2] == 4 * 4 * 4
    assert st["k_clusters"] == (lists.k_state.sizes > 0).sum(-1).float().mean().item()  # none merged
    n = 4 * 16 * 16  # beyond the budget only the lists' padding: under one block (16 keys) per padded query
    assert 0.25 < st["density"] <= 0.3 + 16 * 2 * n / n ** 2  # row, and padded rows are fewer than 2n
    tiles = HVAttention(HVAConfig(layout="tiles", backend="dense", tile=16))
    tiles(q, k, v, grid=grid)
    assert tiles.k_window == (1, 8, 8)
    assert HVAttention(HVAConfig(k_window=(1, 2, 2), layout="lists")).k_window == (1, 2, 2)
