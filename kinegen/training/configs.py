"""Training settings, one dataclass per run (kept free of heavy imports so the CLI can list them)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class VAETrainConfig:
    steps: int = 2200
    batch_size: int = 4
    lr: float = 5e-4
    frames: int = 9
    crop: int = 64
    stats_clips: int = 64  # clips measured for latents_mean/std at the end
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 200


@dataclasses.dataclass
class T2VTrainConfig:
    vae: str = "runs/vae/vae"
    steps: int = 6000
    batch_size: int = 8
    lr: float = 5e-4
    dataset_clips: int = 3072
    frames: int = 17
    size: int = 128
    cfg_dropout: float = 0.1
    flow_shift: float = 3.0
    ema: float = 0.999
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 250


@dataclasses.dataclass
class AdherenceTrainConfig:
    steps: int = 2000
    batch_size: int = 16
    lr: float = 2e-3
    seed: int = 1
    max_minutes: float | None = None
    checkpoint_every: int = 200
