"""Chunk-by-chunk Wan with a KV cache (issue 20, item 1): the cached path equals one block-causal forward, the
rolling window keeps memory flat, a prompt change re-caches, bad settings are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kinegen
from kinegen.errors import ConfigError, InvalidRequestError
from kinegen.pipelines.causal_wan import KVCacheConfig, make_causal
from kinegen.pipelines.wan_ar import WanAutoregressivePipeline, chunk_partition


@pytest.fixture(scope="module")
def wan():
    return kinegen.load_pipeline("tiny-wan")


@pytest.fixture(scope="module")
def ar(wan):
    pipe = WanAutoregressivePipeline(**wan.components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _inputs(tr, frames=6, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, tr.config.in_channels, frames, size, size, generator=g)
    text = torch.randn(1, 8, tr.config.text_dim, generator=g)
    return x, text, torch.tensor([500.0])


@torch.no_grad()
def test_cached_chunks_equal_one_block_causal_forward(wan):
    """Chunks run one after another against the cache give exactly the rows of one forward over the whole sequence
    with the block-causal mask; one chunk spanning everything is the model's own dense forward; remove() restores."""
    tr = wan.transformer
    x, text, t = _inputs(tr)
    dense = tr(x, t, text, return_dict=False)[0]
    state = make_causal(tr)
    try:
        state.chunk_ids = torch.tensor([0, 1, 1, 2, 2, 2])
        masked = tr(x, t, text, return_dict=False)[0]
        state.chunk_ids = None
        rows = []
        for start, n in ((0, 1), (1, 2), (3, 3)):
            state.frame_offset, state.commit = start, True
            rows.append(tr(x[:, :, start:start + n], t, text, return_dict=False)[0])
        assert torch.equal(torch.cat(rows, dim=2), masked)
        assert state.cached_frames == [0, 1, 2, 3, 4, 5]
        assert state.kv_bytes == 2 * 2 * 6 * 16 * tr.config.num_attention_heads * tr.config.attention_head_dim * 4
        assert not torch.allclose(masked, dense)  # later chunks see less than in the bidirectional forward
        state.chunk_ids = torch.zeros(6, dtype=torch.long)  # an all-true mask: another SDPA kernel, same numbers
        torch.testing.assert_close(tr(x, t, text, return_dict=False)[0], dense, rtol=0, atol=1e-6)
    finally:
        state.remove()
    assert torch.equal(tr(x, t, text, return_dict=False)[0], dense)


def test_the_prompt_is_projected_once_per_prompt_not_once_per_forward(wan):
    """Under make_causal, forwards on the same prompt embeddings reuse the text embedder's and the cross-attention
    key and value projections of the first: bit for bit what fresh projections give; a changed tensor, another one
    or a forward with gradients computes them again; remove() takes the hooks off."""
    from kinegen.pipelines.causal_wan import TEXT_MEMO

    tr = wan.transformer
    x, text, t = _inputs(tr, frames=2)
    memo = lambda m: m._diffusers_hook.get_hook(TEXT_MEMO)  # noqa: E731
    modules = [tr.condition_embedder.text_embedder, *(b.attn2.to_k for b in tr.blocks),
               *(b.attn2.to_v for b in tr.blocks), *(b.attn2.norm_k for b in tr.blocks)]
    state = make_causal(tr)
    try:
        with torch.no_grad():
            fresh = [tr(x[:, :, i:i + 1], t, text.clone(), return_dict=False)[0] for i in range(2)]
            assert all(memo(m).hits == 0 for m in modules)
            same = [tr(x[:, :, i:i + 1], t, text, return_dict=False)[0] for i in range(2)]
            assert all(torch.equal(a, b) for a, b in zip(fresh, same, strict=True))
            assert all(memo(m).hits == 1 for m in modules)
            text.mul_(2)  # changed in place: computed again
            changed = tr(x[:, :, :1], t, text, return_dict=False)[0]
            assert torch.equal(changed, tr(x[:, :, :1], t, text.clone(), return_dict=False)[0])
            assert not torch.equal(changed, same[0])
        tr.zero_grad()
        tr(x[:, :, :1], t, text, return_dict=False)[0].square().mean().backward()  # gradients on: no memo
        assert all(memo(m).hits == 1 for m in modules)
        k = tr.blocks[0].attn2.to_k
        assert k.weight.grad.abs().sum() > 0
        with torch.no_grad():
            before, saved = tr(x[:, :, :1], t, text, return_dict=False)[0], k.bias.clone()
            k.bias.add_(0.5)  # an optimizer step: the weights changed, so the projections are computed again
            after = tr(x[:, :, :1], t, text, return_dict=False)[0]
            assert not torch.equal(before, after)
            assert torch.equal(after, tr(x[:, :, :1], t, text.clone(), return_dict=False)[0])
            k.bias.copy_(saved)
            ref = tr(x[:, :, :1], t, text.clone(), return_dict=False)[0]
        with torch.inference_mode():  # its tensors keep no version counter: computed every time, same numbers
            hits = memo(modules[0]).hits
            text_inf = text.clone()
            assert torch.equal(tr(x[:, :, :1], t, text_inf, return_dict=False)[0], ref)
            assert torch.equal(tr(x[:, :, :1], t, text_inf, return_dict=False)[0], ref)
            assert memo(modules[0]).hits == hits
    finally:
        tr.zero_grad(set_to_none=True)
        state.remove()
    assert all(memo(m) is None for m in modules)


