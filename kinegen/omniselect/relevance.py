"""Cross-modal relevance (../shared/reference/omniselect.md, section 2 step 1, and section 5): how much each sampled
frame and each audio segment has to do with the question, in one space, so that the two modalities compare.

:class:`RelevanceScores` is what the pruner reads; estimators produce it. The heuristic here needs no weights and
ignores the question (so its regime is always ``uniform``): audio loudness and frame-difference energy per window.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import torch

_STOP = frozenset("""a an the is are was were be been being am do does did of in on at to for from by with and or
but not no what which who whom whose when where why how that this these those it its they them their there here
than then so if as into onto over under up down out off about above below between while during before after
again any all each few more most other some such only own same too very can will just should could would may might
must shall i me my we our you your he him his she her tell say said make made please video clip sound audio
something anything one ones""".split())


def question_keywords(question: str) -> list[str]:
    """Content words of a question (the paper keeps nouns and adjectives via nltk's tagger; we drop function words
    and the words that name the media themselves, which keeps the same words on our questions)."""
    words = re.findall(r"[a-z]+", question.lower())
    return [w for w in words if w not in _STOP and len(w) > 1]


@dataclasses.dataclass
class RelevanceScores:
    """Relevance logits of sampled frames and audio segments against the question, with their times in seconds.

    Attributes:
        frame_times, frame_scores: one score per sampled frame.
        audio_times, audio_scores: one score per audio segment (the paper cuts the audio into as many segments as
            there are frames).
        has_query: the question named something to look or listen for (no keywords: ``uniform`` regime).
        estimator: which estimator produced the scores.
        seconds: time spent scoring (reported with the prefill: it is part of the cost).
    """

    frame_times: torch.Tensor
    frame_scores: torch.Tensor
    audio_times: torch.Tensor
    audio_scores: torch.Tensor
    has_query: bool = True
    estimator: str = ""
    seconds: float = 0.0

    def means(self) -> tuple[float, float]:
        """(audio, video): the mean logits the regime test compares."""
        a = float(self.audio_scores.float().mean()) if self.audio_scores.numel() else -math.inf
        v = float(self.frame_scores.float().mean()) if self.frame_scores.numel() else -math.inf
        return a, v

    def group_scores(self, modality: str, n_groups: int, group_seconds: float) -> torch.Tensor:
        """Mean score per time group of ``modality`` (``"video"`` or ``"audio"``); empty groups get the overall mean."""
        times, scores = ((self.frame_times, self.frame_scores) if modality == "video"
                         else (self.audio_times, self.audio_scores))
        scores = scores.double()
        overall = scores.mean() if scores.numel() else torch.tensor(0.0, dtype=torch.float64)
        out = torch.full((n_groups,), float(overall), dtype=torch.float64)
        if scores.numel():
            g = (times.double() / group_seconds).floor().long().clamp(0, max(n_groups - 1, 0))
            sums = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, scores)
            counts = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, g, torch.ones_like(scores))
            out = torch.where(counts > 0, sums / counts.clamp_min(1), out)
        return out


class HeuristicRelevance:
    """No weights, no question: audio RMS loudness (dB) per segment and frame-difference energy (dB) per frame.

    Useful where no tri-modal model is available and in tests; its regime is always ``uniform`` (it cannot tell
    what the question asks for), but its per-window scores still steer the group budgets.
    """

    name = "heuristic"

    def score(self, frames: np.ndarray, frame_times: np.ndarray, audio: np.ndarray | None, sample_rate: int,
              question: str = "") -> RelevanceScores:
        import time

        t0 = time.perf_counter()
        f = np.asarray(frames, dtype=np.float32)
        if f.max() > 1.5:
            f = f / 255.0
        diff = np.abs(np.diff(f, axis=0, prepend=f[:1])).mean(axis=(1, 2, 3))
        frame_scores = 10 * np.log10(diff + 1e-6)
        n = len(f)
        if audio is not None and len(audio) >= n:
            seg = np.array_split(np.asarray(audio, dtype=np.float32), n)
            audio_scores = np.array([10 * np.log10(np.mean(s ** 2) + 1e-10) for s in seg])
            seg_len = len(audio) / sample_rate / n
            audio_times = (np.arange(n) + 0.5) * seg_len
        else:
            audio_scores = np.zeros(0)
            audio_times = np.zeros(0)
        return RelevanceScores(torch.as_tensor(np.asarray(frame_times, dtype=np.float64)),
                               torch.as_tensor(frame_scores, dtype=torch.float64),
                               torch.as_tensor(audio_times, dtype=torch.float64),
                               torch.as_tensor(audio_scores, dtype=torch.float64),
                               has_query=False, estimator=self.name, seconds=time.perf_counter() - t0)
