"""Train the bundled AutoencoderKLWan on procedural clips.

The VAE is convolutional, so it trains on short clips (9 frames) and 64x64 crops and then runs
at any size and length. The loss is MSE plus 0.2 L1, with object pixels weighted 5x (the flat
background would otherwise dominate), and a small penalty on the latent mean (1e-4 |mu|^2);
the decoder sees the posterior mean plus a little noise (see the training loop); it is computed on the decoder's
output before diffusers' final clamp (see ``decode_unclamped``). With L1 alone or a learning rate
above ~1e-3 this narrow VAE stalls at predicting the background. When training ends, per-channel latent
statistics are measured on 17-frame 128x128 clips and stored as ``latents_mean``/``latents_std``
in the config, which is how WanPipeline normalises latents.

``--init DIR --decoder-only true`` fine-tunes a trained VAE's decoder with the encoder frozen: the
latents, their statistics (copied from DIR) and every model trained on them stay valid
(docs/bundled_model.md: the bundled decoder was fine-tuned this way after the transformer).

``--first-frame-weight W`` weights video frame 0 in the loss (the causal VAE codes it alone, and the
bundled VAE lost small objects on gray there); ``--first-frame-noise S`` adds noise to latent frame 0 only
(see ``_latent_noise``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.shapes import BACKGROUNDS, render_clip, sample_clip
from ..models.shapes_t2v import build_vae
from .common import Progress, TimeBox, cosine_lr, load_checkpoint
from .configs import VAETrainConfig


def to_tensor(clips: np.ndarray) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """``vae.decode`` without its final clamp to [-1, 1], whose zero gradient outside the range lets
    pixels that overshoot stay dead; the same frame-by-frame causal loop as AutoencoderKLWan._decode."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    frames = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        frames.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                  first_chunk=(i == 0)))
    vae.clear_cache()
    return torch.cat(frames, dim=2)


def object_pixels(clip: np.ndarray, background: str) -> np.ndarray:
    """Approximate object mask of uint8 frames ``[..., H, W, 3]``: pixels more than 40 levels away from the
    background's base colour (1.0), the rest 0.0."""
    bg = np.array(BACKGROUNDS[background], np.int16)
    return (np.abs(clip.astype(np.int16) - bg).max(-1) > 40).astype(np.float32)


def _batch(step: int, cfg: VAETrainConfig):
    clips, masks = [], []
    for i in range(cfg.batch_size):
        seed = cfg.seed * 10_000_019 + step * cfg.batch_size + i
        rng = np.random.default_rng(seed)
        size = int(rng.choice([64, 96, 128]))
        spec = sample_clip(seed, split="all")
        clip = render_clip(spec, cfg.frames, size, size)
        y = int(rng.integers(0, size - cfg.crop + 1))
        x = int(rng.integers(0, size - cfg.crop + 1))
        clip = clip[:, y:y + cfg.crop, x:x + cfg.crop]
        clips.append(clip)
        masks.append(object_pixels(clip, spec.background))
    x = to_tensor(np.stack(clips))
    w = 1.0 + cfg.object_weight * torch.from_numpy(np.stack(masks))[:, None]
    if cfg.first_frame_weight != 1:  # scaled so that the mean frame weight stays 1
        frame = torch.ones(cfg.frames)
        frame[0] = cfg.first_frame_weight
        w = w * (frame / frame.mean()).view(1, 1, -1, 1, 1)
    return x, w


def _initial_vae(cfg: VAETrainConfig):
    """A fresh VAE, or (``cfg.init``) the weights of a saved one; with ``cfg.decoder_only`` the encoder
    is frozen, so the latent space (and every model trained on it) stays what it was."""
    vae = build_vae()
    if cfg.init:
        from diffusers import AutoencoderKLWan

        src = AutoencoderKLWan.from_pretrained(cfg.init, use_safetensors=True).state_dict()
        ours = vae.state_dict()
        if {k: v.shape for k, v in src.items()} != {k: v.shape for k, v in ours.items()}:
            raise ValueError(f"--init {cfg.init}: its architecture differs from the bundled VAE's (build_vae)")
        vae.load_state_dict(src)
    elif cfg.decoder_only:
        raise ValueError("--decoder-only fine-tunes a trained VAE's decoder: pass --init VAE_FOLDER")
    if cfg.decoder_only:
        for module in (vae.encoder, vae.quant_conv):
            module.requires_grad_(False)
    return vae


def _init_latents_std(cfg: VAETrainConfig) -> torch.Tensor | None:
    """Per-channel latent std of the ``--init`` VAE (what the transformer's latents are normalised by)."""
    if not cfg.init:
        return None
    from diffusers import AutoencoderKLWan

    std = AutoencoderKLWan.load_config(cfg.init).get("latents_std")
    return None if std is None else torch.tensor(std)


