"""Answering questions about videos with sound: an omni thinker, its processor, and optional token pruning.

>>> pipe = OmniUnderstandingPipeline.load("kinegen-shapes-omni")
>>> r = pipe.understand("clip.mp4", "which shape makes the high tone?", prune="omniselect:keep=0.3")
>>> r.answer, r.regime, r.media_kept, r.timings["prefill_s"]

The video is read with :func:`kinegen.media_av.read_av` (frames at 2 fps, the sound at 16 kHz); the relevance
estimator (:mod:`kinegen.omniselect.relevance`) scores frames and audio segments against the question before the
prefill, and OmniSelect (or a peer) prunes the prefill's audio and video tokens. The estimator's time is reported
with the prefill's: it is part of what pruning costs.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import InvalidRequestError, ModelNotFoundError

OMNI_MODELS = ("kinegen-shapes-omni",)
CAPTION_QUESTION = "describe the video."


@dataclasses.dataclass
class UnderstandResult:
    """An answer and what it cost."""

    answer: str
    question: str
    regime: str | None
    has_audio: bool
    tokens_before: int
    tokens_after: int
    media_tokens: int
    media_kept: int
    video_kept_mask: torch.Tensor | None  # over the video tokens, in sequence order ([t, h, w] after the merge)
    audio_kept_mask: torch.Tensor | None
    video_grid: tuple[int, int, int]  # merged tokens: (temporal grids, rows, columns)
    timings: dict[str, float]
    prune: dict | None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("video_kept_mask", "audio_kept_mask"):
            d.pop(k)
        return d


def default_omni_models() -> list[str]:
    """The bundled omni models that are installed."""
    from ..loading import ASSETS_DIR

    return [m for m in OMNI_MODELS if (ASSETS_DIR / "models" / m / "config.json").is_file()]


def resolve_omni_folder(model: str | Path) -> Path:
    """A bundled omni model's name or a folder -> its folder; the error names the bundled models."""
    from ..loading import ASSETS_DIR

    if str(model) in OMNI_MODELS:
        folder = ASSETS_DIR / "models" / str(model)
        if not folder.is_dir():
            raise ModelNotFoundError(f"{model} is not in this installation ({folder.parent}); train an omni model with "
                                     "`kinegen train omni --export DIR` and pass --model DIR.")
        return folder
    folder = Path(model)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{model} is neither a bundled omni model ({', '.join(OMNI_MODELS)}) nor a folder "
                                 "with a thinker's config.json.")
    return folder


