"""Fidelity of an accelerated output against the dense output of the same prompt and seed.

One call signature for every metric: ``metric(reference, test) -> float`` on frames
``[F, H, W, 3]`` float in [0, 1]. PSNR and SSIM come from scikit-image; LPIPS is computed
only where its network weights are on disk (never downloaded) and is ``None`` otherwise.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

PSNR_CAP_DB = 100.0
"""PSNR reported for identical outputs (MSE 0 would give infinity, which JSON cannot hold)."""


def _check(reference: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(test, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"cannot compare outputs of shapes {ref.shape} and {out.shape}")
    return ref, out


def psnr(reference: np.ndarray, test: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB over the whole clip (data range 1), capped at ``PSNR_CAP_DB``."""
    from skimage.metrics import peak_signal_noise_ratio

    ref, out = _check(reference, test)
    if np.array_equal(ref, out):
        return PSNR_CAP_DB
    value = float(peak_signal_noise_ratio(ref, out, data_range=1.0))
    return min(value, PSNR_CAP_DB) if math.isfinite(value) else PSNR_CAP_DB


def ssim(reference: np.ndarray, test: np.ndarray) -> float:
    """Structural similarity, averaged over frames (colour, data range 1, uniform 7x7 window)."""
    from skimage.metrics import structural_similarity

    ref, out = _check(reference, test)
    if ref.ndim == 3:
        ref, out = ref[None], out[None]
    side = min(ref.shape[1], ref.shape[2])
    win = min(7, side if side % 2 else side - 1)
    values = [structural_similarity(r, o, channel_axis=-1, data_range=1.0, win_size=win)
              for r, o in zip(ref, out, strict=True)]
    return float(np.mean(values))


def lpips_weights_path() -> Path | None:
    """Where torchvision would cache AlexNet's weights for LPIPS, if they are present."""
    home = Path(os.environ.get("TORCH_HOME", Path.home() / ".cache" / "torch"))
    found = sorted((home / "hub" / "checkpoints").glob("alexnet-*.pth"))
    return found[0] if found else None


def lpips(reference: np.ndarray, test: np.ndarray) -> float | None:
    """LPIPS (AlexNet) averaged over frames, or ``None`` when torchmetrics, torchvision or the
    backbone weights are not available locally (nothing is downloaded)."""
    if lpips_weights_path() is None:
        return None
    try:
        import torch
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity
    except Exception:
        return None
    ref, out = _check(reference, test)
    if ref.ndim == 3:
        ref, out = ref[None], out[None]
    metric = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True)
    to_t = lambda a: torch.from_numpy(a).float().permute(0, 3, 1, 2)  # noqa: E731
    return float(metric(to_t(ref), to_t(out)))


METRICS = {"psnr_db": psnr, "ssim": ssim, "lpips": lpips}
