"""diffusers' AnyFlow-FAR through Kinegen (issue 20, item 1): a saved ``AnyFlowFARPipeline`` folder loads and generates
like any video model, and its cached attention runs on exact sequences where diffusers 0.42 attends to padding."""

from __future__ import annotations

import json

import pytest
import torch

import kinegen
from kinegen.adapters import get_adapter
from kinegen.errors import ConfigError, InvalidRequestError
from kinegen.pipelines.anyflow_far import exact_far_attention, far_chunk_partition

RELEASED = (1, 3, 3, 3, 3, 3, 3, 2)  # diffusers' default chunk_partition: 21 latent frames, 81 video frames


@pytest.fixture(scope="module")
def far():
    pipe = kinegen.load_pipeline("tiny-anyflow-far", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _far_cache(tr, partition, side):
    """Per-layer KV buffers as ``AnyFlowFARPipeline.__call__`` allocates them (step 6), for a latent of ``side``."""
    cfg = tr.config
    full = (side // cfg.patch_size[1]) ** 2 * cfg.full_chunk_limit * max(partition)
    comp = (side // cfg.compressed_patch_size[1]) ** 2 * (len(partition) - cfg.full_chunk_limit + 1) * max(partition)
    shape = (2, 1, cfg.num_attention_heads)
    return {i: {"full_cache": torch.zeros(*shape, full, cfg.attention_head_dim),
                "compressed_cache": torch.zeros(*shape, comp, cfg.attention_head_dim)} for i in range(cfg.num_layers)}


def _chunk_outputs(tr, partition, side, seed=0, reference=True):
    """Each chunk's velocity by the pipeline's protocol (commit the clean prefix into the cache, then one denoising
    forward of the noisy chunk reading it) with the processors installed now, and, if asked, the reference: the
    whole sequence (clean prefix at t = 0, noisy chunk at t) in one forward with diffusers' block-causal mask."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(1, sum(partition), 16, side, side, generator=g)
    text = torch.randn(1, 8, tr.config.text_dim, generator=g)
    t, r = 750.0, 250.0
    cache = _far_cache(tr, partition, side)
    cached, whole = [], []
    for k, n in enumerate(partition):
        start = sum(partition[:k])
        noisy = torch.randn(1, n, 16, side, side, generator=g)
        if k:
            zeros = torch.zeros(1, start)
            tr(hidden_states=clean[:, :start], timestep=zeros, r_timestep=zeros, encoder_hidden_states=text,
               chunk_partition=partition[:k], kv_cache=cache, kv_cache_flag={"num_cached_chunks": k - 1,
                                                                             "is_cache_step": True})
        ts, rs = torch.full((1, n), t), torch.full((1, n), r)
        cached.append(tr(hidden_states=noisy, timestep=ts, r_timestep=rs, encoder_hidden_states=text,
                         chunk_partition=partition[:k + 1], kv_cache=cache, return_dict=False,
                         kv_cache_flag={"num_cached_chunks": k, "is_cache_step": False})[0])
        if reference:
            ts, rs = (torch.cat([torch.zeros(1, start), x], dim=1) for x in (ts, rs))
            whole.append(tr(hidden_states=torch.cat([clean[:, :start], noisy], dim=1), timestep=ts, r_timestep=rs,
                            encoder_hidden_states=text, chunk_partition=partition[:k + 1],
                            return_dict=False)[0][:, -n:])
    return cached, whole


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@torch.no_grad()
def test_cached_chunks_match_the_masked_forward_where_diffusers_attends_to_padding(far):
    """diffusers 0.42 pads a denoising chunk to a multiple of 128 tokens and attends to the zero keys (no mask on
    that path; docs/autoregressive.md, "AnyFlow-FAR models"). Chunks 0-3 of (1, 2, 2, 2) cover an empty cache, the
    full tier and, at chunk 3, the compressed tier (full_chunk_limit 3)."""
    tr = far.transformer
    # 32x32 video: 4 tokens a frame, so every chunk is padded (124 or 120 zero keys): diffusers' rows are off by
    # 4-9% on these random weights, ours by about 1e-7 (float32 rounding).
    stock, reference = _chunk_outputs(tr, [1, 2, 2, 2], side=4)
    with exact_far_attention(tr):
        exact, _ = _chunk_outputs(tr, [1, 2, 2, 2], side=4, reference=False)
    for k in range(4):
        torch.testing.assert_close(exact[k], reference[k], rtol=1e-5, atol=1e-5)
        assert _rel(exact[k], reference[k]) < 1e-6 and _rel(stock[k], reference[k]) > 2e-2, k
    # 128x128 video: 64 tokens a frame, so a two-frame chunk is exactly 128 tokens: diffusers is right there, and
    # wrong on the one-frame first chunk (64 zero keys). The padding is the whole difference.
    stock, reference = _chunk_outputs(tr, [1, 2], side=16, seed=1)
    with exact_far_attention(tr):
        exact, _ = _chunk_outputs(tr, [1, 2], side=16, seed=1, reference=False)
    assert _rel(stock[0], reference[0]) > 1e-2
    torch.testing.assert_close(stock[1], reference[1], rtol=1e-5, atol=1e-5)
    for k in range(2):
        torch.testing.assert_close(exact[k], reference[k], rtol=1e-5, atol=1e-5)
    assert all(type(b.attn1.processor).__name__ == "AnyFlowCausalAttnProcessor" for b in tr.blocks)  # restored


def test_frame_counts_split_like_the_released_partition():
    assert far_chunk_partition(21, RELEASED, 3) == list(RELEASED)  # the configured one, as diffusers' default
    assert far_chunk_partition(13, RELEASED, 3) == [1, 3, 3, 3, 3]  # shorter: the first chunk, then chunks of 3
    assert far_chunk_partition(9, RELEASED, 3) == [1, 3, 3, 2]  # and a shorter last chunk
    assert far_chunk_partition(2, RELEASED, 3) == [1, 1]
    with pytest.raises(InvalidRequestError, match="needs at least 2 chunks; num_frames 1 gives 1 chunk. Try num_frames "
                                                  "5 or more"):
        far_chunk_partition(1, RELEASED, 3)  # diffusers would size the compressed cache at -1 chunks


def test_anyflow_far_runs_through_kinegen_like_any_other(far, tmp_path, capsys):
    """tiny-anyflow-far through generate (2 steps per chunk, 4 chunks, 3 commits), save_pretrained (still a stock
    AnyFlowFARPipeline folder), load_pipeline and the CLI; bad frame counts and step-wise accelerators are refused."""
    from diffusers import AnyFlowFARPipeline

    from kinegen.cli import main

    adapter = get_adapter(far)
    assert adapter.name == "anyflow_far" and get_adapter(far.transformer) is adapter
    assert adapter.spatial_multiple(far) == 32 and adapter.temporal_factor(far) == 4  # VAE 8 x compressed patch 4
    result = kinegen.generate(far, "a red circle", seed=1)
    assert result.frames.shape == (25, 32, 32, 3) and result.timings["transformer_calls"] == 4 * 2 + 3
    assert all(type(b.attn1.processor).__name__ == "AnyFlowCausalAttnProcessor" for b in far.transformer.blocks)

    folder = tmp_path / "far"
    far.save_pretrained(folder)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "AnyFlowFARPipeline"
    assert type(AnyFlowFARPipeline.from_pretrained(folder)) is AnyFlowFARPipeline  # diffusers reads it as it is
    again = kinegen.load_pipeline(str(folder), device="cpu")
    assert type(again).__name__ == "KinegenAnyFlowFARPipeline" and again.kinegen_spec.family == "anyflow_far"
    kw = dict(seed=2, frames=5, guidance=2.0)  # chunks (1, 1); guidance batched, so the cache holds both branches
    assert kinegen.prepare(again, "a red circle", **kw).run_info().guidance_calls == "batched"
    torch.testing.assert_close(kinegen.generate(again, "a red circle", **kw).frames,
                               kinegen.generate(far, "a red circle", **kw).frames, rtol=0, atol=0)

    with pytest.raises(InvalidRequestError, match="form 4k \\+ 1.*Try 17 or 21"):
        kinegen.prepare(far, "a red circle", frames=20)
    with pytest.raises(InvalidRequestError, match="not a multiple of 32"):
        kinegen.prepare(far, "a red circle", height=48)
    with pytest.raises(InvalidRequestError, match="RoPE table \\(32 latent frames\\); generate at most 125 frames"):
        kinegen.prepare(far, "a red circle", frames=129)
    with pytest.raises(InvalidRequestError, match="height and width go up to 512"):
        kinegen.prepare(far, "a red circle", width=544)
    assert adapter.preview_frame(far, torch.randn(1, 2, 16, 4, 4)).shape == (32, 32, 3)  # [B, F, C, H, W] latents
    with pytest.raises(ConfigError, match="generates chunk by chunk with a KV cache"):
        kinegen.generate(far, "a red circle", accelerators=["first-block"])
    out = tmp_path / "v.mp4"
    assert main(["generate", "a red circle", "--model", str(folder), "--frames", "5", "--steps", "1", "-o",
                 str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert main(["generate", "a red circle", "--model", str(folder), "--frames", "1", "-o",
                 str(tmp_path / "bad.mp4")]) == 2
    assert "Try num_frames 5 or more" in capsys.readouterr().err and not (tmp_path / "bad.mp4").exists()