def _latent_noise(mu: torch.Tensor, cfg: VAETrainConfig, latents_std: torch.Tensor | None) -> torch.Tensor:
    """Noise added to the posterior mean before decoding: a little everywhere (0.05 of the latent's std),
    plus, with ``first_frame_noise`` = s, Gaussian noise of std U(0, s) x latents_std per channel on
    latent frame 0 only. The causal VAE puts the whole first image in latent frame 0 and its decode is
    3.5-4x more sensitive to latent errors than later frames'. Measured: it makes the decoder more robust
    to such noise, but did not fix the bundled model's first frames, whose cause was the encoder
    (docs/bundled_model.md)."""
    noise = 0.05 * mu.std() * torch.randn_like(mu)
    if cfg.first_frame_noise > 0:
        std = latents_std if latents_std is not None else mu.std(dim=(0, 2, 3, 4))
        scale = cfg.first_frame_noise * torch.rand(mu.shape[0], 1, 1, 1, 1) * std.view(1, -1, 1, 1, 1)
        noise[:, :, :1] += scale * torch.randn_like(mu[:, :, :1])
    return noise


def train_vae(run_dir: str | Path, cfg: VAETrainConfig) -> Path:
    """Train (or resume) in ``run_dir``; returns the folder of the saved VAE (``run_dir/vae``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    vae = _initial_vae(cfg)
    trained = [p for p in vae.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    step, _ = load_checkpoint(run_dir, {"vae": vae}, opt)
    print(f"VAE: {sum(p.numel() for p in vae.parameters()) / 1e6:.2f}M parameters "
          f"({sum(p.numel() for p in trained) / 1e6:.2f}M trained); starting at step {step}", flush=True)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    latents_std = _init_latents_std(cfg)
    vae.train()
    while step < cfg.steps:
        x, w = _batch(step, cfg)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr)
        with torch.set_grad_enabled(not cfg.decoder_only):
            post = vae.encode(x).latent_dist
        # The posterior mean plus a little fixed noise: with the posterior's own noise (std ~0.9 at
        # initialisation and a KL weight of 1e-6) the decoder learns to ignore the latent and paints
        # the average clip; a near-deterministic latent trains, and the noise keeps the decoder robust
        # to the small errors of sampled latents.
        mu = post.mode()
        rec = decode_unclamped(vae, mu + _latent_noise(mu.detach(), cfg, latents_std))
        err = (rec - x).abs()
        loss_rec = ((rec - x) ** 2 * w).mean() + 0.2 * (err * w).mean()
        loss_kl = mu.pow(2).mean()  # keeps the latent scale bounded (the KL's mean term)
        loss = loss_rec + 1e-4 * loss_kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        step += 1
        progress.update(step, loss=loss_rec.item(), l1=err.mean().item())
        if box.after_step(run_dir, {"vae": vae}, opt, step):
            break
    progress.close()
    if cfg.decoder_only:  # same encoder, same latent statistics: keep the ones the transformer was trained with
        from diffusers import AutoencoderKLWan

        stats = AutoencoderKLWan.load_config(cfg.init)
        return export_vae(vae, run_dir / "vae", cfg.seed, stats=(stats["latents_mean"], stats["latents_std"]))
    return export_vae(vae, run_dir / "vae", cfg.seed, cfg.stats_clips)


@torch.no_grad()
def latent_statistics(vae, n_clips: int = 64, seed: int = 123) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the posterior means on 17-frame 128x128 clips."""
    vae.eval()
    zs = []
    for i in range(0, n_clips, 8):
        clips = np.stack([render_clip(sample_clip(seed + j, split="all"), 17, 128, 128) for j in range(i, i + 8)])
        zs.append(vae.encode(to_tensor(clips)).latent_dist.mode())
    z = torch.cat(zs).transpose(0, 1).reshape(vae.config.z_dim, -1)
    return z.mean(1).tolist(), z.std(1).clamp_min(1e-3).tolist()


def export_vae(vae, folder: Path, seed: int, n_clips: int = 64, stats: tuple | None = None) -> Path:
    """Save with per-channel latent statistics: ``stats`` (mean, std) if given, else measured."""
    mean, std = stats if stats is not None else latent_statistics(vae, n_clips=n_clips, seed=seed + 123)
    final = build_vae(mean, std)
    final.load_state_dict(vae.state_dict())
    final.save_pretrained(folder, safe_serialization=True)
    print(f"saved VAE to {folder} (latents_mean {np.round(mean, 3).tolist()}, std {np.round(std, 3).tolist()})",
          flush=True)
    return folder
