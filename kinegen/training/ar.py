"""Turn the bundled text-to-video model into a chunk-by-chunk one by diffusion forcing (docs/autoregressive.md).

Data: windows of ``frames`` frames cut from endless procedural videos (:func:`kinegen.data.shapes.render_long_clip`:
the training clip, then the same speed bouncing off the edges), half of them from frame 0 and the rest from later
start frames, each with its clip's caption; encoded once with the model's own VAE into ``run_dir/latents/``.

Training (diffusion forcing; CausVid / Self-Forcing's causal initialisation, our reading): the window's latent
frames are split into chunks as the pipeline splits them (one frame, then ``chunk_frames`` each); every chunk gets
its own noise level (a shifted logit-normal draw, or none with ``clean_prob``: clean history, as the commit pass
sees it at inference), each token the timestep of its chunk; the transformer attends block-causally (the masked
path of :mod:`kinegen.pipelines.causal_wan`) and learns the flow velocity ``e - x_0`` of every noisy chunk (a
clean chunk is context only):

    x_t = (1 - s_c) x_0 + s_c e   (s_c per chunk),   loss = |v_theta(x_t, 1000 s, text) - (e - x_0)|^2

The text encoder stays frozen; an EMA of the transformer is exported as a ``WanAutoregressivePipeline`` folder.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..data.shapes import render_long_clip, sample_clip
from ..pipelines.causal_wan import KVCacheConfig, make_causal
from ..pipelines.wan_ar import chunk_partition
from .common import Progress, TimeBox, cosine_lr, load_checkpoint
from .configs import ARTrainConfig
from .t2v import (
    PaddedTextCrossAttention,
    _ema_update,
    _rope_to_float32,
    _sigmas,
    batch_captions,
    encode_text_compact,
)
from .vae import to_tensor

CHUNK = 64


def _window(cfg: ARTrainConfig, i: int) -> tuple[int, int]:
    """(clip seed, start frame) of training window ``i``: from frame 0 or, with ``offset_prob``, a later
    multiple of 4 up to ``max_start``."""
    rng = np.random.default_rng(2_000_000 + cfg.seed * 100_003 + i)
    start = 0 if rng.random() >= cfg.offset_prob else 4 * int(rng.integers(1, cfg.max_start // 4 + 1))
    return 3_000_000 + cfg.seed * 100_000_007 + i, start


@torch.no_grad()
def encode_windows(run_dir: Path, cfg: ARTrainConfig, vae) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Normalised VAE latents ``[N, C, F, h, w]`` of the training windows, encoded once in resumable chunks."""
    folder = run_dir / "latents"
    folder.mkdir(parents=True, exist_ok=True)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
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
                lat.append(vae.encode(to_tensor(clips)).latent_dist.mode())
            save_file({"latents": ((torch.cat(lat) - mean) / std).half().contiguous()}, str(path))
            print(f"encoded windows chunk {c + 1}/{n_chunks} ({(c + 1) * CHUNK / (time.perf_counter() - t0):.1f} "
                  "windows/s)", flush=True)
        chunks.append(load_file(str(path))["latents"])
    return torch.cat(chunks).float(), windows


def chunk_ids(latent_frames: int, chunk_frames: int) -> torch.Tensor:
    """The chunk of each latent frame, as the pipeline splits them: ``[0, 1, 1, 2, 2, ...]``."""
    sizes = chunk_partition(latent_frames, chunk_frames)
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def forcing_sigmas(batch: int, chunks: int, shift: float, clean_prob: float, gen: torch.Generator) -> torch.Tensor:
    """Independent noise levels ``[batch, chunks]`` in [0, 1): the sampler's shifted logit-normal, or 0 (clean)
    with probability ``clean_prob``."""
    s = _sigmas(batch * chunks, shift, gen).view(batch, chunks)
    return torch.where(torch.rand(batch, chunks, generator=gen) < clean_prob, torch.zeros_like(s), s)