@torch.no_grad()
def test_an_interpolated_rope_runs_chunk_by_chunk_only_at_its_reference_size(wan):
    """Chunk by chunk the frames take Wan's integer positions; a transformer with position interpolation (a
    multi-resolution model's kinegen_rope.json) is right that way only at its training grid, so elsewhere it refuses."""
    import copy

    from kinegen.models.rope import install_position_interpolation

    tr = copy.deepcopy(wan.transformer)
    x, text, t = _inputs(tr)  # 8x8 latents with patch 2: a 4x4 grid of tokens per frame
    plain = make_causal(tr)
    plain.frame_offset = 0
    want = tr(x[:, :, :2], t, text, return_dict=False)[0]
    plain.remove()
    rope = install_position_interpolation(tr, (6, 4, 4))
    state = make_causal(tr)
    try:
        state.frame_offset = 0
        assert torch.equal(tr(x[:, :, :2], t, text, return_dict=False)[0], want)
        rope.reference_grid = (6, 8, 8)  # a model trained at twice this size
        with pytest.raises(ConfigError, match=r"interpolation \(kinegen_rope.json\) at 8x8 .* this input is 4x4"):
            tr(x[:, :, :2], t, text, return_dict=False)
    finally:
        state.remove()


@torch.no_grad()
def test_training_in_the_cache_layout_is_what_the_rolling_cache_computes(wan):
    """Diffusion forcing in the cache's layout (a sink at position 0, then frames from later in the video at their
    own positions) gives the rows the cached path gives when a rolling window has dropped the frames in between;
    `cache_layout` builds that layout from a window and its clip's first latent frame."""
    from kinegen.training.ar import cache_layout

    tr = wan.transformer
    x, text, t = _inputs(tr, frames=5)
    state = make_causal(tr)
    try:
        # one batch: a window from frame 0 (positions 0..4) and one at [sink, 7, 8, 9, 10]
        state.chunk_ids = torch.tensor([0, 1, 1, 2, 2])
        state.frame_positions = torch.tensor([[0, 1, 2, 3, 4], [0, 7, 8, 9, 10]])
        masked = tr(torch.cat([x, x]), t, torch.cat([text, text]), return_dict=False)[0]
        state.chunk_ids = state.frame_positions = None
        rows = []
        for start, pos, n in ((0, 0, 1), (1, 7, 2), (3, 9, 2)):
            state.frame_offset, state.commit = pos, True
            rows.append(tr(x[:, :, start:start + n], t, text, return_dict=False)[0])
        torch.testing.assert_close(torch.cat(rows, dim=2), masked[1:], rtol=0, atol=1e-6)
        assert state.cached_frames == [0, 7, 8, 9, 10]
        assert not torch.allclose(masked[0], masked[1], atol=1e-3)  # the positions matter
        state.chunk_ids = torch.tensor([0, 1, 1, 2, 2])
        state.frame_positions = torch.tensor([[0, 1, 2, 3]])
        with pytest.raises(ConfigError, match="frame_positions has shape"):
            tr(x, t, text, return_dict=False)
    finally:
        state.remove()
    lat = torch.arange(2 * 1 * 3 * 1 * 1, dtype=torch.float32).view(2, 1, 3, 1, 1)
    sinks = torch.full((2, 1, 1, 1, 1), -1.0)
    out, positions = cache_layout(lat, sinks, torch.tensor([0, 24]))
    assert positions.tolist() == [[0, 1, 2], [0, 7, 8]]
    assert out[0].flatten().tolist() == [0, 1, 2] and out[1].flatten().tolist() == [-1, 4, 5]


@torch.no_grad()
@pytest.mark.parametrize("context_noise, window", [(0.0, None), (0.2, None), (0.0, 2)])
def test_teacher_forcing_in_one_forward_is_what_the_sampler_computes(wan, context_noise, window):
    """One forward over [clean window; noisy copy] with the teacher-forcing mask gives, for each noisy chunk, what a
    denoising forward of that chunk gives against a cache of the clean chunks committed before it (committed
    clean, or noised to a context-noise level at its timestep, as ``kinegen train ar --context-noise`` trains;
    with a rolling window, only the frames that cache keeps: here the sink and the last one)."""
    from kinegen.pipelines.causal_wan import block_causal_mask, history_window, teacher_forcing_mask

    assert teacher_forcing_mask(torch.tensor([0, 1]), 1).int().tolist() == [
        [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]]
    rolling = KVCacheConfig(sink_frames=1, window_frames=3)
    assert history_window(torch.tensor([0, 1, 1, 2, 2, 3]), rolling).int().tolist() == [
        [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 1, 1, 0]]
    assert block_causal_mask(torch.tensor([0, 1, 1, 2]), 1, KVCacheConfig(1, 2)).int().tolist() == [
        [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 1, 1]]
    tr = wan.transformer
    clean, text, _ = _inputs(tr, frames=5)
    noisy = torch.randn_like(clean)
    clean = (1 - context_noise) * clean + context_noise * torch.randn_like(clean)
    t_noisy = torch.tensor([0.0, 300.0, 300.0, 700.0, 700.0])  # per latent frame: chunk 0 at 0 (a sink), 1, 2
    tokens = 16
    state = make_causal(tr, None if window is None else KVCacheConfig(sink_frames=1, window_frames=window))
    try:
        state.chunk_ids, state.teacher_forcing = torch.tensor([0, 1, 1, 2, 2]), True
        state.frame_positions = torch.tensor([[0, 5, 6, 7, 8] * 2])
        timestep = torch.cat([torch.full((5,), 1000 * context_noise), t_noisy]).repeat_interleave(tokens)[None]
        both = tr(torch.cat([clean, noisy], dim=2), timestep, text, return_dict=False)[0]
        state.chunk_ids, state.teacher_forcing, state.frame_positions = None, False, None
        for start, pos, n in ((0, 0, 1), (1, 5, 2), (3, 7, 2)):
            state.frame_offset, state.commit = pos, False
            t = t_noisy[start:start + n].repeat_interleave(tokens)[None]
            denoised = tr(noisy[:, :, start:start + n], t, text, return_dict=False)[0]
            torch.testing.assert_close(denoised, both[:, :, 5 + start:5 + start + n], rtol=0, atol=1e-5)
            state.commit = True
            committed = tr(clean[:, :, start:start + n], torch.full((1,), 1000 * context_noise), text,
                           return_dict=False)[0]
            torch.testing.assert_close(committed, both[:, :, start:start + n], rtol=0, atol=1e-5)
    finally:
        state.remove()


