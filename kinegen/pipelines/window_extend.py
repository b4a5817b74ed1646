"""Long videos from a bidirectional model, window after window with overlapping history: what users do today
without an autoregressive model, and the baseline the chunk-by-chunk pipeline is measured against.

The layout is SkyReels-V2's diffusion-forcing long-video loop (diffusers'
``SkyReelsV2DiffusionForcingPipeline``, ``overlap_history``): generate a first window of the model's length; then
each next window starts with the last ``overlap`` latent frames of the video so far as its *prefix* and
denoises only the frames after it; the windows' new frames are concatenated in latent space and decoded once at
the end. How the prefix conditions the window:

- ``history="clean"`` (SkyReels-V2 DF): the prefix stays clean, lightly noised to ``condition_noise`` (its
  ``addnoise_condition``, 20 by default as it recommends) and given that timestep, while the new frames get the
  sampler's timestep: per-token timesteps, which diffusers' Wan transformer accepts. Right for a model trained
  with per-frame noise levels; a bidirectional model has never seen a mix.
- ``history="noised"`` (replacement, as in inpainting): at every step the prefix is the clean history noised to
  the step's own noise level with one fixed noise draw, so the whole window shares one timestep, as in the
  model's training; the window's new frames follow the history through attention.

Every window pays the full window's attention (prefix included): time grows with ``1 / (window - overlap)``.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..errors import InvalidRequestError
from .wan_ar import decode_video

HISTORY_MODES = ("clean", "noised")


@dataclasses.dataclass
class WindowStats:
    """One window: its latent frames in the video, how many were history, and its seconds."""

    index: int
    frames: list[int]
    prefix_frames: int
    seconds: float


def window_plan(latent_frames: int, window: int, overlap: int) -> list[tuple[int, int]]:
    """``[(start, length), ...]`` latent-frame windows covering ``latent_frames``: the first ``window`` long, each
    later one starting ``overlap`` frames before the end of the video so far (its prefix)."""
    if not 0 < overlap < window:
        raise InvalidRequestError(f"overlap must be between 1 and window - 1 latent frames; got {overlap} with a "
                                  f"window of {window}.")
    plan = [(0, min(window, latent_frames))]
    done = plan[0][1]
    while done < latent_frames:
        start = done - overlap
        length = min(window, latent_frames - start)
        plan.append((start, length))
        done = start + length
    return plan


@torch.no_grad()
def extend_window_by_window(pipe, prompt: str, *, num_frames: int, height: int, width: int,
                            num_inference_steps: int, guidance_scale: float, window_frames: int = 17,
                            overlap_frames: int = 5, history: str = "clean", condition_noise: float = 20.0,
                            negative_prompt: str | None = None, generator: torch.Generator | None = None,
                            max_sequence_length: int = 226):
    """Generate ``num_frames`` video frames with a bidirectional ``WanPipeline`` (any pipeline with Wan's
    components) window by window.

    ``window_frames`` and ``overlap_frames`` are video frames (``4k + 1``: the model's clip length and the history
    each window starts from). Returns ``(frames [F, H, W, 3] float in [0, 1], [WindowStats, ...])``.
    """
    if history not in HISTORY_MODES:
        raise InvalidRequestError(f"history must be one of {', '.join(HISTORY_MODES)}; got {history!r}.")
    for name, n in (("num_frames", num_frames), ("window_frames", window_frames), ("overlap_frames", overlap_frames)):
        if n % pipe.vae_scale_factor_temporal != 1:
            raise InvalidRequestError(f"{name} must be 4k + 1 video frames; got {n}.")
    to_latent = lambda n: (n - 1) // pipe.vae_scale_factor_temporal + 1  # noqa: E731
    plan = window_plan(to_latent(num_frames), to_latent(window_frames), to_latent(overlap_frames))
    device = pipe._execution_device
    cfg = guidance_scale > 1
    cond, uncond = pipe.encode_prompt(prompt, negative_prompt, do_classifier_free_guidance=cfg,
                                      max_sequence_length=max_sequence_length, device=device)
    embeds = torch.cat([uncond, cond]) if cfg else cond
    transformer = pipe.transformer
    p_t, p_h, p_w = transformer.config.patch_size
    h, w = height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial
    tokens_per_frame = (h // p_h) * (w // p_w)
    channels = transformer.config.in_channels

    video = None  # [1, C, frames so far, h, w]
    stats = []
    for k, (start, length) in enumerate(plan):
        t0 = time.perf_counter()
        prefix = 0 if video is None else video.shape[2] - start
        x = torch.randn((1, channels, length, h, w), generator=generator, dtype=torch.float32).to(device)
        history_noise = x[:, :, :prefix].clone()
        clean = None if prefix == 0 else video[:, :, start:]
        if clean is not None and history == "clean":  # SkyReels-V2's addnoise_condition
            f = 0.001 * condition_noise
            clean = clean * (1 - f) + torch.randn(clean.shape, generator=generator).to(device) * f
        pipe.scheduler.set_timesteps(num_inference_steps, device=device)
        for i, t in enumerate(pipe.scheduler.timesteps):
            if clean is not None:
                if history == "clean":
                    x[:, :, :prefix] = clean
                else:  # flow matching: x_sigma = (1 - sigma) x_0 + sigma noise
                    sigma = float(pipe.scheduler.sigmas[i])
                    x[:, :, :prefix] = (1 - sigma) * clean + sigma * history_noise
            timestep = torch.full((1, length * tokens_per_frame), float(t), device=device)
            if clean is not None and history == "clean":
                timestep[:, :prefix * tokens_per_frame] = condition_noise
            inp = torch.cat([x, x]) if cfg else x
            ts = timestep.expand(inp.shape[0], -1) if history == "clean" else timestep[:, 0].expand(inp.shape[0])
            pred = transformer(hidden_states=inp.to(transformer.dtype), timestep=ts, encoder_hidden_states=embeds,
                               return_dict=False)[0].float()
            if cfg:
                u, c = pred.chunk(2)
                pred = u + guidance_scale * (c - u)
            x = pipe.scheduler.step(pred, t, x, return_dict=False)[0]
        new = x[:, :, prefix:]
        video = new if video is None else torch.cat([video, new], dim=2)
        stats.append(WindowStats(k, list(range(start, start + length)), prefix, time.perf_counter() - t0))
    return decode_video(pipe, video, "np")[0], stats