class OmniUnderstandingPipeline:
    """A Qwen2.5-Omni-layout thinker with its processor and a relevance estimator."""

    def __init__(self, thinker, processor, relevance=None, name: str = ""):
        self.thinker = thinker.eval()
        self.processor = processor
        self.relevance = relevance
        self.name = name

    @classmethod
    def load(cls, model: str | Path = "kinegen-shapes-omni", relevance: str | None = "auto"):
        """Load a folder written by ``kinegen train omni`` (weights, tokenizer, ``kinegen_omni_processor.json``).

        ``relevance``: ``auto`` (the bundled tri-modal scorer where it exists, else the heuristic), ``heuristic``,
        a scorer folder, or None (no relevance: OmniSelect runs in its uniform regime).
        """
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        from ..models.shapes_omni import PROCESSOR_FILE, OmniProcessor

        folder = resolve_omni_folder(model)
        if not (folder / PROCESSOR_FILE).is_file():
            raise ModelNotFoundError(f"{folder} has no {PROCESSOR_FILE}: Kinegen reads omni models written by "
                                     "`kinegen train omni` (a real Qwen2.5-Omni checkpoint needs its own processor, "
                                     "see docs/omniselect.md).")
        thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(str(folder), use_safetensors=True)
        return cls(thinker, OmniProcessor.load(folder), load_relevance(relevance), name=str(model))

    def read(self, video) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        from ..media_av import AVInput, read_av

        av_in = video if isinstance(video, AVInput) else read_av(video, fps=self.processor.config.fps)
        return av_in.frames, av_in.frame_times, (av_in.audio if av_in.has_audio else None)

    def understand(self, video, question: str, prune=None, max_new_tokens: int = 32) -> UnderstandResult:
        """Answer ``question`` about ``video`` (a path or an :class:`~kinegen.media_av.AVInput`), pruning the prefill
        with ``prune`` (``"omniselect:keep=0.3"``, a config, or None)."""
        from ..omniselect import apply_omniselect

        self.processor.check_question(question)
        t0 = time.perf_counter()
        frames, times, audio = self.read(video)
        t_read = time.perf_counter() - t0
        inputs = self.processor([question], [frames], [audio])
        config = _prune_config(prune)
        handle, scores, t_rel = None, None, 0.0
        if config is not None:
            if config.method == "omniselect" and self.relevance is not None:
                t1 = time.perf_counter()
                scores = self.relevance.score(frames, times, audio, self.processor.config.sample_rate, question)
                t_rel = time.perf_counter() - t1
            handle = apply_omniselect(self.thinker, config)
            handle.set_relevance(scores)
        calls: list[float] = []
        pre = self.thinker.register_forward_pre_hook(lambda *_: calls.append(time.perf_counter()))
        post = self.thinker.register_forward_hook(lambda *_: calls.append(time.perf_counter()))
        try:
            with torch.no_grad():
                out = self.thinker.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        finally:
            pre.remove()
            post.remove()
            stats = handle.pruner.last if handle is not None else {}
            if handle is not None:
                handle.remove()
        answer = self.processor.decode(out[0, inputs["input_ids"].shape[1]:])
        ids = inputs["input_ids"][0]
        tok = self.processor.tokenizer
        n_media = int(((ids == tok.convert_tokens_to_ids("<|VIDEO|>"))
                       | (ids == tok.convert_tokens_to_ids("<|AUDIO|>"))).sum())
        row = stats.get("rows", [{}])[0] if stats else {}
        grid = inputs["video_grid_thw"][0].tolist()
        m = self.processor.config.merge_size
        return UnderstandResult(
            answer=answer, question=question, regime=row.get("regime") if stats else None, has_audio=audio is not None,
            tokens_before=int(ids.numel()), tokens_after=int(stats.get("tokens_after", ids.numel())),
            media_tokens=n_media, media_kept=int(stats.get("media_kept", n_media)),
            video_kept_mask=row.get("video_kept_mask"), audio_kept_mask=row.get("audio_kept_mask"),
            video_grid=(grid[0], grid[1] // m, grid[2] // m),
            timings={"read_s": t_read, "relevance_s": t_rel,
                     "prefill_s": calls[1] - calls[0] if len(calls) > 1 else 0.0,
                     "decode_s": calls[-1] - calls[1] if len(calls) > 2 else 0.0,
                     "select_s": handle.pruner.select_seconds if handle is not None else 0.0},
            prune=None if config is None else dataclasses.asdict(config))

    def caption(self, video, prune=None) -> str:
        """A caption of the video in the text-to-video model's words (a prompt for ``kinegen generate``)."""
        return self.understand(video, CAPTION_QUESTION, prune=prune, max_new_tokens=32).answer


def _prune_config(prune):
    from ..accelerators.catalog import parse_spec
    from ..omniselect.config import OmniSelectConfig

    if prune is None or isinstance(prune, OmniSelectConfig):
        return prune
    _, config = parse_spec(prune, kind="prune")
    return config


def load_relevance(which: str | None):
    """``auto``, ``heuristic``, ``clip-clap:CLIP_DIR,CLAP_DIR``, a tri-modal scorer folder, or None -> an estimator
    (or None)."""
    from ..omniselect.relevance import HeuristicRelevance

    if which is None:
        return None
    if which == "heuristic":
        return HeuristicRelevance()
    if which.startswith("clip-clap:"):
        from ..omniselect.clip_clap import ClipClapRelevance

        folders = which.split(":", 1)[1].split(",")
        if len(folders) != 2:
            raise InvalidRequestError("--relevance clip-clap takes two folders: clip-clap:CLIP_DIR,CLAP_DIR.")
        return ClipClapRelevance.from_folders(*folders)
    if which == "auto":
        try:
            from ..omniselect.trimodal import load_bundled_scorer

            return load_bundled_scorer()
        except (ImportError, ModelNotFoundError):
            return HeuristicRelevance()
    from ..omniselect.trimodal import TriModalRelevance

    if not Path(which).is_dir():
        raise InvalidRequestError(f"--relevance {which}: give auto, heuristic, clip-clap:CLIP_DIR,CLAP_DIR, or a "
                                  "tri-modal scorer folder.")
    return TriModalRelevance.load(which)
