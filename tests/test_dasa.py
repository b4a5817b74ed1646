"""DASA on the chunk-by-chunk Wan (issue 21, item 1): dynamics, dynamic-only KV with the log-count bias, region
compute allocation, its settings and its removal. Real numbers on tiny-wan-ar and on make_causal directly."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import kinegen
from kinegen.dasa import DASAConfig, apply_dasa
from kinegen.dasa.dynamics import DynamicsTracker
from kinegen.dasa.kv import keep_plan
from kinegen.dasa.processor import DASASelfAttention
from kinegen.errors import ConfigError
from kinegen.pipelines.causal_wan import KVCacheConfig, make_causal

KW = dict(height=64, width=64, num_frames=33, num_inference_steps=4, guidance_scale=3.0, output_type="latent")
COMPRESS = dict(keep=0.3, ema=0.0, low=1.0, dilate=1)  # no smoothing: on tiny-wan-ar's noise, 5 of 16 tokens per frame


@pytest.fixture(scope="module")
def ar():
    pipe = kinegen.load_pipeline("tiny-wan-ar")  # chunks of 1, 2, 2, ...; sink 1, window 5
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def dense(ar):
    return ar("a red circle", generator=torch.Generator().manual_seed(0), **KW)


def _run(pipe, config, prompt="a red circle", **kw):
    handle = apply_dasa(pipe, config)
    try:
        out = pipe(prompt, generator=torch.Generator().manual_seed(0), **{**KW, **kw})
        return out, handle.stats()
    finally:
        handle.remove()


@torch.no_grad()
@pytest.mark.parametrize("compute", ["reuse", "sparse", "steps", "none"])
def test_keep_everything_is_the_dense_pipeline_exactly(ar, dense, compute):
    """keep=1.0: every token dynamic, so nothing is dropped or skipped and the latents are bit-identical."""
    out, stats = _run(ar, DASAConfig(keep=1.0, compute=compute, backend="dense"))
    assert torch.equal(out.frames, dense.frames)
    assert stats["kv_bytes"] == stats["dense_kv_bytes"] == dense.chunk_stats[-1].kv_bytes
    assert stats["computed_share"] == 1.0 and stats["kept_share"] == 1.0


class _FixedMasks:
    """Stands in for a DASA run: fixed keep masks per latent frame, no compute allocation."""

    plan = None

    def __init__(self, masks: dict, bias: bool, first_whole: bool = True):
        self.masks, self.config, self.first_whole = masks, DASAConfig(bias=bias), first_whole

    def keep_plan(self, frames, tokens_per_frame, device):
        masks = [self.masks.get(f) for f in frames]
        if self.first_whole:
            masks[0] = None
        return keep_plan(masks, frames[0], tokens_per_frame, self.config.bias).to(device)


def _chunked(tr, x, text, chunks, cache_config, masks=None, bias=True, first_whole=True):
    """Each chunk's output, chunk after chunk against the cache (DASA's processor when ``masks`` are given)."""
    state = make_causal(tr, cache_config)
    try:
        if masks is not None:
            run = _FixedMasks(masks, bias, first_whole)
            for block, cache in zip(tr.blocks, state.caches, strict=True):
                block.attn1.set_processor(DASASelfAttention(state, cache, run))
        outs = []
        for start, n in chunks:
            state.frame_offset, state.commit = start, True
            outs.append(tr(x[:, :, start:start + n], torch.tensor([500.0]), text, return_dict=False)[0])
        return outs, state.caches
    finally:
        state.remove()


def _duplicates_video(tr, seed: int = 1):
    """7 latent frames of 4x4 tokens (4 dynamic places, 12 static ones holding the same latent in every frame) and a
    text."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, tr.config.in_channels, 7, 8, 8, generator=g)
    text = torch.randn(1, 8, tr.config.text_dim, generator=g)
    static = torch.ones(4, 4, dtype=torch.bool)
    static[1:3, 1:3] = False
    pixels = static.repeat_interleave(2, 0).repeat_interleave(2, 1)
    x[:, :, :, pixels] = x[:, :, :1, pixels]
    return x, text, static


