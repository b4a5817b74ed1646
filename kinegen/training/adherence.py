"""Train the prompt-adherence classifier on procedural single-shape clips (every combination).

Augmentations make it read generated videos too: Gaussian blur, additive noise, brightness and
contrast jitter, and random 17-frame clips rendered at 64 to 160 pixels before resampling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..data.shapes import COLOUR_NAMES, MOTIONS, SHAPES, render_clip, sample_clip
from ..models.adherence import AdherenceClassifier, downsample_frames, prepare
from .common import Progress, TimeBox, cosine_lr, load_checkpoint
from .configs import AdherenceTrainConfig


def labelled_batch(seeds: list[int], rng: np.random.Generator, augment: bool = True):
    clips, labels = [], {"shape": [], "colour": [], "motion": []}
    for seed in seeds:
        spec = sample_clip(seed, split="all", num_objects=1)
        size = int(rng.choice([64, 96, 128, 160])) if augment else 128
        clips.append(torch.from_numpy(render_clip(spec, 17, size, size)))
        o = spec.primary
        labels["shape"].append(SHAPES.index(o.shape))
        labels["colour"].append(COLOUR_NAMES.index(o.colour))
        labels["motion"].append(MOTIONS.index(o.motion))
    x = prepare(torch.cat([downsample_frames(c[None]) for c in clips]))
    if augment:
        x = _augment(x, rng)
    return x, {k: torch.tensor(v) for k, v in labels.items()}


def _augment(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    b = x.shape[0]
    out = []
    for i in range(b):
        v = x[i]
        if rng.random() < 0.5:  # blur
            k = int(rng.choice([3, 5]))
            v = F.avg_pool3d(v[None], (1, k, k), stride=1, padding=(0, k // 2, k // 2))[0]
        v = v * float(rng.uniform(0.85, 1.15)) + float(rng.uniform(-0.1, 0.1))
        v = v + torch.from_numpy(rng.normal(0, rng.uniform(0, 0.12), v.shape).astype(np.float32))
        out.append(v.clamp(-1, 1))
    return torch.stack(out)


def train_adherence(run_dir: str | Path, cfg: AdherenceTrainConfig) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = AdherenceClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    step, _ = load_checkpoint(run_dir, {"classifier": model}, opt)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    model.train()
    while step < cfg.steps:
        rng = np.random.default_rng(cfg.seed * 7_777_777 + step)
        seeds = [int(s) for s in rng.integers(0, 2**31, cfg.batch_size)]
        x, y = labelled_batch(seeds, rng)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=50)
        logits = model(x)
        loss = sum(F.cross_entropy(logits[k], y[k]) for k in y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        acc = float(np.mean([(logits[k].argmax(1) == y[k]).float().mean().item() for k in y]))
        progress.update(step, loss=loss.item(), acc=acc)
        if box.after_step(run_dir, {"classifier": model}, opt, step):
            break
    progress.close()
    out = run_dir / "adherence_classifier.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return out

