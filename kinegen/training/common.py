"""What every training loop here shares: resumable checkpoints, a time box, progress and logs.

A run folder holds ``checkpoint/`` (model weights as safetensors, optimizer state, ``state.json``
with the step) and ``log.jsonl`` (one JSON line per logged step). Running the same command again
resumes from the checkpoint. Data is procedural and indexed by step, so a resumed run sees the
same batches it would have seen without the interruption.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from ..media import swap_in_dir


def save_checkpoint(run_dir: Path, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer,
                    step: int, extra: dict | None = None) -> None:
    """Write the checkpoint atomically (a temporary folder renamed over the old one)."""
    ckpt = run_dir / "checkpoint"
    tmp = run_dir / "checkpoint.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for name, module in modules.items():
        save_model(module, str(tmp / f"{name}.safetensors"))  # handles tied weights (UMT5's embeddings)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
    swap_in_dir(tmp, ckpt)


def load_checkpoint(run_dir: Path, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer | None):
    """Restore a checkpoint if one exists; returns ``(step, extra)`` (``(0, {})`` for a fresh run)."""
    ckpt = run_dir / "checkpoint"
    if not (ckpt / "state.json").is_file():
        return 0, {}
    for name, module in modules.items():
        load_model(module, str(ckpt / f"{name}.safetensors"))
    if optimizer is not None and (ckpt / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    state = json.loads((ckpt / "state.json").read_text())
    return int(state.pop("step")), state


class Progress:
    """Prints ``step/total loss it/s eta`` and appends the same to ``log.jsonl``."""

    def __init__(self, run_dir: Path, total: int, start: int, every: int = 20):
        self.log = open(run_dir / "log.jsonl", "a")  # noqa: SIM115 (closed in close())
        self.total, self.every = total, every
        self.t0, self.s0 = time.perf_counter(), start
        self.avg: dict[str, float] = {}

    def update(self, step: int, **values: float) -> None:
        for k, v in values.items():
            self.avg[k] = 0.9 * self.avg.get(k, v) + 0.1 * v
        if step % self.every and step != self.total:
            return
        elapsed = time.perf_counter() - self.t0
        rate = (step - self.s0) / max(elapsed, 1e-9)
        eta = (self.total - step) / max(rate, 1e-9)
        shown = " ".join(f"{k} {v:.4f}" for k, v in self.avg.items())
        print(f"step {step}/{self.total} {shown} | {rate:.2f} it/s | eta {eta / 60:.1f} min", flush=True)
        self.log.write(json.dumps({"step": step, "time_s": elapsed, **self.avg}) + "\n")
        self.log.flush()

    def close(self) -> None:
        self.log.close()


class TimeBox:
    """Decides, after each step, whether to checkpoint and whether to stop (steps done or time up)."""

    def __init__(self, total: int, every: int, max_minutes: float | None):
        self.total, self.every = total, every
        self.deadline = time.time() + max_minutes * 60 if max_minutes else None

    def after_step(self, run_dir: Path, modules: dict[str, torch.nn.Module], optimizer, step: int) -> bool:
        """Checkpoint when due; return True when training must stop now."""
        out_of_time = self.deadline is not None and time.time() > self.deadline
        if step % self.every == 0 or step >= self.total or out_of_time:
            save_checkpoint(run_dir, modules, optimizer, step)
        if out_of_time and step < self.total:
            print(f"time box reached at step {step}; run the same command again to continue", flush=True)
        return out_of_time or step >= self.total


def weighted_mse(pred: torch.Tensor, target: torch.Tensor, *weights: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error under the product of ``weights`` (each broadcast to ``pred``; None counts as 1),
    divided by the total weight, so that the loss keeps its scale whatever the weights."""
    w = torch.ones_like(pred[:1, :1])
    for part in weights:
        if part is not None:
            w = w * part
    w = w.expand_as(pred)
    return ((pred - target).square() * w).sum() / w.sum().clamp(min=1e-12)


def frame_weights(weights: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """Per-latent-frame weights ``[F]`` shaped to broadcast over ``like`` ``[B, C, F, h, w]`` (None stays None)."""
    return None if weights is None else weights.to(like).view(1, 1, -1, 1, 1)


def object_weights(mask: torch.Tensor | None, object_weight: float) -> torch.Tensor | None:
    """``1 + object_weight`` on the latent pixels a shape covers (``mask`` in [0, 1]), 1 elsewhere; None without
    a mask. Objects cover ~7% of a clip: unweighted, the flat background dominates the flow loss and a model
    learns colour and motion long before outlines (docs/bundled_model.md)."""
    return None if mask is None else 1 + object_weight * mask


def cosine_lr(step: int, total: int, base: float, warmup: int = 100) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(p * torch.pi)).item()))
