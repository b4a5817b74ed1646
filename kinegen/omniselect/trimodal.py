"""A small tri-modal relevance model trained here (AudioCLIP's idea at toy scale): words, frames and audio segments
in one embedding space, so that a frame's and an audio segment's relevance to a question's words are comparable
numbers (reference note, section 5).

Three towers meet in a 64-d space: a word embedding table (the question's content words), a small CNN over a
64 x 64 frame, and a small 1D CNN over the log-mel spectrogram of a half-second audio segment. A word's logit for a
frame or a segment is ``scale * cos(item, word) + bias``, one scale and one bias for both modalities, trained with a
per-pair sigmoid loss (SigLIP's) against the words that describe each item: the shapes, colours and motions on
screen for a frame; the tone's pitch, "tone", and "click"/"bounce" words for a segment. Sharing the word table is
what puts frames and sounds in one space.

:class:`TriModalRelevance` is the estimator OmniSelect reads: the mean logit over the question's keywords per frame
and per segment (the paper's AudioCLIP scoring, section 2 step 1).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .relevance import RelevanceScores, question_keywords

DIM = 64
SEGMENT_SECONDS = 0.5
N_MELS = 32
SCORER_NAME = "kinegen-shapes-trimodal"


class FrameTower(nn.Module):
    def __init__(self, dim: int = DIM):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.GELU(), nn.Conv2d(32, 64, 3, 2, 1), nn.GELU(),
            nn.Conv2d(64, 96, 3, 2, 1), nn.GELU(), nn.Conv2d(96, 96, 3, 2, 1), nn.GELU())
        self.proj = nn.Linear(96 * 2, dim)

    def forward(self, x):  # [B, 3, 64, 64] in [0, 1]
        h = self.net(x * 2 - 1)
        return self.proj(torch.cat([h.mean((2, 3)), h.amax((2, 3))], -1))


class AudioTower(nn.Module):
    def __init__(self, dim: int = DIM, n_mels: int = N_MELS):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(n_mels, 96, 3, 1, 1), nn.GELU(), nn.Conv1d(96, 96, 3, 2, 1), nn.GELU(),
            nn.Conv1d(96, 96, 3, 2, 1), nn.GELU())
        self.proj = nn.Linear(96 * 2, dim)

    def forward(self, mel):  # [B, n_mels, frames] log-mel
        h = self.net(mel)
        return self.proj(torch.cat([h.mean(-1), h.amax(-1)], -1))


class TriModalModel(nn.Module):
    def __init__(self, vocab: list[str], dim: int = DIM):
        super().__init__()
        self.vocab = list(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.words = nn.Embedding(len(vocab), dim)
        self.frame = FrameTower(dim)
        self.audio = AudioTower(dim)
        self.log_scale = nn.Parameter(torch.tensor(np.log(10.0), dtype=torch.float32))
        self.bias = nn.Parameter(torch.tensor(-5.0))

    def logits(self, items: torch.Tensor, word_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``scale * cos(item, word) + bias`` for every item and word (every word of the vocabulary by default)."""
        w = self.words.weight if word_ids is None else self.words(word_ids)
        return self.log_scale.exp() * F.normalize(items, dim=-1) @ F.normalize(w, dim=-1).T + self.bias


def log_mel(audio: np.ndarray, sample_rate: int = 16000, n_mels: int = N_MELS) -> np.ndarray:
    """``[n_mels, frames]`` log-mel at 100 frames per second (Whisper's feature extractor, padded to the longest)."""
    fe = _feature_extractor(n_mels, sample_rate)
    return fe(np.asarray(audio, np.float32), sampling_rate=sample_rate, padding="longest",
              return_tensors="np")["input_features"][0]


_FE = {}


def _feature_extractor(n_mels: int, sample_rate: int):
    from transformers import WhisperFeatureExtractor

    key = (n_mels, sample_rate)
    if key not in _FE:
        _FE[key] = WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=sample_rate)
    return _FE[key]