@torch.no_grad()
def test_biased_compressed_cache_equals_dense_attention_on_exact_duplicates(ar):
    """Static places identical in every frame and RoPE without its temporal phase: within a chunk their keys and
    values are exact duplicates at every layer, so the anchor with bias log(1 + dropped) gives the dense output
    (section 4.1), also after the window evicted an anchor whose span survives; without the bias it does not."""
    tr = copy.deepcopy(ar.transformer)
    t_dim = tr.rope.t_dim
    tr.rope.freqs_cos[:, :t_dim] = 1.0  # no temporal phase: duplicates stay duplicates after RoPE
    tr.rope.freqs_sin[:, :t_dim] = 0.0
    x, text, static = _duplicates_video(tr, seed=0)
    chunks = [(0, 1), (1, 2), (3, 2), (5, 2)]
    config = KVCacheConfig(sink_frames=1, window_frames=4)
    masks = {f: ~static.flatten() for f in range(7)}  # later frames keep their dynamic places only
    want, dense_caches = _chunked(tr, x, text, chunks, config)
    got, caches = _chunked(tr, x, text, chunks, config, masks)
    for w, o in zip(want, got, strict=True):
        torch.testing.assert_close(o, w, rtol=0, atol=1e-5)
    # Chunk 3 saw frames [0, 2, 3, 4]: frame 1 (chunk 1's anchor) had gone, its static tokens standing for frame 2
    # alone. At the end the window holds [0, 4, 5, 6]: the sink whole, chunk 2's anchor (frame 3) gone but its 12
    # static tokens standing for frame 4 (bias log 1), chunk 3's anchor standing for frames 5 and 6 (bias log 2).
    c = caches[0]
    assert c.frames == dense_caches[0].frames == [0, 4, 5, 6]
    assert c.k.shape[1] == 16 + 12 + 4 + 16 + 4 and dense_caches[0].k.shape[1] == 4 * 16
    assert c.nbytes * 64 == dense_caches[0].nbytes * 52
    assert int((c.token_frames == 0).sum()) == 16 and int((c.token_frames == 3).sum()) == 12
    assert sorted(set(c.bias.exp().round().int().tolist())) == [1, 2]
    unbiased, _ = _chunked(tr, x, text, chunks, config, masks, bias=False)
    assert (unbiased[2] - want[2]).abs().max() > 1e-3  # dropping duplicates without the bias changes the output


@torch.no_grad()
def test_a_compressed_first_frame_stands_on_cached_tokens(ar):
    """anchor_every=0: after the first (whole) chunk every frame keeps its dynamic places only, first frames too; a
    static place leans on the latest cached token there (the sink's, here), whose span and bias grow across chunks.
    With one block that is the dense output exactly; deeper, a static token's keys in another chunk are no longer
    exact duplicates (its context, the chunk's dynamic tokens, differs), and the error stays a few percent of
    dropping them without the bias. A cache with no token at a dropped place refuses rather than attend to nothing."""
    chunks = [(0, 1), (1, 2), (3, 2), (5, 2)]
    config = KVCacheConfig(sink_frames=1, window_frames=4)
    errors = {}
    for blocks in (1, None):
        tr = copy.deepcopy(ar.transformer)
        tr.blocks = tr.blocks[:blocks]
        t_dim = tr.rope.t_dim
        tr.rope.freqs_cos[:, :t_dim] = 1.0  # no temporal phase: duplicates stay duplicates after RoPE
        tr.rope.freqs_sin[:, :t_dim] = 0.0
        x, text, static = _duplicates_video(tr)
        masks = {f: ~static.flatten() for f in range(1, 7)}
        want, _ = _chunked(tr, x, text, chunks, config)
        for bias in (True, False):
            got, caches = _chunked(tr, x, text, chunks, config, masks, bias=bias, first_whole=False)
            errors[blocks, bias] = max(float((o - w).abs().max()) for o, w in zip(got, want, strict=True))
    assert errors[1, True] < 1e-5 < 1e-3 < errors[1, False]
    assert errors[None, True] < 0.1 * errors[None, False]
    _, caches = _chunked(tr, x, text, chunks, config, masks, first_whole=False)
    c = caches[0]
    assert c.frames == [0, 4, 5, 6]
    assert c.k.shape[1] == 16 + 3 * 4  # the sink whole and the window's dynamic places: 28 of 64 tokens
    counts = c.bias.exp().round().int()
    assert counts[:16].tolist() == torch.where(static.flatten(), 4, 1).tolist()  # a static sink token: 4 frames
    assert counts[16:].tolist() == [1] * 12
    _, anchored = _chunked(tr, x, text, chunks, config, masks)
    assert anchored[0].k.shape[1] == 16 + 12 + 4 + 16 + 4  # an anchor in every chunk (the default)
    cache = copy.deepcopy(c)
    cache.token_pos = cache.token_pos[12:]  # (as if the static places' tokens were gone)
    cache.token_frames, cache.token_last = cache.token_frames[12:], cache.token_last[12:]
    with pytest.raises(ValueError, match="no cached token"):
        cache.append(c.k[:, :4], c.v[:, :4], [7], torch.full((4,), 7), torch.full((4,), 7),
                     torch.tensor([5, 6, 9, 10]), torch.tensor([0]), torch.tensor([7]))


