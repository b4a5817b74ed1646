"""``kinegen train omni``: the small Qwen2.5-Omni thinker ``kinegen-shapes-omni`` on procedural clips with sound.

Each step draws ``batch_size`` training clips (:mod:`kinegen.data.av_shapes`, indexed by step so a resumed run sees
the same batches), one question per clip (questions that need both senses ``both_weight`` times as often, captions
``describe_share`` of the time), renders 8 frames (2 fps over 4 s, with a little jitter in time) and the sound
(random gain), lays them out with :class:`kinegen.models.shapes_omni.OmniProcessor`, and trains the whole thinker
with cross-entropy on the answer tokens plus, with weight ``probe_weight``, the encoder probes below. The export is
a folder ``from_pretrained`` reads, with the tokenizer and the processor's settings beside the weights (the probes
are not part of it).

Encoder probes. A real Qwen2.5-Omni starts from pretrained encoders (a ViT and Whisper's); ours start from random
weights, and with the answer loss alone the thinker learns the language prior and its vision encoder drifts to one
large constant vector per token (at step 1,300 of the first run, blanking the media changed the loss by 2e-5; the
video tokens' norm was 191 against the text embeddings' 0.03). So each second of the clip gets labels the
generator knows, and linear heads on the encoders' mean-pooled tokens of that second learn them: the colour, shape
and motion of the shape on screen from the video tokens, its tone and the click count from the audio tokens. It is
the supervised stand-in for encoder pretraining; the language model still has to learn to read the tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.av_shapes import (
    AV_MOTIONS,
    PITCHES,
    bounce_times,
    question_vocabulary,
    questions_for,
    render_audio,
    render_frames,
    sample_av_clip,
)
from ..data.shapes import COLOURS, SHAPES
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


def frame_times(clip, rng: np.random.Generator | None = None, frames: int = FRAMES) -> np.ndarray:
    """When the frames are taken: 2 fps, as a reader samples a file of the clip; with ``rng``, a little jitter."""
    times = np.linspace(0, clip.seconds * (1 - 1 / 32), frames)
    if rng is not None:
        times = np.clip(times + rng.uniform(-0.06, 0.06, frames), 0, clip.seconds - 1e-3)
    return times


def clip_media(clip, rng: np.random.Generator | None = None, frames: int = FRAMES, times: np.ndarray | None = None):
    """The frames (at 2 fps, as a reader samples a file of the clip, or at ``times``) and the sound of a clip; with
    ``rng``, time jitter (unless ``times`` are given) and a random gain."""
    times = frame_times(clip, rng, frames) if times is None else times
    audio = render_audio(clip)
    if rng is not None:
        audio = np.clip(audio * rng.uniform(0.6, 1.3), -1, 1)
    return render_frames(clip, times), audio


# ---------------------------------------------------------------------------- encoder probes

PROBES = {  # name -> (encoder, classes); class 0 is "nothing on screen" / "silence"
    "colour": ("video", len(COLOURS) + 1),
    "shape": ("video", len(SHAPES) + 1),
    "motion": ("video", len(AV_MOTIONS) + 1),
    "pitch": ("audio", len(PITCHES) + 1),
    "clicks": ("audio", 3),  # none, one, two or more in that second
}


def second_labels(clip, times: np.ndarray) -> dict[str, list[int]]:
    """Per temporal patch of the video (two frames) and per second of the sound: what the probes should read.

    Video patch ``k`` holds frames ``2k`` and ``2k+1``; its label is the first shape on screen at their middle
    time. Second ``k`` of the sound is labelled with the tone of the shape on screen at ``k + 0.5`` s and its
    number of clicks."""
    def on_screen(t):
        seen = clip.visible(float(t))
        return seen[0] if seen else None

    colours, shapes = list(COLOURS), list(SHAPES)
    out: dict[str, list[int]] = {k: [] for k in PROBES}
    for k in range(len(times) // 2):
        o = on_screen((times[2 * k] + times[2 * k + 1]) / 2)
        out["colour"].append(colours.index(o.colour) + 1 if o else 0)
        out["shape"].append(shapes.index(o.shape) + 1 if o else 0)
        out["motion"].append(AV_MOTIONS.index(o.motion) + 1 if o else 0)
    clicks = [t for o in clip.objects for t in bounce_times(o)]
    for k in range(int(np.ceil(clip.seconds))):
        o = on_screen(k + 0.5)
        out["pitch"].append(list(PITCHES).index(o.pitch) + 1 if o else 0)
        out["clicks"].append(min(sum(k <= t < k + 1 for t in clicks), 2))
    return out


class EncoderProbes(torch.nn.Module):
    """Linear heads on the mean-pooled encoder tokens of each temporal patch (video) and second (audio)."""

    def __init__(self, width: int, audio_tokens_per_second: int = 25):
        super().__init__()
        self.audio_tokens_per_second = audio_tokens_per_second
        self.heads = torch.nn.ModuleDict({k: torch.nn.Linear(width, n) for k, (_, n) in PROBES.items()})

    def pooled(self, video: tuple[torch.Tensor, ...], grids: torch.Tensor, audio: torch.Tensor,
               audio_lengths: list[int]):
        """Per clip, merged video tokens ``[t * h * w, d]`` -> ``[t, d]`` and audio tokens -> ``[seconds, d]``."""
        vids = [x.reshape(int(g[0]), -1, x.shape[-1]).mean(1) for x, g in zip(video, grids, strict=True)]
        per, auds = self.audio_tokens_per_second, []
        for x in torch.split(audio, audio_lengths):
            n = len(x) // per
            auds.append(x[: n * per].reshape(n, per, -1).mean(1))
        return vids, auds

    def loss(self, video: list[torch.Tensor], audio: list[torch.Tensor], labels: list[dict[str, list[int]]]):
        """Mean cross-entropy over the heads and each head's accuracy."""
        total, accs = 0.0, {}
        for k, (enc, _) in PROBES.items():
            pooled = video if enc == "video" else audio
            n = [min(len(pooled[i]), len(lab[k])) for i, lab in enumerate(labels)]  # a clip's seconds, both sides
            feats = torch.cat([pooled[i][: n[i]] for i in range(len(labels))])
            target = torch.tensor([y for i, lab in enumerate(labels) for y in lab[k][: n[i]]])
            logits = self.heads[k](feats)
            total = total + torch.nn.functional.cross_entropy(logits, target)
            accs[k] = float((logits.argmax(-1) == target).float().mean())
        return total / len(PROBES), accs


