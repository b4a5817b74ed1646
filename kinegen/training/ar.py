"""Turn the bundled text-to-video model into a chunk-by-chunk one (docs/autoregressive.md, "Training").

Data: windows of ``frames`` frames cut from endless procedural videos (:func:`kinegen.data.shapes.render_long_clip`:
the training clip, then the same speed bouncing off the edges), half of them from frame 0 and the rest from later
start frames, each with its clip's caption; encoded once with the model's own VAE into ``run_dir/latents/``. The
window's latent frames are split into chunks as the pipeline splits them (one frame, then ``chunk_frames`` each);
each chunk gets its own noise level ``s_c`` (a shifted logit-normal draw), each token its chunk's timestep, and the
loss is the flow velocity of the noisy chunks:

    x_t = (1 - s_c) x_0 + s_c e   (s_c per chunk),   loss = |v_theta(x_t, 1000 s, text) - (e - x_0)|^2

Two ways to give a chunk its history (CausVid / Self-Forcing's causal initialisation, our reading):

- **Teacher forcing** (``teacher_forcing``, the default; :func:`teacher_forcing_loss`): one forward over the
  clean window followed by its noisy copy, where a noisy chunk sees the clean chunks before it and itself. That is
  exactly what the sampler computes (a clean cache committed chunk by chunk, then the chunk being denoised;
  tested), so every chunk trains in the setting it meets at inference. Twice the tokens per forward.
- **Diffusion forcing** (:func:`forcing_loss`): one block-causal forward where every chunk, history included, has
  its own level (``clean_prob`` of them none). Cheaper, but a chunk whose history is all clean, the only case the
  sampler runs, is rare (0.25^4 for the fifth chunk): the shipped model's first stage was trained this way.

Two more things bring training closer to inference:

- **The cache's layout.** At inference the rolling cache holds the sink (the video's first latent frame, RoPE
  position 0) and the most recent frames at their own positions, far from 0 after a few seconds. With
  ``cache_layout`` and ``sink_frames > 0`` a window that starts later in the video is trained that way: its first
  latent frame (the start frame coded alone) is replaced by the clip's first latent frame at position 0 and the
  rest keep their positions in the video (:attr:`CausalWanState.frame_positions`), so the gap between the sink
  and the window is one the model has seen. And a chunk sees only the history that cache keeps (the sink and the
  last ``window_frames - sink_frames`` frames before it: :func:`kinegen.pipelines.causal_wan.history_window`),
  which binds once a window is longer than the cache (``--frames 49`` in segments of 17 at the default 9).
- **Its own errors** (error recycling, Stable Video Infinity's fine-tune, our reading): with ``recycle_prob`` a
  step first noises the clean history (level up to ``recycle_sigma``) and asks the model for it back,
  ``x_0_hat = x_t - s v_theta``; that estimate, with the model's blur and colour errors in it, is the history the
  noisy chunks are trained to continue from, while their targets stay the real video. A cheap stand-in for
  training on whole rollouts (one extra forward without gradients, not 20 steps per chunk).
- **Its own rollouts** (``rollout_prob``, teacher forcing only; :func:`rollout`): the history of a step is the
  window's first chunks from the real video, then up to ``rollout_chunks`` chunks the model generates itself
  chunk by chunk from them, as the sampler does (``rollout_steps`` steps with the export's guidance, each chunk
  committed to a KV cache noised to ``context_noise``), then the rest of the real window. Every noisy chunk is
  still trained towards the real video, so a chunk after the rolled-out ones learns to continue the video from
  history with the sampler's own accumulated errors in it (exposure bias: Self-Forcing trains on rollouts for
  this reason; it matches them to a teacher's distribution by DMD, where our procedural videos give the real
  continuation itself, bounces included, which no bidirectional teacher trained on clips from frame 0 knows).
  The rolled-out chunks start from real history, so they stay close to the real trajectory, and the real
  continuation stays a fair target. (Tried as a third stage; it did not help and is not in the shipped model:
  benchmarks/autoregressive.md, "Training on its own rollouts".)
- **VAE segments** (``segment_frames``): windows of whole segments, each coded alone by the VAE (its first frame
  an image latent), as :class:`~kinegen.pipelines.WanAutoregressivePipeline` generates and decodes with
  ``segment_frames``: a VAE trained on short clips does not code longer ones (docs/autoregressive.md, Design).
  Windows start at segment starts; a later one keeps all its latent frames after the sink, so a batch holds one
  kind (:func:`segment_batch`). With ``segment_overlap`` a segment starts on the previous one's last frame, as
  the pipeline then re-encodes it (windows of 33 frames are two segments of 17). Such a later segment's image
  latent is never generated at inference (the pipeline re-encodes the frame shown); with ``relink_loss`` off it
  is history only, with no loss (:func:`relinked_frames`), so the one single-frame chunk the model is trained to
  generate is the video's first; ``relink_weight`` weights that loss instead. With ``relink_recycle`` error
  recycling crosses those boundaries as the sampler does: in that share of a recycled history's windows each
  later image latent is the previous segment's last frame of the model's estimate, decoded, rounded to 8 bits and
  encoded again (:func:`reencoded_boundaries`), not the real frame's (a share, because the decoding costs about
  as much as a training step for a whole batch). With ``later_history_segments`` a later window's first
  segments are history only (:func:`history_only_frames`): every segment it trains then follows one in the cache,
  as at inference, instead of the sink alone; ``later_share`` sets how often a batch is of later windows (each
  later start is otherwise about 4% of the windows, against half from frame 0, while most of a long video is
  generated after frame 48). Tried together in stage 2; neither is in the shipped model.
- **Noisy context** (``context_noise``, teacher forcing only): the clean copy is noised to this level,
  ``(1 - s) x_0 + s e`` at timestep ``1000 s``, as the exported pipeline (whose ``context_noise`` it sets) commits
  chunks; the model learns to continue from history whose fine detail it cannot trust.

With ``object_weight`` the flow loss weights the latent pixels a shape covers by ``1 + object_weight``, as the
bundled text-to-video model was trained (:func:`encode_masks`: the masks in the latents' layout).

The text encoder stays frozen; an EMA of the transformer is exported as a ``WanAutoregressivePipeline`` folder.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..data.shapes import render_long_clip, render_long_mask, sample_clip
from ..errors import ConfigError
from ..models.shapes_t2v import build_scheduler
from ..pipelines.causal_wan import KVCacheConfig, make_causal
from ..pipelines.wan_ar import (
    chunk_partition,
    context_latents,
    decode_latents,
    encode_shown_frame,
    normalize_latents,
    segment_chunks,
    segment_latent_frames,
)
from .common import Progress, TimeBox, cosine_lr, frame_weights, load_checkpoint, object_weights, weighted_mse
from .configs import ARTrainConfig
from .t2v import (
    PaddedTextCrossAttention,
    _ema_update,
    _rope_to_float32,
    _sigmas,
    batch_captions,
    encode_text_compact,
    latent_coverage,
)
from .vae import to_tensor

CHUNK = 64


def _window(cfg: ARTrainConfig, i: int) -> tuple[int, int]:
    """(clip seed, start frame) of training window ``i``: from frame 0 or, with ``offset_prob``, a later
    multiple of 4 (of :func:`segment_stride` with segments: windows start where the pipeline's segments do) up to
    ``max_start``."""
    rng = np.random.default_rng(2_000_000 + cfg.seed * 100_003 + i)
    unit = segment_stride(cfg) or 4
    start = 0 if rng.random() >= cfg.offset_prob else unit * int(rng.integers(1, cfg.max_start // unit + 1))
    return 3_000_000 + cfg.seed * 100_000_007 + i, start


def segment_stride(cfg: ARTrainConfig) -> int:
    """Video frames from one segment's start to the next (0: no segments): ``segment_frames``, one less when
    segments overlap by a frame."""
    return cfg.segment_frames - 1 if cfg.segment_frames and cfg.segment_overlap else cfg.segment_frames


def segment_spans(frames: int, segment_frames: int, overlap: bool = False) -> list[slice]:
    """The VAE segments of a clip of ``frames`` frames, each ``segment_frames`` long (``overlap``: each starting on
    the previous one's last frame); frames after the last whole segment are left out."""
    stride = segment_frames - 1 if overlap else segment_frames
    n = (frames - 1) // stride if overlap else frames // stride
    return [slice(i * stride, i * stride + segment_frames) for i in range(n)]


def encode_segmented(vae, clips: np.ndarray, segment_frames: int, overlap: bool = False) -> torch.Tensor:
    """VAE latents ``[B, C, F, h, w]`` of uint8 clips ``[B, T, H, W, 3]`` coded as segments of ``segment_frames``
    frames, each alone (the first frame of each coded as an image), their latent frames end to end: the layout
    of :class:`~kinegen.pipelines.WanAutoregressivePipeline` with ``segment_frames``. ``0``: each clip whole.
    ``overlap``: a segment starts on the previous one's last frame (``T = 1 + n (segment_frames - 1)``)."""
    if not segment_frames:
        return vae.encode(to_tensor(clips)).latent_dist.mode()
    b, t = clips.shape[:2]
    spans = segment_spans(t, segment_frames, overlap)
    n = len(spans)
    parts = np.stack([clips[:, span] for span in spans], axis=1)
    z = vae.encode(to_tensor(parts.reshape(b * n, segment_frames, *clips.shape[2:]))).latent_dist.mode()
    z = z.view(b, n, *z.shape[1:]).transpose(1, 2)  # [B, C, segments, latents, h, w]
    return z.reshape(b, z.shape[1], -1, *z.shape[-2:])


@torch.no_grad()
def encode_windows(run_dir: Path, cfg: ARTrainConfig, vae) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Normalised VAE latents ``[N, C, F, h, w]`` of the training windows, encoded once in resumable chunks."""
    folder = run_dir / "latents"
    folder.mkdir(parents=True, exist_ok=True)
    windows = [_window(cfg, i) for i in range(cfg.dataset_windows)]
    chunks = []
    n_chunks = (len(windows) + CHUNK - 1) // CHUNK
    t0 = time.perf_counter()
    for c in range(n_chunks):
        path = folder / f"chunk_{c:04d}.safetensors"
        if not path.is_file():
            part = windows[c * CHUNK:(c + 1) * CHUNK]
            lat = []
            for j in range(0, len(part), 4):
                clips = np.stack([render_long_clip(sample_clip(seed, split="train"), cfg.frames, cfg.size, cfg.size,
                                                   start=start) for seed, start in part[j:j + 4]])
                lat.append(encode_segmented(vae, clips, cfg.segment_frames, cfg.segment_overlap))
            save_file({"latents": normalize_latents(vae, torch.cat(lat)).half().contiguous()}, str(path))
            print(f"encoded windows chunk {c + 1}/{n_chunks} ({(c + 1) * CHUNK / (time.perf_counter() - t0):.1f} "
                  "windows/s)", flush=True)
        chunks.append(load_file(str(path))["latents"])
    return torch.cat(chunks).float(), windows


def segment_coverage(mask: np.ndarray, segment_frames: int, overlap: bool = False) -> torch.Tensor:
    """One window's object coverage ``[T, H, W]`` on the latent grid in the layout of :func:`encode_segmented`
    (segment by segment, each one's first frame an image latent), bool ``[F, h, w]``."""
    m = torch.from_numpy(mask)
    if not segment_frames:
        return latent_coverage(m)
    return torch.cat([latent_coverage(m[span]) for span in segment_spans(len(m), segment_frames, overlap)])


def encode_masks(run_dir: Path, cfg: ARTrainConfig,
                 windows: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the shapes are, on the latent grid: ``(windows [N, 1, F, h, w], sinks [N, 1, 1, h, w])`` in {0, 1},
    aligned with :func:`encode_windows` and :func:`encode_sinks` (for ``object_weight``), rendered once into
    ``run_dir/latents/masks.safetensors``."""
    path = run_dir / "latents" / "masks.safetensors"
    if not path.is_file():
        specs = [(sample_clip(seed, split="train"), start) for seed, start in windows]
        win = torch.stack([segment_coverage(render_long_mask(spec, cfg.frames, cfg.size, cfg.size, start=start),
                                            cfg.segment_frames, cfg.segment_overlap) for spec, start in specs])
        sink = torch.stack([latent_coverage(torch.from_numpy(render_long_mask(spec, 1, cfg.size, cfg.size)))
                            for spec, _ in specs])
        save_file({"windows": win.to(torch.uint8)[:, None].contiguous(),
                   "sinks": sink.to(torch.uint8)[:, None].contiguous()}, str(path))
        print(f"rendered the shapes' masks of {len(windows)} windows", flush=True)
    masks = load_file(str(path))
    return masks["windows"].float(), masks["sinks"].float()


@torch.no_grad()
def encode_sinks(run_dir: Path, cfg: ARTrainConfig, vae, windows: list[tuple[int, int]]) -> torch.Tensor:
    """Normalised latent of each window's clip's first frame ``[N, C, 1, h, w]`` (the sink a rolling cache keeps),
    encoded once into ``run_dir/latents/sinks.safetensors``."""
    path = run_dir / "latents" / "sinks.safetensors"
    if not path.is_file():
        lat = []
        for j in range(0, len(windows), 32):
            first = np.stack([render_long_clip(sample_clip(seed, split="train"), 1, cfg.size, cfg.size, start=0)
                              for seed, _ in windows[j:j + 32]])
            lat.append(vae.encode(to_tensor(first)).latent_dist.mode())
        save_file({"latents": normalize_latents(vae, torch.cat(lat)).half().contiguous()}, str(path))
        print(f"encoded {len(windows)} sink frames", flush=True)
    return load_file(str(path))["latents"].float()


def cache_layout(x0: torch.Tensor, sinks: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows as the rolling cache sees them: ``(latents, positions [B, F])``.

    A window from frame 0 stays as it is, at positions ``0 .. F-1``. A window from video frame ``4u`` has its first
    latent frame (frame ``4u`` coded alone, which no cache holds) replaced by the clip's first latent frame, the
    sink, at position 0; its other latent frames code video frames ``4(u + j) - 3 .. 4(u + j)`` and sit at
    positions ``u + j``.
    """
    f = x0.shape[2]
    u = (starts // 4).view(-1, 1)
    positions = torch.arange(f).view(1, -1) + u
    positions[:, 0] = 0
    later = (starts > 0).view(-1, 1, 1, 1, 1)
    x0 = torch.cat([torch.where(later, sinks, x0[:, :, :1]), x0[:, :, 1:]], dim=2)
    return x0, positions


def segment_batch(latents, sinks, starts, cfg: ARTrainConfig, segment_latents: int, ids: torch.Tensor,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(idx, x0, positions, ids)`` of a batch of windows coded in VAE segments: all from frame 0 or, as often as
    the data has them, all from later segments. A later window keeps every latent frame (its first is its segment's
    image latent, which the cache holds at inference) at its position in the video, after the sink at position 0
    (with ``sinks``): one chunk more than a window from frame 0, hence one kind per batch. ``later_share``: how
    often a batch is of later windows (default: their share of the data, about ``offset_prob``)."""
    later = starts > 0
    share = later.float().mean() if cfg.later_share is None else cfg.later_share
    use_later = bool(torch.rand((), generator=gen) < share)
    pool = torch.nonzero(later == use_later)[:, 0]
    if len(pool) == 0:
        raise ConfigError(f"--later-share {cfg.later_share} asks for batches of windows that start "
                          f"{'later in the video' if use_later else 'at frame 0'}, but none of the "
                          f"{len(starts)} windows does: raise --dataset-windows, or bring --offset-prob away from 0 "
                          "and 1.")
    idx = pool[torch.randint(len(pool), (cfg.batch_size,), generator=gen)]
    x0 = latents[idx]
    first = starts[idx] // segment_stride(cfg) * segment_latents  # the window's first latent frame in the video
    positions = torch.arange(x0.shape[2]).view(1, -1) + first.view(-1, 1)
    if use_later and sinks is not None:
        x0 = torch.cat([sinks[idx], x0], dim=2)
        positions = torch.cat([torch.zeros_like(positions[:, :1]), positions], dim=1)
        ids = torch.cat([ids.new_zeros(1), ids + 1])
    return idx, x0, positions, ids


def relinked_frames(frames: int, segment_latents: int, after_sink: bool) -> torch.Tensor:
    """Bool ``[frames]``: the latent frames of a :func:`segment_batch` window that the pipeline with
    ``segment_overlap`` does not generate but re-encodes from the frame shown: every segment's image latent but the
    video's first frame (with ``after_sink``, the batch's frame 0 is the sink, the video's first frame, and its
    window's own first latent frame, frame 1, is a later segment's)."""
    j = torch.arange(frames) - int(after_sink)  # latent frame within the window (-1: the sink)
    return (j % segment_latents == 0) & ((j > 0) | (after_sink & (j == 0)))


def history_only_frames(frames: int, segment_latents: int, segments: int, after_sink: bool) -> torch.Tensor:
    """Bool ``[frames]``: the latent frames of a batch of later windows (:func:`segment_batch`; with
    ``after_sink`` the sink first) that are history only with ``later_history_segments``: the window's first
    ``segments`` segments. Each segment trained after them then has the segment before it in its history, as every
    segment after the first has at inference; without them a later window's first segment is trained after the sink
    alone, a history the rolling cache never holds there (benchmarks/autoregressive.md, "Later windows after a
    segment of history": tried with ``later_share`` 0.7, not shipped)."""
    j = torch.arange(frames) - int(after_sink)  # latent frame within the window (-1: the sink)
    return (j >= 0) & (j < segments * segment_latents)


@torch.no_grad()
def reencoded_boundaries(vae, x: torch.Tensor, segment_latents: int, after_sink: bool,
                         rows: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (normalised latents of :func:`segment_batch` windows) with each later segment's image latent whose
    whole previous segment is in the window replaced, in order, by that segment's last frame decoded and encoded
    again (:func:`~kinegen.pipelines.wan_ar.encode_shown_frame`), as the pipeline with ``segment_overlap`` starts
    a segment from the frames it showed; in the windows ``rows`` (indices; None: all). With ``after_sink`` frame
    0 is the sink and frame 1 an image latent whose segment before lies outside the window; it stays."""
    out = x.clone()
    rows = torch.arange(x.shape[0]) if rows is None else rows
    if len(rows) == 0:
        return out
    for lo in range(int(after_sink) + segment_latents, x.shape[2], segment_latents):
        before = out[rows, :, lo - segment_latents:lo]
        frame = decode_latents(vae, before)[:, :, -1:]
        out[rows, :, lo:lo + 1] = encode_shown_frame(vae, frame).to(out)
    return out


def chunk_ids(latent_frames: int, chunk_frames: int, segment_latents: int = 0) -> torch.Tensor:
    """The chunk of each latent frame, as the pipeline splits them: ``[0, 1, 1, 2, 2, ...]``; with VAE segments
    of ``segment_latents`` latent frames, segment by segment (``[0, 1, 1, 2, 2, 3, 4, 4, 5, 5]`` for two of 5)."""
    sizes = (segment_chunks(latent_frames, chunk_frames, segment_latents) if segment_latents
             else chunk_partition(latent_frames, chunk_frames))
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def forcing_sigmas(batch: int, chunks: int, shift: float, clean_prob: float, gen: torch.Generator) -> torch.Tensor:
    """Independent noise levels ``[batch, chunks]`` in [0, 1): the sampler's shifted logit-normal, or 0 (clean)
    with probability ``clean_prob``."""
    s = _sigmas(batch * chunks, shift, gen).view(batch, chunks)
    return torch.where(torch.rand(batch, chunks, generator=gen) < clean_prob, torch.zeros_like(s), s)


def _tokens(transformer, x0: torch.Tensor) -> int:
    """Tokens per latent frame of ``x0`` after patching."""
    _, p_h, p_w = transformer.config.patch_size
    return (x0.shape[3] // p_h) * (x0.shape[4] // p_w)


def noised(x0, level, noise, ids, tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(s, x_t, timestep)`` for latents noised to per-chunk ``level`` ``[B, chunks]``: ``s`` per latent frame,
    ``x_t = (1 - s) x_0 + s e`` and the per-token timesteps ``[B, frames * tokens]`` the transformer takes."""
    s = level[:, ids].view(x0.shape[0], 1, -1, 1, 1)
    return s, (1 - s) * x0 + s * noise, (level[:, ids] * 1000).repeat_interleave(tokens, dim=1)


def forcing_loss(transformer, state, x0, text, ids, cfg: ARTrainConfig, gen: torch.Generator,
                 mask: torch.Tensor | None = None, frame_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Diffusion forcing: every chunk its own noise level (some clean), one block-causal forward, the flow loss on
    the noisy chunks (latent pixels in ``mask`` ``[B, 1, F, h, w]`` weighted ``1 + object_weight``; latent frame
    ``f`` times ``frame_weight[f]``)."""
    b, chunks, tokens = x0.shape[0], int(ids.max()) + 1, _tokens(transformer, x0)
    noise = torch.randn(x0.shape, generator=gen)
    sig = forcing_sigmas(b, chunks, cfg.flow_shift, cfg.clean_prob, gen)
    recycle = bool(torch.rand((), generator=gen) < cfg.recycle_prob)
    sig_back = torch.rand(sig.shape, generator=gen) * cfg.recycle_sigma  # drawn every step: one RNG stream
    state.chunk_ids, state.teacher_forcing = ids, False
    if recycle:
        with torch.no_grad():
            x0 = recycled_history(transformer, x0, sig, sig_back, noise, ids, tokens, text)
    s, xt, timestep = noised(x0, sig, noise, ids, tokens)  # clean chunks: x0 itself (or the model's estimate of it)
    pred = transformer(xt, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
    # Clean chunks are context only: at s = 0 the velocity e - x_0 names noise the input does not contain.
    noisy = (s > 0).float()
    # (Where x0 was recycled it differs from the real latents only on clean chunks, which carry no loss.)
    return weighted_mse(pred, noise - x0, noisy, object_weights(mask, cfg.object_weight),
                        frame_weights(frame_weight, pred))


def teacher_forcing_loss(transformer, state, x0, text, ids, cfg: ARTrainConfig, gen: torch.Generator,
                         history: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                         frame_weight: torch.Tensor | None = None,
                         relink: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Teacher forcing in one forward, as the sampler runs: the clean window followed by a noisy copy (every chunk
    its own level); a noisy chunk sees the clean chunks before it and itself, a clean chunk the clean chunks up to
    its own (:func:`kinegen.pipelines.causal_wan.teacher_forcing_mask`), so every chunk is trained in the setting of
    its denoising forwards at inference (a clean cache, committed chunk by chunk). The clean copy is ``history``
    where given (a window with chunks the model rolled out, :func:`rollout`), else with ``recycle_prob`` the
    model's own one-step estimate of the window (error recycling), else the window itself; the targets are always
    the window's, latent pixels in ``mask`` ``[B, 1, F, h, w]`` weighted ``1 + object_weight``, latent frames in
    ``f`` times ``frame_weight[f]``. ``relink`` (:func:`reencoded_boundaries`) remakes a recycled history's later
    segment image latents from its own frames."""
    b, f, chunks, tokens = x0.shape[0], x0.shape[2], int(ids.max()) + 1, _tokens(transformer, x0)
    noise = torch.randn(x0.shape, generator=gen)
    sig = _sigmas(b * chunks, cfg.flow_shift, gen).view(b, chunks)
    recycle = bool(torch.rand((), generator=gen) < cfg.recycle_prob)
    sig_back = torch.rand(sig.shape, generator=gen) * cfg.recycle_sigma
    context = x0 if history is None else history
    if recycle and history is None:
        with torch.no_grad():
            state.chunk_ids, state.teacher_forcing = ids, False
            context = one_step_estimate(transformer, x0, sig_back, noise.flip(0), ids, tokens, text)  # other noise
            if relink is not None:
                context = relink(context)
    _, xt, timestep = noised(x0, sig, noise, ids, tokens)
    level = torch.full((b, chunks), cfg.context_noise)
    if cfg.context_noise:  # committed as the exported pipeline commits: (1 - s) x_0 + s e at timestep 1000 s
        _, context, _ = noised(context, level, torch.randn(x0.shape, generator=gen), ids, tokens)
    positions = state.frame_positions
    state.chunk_ids, state.teacher_forcing = ids, True
    state.frame_positions = torch.cat([positions, positions], dim=1)
    context_t = (level[:, ids] * 1000).repeat_interleave(tokens, dim=1)
    timestep = torch.cat([context_t, timestep], dim=1)  # the clean copy at t = 0 (or its context-noise level)
    try:
        pred = transformer(torch.cat([context, xt], dim=2), timestep=timestep, encoder_hidden_states=text,
                           return_dict=False)[0][:, :, f:]
    finally:
        state.frame_positions, state.teacher_forcing = positions, False
    return weighted_mse(pred, noise - x0, object_weights(mask, cfg.object_weight), frame_weights(frame_weight, pred))


def one_step_estimate(transformer, x0, level, noise, ids, tokens, text) -> torch.Tensor:
    """The model's estimate of ``x0`` from one forward of it noised to ``level`` ``[B, chunks]``:
    ``x_t = (1 - s) x_0 + s e``, ``x_0_hat = x_t - s v_theta(x_t)`` (exact at ``s = 0``)."""
    s, xt, timestep = noised(x0, level, noise, ids, tokens)
    return xt - s * transformer(xt, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]


def recycled_history(transformer, x0, sig, sig_back, noise, ids, tokens, text) -> torch.Tensor:
    """``x0`` with each clean chunk (``sig == 0``) replaced by the model's one-step estimate of it from a copy noised
    to ``sig_back`` (error recycling). The noisy chunks enter that forward as they will be trained (same levels,
    same ``noise``), so the estimate sees the same context; they are returned unchanged."""
    clean = sig == 0
    if not clean.any():
        return x0
    estimate = one_step_estimate(transformer, x0, torch.where(clean, sig_back, sig), noise, ids, tokens, text)
    return torch.where(clean[:, ids].view(x0.shape[0], 1, -1, 1, 1), estimate, x0)


@torch.no_grad()
def rollout(transformer, state, x0, positions, text, ids, first: int, count: int, scheduler, steps: int,
            guidance: float, context_noise: float, gen: torch.Generator) -> torch.Tensor:
    """``x0`` ``[B, C, F, h, w]`` with chunks ``first .. first + count - 1`` replaced by the model's own, generated
    as :class:`~kinegen.pipelines.WanAutoregressivePipeline` generates them: the chunks before ``first`` are
    committed from ``x0`` to the KV cache, then each generated chunk is denoised from noise in ``steps`` steps of
    ``scheduler`` against the cache and committed in turn (every commit noised to ``context_noise``, at timestep
    ``1000 * context_noise``). Frames sit at ``positions`` ``[B, F]``; ``text`` is ``[uncond; cond]`` (``2B``
    rows) with ``guidance > 1``, else the ``B`` conditional rows. Noise is drawn from ``gen`` in the pipeline's
    order, so with ``first = 0`` and one sample this is the pipeline's rollout (tested)."""
    b, channels, _, h, w = x0.shape
    branches = text.shape[0] // b
    if branches not in (1, 2) or text.shape[0] != branches * b:
        raise ValueError(f"text has {text.shape[0]} rows for {b} samples; give B rows, or 2B ([uncond; cond]) "
                         "with guidance")
    out = x0.clone()
    saved = (state.chunk_ids, state.teacher_forcing, state.frame_positions, state.commit)
    state.chunk_ids, state.teacher_forcing = None, False
    state.clear()

    def forward(x, t, lo, commit):
        state.frame_positions = positions[:, lo:lo + x.shape[2]].repeat(branches, 1)
        state.commit = commit
        timestep = torch.full((b * branches,), float(t))
        return transformer(x.repeat(branches, 1, 1, 1, 1), timestep=timestep, encoder_hidden_states=text,
                           return_dict=False)[0].float()

    try:
        for c in range(first + count):
            frames = torch.nonzero(ids == c)[:, 0]
            lo, n = int(frames[0]), len(frames)
            if c >= first:
                x = torch.randn((b, channels, n, h, w), generator=gen, dtype=torch.float32)
                scheduler.set_timesteps(steps)
                for t in scheduler.timesteps:
                    pred = forward(x, t, lo, commit=False)
                    if branches == 2:
                        uncond, cond = pred.chunk(2)
                        pred = uncond + guidance * (cond - uncond)
                    x = scheduler.step(pred, t, x, return_dict=False)[0]
                out[:, :, lo:lo + n] = x
            if c < first + count - 1:  # the last generated chunk has no one after it to see it
                forward(context_latents(out[:, :, lo:lo + n], context_noise, gen), 1000 * context_noise, lo, True)
    finally:
        state.clear()
        state.chunk_ids, state.teacher_forcing, state.frame_positions, state.commit = saved
    return out


def rollout_span(chunks: int, most: int, gen: torch.Generator) -> tuple[int, int]:
    """``(first, count)`` of the chunks a step rolls out: ``count`` from 1 to ``most``, after at least two real
    chunks (the first frame and one chunk, which place the shape and show its motion, so the rollout stays near
    the real trajectory) and before at least one (trained towards the real continuation of a history the model
    made)."""
    most = min(most, chunks - 3)
    if most < 1:
        raise ValueError(f"a rollout needs a window of at least 4 chunks; this one has {chunks}")
    count = int(torch.randint(1, most + 1, (), generator=gen))
    first = int(torch.randint(2, chunks - count, (), generator=gen))
    return first, count


def rolled_out(transformer, state, cross, tokenizer, text_encoder, x0, captions, ids, cfg: ARTrainConfig,
               scheduler, gen: torch.Generator) -> torch.Tensor:
    """A step's history with some chunks the model's own (:func:`rollout_span`, :func:`rollout`): the batch's
    captions with the export's guidance (the unconditional branch the empty caption), the model in eval mode;
    ``cross`` (the training's cross-attention processor) is given the rollout's text padding and then its own back."""
    first, count = rollout_span(int(ids.max()) + 1, cfg.rollout_chunks, gen)
    guided = cfg.guidance > 1
    was_training, pad_copies = transformer.training, cross.pad_copies
    with torch.no_grad():
        text, cross.pad_copies = encode_text_compact(tokenizer, text_encoder,
                                                     [""] * len(captions) * guided + list(captions))
    transformer.eval()
    try:
        return rollout(transformer, state, x0, state.frame_positions, text, ids, first, count, scheduler,
                       cfg.rollout_steps, cfg.guidance, cfg.context_noise, gen)
    finally:
        transformer.train(was_training)
        cross.pad_copies = pad_copies


def check_config(cfg: ARTrainConfig) -> None:
    """Raise :class:`~kinegen.errors.ConfigError` naming the flag to change where the settings do not fit together
    (their ranges one by one are the CLI's to check): windows and segments the VAE codes and the chunks split, the
    export's cache, and teacher forcing where a setting needs it. ``kinegen train ar`` calls it before any work."""
    seg, frames, chunk = cfg.segment_frames, cfg.frames, cfg.chunk_frames
    if seg and (seg % 4 != 1 or seg < 5 or ((seg - 1) // 4) % chunk):
        raise ConfigError(f"--segment-frames must be 4k + 1 frames whose k latent frames after the first split "
                          f"into chunks of --chunk-frames {chunk} (17 at the defaults); got {seg}.")
    if seg and cfg.segment_overlap and ((frames - 1) % (seg - 1) or cfg.max_start % (seg - 1)):
        raise ConfigError(f"with --segment-overlap, segments of {seg} frames start every {seg - 1}: --frames must "
                          f"be 1 + a multiple of {seg - 1} and --max-start a multiple of it (e.g. --frames "
                          f"{2 * seg - 1} --max-start {13 * (seg - 1)}); got {frames} and {cfg.max_start}.")
    if seg and not cfg.segment_overlap and (frames % seg or cfg.max_start % seg):
        raise ConfigError(f"--frames and --max-start must be whole numbers of segments of --segment-frames {seg} "
                          f"(e.g. --frames {2 * seg} --max-start {12 * seg}); got {frames} and {cfg.max_start}.")
    if (cfg.later_history_segments or cfg.later_share is not None) and not (seg and cfg.offset_prob > 0):
        raise ConfigError("--later-history-segments and --later-share are about batches of windows that start later "
                          "in the video, in VAE segments: give --segment-frames 17 and --offset-prob above 0; got "
                          f"--segment-frames {seg} and --offset-prob {cfg.offset_prob}.")
    if seg and cfg.later_history_segments:
        per_window = (frames - 1) // (seg - 1) if cfg.segment_overlap else frames // seg
        if cfg.later_history_segments >= per_window:
            raise ConfigError(f"--later-history-segments must leave a segment of the window to train: below "
                              f"{per_window} (the segments of --frames {frames}); got {cfg.later_history_segments}.")
    if seg and cfg.rollout_prob:
        raise ConfigError("--rollout-prob does not support --segment-frames yet; leave one of them out.")
    if not seg and cfg.segment_overlap:
        raise ConfigError("--segment-overlap overlaps VAE segments: give --segment-frames too (e.g. 17).")
    if cfg.relink_recycle and not (cfg.segment_overlap and cfg.teacher_forcing and cfg.recycle_prob > 0):
        raise ConfigError("--relink-recycle re-encodes the segment starts of a recycled history: it needs "
                          "--segment-overlap true, --teacher-forcing true and --recycle-prob above 0; got "
                          f"{cfg.segment_overlap}, {cfg.teacher_forcing} and {cfg.recycle_prob}.")
    if cfg.relink_weight != 1 and not (cfg.segment_overlap and cfg.relink_loss):
        raise ConfigError("--relink-weight weights the loss on the image latents the pipeline re-encodes between "
                          "overlapping segments: give --segment-frames 17 --segment-overlap true, and not "
                          f"--relink-loss false; got --relink-weight {cfg.relink_weight}.")
    if not cfg.relink_loss and not cfg.segment_overlap:
        raise ConfigError("--relink-loss false leaves out the image latents the pipeline re-encodes between "
                          "overlapping segments: give --segment-frames 17 --segment-overlap true too.")
    if cfg.window_frames < chunk:
        raise ConfigError(f"--window-frames {cfg.window_frames} is smaller than a chunk (--chunk-frames {chunk}); "
                          "the exported cache must hold at least one whole chunk.")
    for name, does in (("context_noise", "noises the clean history of teacher forcing"),
                       ("rollout_prob", "gives teacher forcing a history the model rolled out itself")):
        if getattr(cfg, name) and not cfg.teacher_forcing:
            raise ConfigError(f"--{name.replace('_', '-')} {does}; keep --teacher-forcing true.")
    if cfg.rollout_prob and frames < 12 * chunk + 1:
        raise ConfigError(f"--rollout-prob needs windows of at least 4 chunks (two real ones, one rolled out, one "
                          f"after it): --frames {12 * chunk + 1} or more at --chunk-frames {chunk}; got {frames}.")
    if not seg and (frames % 4 != 1 or (frames - 1) // 4 % chunk):
        raise ConfigError(f"--frames must be 1 + 4 * {chunk} * k (the VAE codes 4 frames per latent frame after "
                          f"the first, and those split into chunks of --chunk-frames {chunk}); got {frames}.")
    KVCacheConfig(sink_frames=cfg.sink_frames, window_frames=cfg.window_frames)  # the export's cache checks itself


def train_ar(run_dir: str | Path, cfg: ARTrainConfig) -> Path:
    """Encode the windows (once), then train or resume; exports ``run_dir/pipeline``."""
    from diffusers import WanPipeline

    from ..loading import ASSETS_DIR

    init = Path(cfg.init) if cfg.init else ASSETS_DIR / "models" / "kinegen-shapes-t2v"
    check_config(cfg)
    seg = segment_latent_frames(cfg.segment_frames) if cfg.segment_frames else 0
    covered = cfg.frames - 1 if seg and cfg.segment_overlap else cfg.frames  # overlapping: after the first frame
    latent_frames = covered // segment_stride(cfg) * seg if seg else (cfg.frames - 1) // 4 + 1
    ids = chunk_ids(latent_frames, cfg.chunk_frames, seg)
    cache = KVCacheConfig(sink_frames=cfg.sink_frames, window_frames=cfg.window_frames)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base = WanPipeline.from_pretrained(init, use_safetensors=True)
    vae, tokenizer, text_encoder = base.vae.eval(), base.tokenizer, base.text_encoder.eval().requires_grad_(False)
    latents, windows = encode_windows(run_dir, cfg, vae)
    specs = [sample_clip(seed, split="train") for seed, _ in windows]
    starts = torch.tensor([start for _, start in windows])
    sinks = encode_sinks(run_dir, cfg, vae, windows) if cfg.cache_layout and cfg.sink_frames > 0 else None
    if cfg.object_weight:  # the shapes' masks ride along as a last channel through the batch layouts below
        masks, sink_masks = encode_masks(run_dir, cfg, windows)
        latents = torch.cat([latents, masks], dim=1)
        sinks = None if sinks is None else torch.cat([sinks, sink_masks], dim=1)

    torch.manual_seed(cfg.seed)
    transformer = base.transformer
    _rope_to_float32(transformer)
    ema = copy.deepcopy(transformer).requires_grad_(False)  # before make_causal: exported as a plain Wan model
    cross = PaddedTextCrossAttention()
    for block in transformer.blocks:
        block.attn2.set_processor(cross)
    state = make_causal(transformer, cache)  # a chunk's history in training is what this cache keeps at inference
    scheduler = build_scheduler(cfg.flow_shift)  # the export's sampler, for the rollouts
    params = list(transformer.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ckpt_modules = {"transformer": transformer, "ema_transformer": ema}
    step, _ = load_checkpoint(run_dir, ckpt_modules, opt)
    print(f"AR: {sum(p.numel() for p in params) / 1e6:.2f}M trainable parameters, {len(windows)} windows of "
          f"{cfg.frames} frames in {len(ids.unique())} chunks; starting at step {step}", flush=True)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    transformer.train()
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        if seg:  # a batch of windows from frame 0, or of later ones after the sink: the chunks differ
            idx, x0, state.frame_positions, step_ids = segment_batch(latents, sinks, starts, cfg, seg, ids, gen)
            after_sink = len(step_ids) > len(ids)  # a batch of later windows: the sink comes first
            frame_weight = None  # the loss on the image latents the pipeline re-encodes: relink_weight, or none
            relink_weight = cfg.relink_weight if cfg.relink_loss else 0.0
            if cfg.segment_overlap and relink_weight != 1:
                frame_weight = torch.where(relinked_frames(len(step_ids), seg, after_sink), relink_weight, 1.0)
            if cfg.later_history_segments and bool(starts[idx[0]] > 0):  # a later window's first segments:
                weight = 1.0 if frame_weight is None else frame_weight      # history only, no loss
                history = history_only_frames(len(step_ids), seg, cfg.later_history_segments, after_sink)
                frame_weight = torch.where(history, 0.0, weight)
            relink = None
            if cfg.relink_recycle:  # its own generator: the step's noise stays what it is without the flag
                pick_gen = torch.Generator().manual_seed((cfg.seed << 32) + step)
                pick = torch.rand(x0.shape[0], generator=pick_gen) < cfg.relink_recycle
                relink = functools.partial(reencoded_boundaries, vae, segment_latents=seg, after_sink=after_sink,
                                           rows=torch.nonzero(pick)[:, 0])
        else:
            idx = torch.randint(len(windows), (cfg.batch_size,), generator=gen)
            x0, step_ids, frame_weight, relink = latents[idx], ids, None, None
            if sinks is not None:
                x0, state.frame_positions = cache_layout(x0, sinks[idx], starts[idx])
            else:
                state.frame_positions = torch.arange(x0.shape[2]).expand(x0.shape[0], -1)
        x0, mask = (x0[:, :-1], x0[:, -1:]) if cfg.object_weight else (x0, None)
        captions = batch_captions(specs, idx, step, cfg.cfg_dropout, gen)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=100)
        with torch.no_grad():
            text, cross.pad_copies = encode_text_compact(tokenizer, text_encoder, captions)
        if cfg.teacher_forcing:
            history = None
            if cfg.rollout_prob and bool(torch.rand((), generator=gen) < cfg.rollout_prob):
                history = rolled_out(transformer, state, cross, tokenizer, text_encoder, x0, captions, ids, cfg,
                                     scheduler, gen)
            loss = teacher_forcing_loss(transformer, state, x0, text, step_ids, cfg, gen, history=history, mask=mask,
                                        frame_weight=frame_weight, relink=relink)
        else:
            loss = forcing_loss(transformer, state, x0, text, step_ids, cfg, gen, mask=mask,
                                frame_weight=frame_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        _ema_update(ema, transformer, min(cfg.ema, (1 + step) / (10 + step)))
        step += 1
        progress.update(step, loss=loss.item())
        if box.after_step(run_dir, ckpt_modules, opt, step):
            break
    progress.close()
    state.remove()
    return export_ar_pipeline(run_dir / "pipeline", base, ema, cfg)


def export_ar_pipeline(folder: Path, base, transformer, cfg: ARTrainConfig) -> Path:
    """Save a ``WanAutoregressivePipeline`` folder (safetensors) with the chunk and cache settings and
    ``kinegen_defaults.json`` (the training size; 121 frames at 24 fps, 20 steps per chunk, ``cfg.guidance``)."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from ..loading import write_generation_defaults
    from ..pipelines import WanAutoregressivePipeline

    transformer = copy.deepcopy(transformer)
    for block in transformer.blocks:
        block.attn2.set_processor(WanAttnProcessor())
    transformer.rope.freqs_cos = transformer.rope.freqs_cos.double()
    transformer.rope.freqs_sin = transformer.rope.freqs_sin.double()
    pipe = WanAutoregressivePipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                                     scheduler=build_scheduler(cfg.flow_shift), transformer=transformer.eval(),
                                     chunk_frames=cfg.chunk_frames, sink_frames=cfg.sink_frames,
                                     window_frames=cfg.window_frames, context_noise=cfg.context_noise,
                                     segment_frames=cfg.segment_frames or None,
                                     segment_overlap=bool(cfg.segment_frames and cfg.segment_overlap))
    pipe.save_pretrained(folder, safe_serialization=True)
    # 20 steps per chunk, as the bundled model samples: diffusion forcing does not distil the sampler (a few-step
    # student, as Self-Forcing's 4 steps, would be a further stage). 121 frames at 24 fps: a 5-second video.
    write_generation_defaults(folder, height=cfg.size, width=cfg.size, frames=121, steps=20, guidance=cfg.guidance,
                              fps=24)
    print(f"saved pipeline to {folder}", flush=True)
    return folder