def test_keep_plan_spans_and_representatives():
    """A dropped token is represented by the latest kept token at its place; its span grows to cover it."""
    m1 = torch.tensor([True, False, False, True])
    m2 = torch.tensor([False, True, False, True])
    plan = keep_plan([None, m1, m2], 10, 4)
    assert plan.index.tolist() == [0, 1, 2, 3, 4, 7, 9, 11]
    assert plan.token_frames.tolist() == [10, 10, 10, 10, 11, 11, 12, 12]
    assert plan.token_last.tolist() == [10, 11, 12, 10, 12, 11, 12, 12]
    assert plan.token_pos.tolist() == [0, 1, 2, 3, 0, 3, 1, 3]
    assert keep_plan([None, m1, m2], 10, 4, bias=False).token_last.tolist() == [10, 10, 10, 10, 11, 11, 12, 12]
    assert plan.carried_pos.numel() == 0
    # A compressed first frame (anchor_every != 1): places dropped before the chunk kept a token there lean on the
    # cache, up to the last frame they stay dropped; place 2 is dropped in both frames, place 1 only in the first.
    plan = keep_plan([m1, m2], 20, 4)
    assert plan.index.tolist() == [0, 3, 5, 7]
    assert plan.token_last.tolist() == [21, 20, 21, 21]
    assert plan.carried_pos.tolist() == [1, 2] and plan.carried_last.tolist() == [20, 21]
    assert keep_plan([m1, m2], 20, 4, bias=False).carried_pos.numel() == 0


def _sequence(values: list[float], size: int = 8) -> list[torch.Tensor]:
    """Latent chunks (1 channel, 2 frames each, an 8x8 latent = 4x4 tokens of 2x2) where token (0, 0) changes by
    ``values[i]`` from frame to frame in chunk i, token (3, 3) by 2 in every frame, and everything else is still."""
    frames, z = [], torch.zeros(1, 1, 1, size, size)
    for v in values:
        for _ in range(2):
            z = z.clone()
            z[..., :2, :2] += v
            z[..., 6:, 6:] += 2.0
            frames.append(z)
    return [torch.cat(frames[i:i + 2], dim=2) for i in range(0, len(frames), 2)]


def _masks(tracker, chunks) -> list[bool]:
    """Whether token (0, 0) is dynamic after each chunk."""
    out, previous = [], torch.zeros(1, 1, 1, 8, 8)
    for z in chunks:
        tracker.update(z, previous, (2, 2))
        previous = z[:, :, -1:]
        out.append(bool(tracker.dynamic[0, 0]))
    return out


def test_masks_do_not_flicker_under_hysteresis():
    """A token whose motion hovers around the entry threshold flips chunk after chunk without hysteresis and stays
    dynamic with it; it turns static only once its smoothed score has fallen below the exit level."""
    hovering = _sequence([1.2, 0.8, 1.1, 0.7, 1.2, 0.8, 1.1, 0.7])
    plain = {"centre": False}  # the raw differences, so the threshold reads them as written
    flicker = _masks(DynamicsTracker(1.0, 1.0, 0.0, 1.0, 1, None, **plain), hovering)
    assert flicker == [True, False] * 4
    steady = _masks(DynamicsTracker(1.0, 1.0, 0.5, 0.5, 1, None, **plain), hovering)
    assert steady == [True] * 8
    # Motion that stops: static again after the EMA decays below 0.5 of the threshold (2 chunks of 2 frames).
    stopping = _masks(DynamicsTracker(1.0, 1.0, 0.5, 0.5, 1, None, **plain), _sequence([1.5, 0, 0, 0]))
    assert stopping == [True, False, False, False]
    # The 3x3 max-filter keeps the neighbours of a moving token dynamic; the budget picks the top share.
    tracker = DynamicsTracker(0.5, None, 0.0, 1.0, 3, None)
    masks = tracker.update(_sequence([1.0])[0], torch.zeros(1, 1, 1, 8, 8), (2, 2))
    grid = masks[1].view(4, 4)
    assert masks[0] is None and grid[:2, :2].all() and grid[2:, 2:].all() and int(grid.sum()) == 8