def train_ar(run_dir: str | Path, cfg: ARTrainConfig) -> Path:
    """Encode the windows (once), then train or resume; exports ``run_dir/pipeline``."""
    from diffusers import WanPipeline

    from ..loading import ASSETS_DIR

    init = Path(cfg.init) if cfg.init else ASSETS_DIR / "models" / "kinegen-shapes-t2v"
    if cfg.frames % 4 != 1:
        raise ValueError(f"--frames must be 4k + 1; got {cfg.frames}")
    ids = chunk_ids((cfg.frames - 1) // 4 + 1, cfg.chunk_frames)  # a frame count that does not split fails here
    KVCacheConfig(sink_frames=cfg.sink_frames, window_frames=cfg.window_frames)  # the export's cache, checked now
    if cfg.window_frames < cfg.chunk_frames:
        raise ValueError(f"--window-frames {cfg.window_frames} is smaller than a chunk ({cfg.chunk_frames})")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base = WanPipeline.from_pretrained(init, use_safetensors=True)
    vae, tokenizer, text_encoder = base.vae.eval(), base.tokenizer, base.text_encoder.eval().requires_grad_(False)
    latents, windows = encode_windows(run_dir, cfg, vae)
    specs = [sample_clip(seed, split="train") for seed, _ in windows]

    torch.manual_seed(cfg.seed)
    transformer = base.transformer
    _rope_to_float32(transformer)
    ema = copy.deepcopy(transformer).requires_grad_(False)  # before make_causal: exported as a plain Wan model
    cross = PaddedTextCrossAttention()
    for block in transformer.blocks:
        block.attn2.set_processor(cross)
    state = make_causal(transformer)
    state.chunk_ids = ids
    params = list(transformer.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ckpt_modules = {"transformer": transformer, "ema_transformer": ema}
    step, _ = load_checkpoint(run_dir, ckpt_modules, opt)
    print(f"AR: {sum(p.numel() for p in params) / 1e6:.2f}M trainable parameters, {len(windows)} windows of "
          f"{cfg.frames} frames in {len(ids.unique())} chunks; starting at step {step}", flush=True)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    per_frame = ids.bincount()
    patch = transformer.config.patch_size
    transformer.train()
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(len(windows), (cfg.batch_size,), generator=gen)
        x0 = latents[idx]
        captions = batch_captions(specs, idx, step, cfg.cfg_dropout, gen)
        noise = torch.randn(x0.shape, generator=gen)
        sig = forcing_sigmas(cfg.batch_size, len(per_frame), cfg.flow_shift, cfg.clean_prob, gen)
        s = sig[:, ids].view(cfg.batch_size, 1, -1, 1, 1)  # each latent frame its chunk's level
        xt = (1 - s) * x0 + s * noise
        tokens = (x0.shape[3] // patch[1]) * (x0.shape[4] // patch[2])
        timestep = (sig[:, ids] * 1000).repeat_interleave(tokens, dim=1)  # [B, tokens]: per-token timesteps
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=100)
        with torch.no_grad():
            text, cross.pad_copies = encode_text_compact(tokenizer, text_encoder, captions)
        pred = transformer(xt, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
        # Clean chunks are context only: at s = 0 the velocity e - x_0 names noise the input does not contain.
        noisy = (s > 0).float().expand_as(x0)
        loss = ((pred - (noise - x0)).square() * noisy).sum() / noisy.sum().clamp(min=1)
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
    ``kinegen_defaults.json`` (the training size; 121 frames at 24 fps, 20 steps per chunk)."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from ..loading import write_generation_defaults
    from ..models.shapes_t2v import build_scheduler
    from ..pipelines import WanAutoregressivePipeline

    transformer = copy.deepcopy(transformer)
    for block in transformer.blocks:
        block.attn2.set_processor(WanAttnProcessor())
    transformer.rope.freqs_cos = transformer.rope.freqs_cos.double()
    transformer.rope.freqs_sin = transformer.rope.freqs_sin.double()
    pipe = WanAutoregressivePipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                                     scheduler=build_scheduler(cfg.flow_shift), transformer=transformer.eval(),
                                     chunk_frames=cfg.chunk_frames, sink_frames=cfg.sink_frames,
                                     window_frames=cfg.window_frames)
    pipe.save_pretrained(folder, safe_serialization=True)
    # 20 steps per chunk, as the bundled model samples: diffusion forcing does not distil the sampler (a few-step
    # student, as Self-Forcing's 4 steps, would be a further stage). 121 frames at 24 fps: a 5-second video.
    write_generation_defaults(folder, height=cfg.size, width=cfg.size, frames=121, steps=20, guidance=4.0, fps=24)
    print(f"saved pipeline to {folder}", flush=True)
    return folder