@torch.no_grad()
@pytest.mark.parametrize("guidance", [1.0, 2.0])
def test_a_training_rollout_is_what_the_sampler_generates(ar, guidance):
    """`kinegen train ar --rollout-prob`'s history: rolled out from the start it is, latent for latent, the
    pipeline's own video (same noise, context noise, guidance, steps); rolled out from a later chunk it keeps the
    real chunks around the ones it generates, and the model is left as it was."""
    from kinegen.training.ar import chunk_ids, rollout, rollout_span

    tr, prompt = ar.transformer, "a red circle moving right"
    kw = dict(height=32, width=32, num_frames=17, num_inference_steps=3, guidance_scale=guidance, context_noise=0.2,
              chunk_frames=2)
    video = ar(prompt, generator=torch.Generator().manual_seed(0), output_type="latent", **kw).frames
    text = ar._embeds(prompt, None, guidance, "cpu")
    ids = chunk_ids(video.shape[2], 2)  # [0, 1, 1, 2, 2]
    positions = torch.arange(video.shape[2])[None]
    state = make_causal(tr)
    try:
        ours = rollout(tr, state, torch.zeros_like(video), positions, text, ids, 0, int(ids.max()) + 1,
                       ar.scheduler, 3, guidance, 0.2, torch.Generator().manual_seed(0))
        torch.testing.assert_close(ours, video, rtol=0, atol=1e-5)
        real = torch.randn(video.shape, generator=torch.Generator().manual_seed(1))
        part = rollout(tr, state, real, positions, text, ids, 1, 1, ar.scheduler, 3, guidance, 0.2,
                       torch.Generator().manual_seed(0))
        assert state.cached_frames == [] and state.chunk_ids is None and not state.commit
    finally:
        state.remove()
    generated = ids == 1
    torch.testing.assert_close(part[:, :, ~generated], real[:, :, ~generated], rtol=0, atol=0)
    assert (part[:, :, generated] - real[:, :, generated]).abs().mean() > 0.1
    spans = {rollout_span(5, 2, torch.Generator().manual_seed(s)) for s in range(64)}
    assert spans == {(2, 1), (3, 1), (2, 2)}  # two real chunks before, at least one after
    with pytest.raises(ValueError, match="at least 4 chunks"):
        rollout_span(3, 2, torch.Generator())


@torch.no_grad()
def test_vae_segments_code_the_video_in_clips_the_vae_was_trained_on(wan):
    """segment_frames=9 (3 latent frames): chunks restart with an image latent every segment, each segment is
    decoded alone (streamed too), a video that ends inside a segment gets whole chunks and is cut to its length,
    and training windows are encoded in the same layout."""
    from kinegen.pipelines.wan_ar import segment_partition
    from kinegen.training.ar import chunk_ids, encode_segmented

    assert segment_partition(17, 17, 2) == [1, 2, 2]
    assert segment_partition(241, 17, 2) == [1, 2, 2] * 14 + [1, 2]  # 3 frames left: 5 decoded, 2 cut
    assert chunk_ids(10, 2, 5).tolist() == [0, 1, 1, 2, 2, 3, 4, 4, 5, 5]
    pipe = WanAutoregressivePipeline(**wan.components, chunk_frames=2, segment_frames=9)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(height=32, width=32, num_frames=21, num_inference_steps=2, guidance_scale=1.0)
    assert pipe.check_frames(21) == [1, 2, 1, 2, 1, 2]  # two segments of 9 frames, then 3 frames in one of 9
    out = pipe("a red circle", generator=torch.Generator().manual_seed(0), output_type="latent", **kw)
    latents = out.frames
    assert latents.shape[2] == 9 and [s.frames for s in out.chunk_stats][:3] == [[0], [1, 2], [3]]
    video = np.asarray(pipe("a red circle", generator=torch.Generator().manual_seed(0), **kw).frames[0])
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    alone = torch.cat([pipe.vae.decode(latents[:, :, lo:lo + 3] * std + mean).sample for lo in (0, 3, 6)], dim=2)
    alone = pipe.video_processor.postprocess_video(alone, output_type="np")[0][:21]
    np.testing.assert_allclose(video, alone, rtol=0, atol=1e-5)
    whole = pipe.video_processor.postprocess_video(pipe.vae.decode(latents * std + mean).sample, output_type="np")[0]
    assert np.abs(whole[9:21] - video[9:]).max() > 1e-3  # not what one decode of the whole video gives
    parts = list(pipe.stream("a red circle", generator=torch.Generator().manual_seed(0), **kw))
    assert [p.frames.shape[0] for p in parts] == [1, 8, 1, 8, 1, 2]
    np.testing.assert_allclose(np.concatenate([p.frames for p in parts]), video, rtol=0, atol=1e-5)
    clips = np.random.default_rng(0).integers(0, 255, (2, 18, 32, 32, 3), dtype=np.uint8)
    z = encode_segmented(pipe.vae, clips, 9)
    from kinegen.training.vae import to_tensor

    torch.testing.assert_close(z[1:, :, 3:], pipe.vae.encode(to_tensor(clips[1:, 9:])).latent_dist.mode())
    z = encode_segmented(pipe.vae, clips[:, :17], 9, overlap=True)  # frames 0-8, then 8-16
    torch.testing.assert_close(z[1:, :, 3:], pipe.vae.encode(to_tensor(clips[1:, 8:17])).latent_dist.mode())
    with pytest.raises(ConfigError, match="4k \\+ 1"):
        WanAutoregressivePipeline(**wan.components, segment_frames=8)
    with pytest.raises(ConfigError, match="chunk"):
        WanAutoregressivePipeline(**wan.components, chunk_frames=3, segment_frames=9)


