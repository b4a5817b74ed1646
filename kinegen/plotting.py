"""Every picture the package draws: TVMap and caching plan, sparse-attention block pattern, profile plots.

The functions take plain data (arrays, lists, numbers), so plotting depends on nothing above it, and
draw on :class:`matplotlib.figure.Figure` objects, never through pyplot's global state, so server
threads can draw at the same time. Each writes one PNG atomically (``media.atomic_path``) and
returns its path as a string. matplotlib is imported on first use.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence

import numpy as np

from .media import atomic_path

PathLike = str | os.PathLike


def _figure(figsize: tuple[float, float], dpi: float | None = None):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, dpi=dpi)


def _save(fig, path: PathLike, dpi: float | None = None) -> str:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        if dpi is None:
            fig.savefig(tmp, format="png")
        else:
            fig.savefig(tmp, format="png", dpi=dpi)
    return str(path)


def save_heatmap(path: PathLike, tvmap, plan=None, group_names: Sequence[str] | None = None,
                 title: str = "") -> str:
    """A TVMap ``[steps, groups]`` (log scale) and, beside it, a caching plan (computed cells dark) as one PNG.

    ``plan`` is a ``[steps, groups]`` boolean array (None: the map alone); ``group_names`` label the rows
    when there are at most 24 of them; ``title`` is wrapped above both panels.
    """
    tvmap = np.asarray(tvmap, dtype=np.float64)
    ncols = 2 if plan is not None else 1
    fig = _figure((4.2 * ncols + 1, 3.6))
    axes = fig.subplots(1, ncols, squeeze=False)
    ax = axes[0, 0]
    im = ax.imshow(np.log10(tvmap.T + 1e-8), aspect="auto", origin="lower", cmap="magma")
    ax.set_title("TVMap (log10)")
    ax.set_xlabel("step")
    ax.set_ylabel("block group")
    fig.colorbar(im, ax=ax, fraction=0.046)
    if plan is not None:
        ax = axes[0, 1]
        ax.imshow(np.asarray(plan, dtype=float).T, aspect="auto", origin="lower", cmap="Greys", vmin=0, vmax=1)
        frac = float(np.asarray(plan).mean())
        ax.set_title(f"plan: computed (black) {frac:.0%}")
        ax.set_xlabel("step")
    if group_names is not None and len(group_names) <= 24:
        for a in axes[0]:
            a.set_yticks(range(len(group_names)))
            a.set_yticklabels(group_names, fontsize=6)
    if title:
        fig.suptitle(textwrap.fill(title, 60 * ncols), fontsize=8)
    return _save(fig, path, dpi=110)


def save_block_pattern(path: PathLike, pattern, density: float | None = None) -> str:
    """A sparse-attention accelerator's kept (query block, key block) pairs (kept = dark).

    ``pattern`` is a 2D ``[q, k]`` or ``[heads, q, k]`` 0/1 array (3D: the mean over heads is shown).
    """
    pattern = np.asarray(pattern, dtype=np.float32)
    if pattern.ndim == 3:
        pattern = pattern.mean(0)
    fig = _figure((4, 4), dpi=100)
    ax = fig.subplots()
    ax.imshow(pattern, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    ax.set_title("kept blocks" + (f" (density {density:.2f})" if density is not None else ""))
    return _save(fig, path)


def plot_speedup_vs_psnr(path: PathLike, labels: Sequence[str], speedups: Sequence[float],
                         psnr_db: Sequence[float], *, psnr_cap_db: float, title: str = "") -> str:
    """One labelled point per configuration: end-to-end speedup over dense against PSNR vs dense.

    Points at ``psnr_cap_db`` (outputs identical to dense) are left out, since they would squash the
    axis; the dashed line at 1x stands for them.
    """
    fig = _figure((6, 4), dpi=120)
    ax = fig.subplots()
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.annotate("dense (identical)", (1.0, 1.0), xycoords=("data", "axes fraction"), textcoords="offset points",
                xytext=(4, -12), fontsize=8, color="gray")
    for label, x, y in zip(labels, speedups, psnr_db, strict=True):
        if y < psnr_cap_db:
            ax.scatter(x, y, s=40)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("end-to-end speedup over dense (x)")
    ax.set_ylabel("PSNR vs dense (dB)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_latency(path: PathLike, labels: Sequence[str], median_s: Sequence[float], min_s: Sequence[float],
                 max_s: Sequence[float], transformer_s: Sequence[float], *, title: str = "") -> str:
    """Seconds per generation for each configuration: end to end (median bar, min-max whiskers) with the
    transformer's median drawn inside it."""
    x = np.arange(len(labels))
    med = np.asarray(median_s, dtype=np.float64)
    lo = med - np.asarray(min_s, dtype=np.float64)
    hi = np.asarray(max_s, dtype=np.float64) - med
    fig = _figure((max(5, 1.2 * len(labels) + 2), 4), dpi=120)
    ax = fig.subplots()
    ax.bar(x, med, color="#9bb8d3", label="end to end (median, min-max)", yerr=[lo, hi], capsize=3)
    ax.bar(x, np.asarray(transformer_s, dtype=np.float64), width=0.5, color="#2f6690", label="transformer")
    ax.set_xticks(x, list(labels), rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("seconds per generation")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


__all__ = ["plot_latency", "plot_speedup_vs_psnr", "save_block_pattern", "save_heatmap"]


def save_kept_tokens(path: PathLike, frames: np.ndarray, video_mask, grid: Sequence[int], audio: np.ndarray | None,
                     audio_mask, sample_rate: int = 16000, title: str = "") -> str:
    """What token pruning kept: for each temporal grid of the video (two frames), its first frame with pruned
    tokens darkened; below, the waveform with the kept audio tokens shaded (25 per second).

    ``video_mask`` is over the video tokens in sequence order (``grid = (t, h, w)`` merged tokens), ``audio_mask``
    over the audio tokens, both booleans (or None: everything kept).
    """
    t, h, w = (int(g) for g in grid)
    vm = np.ones(t * h * w, bool) if video_mask is None else np.asarray(video_mask, bool)
    vm = vm.reshape(t, h, w)
    step = max(len(frames) // t, 1)
    fig = _figure((max(2.0 * t, 4.0), 4.2 if audio is not None else 2.4), dpi=100)
    gs = fig.add_gridspec(2 if audio is not None else 1, t)
    for i in range(t):
        ax = fig.add_subplot(gs[0, i])
        img = np.asarray(frames[min(i * step, len(frames) - 1)]).astype(np.float32) / 255.0
        cell = np.kron(vm[i].astype(np.float32), np.ones((img.shape[0] // h + 1, img.shape[1] // w + 1)))
        cell = cell[: img.shape[0], : img.shape[1], None]
        ax.imshow(img * (0.25 + 0.75 * cell))
        ax.set_title(f"{i * step / max(len(frames), 1) * t * 1.0:.0f}: {int(vm[i].sum())}/{h * w}", fontsize=8)
        ax.axis("off")
    if audio is not None:
        ax = fig.add_subplot(gs[1, :])
        times = np.arange(len(audio)) / sample_rate
        ax.plot(times, audio, lw=0.4, color="0.3")
        if audio_mask is not None:
            for j, kept in enumerate(np.asarray(audio_mask, bool)):
                if kept:
                    ax.axvspan(j / 25, (j + 1) / 25, color="tab:orange", alpha=0.35, lw=0)
        ax.set_xlim(0, max(times[-1] if len(times) else 1, 1e-3))
        ax.set_xlabel("seconds (shaded: audio tokens kept)")
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)
