"""``kinegen train omni``: the small Qwen2.5-Omni thinker ``kinegen-shapes-omni`` on procedural clips with sound.

Each step draws ``batch_size`` training clips (:mod:`kinegen.data.av_shapes`, indexed by step so a resumed run sees
the same batches), one question per clip (questions that need both senses ``both_weight`` times as often, captions
``describe_share`` of the time), renders 8 frames (2 fps over 4 s, with a little jitter in time) and the sound
(random gain), lays them out with :class:`kinegen.models.shapes_omni.OmniProcessor`, and trains the whole thinker
with cross-entropy on the answer tokens only. The export is a folder ``from_pretrained`` reads, with the tokenizer
and the processor's settings beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.av_shapes import question_vocabulary, questions_for, render_audio, render_frames, sample_av_clip
from .common import Progress, TimeBox, cosine_lr, load_checkpoint
from .configs import OmniTrainConfig

FRAMES = 8  # 2 fps over the 4-second clips


def pick_question(clip, rng: np.random.Generator, describe_share: float, both_weight: float):
    qs = questions_for(clip)
    if rng.random() < describe_share:
        return next(q for q in qs if q.needs == "describe")
    qs = [q for q in qs if q.needs != "describe"]
    w = np.array([both_weight if q.needs == "both" else 1.0 for q in qs])
    return qs[int(rng.choice(len(qs), p=w / w.sum()))]


def clip_media(clip, rng: np.random.Generator | None = None, frames: int = FRAMES):
    """The frames (at 2 fps, as a reader samples a file of the clip) and the sound of a clip; with ``rng``, time
    jitter and a random gain."""
    times = np.linspace(0, clip.seconds * (1 - 1 / 32), frames)
    audio = render_audio(clip)
    if rng is not None:
        times = np.clip(times + rng.uniform(-0.06, 0.06, frames), 0, clip.seconds - 1e-3)
        audio = np.clip(audio * rng.uniform(0.6, 1.3), -1, 1)
    return render_frames(clip, times), audio


def omni_batch(proc, seeds: list[int], rng: np.random.Generator, cfg: OmniTrainConfig, split: str = "train"):
    questions, answers, frames, audio = [], [], [], []
    for s in seeds:
        clip = sample_av_clip(s, split)
        q = pick_question(clip, rng, cfg.describe_share, cfg.both_weight)
        f, a = clip_media(clip, rng)
        questions.append(q.text)
        answers.append(q.answer)
        frames.append(f)
        audio.append(a)
    return proc(questions, frames, audio, answers)


def build_model(seed: int = 0):
    """A fresh thinker and its processor."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from ..models.shapes_omni import OmniProcessor, build_word_tokenizer, shapes_omni_config

    tok = build_word_tokenizer(question_vocabulary())
    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(shapes_omni_config(len(tok), tok))
    model.generation_config.eos_token_id = tok.eos_token_id  # answers end with <|im_end|>
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, OmniProcessor(tok)


def train_omni(run_dir: str | Path, cfg: OmniTrainConfig) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model, proc = build_model(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step, _ = load_checkpoint(run_dir, {"thinker": model}, opt)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    model.train()
    while step < cfg.steps:
        rng = np.random.default_rng([cfg.seed, step, 4242])
        seeds = [int(s) for s in rng.integers(0, 2**31, cfg.batch_size)]
        batch = omni_batch(proc, seeds, rng, cfg)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=100)
        out = model(**batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        labels = batch["labels"][:, 1:]
        pred = out.logits[:, :-1].argmax(-1)
        answered = labels != -100
        token_acc = float((pred[answered] == labels[answered]).float().mean())
        progress.update(step, loss=out.loss.item(), token_acc=token_acc)
        if box.after_step(run_dir, {"thinker": model}, opt, step):
            break
    progress.close()
    export = run_dir / "model"
    model.eval()
    model.save_pretrained(str(export), safe_serialization=True)
    proc.save_pretrained(export)
    return export