def audio_segments(audio: np.ndarray, n: int, sample_rate: int = 16000) -> tuple[torch.Tensor, np.ndarray]:
    """The track cut into ``n`` equal segments (the paper's rule: as many as sampled frames), each as a log-mel
    ``[n_mels, 50]`` (a half-second window centred on the segment), and the segments' centre times."""
    mel = log_mel(audio, sample_rate)
    total = mel.shape[1]
    width = int(SEGMENT_SECONDS * 100)
    centres = (np.arange(n) + 0.5) * total / n
    segs = []
    for c in centres:
        a = int(round(c - width / 2))
        a = min(max(a, 0), max(total - width, 0))
        seg = mel[:, a:a + width]
        if seg.shape[1] < width:
            seg = np.pad(seg, ((0, 0), (0, width - seg.shape[1])), constant_values=float(mel.min()))
        segs.append(seg)
    return torch.from_numpy(np.stack(segs)).float(), centres / 100.0


class TriModalRelevance:
    """Relevance of frames and audio segments to a question's keywords, from a :class:`TriModalModel`."""

    name = "trimodal"

    def __init__(self, model: TriModalModel):
        self.model = model.eval()

    @classmethod
    def load(cls, folder: str | Path) -> TriModalRelevance:
        from safetensors.torch import load_model

        folder = Path(folder)
        vocab = json.loads((folder / "vocab.json").read_text())
        model = TriModalModel(vocab)
        load_model(model, str(folder / "model.safetensors"))
        return cls(model)

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_model

        from ..media import atomic_path

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / "model.safetensors") as tmp:
            save_model(self.model, str(tmp))
        with atomic_path(folder / "vocab.json") as tmp:
            tmp.write_text(json.dumps(self.model.vocab))

    def keyword_ids(self, question: str) -> list[int]:
        return [self.model.index[w] for w in question_keywords(question) if w in self.model.index]

    @torch.no_grad()
    def score(self, frames: np.ndarray, frame_times: np.ndarray, audio: np.ndarray | None, sample_rate: int,
              question: str = "") -> RelevanceScores:
        t0 = time.perf_counter()
        ids = self.keyword_ids(question)
        f = torch.from_numpy(_frames_64(frames)).permute(0, 3, 1, 2).float() / 255.0
        word_ids = torch.tensor(ids or [0])
        frame_scores = self.model.logits(self.model.frame(f), word_ids).mean(-1).double()
        if audio is not None and len(audio):
            segs, times = audio_segments(audio, len(frames), sample_rate)
            audio_scores = self.model.logits(self.model.audio(segs), word_ids).mean(-1).double()
            audio_times = torch.from_numpy(times)
        else:
            audio_scores, audio_times = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
        return RelevanceScores(torch.as_tensor(np.asarray(frame_times, np.float64)), frame_scores, audio_times,
                               audio_scores, has_query=bool(ids), estimator=self.name,
                               seconds=time.perf_counter() - t0)


def _frames_64(frames: np.ndarray) -> np.ndarray:
    import cv2

    f = np.asarray(frames)
    if f.shape[1:3] != (64, 64):
        f = np.stack([cv2.resize(x, (64, 64), interpolation=cv2.INTER_AREA) for x in f])
    return f


def load_bundled_scorer() -> TriModalRelevance:
    from ..errors import ModelNotFoundError
    from ..loading import ASSETS_DIR

    folder = ASSETS_DIR / "models" / SCORER_NAME
    if not (folder / "model.safetensors").is_file():
        raise ModelNotFoundError(f"the bundled relevance scorer is missing from {folder}")
    return TriModalRelevance.load(folder)


# ---------------------------------------------------------------------------- what describes what


def frame_words(clip, t: float) -> set[str]:
    """Words that describe the frame of ``clip`` at ``t``."""
    words = {clip.background, "background"}
    for o in clip.visible(t):
        words |= {o.shape, o.colour, "shape", "colour"}
        words |= {"bounce", "bounces", "bouncing"} if o.motion == "bouncing" else {o.motion, "move", "moving"}
    return words


def segment_words(clip, t0: float, t1: float) -> set[str]:
    """Words that describe the sound of ``clip`` between ``t0`` and ``t1``."""
    from ..data.av_shapes import bounce_times

    words: set[str] = set()
    for o in clip.objects:
        if o.t_on < t1 and o.t_off > t0:
            words |= {o.pitch, "tone", "tones", "makes", "sounds"}
        if any(t0 <= b < t1 for b in bounce_times(o)):
            words |= {"click", "clicks", "bounce", "bounces", "sounds"}
    return words


def content_vocabulary() -> list[str]:
    """The words the scorer embeds: every content word of the procedural questions and answers."""
    from ..data.av_shapes import question_vocabulary

    return [w for w in question_vocabulary() if re.fullmatch(r"[a-z]+", w) and question_keywords(w)]