def omni_batch(proc, seeds: list[int], rng: np.random.Generator, cfg: OmniTrainConfig, split: str = "train"):
    """The thinker's keyword arguments for one training batch, and each clip's :func:`second_labels`."""
    questions, answers, frames, audio, labels = [], [], [], [], []
    for s in seeds:
        clip = sample_av_clip(s, split)
        q = pick_question(clip, rng, cfg.describe_share, cfg.both_weight)
        times = frame_times(clip, rng)
        f, a = clip_media(clip, rng, times=times)
        frames.append(f)
        audio.append(a)
        labels.append(second_labels(clip, times))
        questions.append(q.text)
        answers.append(q.answer)
    return proc(questions, frames, audio, answers), labels


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


class EncoderTaps:
    """Forward hooks that keep the vision and audio encoders' outputs of the last forward."""

    def __init__(self, thinker):
        self.outputs: dict[str, object] = {}
        inner = thinker.model
        self.handles = [inner.visual.register_forward_hook(self._keep("video")),
                        inner.audio_tower.register_forward_hook(self._keep("audio"))]

    def _keep(self, name):
        def hook(module, args, output):
            self.outputs[name] = output
        return hook

    def features(self, batch: dict, proc):
        """Merged video tokens per clip and the audio tokens (concatenated) with each clip's count."""
        video = self.outputs["video"].pooler_output  # transformers splits it per clip after the encoder returns
        grids = batch["video_grid_thw"]
        if torch.is_tensor(video):
            video = torch.split(video, [int(g.prod()) // proc.config.merge_size ** 2 for g in grids])
        lengths = [proc.audio_token_count(int(n)) for n in batch["feature_attention_mask"].sum(-1)]
        return video, grids, self.outputs["audio"].last_hidden_state, lengths

    def remove(self):
        for h in self.handles:
            h.remove()


def answer_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of rows whose first answer token is predicted right (teacher forcing)."""
    labels = labels[:, 1:]
    first = (labels != -100).float().argmax(-1)
    rows = torch.arange(len(labels))
    return float((logits[:, :-1].argmax(-1)[rows, first] == labels[rows, first]).float().mean())


def train_omni(run_dir: str | Path, cfg: OmniTrainConfig) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model, proc = build_model(cfg.seed)
    probes = EncoderProbes(model.config.text_config.hidden_size, proc.config.position_id_per_seconds)
    modules = {"thinker": model, "probes": probes}
    params = [*model.parameters(), *probes.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step, _ = load_checkpoint(run_dir, modules, opt)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    taps = EncoderTaps(model)
    model.train()
    while step < cfg.steps:
        rng = np.random.default_rng([cfg.seed, step, 4242])
        seeds = [int(s) for s in rng.integers(0, 2**31, cfg.batch_size)]
        batch, labels = omni_batch(proc, seeds, rng, cfg)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=100)
        out = model(**batch)
        video, grids, audio, lengths = taps.features(batch, proc)
        probe_loss, probe_acc = probes.loss(*probes.pooled(video, grids, audio, lengths), labels)
        loss = out.loss + cfg.probe_weight * probe_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        progress.update(step, loss=out.loss.item(), answer_acc=answer_accuracy(out.logits, batch["labels"]),
                        probe_loss=probe_loss.item(), **{f"{k}_acc": v for k, v in probe_acc.items()})
        if box.after_step(run_dir, modules, opt, step):
            break
    progress.close()
    taps.remove()
    export = run_dir / "model"
    model.eval()
    model.save_pretrained(str(export), safe_serialization=True)
    proc.save_pretrained(export)
    return export