@torch.no_grad()
def test_overlapping_segments_start_from_the_previous_segments_last_frame(wan):
    """segment_overlap: a later segment's image latent is the previous segment's last frame decoded and encoded
    again (not generated), that frame is shown once, so 241 frames are 15 segments of 17; call and stream agree."""
    from kinegen.pipelines.wan_ar import denormalize_latents, normalize_latents, segment_partition

    assert segment_partition(241, 17, 2, overlap=True) == [1, 2, 2] * 15
    assert segment_partition(17, 17, 2, overlap=True) == [1, 2, 2]
    pipe = WanAutoregressivePipeline(**wan.components, chunk_frames=2, segment_frames=9, segment_overlap=True)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(height=32, width=32, num_frames=21, num_inference_steps=2, guidance_scale=1.0)
    assert pipe.check_frames(21) == [1, 2, 1, 2, 1, 2]  # 9 frames, 8 more, then 4 more in a segment cut short
    latents = pipe("a red circle", generator=torch.Generator().manual_seed(0), output_type="latent", **kw).frames
    decode = [pipe.vae.decode(denormalize_latents(pipe.vae, latents[:, :, lo:lo + 3])).sample for lo in (0, 3, 6)]
    for k in (1, 2):  # each later image latent re-encodes the 8-bit last frame of the segment before
        last = ((decode[k - 1][:, :, -1:].clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1
        torch.testing.assert_close(latents[:, :, 3 * k:3 * k + 1],
                                   normalize_latents(pipe.vae, pipe.vae.encode(last).latent_dist.mode()))
    video = np.asarray(pipe("a red circle", generator=torch.Generator().manual_seed(0), **kw).frames[0])
    alone = torch.cat([decode[0], decode[1][:, :, 1:], decode[2][:, :, 1:]], dim=2)
    alone = pipe.video_processor.postprocess_video(alone, output_type="np")[0][:21]
    np.testing.assert_allclose(video, alone, rtol=0, atol=1e-5)
    parts = list(pipe.stream("a red circle", generator=torch.Generator().manual_seed(0), **kw))
    assert [p.frames.shape[0] for p in parts] == [1, 8, 0, 8, 0, 4]
    np.testing.assert_allclose(np.concatenate([p.frames for p in parts]), video, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="segment_frames"):
        WanAutoregressivePipeline(**wan.components, chunk_frames=2, segment_overlap=True)
    with pytest.raises(ConfigError, match="first_chunk_frames"):
        pipe.check_frames(21, first_chunk_frames=3)


@torch.no_grad()
def test_rolling_window_keeps_sinks_and_recent_frames_and_flat_memory(ar):
    kw = dict(height=32, width=32, num_frames=33, chunk_frames=2, num_inference_steps=1,
              generator=torch.Generator().manual_seed(0))
    rolling = ar("a red circle", sink_frames=1, window_frames=5, **kw).chunk_stats
    glob = ar("a red circle", **kw).chunk_stats
    assert [s.frames for s in rolling][:3] == [[0], [1, 2], [3, 4]] and len(rolling) == 5
    assert rolling[-1].cached_frames == [0, 5, 6, 7, 8]  # the sink, then the 4 most recent
    per_frame = glob[0].kv_bytes
    assert [s.kv_bytes for s in glob] == [per_frame * len(s.cached_frames) for s in glob] == \
        [per_frame * n for n in (1, 3, 5, 7, 9)]  # a global cache grows linearly
    assert [s.kv_bytes for s in rolling][2:] == [5 * per_frame] * 3  # flat once the window is full
    # a pipeline configured with a window still runs with a global cache when a call asks for one
    ar.register_to_config(sink_frames=1, window_frames=5)
    try:
        assert [s.kv_bytes for s in ar("a red circle", window_frames="global", **kw).chunk_stats] == \
            [s.kv_bytes for s in glob]
    finally:
        ar.register_to_config(sink_frames=0, window_frames=None)


@torch.no_grad()
def test_prompt_change_recaches_the_window_under_the_new_prompt(ar):
    """After a switch the cache holds what committing the kept frames under the new prompt gives, chunk by chunk."""
    kw = dict(height=32, width=32, num_frames=17, chunk_frames=2, num_inference_steps=1, sink_frames=1,
              window_frames=3)
    seen = {}

    def keep(c, n, latents):
        seen[c] = latents.clone()

    out = ar([(0, "a red circle"), (2, "a blue square")], generator=torch.Generator().manual_seed(1),
             callback_on_chunk_end=keep, output_type="latent", **kw)
    same = ar("a red circle", generator=torch.Generator().manual_seed(1), output_type="latent", **kw)
    assert torch.equal(out.frames[:, :, :3], same.frames[:, :, :3])  # chunks before the switch are unchanged
    assert not torch.allclose(out.frames[:, :, 3:], same.frames[:, :, 3:])
    # Re-caching after the window has dropped frames 1 and 2: the kept frames [0, 3, 4] are committed again under
    # the new prompt, chunk by chunk (frame 0, then frames 3-4 seeing frame 0), as a fresh cache would hold them.
    tr = ar.transformer
    state = make_causal(tr, KVCacheConfig(sink_frames=1, window_frames=3))
    try:
        embeds = ar._embeds("a blue square", None, 1.0, "cpu")
        for start, x in ((0, seen[0]), (3, seen[2])):
            ar._forward(x, 0, embeds, state, frame_offset=start, commit=True)
        assert state.cached_frames == [0, 3, 4]
        expected_k = [c.k.clone() for c in state.caches]
        state.clear()
        clean = {0: seen[0], 1: seen[1][:, :, :1], 2: seen[1][:, :, 1:], 3: seen[2][:, :, :1], 4: seen[2][:, :, 1:]}
        old = ar._embeds("a red circle", None, 1.0, "cpu")
        for start, x in ((0, seen[0]), (1, seen[1]), (3, seen[2])):
            ar._forward(x, 0, old, state, frame_offset=start, commit=True)
        ar._recache(state, clean, {0: 0, 1: 1, 2: 1, 3: 2, 4: 2}, embeds)
        assert state.cached_frames == [0, 3, 4]
        for got, want in zip((c.k for c in state.caches), expected_k, strict=True):
            torch.testing.assert_close(got, want)
    finally:
        state.remove()


@torch.no_grad()
def test_a_prompt_switch_with_guidance_recaches_both_branches(ar):
    """With guidance the cache holds a conditional and an unconditional row; a prompt switch re-caches both."""
    out = ar([(0, "a red circle"), (1, "a blue square")], generator=torch.Generator().manual_seed(1), height=32,
             width=32, num_frames=17, num_inference_steps=2, guidance_scale=3.0, chunk_frames=2, window_frames=3,
             sink_frames=1, output_type="latent")
    assert out.frames.shape[2] == 5 and torch.isfinite(out.frames).all()


@torch.no_grad()
def test_context_noise_commits_each_chunk_noised_at_its_level(ar, monkeypatch):
    """With ``context_noise`` s, the commit forward runs on ``(1 - s) x_0 + s e`` at timestep 1000 s; 0 is clean."""
    kw = dict(height=32, width=32, num_frames=17, chunk_frames=2, num_inference_steps=1, output_type="latent")
    calls, forward = [], ar._forward

    def spy(latents, t, embeds, state, *, frame_offset, commit):
        if commit:
            calls.append((float(t), latents.clone()))
        return forward(latents, t, embeds, state, frame_offset=frame_offset, commit=commit)

    monkeypatch.setattr(ar, "_forward", spy)
    clean = ar("a red circle", generator=torch.Generator().manual_seed(1), **kw).frames
    assert [t for t, _ in calls] == [0.0, 0.0, 0.0] and torch.equal(calls[0][1], clean[:, :, :1])
    calls.clear()
    noised = ar("a red circle", generator=torch.Generator().manual_seed(1), context_noise=0.25, **kw).frames
    assert [t for t, _ in calls] == [250.0, 250.0, 250.0]
    torch.testing.assert_close(noised[:, :, :1], clean[:, :, :1])  # the first chunk is denoised before any commit
    committed = calls[0][1]
    assert not torch.allclose(committed, noised[:, :, :1])
    noise = (committed - 0.75 * noised[:, :, :1]) / 0.25  # what was added is unit Gaussian noise
    assert 0.8 < float(noise.std()) < 1.2 and abs(float(noise.mean())) < 0.2
    assert not torch.allclose(noised[:, :, 1:], clean[:, :, 1:])  # later chunks see the noised history
    with pytest.raises(ConfigError, match="context_noise is a noise level in \\[0, 1\\)"):
        ar("a red circle", context_noise=1.0, **kw)


def test_bad_settings_are_refused_with_the_valid_values(ar):
    with pytest.raises(InvalidRequestError, match="try num_frames 17 or 25"):
        chunk_partition(6, 2)  # 6 latent frames (21 video frames) do not split into 1 + 2 + 2 + ...
    assert chunk_partition(5, 2) == [1, 2, 2]
    with pytest.raises(ConfigError, match="must be larger than sink_frames"):
        KVCacheConfig(sink_frames=2, window_frames=2)
    with pytest.raises(ConfigError, match="smaller than a chunk"):
        ar("a red circle", height=32, width=32, num_frames=17, chunk_frames=4, window_frames=3)
    with pytest.raises(InvalidRequestError, match="starts at chunk 0 and names chunks 0 to 2"):
        ar([(1, "a red circle")], height=32, width=32, num_frames=17, chunk_frames=2)
    with pytest.raises(InvalidRequestError, match="list of \\(chunk index, prompt\\) pairs"):
        ar([("a red circle",)], height=32, width=32, num_frames=17, chunk_frames=2)
    with pytest.raises(InvalidRequestError, match="4k \\+ 1"):
        ar("a red circle", height=32, width=32, num_frames=16)
    # A refused run leaves the model as it was: its own processors, no cache.
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in ar.transformer.blocks)


def test_a_bidirectional_checkpoint_is_refused_unless_asked_for(wan, tmp_path):
    """Loading a WanPipeline folder as a chunk-by-chunk pipeline names what to do; a saved causal one loads."""
    wan.save_pretrained(tmp_path / "bidirectional")
    with pytest.raises(ConfigError, match="not a causal one.*kinegen train ar --init"):
        WanAutoregressivePipeline.from_pretrained(tmp_path / "bidirectional")
    pipe = WanAutoregressivePipeline.from_pretrained(tmp_path / "bidirectional", allow_bidirectional=True)
    pipe.save_pretrained(tmp_path / "causal")
    assert type(WanAutoregressivePipeline.from_pretrained(tmp_path / "causal")).__name__ == "WanAutoregressivePipeline"


@torch.no_grad()
def test_stream_yields_each_chunk_decoded_as_the_whole_video_decodes(ar):
    """stream() decodes chunk by chunk with the causal VAE's cache carried over: the frames, put together, are
    the ones the one-shot call decodes (with diffusers' vae.decode), up to float rounding; the first chunk (one
    latent frame) is one video frame, later ones four per latent frame."""
    import numpy as np

    kw = dict(height=32, width=32, num_frames=17, chunk_frames=2, num_inference_steps=2, guidance_scale=3.0)
    whole = np.asarray(ar("a red circle", generator=torch.Generator().manual_seed(3), **kw).frames[0])
    parts = list(ar.stream("a red circle", generator=torch.Generator().manual_seed(3), **kw))
    assert [p.frames.shape[0] for p in parts] == [1, 8, 8] and [p.index for p in parts] == [0, 1, 2]
    np.testing.assert_allclose(np.concatenate([p.frames for p in parts]), whole, rtol=0, atol=1e-5)
    # The chunked decoder is diffusers' own decode, up to the order of float operations.
    from kinegen.pipelines.wan_ar import StreamingWanDecoder

    z = torch.randn(1, ar.vae.config.z_dim, 5, 4, 4, generator=torch.Generator().manual_seed(0))
    mean = torch.tensor(ar.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(ar.vae.config.latents_std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(StreamingWanDecoder(ar.vae).decode(z), ar.vae.decode(z * std + mean).sample,
                               rtol=0, atol=1e-5)
    # Closing the stream early stops the run and gives the model back.
    gen = ar.stream("a red circle", generator=torch.Generator().manual_seed(3), **kw)
    next(gen)
    gen.close()
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in ar.transformer.blocks)
    with pytest.raises(ConfigError, match="not output_type"):
        next(ar.stream("a red circle", output_type="np"))


def test_an_autoregressive_model_runs_through_kinegen_like_any_other(tmp_path, capsys):
    """tiny-wan-ar through load_pipeline, generate and the CLI: its chunk settings survive save_pretrained, a frame
    count that does not split into chunks is refused before anything runs, step-wise accelerators are refused."""
    from kinegen.cli import main

    pipe = kinegen.load_pipeline("tiny-wan-ar")
    result = kinegen.generate(pipe, "a red circle", seed=1, frames=33)
    # 9 latent frames = chunks of 1, 2, 2, 2, 2; each 2 denoising steps (guidance batched) and 1 commit
    assert result.frames.shape == (33, 32, 32, 3) and result.timings["transformer_calls"] == 5 * (2 + 1)
    folder = tmp_path / "ar"
    pipe.save_pretrained(folder)
    again = kinegen.load_pipeline(str(folder))
    assert type(again).__name__ == "WanAutoregressivePipeline"
    assert (again.config.chunk_frames, again.config.sink_frames, again.config.window_frames) == (2, 1, 5)
    assert again.kinegen_spec.family == "wan_ar"
    with pytest.raises(InvalidRequestError, match="try num_frames 17 or 25"):
        kinegen.prepare(pipe, "a red circle", frames=21)
    with pytest.raises(ConfigError, match="generates chunk by chunk with a KV cache"):
        kinegen.generate(pipe, "a red circle", frames=17, accelerators=["first-block"])
    out = tmp_path / "v.mp4"
    assert main(["generate", "a red circle", "--model", str(folder), "--frames", "33", "--seed", "1", "-o",
                 str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert main(["generate", "a red circle", "--model", str(folder), "--frames", "21", "-o",
                 str(tmp_path / "bad.mp4")]) == 2
    assert "try num_frames 17 or 25" in capsys.readouterr().err and not (tmp_path / "bad.mp4").exists()


def test_the_kv_window_is_a_request_setting(tmp_path, capsys):
    """``window_frames`` / ``sink_frames`` (``--window-frames`` / ``--sink-frames``) set the cache of one run: a
    window of 3 holds 3 latent frames once full where the model's own (5) holds 5, and changes the video; bad values
    and models without a rolling window are refused before anything runs, naming what to do."""
    from kinegen.cli import main

    pipe = kinegen.load_pipeline("tiny-wan-ar")  # sink 1, window 5, chunks of 2
    own = kinegen.generate(pipe, "a red circle", seed=1, frames=33)
    small = kinegen.generate(pipe, "a red circle", seed=1, frames=33, window_frames=3)
    assert [len(c["cached_frames"]) for c in own.chunks][-1] == 5
    assert [len(c["cached_frames"]) for c in small.chunks][-2:] == [3, 3]
    assert small.chunks[-1]["cached_frames"][0] == 0  # the sink stays
    assert small.chunks[-1]["kv_bytes"] == own.chunks[-1]["kv_bytes"] * 3 // 5
    assert not np.allclose(small.frames, own.frames)
    every = kinegen.generate(pipe, "a red circle", seed=1, frames=33, window_frames="global", sink_frames=0)
    assert every.chunks[-1]["cached_frames"] == list(range(9))  # every latent frame, once the last is committed
    with pytest.raises(InvalidRequestError, match="smaller than a chunk \\(2 frames\\).*try 2 or more"):
        kinegen.prepare(pipe, "a red circle", frames=33, window_frames=1, sink_frames=0)
    with pytest.raises(InvalidRequestError, match="must be larger than sink_frames"):
        kinegen.prepare(pipe, "a red circle", frames=33, window_frames=3, sink_frames=3)
    with pytest.raises(InvalidRequestError, match="window_frames must be a number of latent frames"):
        kinegen.GenerationRequest("a red circle", window_frames="all")
    with pytest.raises(InvalidRequestError, match="tiny-wan has none: drop --window-frames"):
        kinegen.prepare(kinegen.load_pipeline("tiny-wan"), "a red circle", frames=9, window_frames=3)
    out = tmp_path / "v.mp4"
    assert main(["generate", "a red circle", "--model", "tiny-wan-ar", "--frames", "17", "--window-frames", "3",
                 "--sink-frames", "0", "-o", str(out)]) == 0
    assert out.is_file()
    assert main(["generate", "a red circle", "--model", "tiny-wan-ar", "--frames", "17", "--window-frames", "1",
                 "--sink-frames", "0", "-o", str(tmp_path / "bad.mp4")]) == 2
    assert "try 2 or more" in capsys.readouterr().err and not (tmp_path / "bad.mp4").exists()


def test_diffusion_forcing_trains_resumes_and_exports_a_causal_pipeline(tmp_path):
    """`kinegen train ar` on a tiny budget: per-chunk noise levels (some chunks clean), the run resumes from its
    checkpoint, and the export is a WanAutoregressivePipeline folder that loads and generates with its chunk
    settings. (Whether it learns is for the real run, docs/autoregressive.md.)"""
    import json

    from kinegen.cli import main
    from kinegen.training.ar import chunk_ids, forcing_sigmas

    assert chunk_ids(5, 2).tolist() == [0, 1, 1, 2, 2]
    sig = forcing_sigmas(64, 3, 3.0, 0.25, torch.Generator().manual_seed(0))
    clean = (sig == 0).float().mean().item()
    assert sig.shape == (64, 3) and 0.15 < clean < 0.35 and sig.max() < 1  # about a quarter of chunks clean
    run = tmp_path / "run"
    args = ["train", "ar", "--run", str(run), "--frames", "9", "--size", "32", "--dataset-windows", "8",
            "--batch-size", "2", "--checkpoint-every", "3", "--lr", "1e-3", "--window-frames", "3"]
    assert main([*args, "--steps", "3"]) == 0
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 3
    assert main([*args, "--steps", "6"]) == 0  # resumes at step 3
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 6 and log[-1]["step"] == 6
    pipe = kinegen.load_pipeline(str(run / "pipeline"))
    assert type(pipe).__name__ == "WanAutoregressivePipeline"
    assert (pipe.config.chunk_frames, pipe.config.sink_frames, pipe.config.window_frames) == (2, 1, 3)
    result = kinegen.generate(pipe, "a red circle moving right", frames=17, steps=2, seed=0)
    assert result.frames.shape == (17, 32, 32, 3)
    # Diffusion forcing (stage 1's recipe) and error recycling on every step train too.
    other = tmp_path / "forcing"
    assert main(["train", "ar", "--run", str(other), *args[4:], "--steps", "2", "--teacher-forcing", "false",
                 "--recycle-prob", "1", "--guidance", "2", "--object-weight", "4"]) == 0
    assert json.loads((other / "pipeline" / "kinegen_defaults.json").read_text())["guidance"] == 2.0
    # Teacher forcing with the history noised as the export will commit it.
    noised = tmp_path / "context-noise"
    assert main(["train", "ar", "--run", str(noised), *args[4:], "--steps", "2", "--context-noise", "0.2"]) == 0
    assert kinegen.load_pipeline(str(noised / "pipeline")).config.context_noise == 0.2
    # Teacher forcing on the model's own rollouts (every step), on windows of 4 chunks (25 frames) or more.
    rolled = tmp_path / "rollouts"
    rollouts = ["--steps", "2", "--rollout-prob", "1", "--rollout-steps", "2", "--guidance", "2"]
    assert main(["train", "ar", "--run", str(rolled), *args[4:], "--frames", "25", *rollouts]) == 0
    assert json.loads((rolled / "checkpoint" / "state.json").read_text())["step"] == 2
    # Windows coded in VAE segments (two of 9 frames, later ones from a segment start after the sink): the export
    # generates in that layout, cut to the frames asked for.
    segmented = tmp_path / "segments"
    assert main(["train", "ar", "--run", str(segmented), *args[4:], "--steps", "2", "--frames", "18",
                 "--segment-frames", "9", "--max-start", "36"]) == 0
    pipe = kinegen.load_pipeline(str(segmented / "pipeline"))
    assert pipe.config.segment_frames == 9 and pipe.check_frames(21) == [1, 2, 1, 2, 1, 2]
    assert kinegen.generate(pipe, "a red circle", frames=21, steps=1, seed=0).frames.shape == (21, 32, 32, 3)
    # Overlapping segments (two of 9 frames sharing frame 8; windows start every 8 frames): so does the export.
    overlapped = tmp_path / "overlap"
    assert main(["train", "ar", "--run", str(overlapped), *args[4:], "--steps", "2", "--frames", "17",
                 "--segment-frames", "9", "--segment-overlap", "true", "--max-start", "32",
                 "--object-weight", "4", "--relink-loss", "false", "--relink-recycle", "1",
                 "--recycle-prob", "1"]) == 0
    # (--object-weight: the shapes' masks, rendered once, in the latents' layout: 2 segments of 3 latent frames;
    # --relink-loss false: no loss on the second segment's image latent, which the export re-encodes;
    # --relink-recycle 1 with every step recycled: that latent remade from the recycled first segment.)
    weighted = tmp_path / "relink-weight"  # the loss on that latent weighted instead (a step is enough to run it)
    assert main(["train", "ar", "--run", str(weighted), *args[4:], "--steps", "1", "--frames", "17",
                 "--segment-frames", "9", "--segment-overlap", "true", "--max-start", "32",
                 "--relink-weight", "3"]) == 0
    later = tmp_path / "later-history"  # every batch of later windows, their first segment history only
    assert main(["train", "ar", "--run", str(later), *args[4:], "--steps", "1", "--frames", "17",
                 "--segment-frames", "9", "--segment-overlap", "true", "--max-start", "32",
                 "--later-share", "1", "--later-history-segments", "1"]) == 0
    from safetensors.torch import load_file

    masks = load_file(str(overlapped / "latents" / "masks.safetensors"))
    latents = load_file(str(overlapped / "latents" / "chunk_0000.safetensors"))["latents"]
    assert masks["windows"].shape == (8, 1, 6, 4, 4) == (latents.shape[0], 1, *latents.shape[2:])
    assert masks["sinks"].shape == (8, 1, 1, 4, 4) and 0 < masks["windows"].float().mean() < 0.5
    pipe = kinegen.load_pipeline(str(overlapped / "pipeline"))
    assert pipe.segment_overlap and pipe.check_frames(25) == [1, 2, 1, 2, 1, 2]  # 9, then 8 more twice
    assert kinegen.generate(pipe, "a red circle", frames=25, steps=1, seed=0).frames.shape == (25, 32, 32, 3)
    assert main(["train", "ar", "--run", str(tmp_path / "short"), *args[4:], *rollouts]) == 2  # 9 frames: 2 chunks
    assert not (tmp_path / "short").exists()
    assert main(["train", "ar", "--run", str(tmp_path / "bad"), *args[4:], "--steps", "2", "--context-noise", "1"]) == 2
    assert not (tmp_path / "bad").exists()


def test_the_web_service_runs_and_stops_an_autoregressive_model(tmp_path):
    """The app's service drives tiny-wan-ar like any model: step progress per chunk, and a cancel stops it at the
    next step with nothing written."""
    import threading

    from kinegen.apps.service import AppConfig, Service
    from kinegen.errors import RunCancelled
    from kinegen.generation import GenerationRequest

    svc = Service(AppConfig(models=["tiny-wan-ar"], gan_models=[], output_dir=tmp_path / "out"))
    steps = []
    out = svc.generate("tiny-wan-ar", GenerationRequest(prompt="a red circle", frames=17, seed=0),
                       step_callback=lambda i, n, latents: steps.append((i, n)))
    assert out["output"].endswith(".mp4") and steps == [(0, 2), (1, 2)] * 3  # 3 chunks of 2 steps
    cancel = threading.Event()

    def stop_after_first(i, n, latents):
        cancel.set()

    with pytest.raises(RunCancelled):
        svc.generate("tiny-wan-ar", GenerationRequest(prompt="a red circle", frames=17, seed=1),
                     step_callback=stop_after_first, cancel=cancel)
    assert len(svc.history_rows()) == 1 and sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".jsonl",
                                                                                                       ".mp4"]


def test_window_plan_covers_the_video_with_overlapping_prefixes():
    from kinegen.pipelines.window_extend import window_plan

    assert window_plan(61, 5, 2) == [(0, 5)] + [(3 + 3 * k, 5) for k in range(18)] + [(57, 4)]
    assert window_plan(5, 5, 2) == [(0, 5)]
    plan = window_plan(23, 5, 1)
    assert all(s == prev_s + prev_n - 1 for (prev_s, prev_n), (s, _) in zip(plan, plan[1:], strict=False))
    with pytest.raises(InvalidRequestError, match="between 1 and window - 1"):
        window_plan(20, 5, 5)


@pytest.mark.parametrize("history", ["clean", "noised"])
def test_window_by_window_extension_of_a_bidirectional_model(history):
    import kinegen
    from kinegen.pipelines.window_extend import extend_window_by_window

    pipe = kinegen.load_pipeline("tiny-wan")
    kw = dict(num_frames=29, height=32, width=32, num_inference_steps=2, guidance_scale=2.0, window_frames=17,
              overlap_frames=5, history=history)
    frames, stats = extend_window_by_window(pipe, "a red circle", generator=torch.Generator().manual_seed(0), **kw)
    assert frames.shape == (29, 32, 32, 3) and 0 <= frames.min() and frames.max() <= 1
    assert [(s.frames[0], len(s.frames), s.prefix_frames) for s in stats] == [(0, 5, 0), (3, 5, 2)]
    again, _ = extend_window_by_window(pipe, "a red circle", generator=torch.Generator().manual_seed(0), **kw)
    np.testing.assert_array_equal(frames, again)
    with pytest.raises(InvalidRequestError, match="history must be one of clean, noised"):
        extend_window_by_window(pipe, "x", **{**kw, "history": "replace"})
    with pytest.raises(InvalidRequestError, match="overlap_frames must be 4k \\+ 1"):
        extend_window_by_window(pipe, "x", **{**kw, "overlap_frames": 4})
