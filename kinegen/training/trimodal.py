"""``kinegen train relevance``: the tri-modal relevance scorer (:mod:`kinegen.omniselect.trimodal`).

Each step draws ``batch_size`` training clips, one random time in each, and takes the frame at that time and the
half second of sound around it. Every (item, word) pair of the vocabulary is a binary target (does the word describe
this frame, this sound?), with SigLIP's sigmoid loss on ``scale * cos + bias``; frames and sounds share the words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.av_shapes import render_audio, render_frames, sample_av_clip
from ..omniselect.trimodal import (
    SEGMENT_SECONDS,
    TriModalModel,
    TriModalRelevance,
    content_vocabulary,
    frame_words,
    log_mel,
    segment_words,
)
from .common import Progress, TimeBox, cosine_lr, load_checkpoint
from .configs import RelevanceTrainConfig


def relevance_batch(seeds, rng: np.random.Generator, index: dict[str, int]):
    frames, segs, fl, al = [], [], [], []
    width = int(SEGMENT_SECONDS * 100)
    for s in seeds:
        clip = sample_av_clip(int(s))
        t = float(rng.uniform(0.05, clip.seconds - 0.05))
        frames.append(render_frames(clip, [t])[0])
        mel = log_mel(render_audio(clip) * rng.uniform(0.6, 1.3))
        a = int(round(t * 100 - width / 2))
        a = min(max(a, 0), mel.shape[1] - width)
        segs.append(mel[:, a:a + width])
        for words, out in ((frame_words(clip, t), fl), (segment_words(clip, a / 100, (a + width) / 100), al)):
            y = np.zeros(len(index), np.float32)
            y[[index[w] for w in words if w in index]] = 1
            out.append(y)
    f = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float() / 255.0
    return f, torch.from_numpy(np.stack(segs)).float(), torch.from_numpy(np.stack(fl)), torch.from_numpy(np.stack(al))


def train_relevance(run_dir: str | Path, cfg: RelevanceTrainConfig) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = TriModalModel(content_vocabulary())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    step, _ = load_checkpoint(run_dir, {"scorer": model}, opt)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    model.train()
    while step < cfg.steps:
        rng = np.random.default_rng([cfg.seed, step, 77])
        f, a, yf, ya = relevance_batch(rng.integers(0, 2**31, cfg.batch_size), rng, model.index)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=50)
        lf, la = model.logits(model.frame(f)), model.logits(model.audio(a))
        loss = F.binary_cross_entropy_with_logits(lf, yf) + F.binary_cross_entropy_with_logits(la, ya)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        acc = 0.5 * (((lf > 0) == (yf > 0)).all(-1).float().mean() + ((la > 0) == (ya > 0)).all(-1).float().mean())
        progress.update(step, loss=loss.item(), exact=float(acc))
        if box.after_step(run_dir, {"scorer": model}, opt, step):
            break
    progress.close()
    export = run_dir / "scorer"
    TriModalRelevance(model).save_pretrained(export)
    return export