def test_peer_selections_keep_the_same_budget_anywhere():
    """The peers at equal KV budget (issue 21, item 2): uniform and random token dropping keep ceil(keep * tokens)
    of every later frame (a chunk's first frame stays whole), whatever moves; uniform shifts its stride frame by
    frame, random differs per frame."""
    moving = _sequence([1.0, 1.0])[0]  # only the top-left corner moves
    for select in ("uniform", "random"):
        tracker = DynamicsTracker(0.3, None, 0.5, 0.5, 3, None, select=select)
        masks = tracker.update(moving, torch.zeros(1, 1, 1, 8, 8), (2, 2))
        masks += tracker.update(moving, moving[:, :, -1:], (2, 2))
        assert masks[0] is None and masks[2] is None  # each chunk's anchor frame is whole
        assert [int(masks[i].sum()) for i in (1, 3)] == [5, 5]  # ceil(0.3 * 16)
        assert not torch.equal(masks[1], masks[3]) and torch.equal(tracker.dynamic.flatten(), masks[3])
    with pytest.raises(ConfigError, match="select must be one of dynamics, uniform, random"):
        DASAConfig(select="topk")


def _drifting(chunks: int, shift: float, noise: float, block: float = 1.0,
              seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Latent chunks (4 channels, 2 frames each, 16x16 latent = 8x8 tokens of 2x2) of a still textured scene whose
    every place shifts by the same per-channel ``shift`` from frame to frame (a causal VAE coding a still scene
    differently at each latent position) and flickers by ``noise``, with a 4x4 block moving one latent pixel right
    per frame along the top rows; and the frame before the first chunk."""
    gen = torch.Generator().manual_seed(seed)
    texture = torch.randn(1, 4, 1, 16, 16, generator=gen)
    offsets = torch.randn(1, 4, 1, 1, 1, generator=gen)
    frames = []
    for t in range(2 * chunks + 1):
        z = texture + shift * (t % 5) * offsets + noise * torch.randn(1, 4, 1, 16, 16, generator=gen)
        z[..., :4, t % 12:t % 12 + 4] += block
        frames.append(z)
    return [torch.cat(frames[i:i + 2], dim=2) for i in range(1, len(frames) - 1, 2)], frames[0]


def _kept_share(tracker, chunks, first) -> float:
    """The mean share of the later frames' tokens kept, over the chunks after the first two."""
    previous, shares = first, []
    for i, z in enumerate(chunks):
        masks = tracker.update(z, previous, (2, 2))
        previous = z[:, :, -1:]
        if i >= 2:
            shares += [float(m.float().mean()) for m in masks if m is not None]
    return sum(shares) / len(shares)


def test_a_shift_every_place_shares_is_not_motion():
    """A still scene coded with a per-channel shift at each latent position (as the VAE codes each latent frame of
    a segment) plus one moving block: the plain difference reads the shift as motion everywhere and the hysteresis
    holds every token; taking each frame's per-channel mean off first (``centre``) leaves the block and its edges."""
    chunks, first = _drifting(8, shift=0.6, noise=0.0)
    plain = DynamicsTracker(0.2, None, 0.5, 0.5, 3, None, centre=False, floor=False)
    centred = DynamicsTracker(0.2, None, 0.5, 0.5, 3, None, centre=True, floor=False)
    assert _kept_share(plain, chunks, first) > 0.9
    assert _kept_share(centred, chunks, first) < 0.4
    assert bool(centred.dynamic[:2, 2:4].all())  # the block's place in the last frame (latent columns 4-7)


def test_a_background_that_flickers_everywhere_falls_out_of_the_dynamic_set():
    """A textured background that flickers a little at every place (the model re-rendering it) and one moving
    block: membership measured from 0 puts the typical token just under the entry level, so the hysteresis holds
    nearly all of them; measured from the frame's median (``floor``) it is 0 and the set shrinks to the budget's
    order, the moving block still in it."""
    chunks, first = _drifting(8, shift=0.0, noise=0.3)
    held = DynamicsTracker(0.3, None, 0.5, 0.5, 3, None, floor=False)
    floored = DynamicsTracker(0.3, None, 0.5, 0.5, 3, None, floor=True)
    assert _kept_share(held, chunks, first) > 0.9
    assert _kept_share(floored, chunks, first) < 0.6
    assert bool(floored.dynamic[:2, 2:4].all())  # the block's place in the last frame (latent columns 4-7)


def test_a_scene_change_or_a_prompt_switch_is_a_keyframe():
    tracker = DynamicsTracker(0.3, None, 0.5, 0.5, 3, 3.0)
    previous = torch.zeros(1, 1, 1, 8, 8)
    still = torch.zeros(1, 1, 2, 8, 8)
    still[..., :2, :2] = 0.1
    assert tracker.update(still, previous, (2, 2))[1] is not None
    cut = 5 * torch.randn(1, 1, 2, 8, 8, generator=torch.Generator().manual_seed(0))  # everything changes at once
    assert tracker.update(cut, still[:, :, -1:], (2, 2)) == [None, None]
    assert tracker.scene_changes == 1 and tracker.keyframe and tracker.dynamic is None
    assert tracker.update(cut, cut[:, :, -1:], (2, 2), force_keyframe=True) == [None, None]
    assert tracker.keyframes == 2


@torch.no_grad()
def test_eviction_keeps_the_sink_and_the_kv_cache_shrinks(ar, dense):
    """On the compressed cache the rolling window still keeps the sink frame whole and the 4 most recent frames,
    and KV bytes stay flat once the window is full, below the dense cache's."""
    seen = {}

    class Peek:  # reads the first layer's cache after the last commit
        def begin(self, pipe, state):
            self.state = state

        def before_chunk(self, *args):
            pass

        def before_commit(self, latents, frame_offset):
            pass

        def end(self):
            c = self.state.caches[0]
            seen.update(frames=list(c.frames), token_frames=c.token_frames.clone())

    handle = apply_dasa(ar, DASAConfig(**COMPRESS, compute="none"))
    ar.chunk_hooks = (*ar.chunk_hooks, Peek())
    try:
        out = ar("a red circle", generator=torch.Generator().manual_seed(0), **KW)
        stats = handle.stats()
    finally:
        handle.remove()
    assert seen["frames"] == [0, 5, 6, 7, 8] == out.chunk_stats[-1].cached_frames
    assert int((seen["token_frames"] == 0).sum()) == 16  # the sink frame, whole (4x4 tokens)
    kv = [s.kv_bytes for s in out.chunk_stats]
    assert kv[2:] == [kv[2]] * 3 and kv[-1] == stats["kv_bytes"] < stats["dense_kv_bytes"]
    assert stats["dense_kv_bytes"] == dense.chunk_stats[-1].kv_bytes
    # every later frame keeps 5 of 16 tokens: a window of sink + 2 chunks of (16 + 5) tokens, of 5 * 16
    assert stats["kv_ratio"] == pytest.approx((16 + 2 * 21) / 80)
    assert [c["kept_share"] for c in stats["chunks"]] == [1.0] + [21 / 32] * 4
    # anchor_every=2: every other chunk's first frame is compressed too; 0: every first frame after the first chunk.
    # The cached token that stands for a static place survives eviction while its span reaches into the window
    # (after the 4-frame window here, 11 anchor tokens of frame 3 for frames 5-6, or older tokens for anchor_every=0)
    ratios = {1: stats["kv_ratio"]}
    for anchor_every, shares in ((2, [1.0, 10 / 32, 21 / 32, 10 / 32, 21 / 32]), (0, [1.0] + [10 / 32] * 4)):
        _, stats = _run(ar, DASAConfig(**COMPRESS, compute="none", anchor_every=anchor_every))
        assert [c["kept_share"] for c in stats["chunks"]] == shares
        ratios[anchor_every] = stats["kv_ratio"]
    assert ratios[0] < ratios[2] == ratios[1] == pytest.approx((16 + 2 * 21) / 80)


@torch.no_grad()
def test_region_compute_gives_static_tokens_less_work(ar):
    """reuse: static tokens computed every other step; steps with no step of their own: static places end as the
    previous chunk's last clean frame exactly; sparse: with every region in reach it is the full attention (the bias
    riding as an extra head dimension), with radius 0 it keeps a fifth of the tiles and changes the output."""
    none, _ = _run(ar, DASAConfig(**COMPRESS, compute="none"))
    _, reuse = _run(ar, DASAConfig(**COMPRESS, compute="reuse", refresh=2, recheck=False))
    static = [c["static_share"] for c in reuse["chunks"]]
    assert static[:2] == [0.0, 0.0] and all(s > 0.5 for s in static[2:])  # chunks 0-1: no dynamics known yet
    assert [c["computed_share"] for c in reuse["chunks"]] == pytest.approx([1 - s / 2 for s in static])
    held, stats = _run(ar, DASAConfig(**COMPRESS, compute="steps", static_share=0.0, recheck=False))
    lat = held.frames[0]  # [C, F, h, w]; chunks: [0], [1, 2], [3, 4], ...
    same = (lat[:, 3:5] - lat[:, 2:3]).abs().amax(dim=(0, 1)) < 1e-5
    places = same.view(4, 2, 4, 2).all(dim=(1, 3)).float().mean()
    assert float(places) == pytest.approx(stats["chunks"][2]["static_share"])
    full, stats = _run(ar, DASAConfig(**COMPRESS, compute="sparse", backend="dense", radius=4))
    torch.testing.assert_close(full.frames, none.frames, rtol=0, atol=1e-4)
    assert stats["sparse_density"] == 1.0
    local, stats = _run(ar, DASAConfig(**COMPRESS, compute="sparse", backend="dense", radius=0, region=1,
                                       recheck=False))
    assert stats["sparse_density"] < 0.3 and (local.frames - none.frames).abs().max() > 1e-3


def test_places_a_chunk_moves_into_are_rechecked_from_its_own_prediction(ar):
    """The static places come from the chunks before; the chunk's own clean-latent prediction shows where it moves
    now. A block moving one latent pixel right per frame: the prediction's new places (token columns 4 and 6 of the
    top rows, column 6 never dynamic before) and nothing else; a prediction blurred everywhere is not motion
    everywhere. In the pipeline, what the recheck turns dynamic is what a run without it left static."""
    chunks, first = _drifting(5, shift=0.6, noise=0.05)
    tracker, previous = DynamicsTracker(0.2, None, 0.5, 0.5, 1, None), first
    for z in chunks[:4]:
        tracker.update(z, previous, (2, 2))
        previous = z[:, :, -1:]
    moved = tracker.moved(chunks[4], previous, (2, 2))
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[:2, [4, 6]] = True
    assert torch.equal(moved, expected) and not bool(tracker.dynamic[:2, 6].any())
    blurred = torch.nn.functional.avg_pool3d(chunks[4], (1, 3, 3), 1, (0, 1, 1), count_include_pad=False)
    assert int(tracker.moved(blurred, previous, (2, 2)).sum()) < 16
    assert DynamicsTracker(0.2, None, 0.5, 0.5, 1, None).moved(chunks[4], previous, (2, 2)) is None  # no peak yet
    # tiny-wan-ar: chunk 2 is the first with static places, the same ones with and without the recheck.
    settings = dict(**COMPRESS, compute="reuse", refresh=2)
    _, before = _run(ar, DASAConfig(**settings, recheck=False))
    _, after = _run(ar, DASAConfig(**settings, recheck=True))
    plain, rechecked = before["chunks"][2], after["chunks"][2]
    assert plain["rechecked_share"] == 0 and 0 < rechecked["rechecked_share"] < plain["static_share"]
    assert rechecked["static_share"] + rechecked["rechecked_share"] == pytest.approx(plain["static_share"])
    assert rechecked["computed_share"] > plain["computed_share"]


def test_static_queries_see_their_neighbourhood_and_the_sink_with_the_bias():
    """The block-sparse layout means, token by token: a static query sees the keys within `radius` regions of its
    own (cached and in the chunk) and every sink token, a dynamic query every key; scores get the cache's bias."""
    from kinegen.dasa.sparse import sparse_attention, sparse_plan

    g = torch.Generator().manual_seed(0)
    static = torch.rand(16, generator=g) < 0.6  # a 4x4 grid, regions of 1 token, radius 1
    cache_frames = torch.tensor([0] * 16 + [1] * 16 + [2] * 5)
    cache_places = torch.cat([torch.arange(16), torch.arange(16), torch.tensor([0, 5, 6, 9, 15])])
    plan = sparse_plan((2, 4, 4), static, cache_frames, cache_places, [0], region=1, radius=1, tile=4)
    q, k, v = (torch.randn(2, n, 3, 8, generator=g) for n in (32, 37 + 32, 37 + 32))
    bias = torch.cat([torch.rand(37, generator=g), torch.zeros(32)])
    places = torch.cat([cache_places, torch.arange(16).repeat(2)])
    qp = torch.arange(16).repeat(2)
    near = ((qp[:, None] // 4 - places[None] // 4).abs() <= 1) & ((qp[:, None] % 4 - places[None] % 4).abs() <= 1)
    sink = torch.cat([cache_frames == 0, torch.zeros(32, dtype=torch.bool)])
    allowed = ~static.repeat(2)[:, None] | near | sink[None]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 8 ** -0.5 + bias
    want = torch.einsum("bhqk,bkhd->bhqd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
    torch.testing.assert_close(sparse_attention(q, k, v, bias, plan, "dense"), want, rtol=0, atol=1e-5)
    assert plan.static_queries == 2 * int(static.sum()) and 0 < plan.density() < 1


@torch.no_grad()
def test_a_prompt_switch_keeps_its_chunk_whole_and_recaches_the_compressed_window(ar):
    out, stats = _run(ar, DASAConfig(**COMPRESS), prompt=[(0, "a red circle"), (3, "a blue square")])
    chunks = stats["chunks"]
    assert [c["keyframe"] for c in chunks] == [True, False, False, True, False]
    assert chunks[3]["kept_share"] == 1.0 and chunks[3]["static_share"] == 0.0
    assert out.chunk_stats[-1].cached_frames == [0, 5, 6, 7, 8]
    # with compressed first frames the re-cached window's first run is whole (nothing cached stands for it)
    out, stats = _run(ar, DASAConfig(**COMPRESS, anchor_every=0), prompt=[(0, "a red circle"), (3, "a blue square")])
    assert [c["keyframe"] for c in stats["chunks"]] == [True, False, False, True, False]
    assert torch.isfinite(out.frames).all() and stats["kv_bytes"] < stats["dense_kv_bytes"]


@torch.no_grad()
def test_a_relinked_segment_start_is_kept_whole_not_called_a_scene_change(ar):
    """With overlapping VAE segments each later segment starts on an image latent re-encoded from the frame shown:
    kept whole, left out of the dynamics (its difference from the 4-frame latents is not motion), not a keyframe."""
    from kinegen.pipelines import WanAutoregressivePipeline

    pipe = WanAutoregressivePipeline(**ar.components, chunk_frames=2, sink_frames=1, window_frames=5,
                                     segment_frames=9, segment_overlap=True)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.check_frames(33) == [1, 2] * 4 and [pipe.relinks(f) for f in (0, 1, 3, 6, 9)] == [
        False, False, True, True, True]
    out, stats = _run(pipe, DASAConfig(**COMPRESS, anchor_every=0))  # no anchors: only keyframes kept whole
    chunks = stats["chunks"]
    assert [c["keyframe"] for c in chunks][::2] == [True, False, False, False]  # chunk 0, then the relinked ones
    assert all(c["kept_share"] == 1.0 for c in chunks[::2]) and all(c["kept_share"] < 1 for c in chunks[3::2])
    assert stats["scene_changes"] == 0 and stats["kv_bytes"] < stats["dense_kv_bytes"]
    assert torch.isfinite(out.frames).all()
    # A relinked chunk is not denoised: it has no computed share and does not dilute the run's.
    assert [c["computed_share"] is None for c in chunks] == [False] + [False, True] * 3 + [False]
    denoised = [c for c in chunks if c["denoised_tokens"]]
    assert stats["computed_share"] == pytest.approx(sum(c["computed_tokens"] for c in denoised)
                                                    / sum(c["denoised_tokens"] for c in denoised))
    assert stats["computed_share"] > sum(c["computed_share"] or 0 for c in chunks) / len(chunks)
    # relink_whole=False: the relinked latent keeps only the places the dynamics mark (the next chunk's static
    # places are those the dynamics left static), and the cache holds less.
    out2, compressed = _run(pipe, DASAConfig(**COMPRESS, anchor_every=0, relink_whole=False))
    relinked = compressed["chunks"][2::2][:3]
    assert all(not c["keyframe"] and 0 < c["kept_share"] < 1 for c in relinked)
    assert all(c["kept_share"] == pytest.approx(1 - n["static_share"])
               for c, n in zip(relinked, compressed["chunks"][3::2], strict=True))
    assert compressed["kv_bytes"] < stats["kv_bytes"] and torch.isfinite(out2.frames).all()


@torch.no_grad()
def test_remove_restores_the_pipeline(ar, dense):
    handle = apply_dasa(ar, DASAConfig(**COMPRESS))
    with pytest.raises(ConfigError, match="already applied"):
        apply_dasa(ar, DASAConfig())
    ar("a red circle", generator=torch.Generator().manual_seed(0), **KW)
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in ar.transformer.blocks)
    handle.remove()
    assert "chunk_hooks" not in ar.__dict__ and ar.chunk_hooks == ()
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in ar.transformer.blocks)
    assert torch.equal(ar("a red circle", generator=torch.Generator().manual_seed(0), **KW).frames, dense.frames)


def test_bad_settings_and_pipelines_are_refused_with_the_valid_values():
    from kinegen.accelerators.catalog import parse_spec

    for spec, message in (("dasa:compute=fast", "compute must be one of reuse, sparse, steps, none"),
                          ("dasa:keep=0", "keep must be in \\(0, 1\\]"), ("dasa:keep=1.5", "keep must be in"),
                          ("dasa:threshold=-1", "threshold must be above 0"), ("dasa:ema=1", "ema must be in"),
                          ("dasa:low=0", "low must be in"), ("dasa:dilate=2", "odd size"),
                          ("dasa:scene_jump=0.5", "scene_jump must be above 1"), ("dasa:refresh=0", "refresh"),
                          ("dasa:static_share=2", "static_share"), ("dasa:tile=24", "power of two"),
                          ("dasa:backend=cuda", "backend must be one of auto, flex, triton, dense"),
                          ("dasa:anchor_every=-1", "anchor_every must be 0"),
                          ("dasa:centre=maybe", "centre='maybe' is not a valid bool"),
                          ("dasa:speed=2", "Valid keys: anchor_every, backend, bias, centre, compute")):
        with pytest.raises(ConfigError, match=message):
            parse_spec(spec, kind="attention")
    acc, config = parse_spec("dasa:keep=0.3,compute=sparse", kind="attention")
    assert (acc.kind, config.keep, config.compute) == ("attention", 0.3, "sparse")
    with pytest.raises(ConfigError, match="generates the whole video at once"):
        apply_dasa(kinegen.load_pipeline("tiny-wan"))
    with pytest.raises(ConfigError, match="chunk-by-chunk generation with a KV cache"):
        kinegen.generate(kinegen.load_pipeline("tiny-wan"), "a red circle", frames=9, accelerators=["dasa"])
    with pytest.raises(ConfigError, match="keeps its own KV cache"):
        apply_dasa(kinegen.load_pipeline("tiny-anyflow-far"))


def test_the_cli_runs_dasa_and_reports_kv_bytes_against_dense(tmp_path, capsys):
    from kinegen.cli import main

    assert main(["models", "--accelerators"]) == 0
    listed = capsys.readouterr().out
    assert "dasa" in listed and "keep=0.3" in listed and "compute=reuse" in listed
    out = tmp_path / "v.mp4"
    assert main(["generate", "a red circle", "--model", "tiny-wan-ar", "--frames", "17", "--attention",
                 "dasa:keep=0.3", "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    stats = next(a for a in summary["accelerators"] if a["name"] == "dasa")
    assert out.is_file() and stats["config"]["keep"] == 0.3
    assert 0 < stats["kv_bytes"] <= stats["dense_kv_bytes"] and len(stats["chunks"]) == 3
    assert stats["kv_bytes"] == summary["chunk_stats"][-1]["kv_bytes"]
    assert math.isclose(stats["kv_ratio"], stats["kv_bytes"] / stats["dense_kv_bytes"])


def test_far_history_pooling_is_exact_on_block_duplicates_and_quarters_far_frames():
    """The AnyFlow-FAR-style peer: a far frame's keys and values pooled over 2x2 places with the bias log(4) give
    the full cache's attention exactly when each 2x2 block holds duplicates, and cost a quarter of the bytes."""
    import torch.nn.functional as F

    from kinegen.dasa.peers import pool_frame
    from kinegen.pipelines.causal_wan import LayerKVCache

    gen = torch.Generator().manual_seed(0)

    def blocky():  # [1, 16, 2, 8]: a 4x4 grid whose 2x2 blocks repeat one token
        x = torch.randn(1, 2, 2, 2, 8, generator=gen)
        return x.repeat_interleave(2, 1).repeat_interleave(2, 2).reshape(1, 16, 2, 8)

    cache = LayerKVCache()
    for f in range(3):
        cache.append(blocky(), blocky(), [f])
    q = torch.randn(1, 2, 5, 8, generator=gen)

    def attend(c):
        mask = None if c.bias is None else c.bias.view(1, 1, 1, -1)
        return F.scaled_dot_product_attention(q, c.k.transpose(1, 2), c.v.transpose(1, 2), attn_mask=mask)

    full, bytes_full = attend(cache), cache.nbytes
    pool_frame(cache, 1, (4, 4), 2)
    assert cache.k.shape[1] == 16 + 4 + 16 and cache.nbytes == bytes_full * 36 // 48
    assert torch.allclose(attend(cache), full, atol=1e-5)
    assert cache.token_frames.tolist() == [0] * 16 + [1] * 4 + [2] * 16
    cache.bias = None  # without the bias the pooled frame weighs 4x too little
    assert not torch.allclose(attend(cache), full, atol=1e-3)


@torch.no_grad()
def test_far_history_pooling_in_the_pipeline_keeps_what_the_window_keeps(ar):
    """tiny-wan-ar (window 5 with 1 sink, chunks of 2): with 1 frame kept whole before the chunk just committed, one
    of the 4 frames after the sink is pooled to a quarter: (1 + 3 + 1/4) / 5 of the dense cache, from the third
    chunk on; frames about to be evicted are not pooled."""
    from kinegen.dasa.peers import FarHistoryPooling

    kw = dict(height=64, width=64, num_frames=49, num_inference_steps=2, guidance_scale=1.0)
    dense = [c.stats.kv_bytes for c in ar.stream("a red circle", generator=torch.Generator().manual_seed(0), **kw)]
    ar.chunk_hooks = (FarHistoryPooling(near_frames=1, factor=2),)
    try:
        pooled = [c.stats.kv_bytes for c in ar.stream("a red circle", generator=torch.Generator().manual_seed(0),
                                                       **kw)]
    finally:
        del ar.chunk_hooks
    assert pooled[:2] == dense[:2]
    assert all(p == d * (1 + 3 + 0.25) / 5 for p, d in zip(pooled[2:], dense[2:], strict=True))
