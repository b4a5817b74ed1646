"""Accuracy of an omni model on procedural questions about clips with sound (``kinegen eval omni``).

Clips of a split (:mod:`kinegen.data.av_shapes`), every question each clip answers except the caption, rendered
as a reader would sample a file of them (2 fps), answered greedily; an answer is right when it is the expected word.
Captions are scored separately: the share of their attribute words (colours, shapes, motions, background) that
match. Results per sense needed (``video``, ``audio``, ``both``) and per template, with the regime OmniSelect
chose beside the regime the question calls for (``video`` -> video-centric, ``audio`` -> audio-centric, ``both`` ->
uniform) when pruning is on.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import torch

EXPECTED_REGIME = {"video": "video", "audio": "audio", "both": "uniform"}


def question_set(n_clips: int, split: str, seed: int = 0, captions: bool = False):
    """(clip, question) pairs: every non-caption question of ``n_clips`` clips (and their captions if asked)."""
    from ..data.av_shapes import questions_for, sample_av_clip

    out = []
    for i in range(n_clips):
        clip = sample_av_clip(seed * 100_003 + i, split)
        for q in questions_for(clip):
            if (q.needs == "describe") == captions:
                out.append((clip, q))
    return out


@torch.no_grad()
def evaluate_omni(pipe, n_clips: int = 50, split: str = "held_out", seed: int = 0, prune=None,
                  captions: bool = True, progress=None) -> dict:
    """Accuracy of ``pipe`` (:class:`kinegen.pipelines.omni_understand.OmniUnderstandingPipeline`)."""
    from ..media_av import AVInput
    from ..training.omni import clip_media

    pairs = question_set(n_clips, split, seed) + (question_set(n_clips, split, seed, captions=True)
                                                  if captions else [])
    right = collections.Counter()
    total = collections.Counter()
    regimes = collections.Counter()
    regime_total = collections.Counter()
    caption_scores, prefill, kept, records = [], [], [], []
    media_cache: dict[int, AVInput] = {}
    t0 = time.perf_counter()
    for i, (clip, q) in enumerate(pairs):
        if clip.seed not in media_cache:
            frames, audio = clip_media(clip)
            times = np.linspace(0, clip.seconds * (1 - 1 / 32), len(frames))
            media_cache[clip.seed] = AVInput(frames, times, audio, 16000, clip.seconds, "procedural")
        r = pipe.understand(media_cache[clip.seed], q.text, prune=prune,
                            max_new_tokens=32 if q.needs == "describe" else 4)
        prefill.append(r.timings["prefill_s"] + r.timings["relevance_s"])
        kept.append(r.media_kept / max(r.media_tokens, 1))
        if q.needs == "describe":
            caption_scores.append(caption_match(r.answer, q.answer))
        else:
            ok = r.answer == q.answer
            right[q.needs] += ok
            total[q.needs] += 1
            right[q.template] += ok
            total[q.template] += 1
            if r.regime is not None and r.regime != "-":
                regime_total[q.needs] += 1
                regimes[q.needs] += r.regime == EXPECTED_REGIME[q.needs]
        records.append({"clip": clip.seed, "question": q.text, "expected": q.answer, "answer": r.answer,
                        "needs": q.needs, "regime": r.regime})
        if progress is not None:
            progress(i + 1, len(pairs))
    needs = [k for k in ("video", "audio", "both") if total[k]]
    n_q = sum(total[k] for k in needs)
    return {
        "split": split, "clips": n_clips, "questions": n_q, "seconds": time.perf_counter() - t0,
        "accuracy": sum(right[k] for k in needs) / max(n_q, 1),
        "by_need": {k: right[k] / total[k] for k in needs},
        "by_template": {k: right[k] / total[k] for k in sorted(total) if k not in ("video", "audio", "both")},
        "caption_match": float(np.mean(caption_scores)) if caption_scores else None,
        "regime_accuracy": ({k: regimes[k] / regime_total[k] for k in regime_total} if regime_total else None),
        "median_prefill_s": float(np.median(prefill)) if prefill else None,
        "mean_media_keep": float(np.mean(kept)) if kept else None,
        "records": records,
    }


def caption_match(answer: str, expected: str) -> float:
    """Share of the expected caption's attribute words (in order of objects) the answer has at the same place."""
    from ..data.av_shapes import AV_MOTIONS, BACKGROUNDS, COLOURS, SHAPES

    keep = set(COLOURS) | set(SHAPES) | set(AV_MOTIONS) | set(BACKGROUNDS)
    want = [w for w in expected.split() if w in keep]
    got = [w for w in answer.replace(".", " ").split() if w in keep]
    if not want:
        return 1.0
    return sum(a == b for a, b in zip(want, got, strict=False)) / len(want)
