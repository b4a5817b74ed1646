"""Relevance from local CLIP and CLAP folders (reference note, section 5: "CLAP + CLIP").

CLIP scores frames against ``"a photo of a {word}"`` and CLAP scores audio segments against ``"the sound of a
{word}"``, one word of the question at a time. The two models have separate embedding spaces whose logit scales do
not compare, so each similarity is standardised against the same model's similarities to a fixed list of reference
words: a score is how many standard deviations the question's word matches the frame (or the sound) better than
words in general. In those units frames and sounds compare; OmniSelect's ``theta`` is then a margin in standard
deviations (around 0.5, not the 2 logits of a shared space).

Both folders are ``save_pretrained`` folders (model, tokenizer, and CLIP's image processor or CLAP's feature
extractor) read with ``local_files_only``: no download.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from .relevance import RelevanceScores, question_keywords

REFERENCE_WORDS = ("thing", "object", "person", "car", "tree", "house", "water", "music", "voice", "noise", "wind",
                   "animal", "food", "road", "sky", "room", "light", "metal", "paper", "machine", "crowd", "door",
                   "table", "phone", "bird", "engine", "rain", "street", "window", "ball")


def _features(out) -> torch.Tensor:
    x = getattr(out, "pooler_output", out)
    return torch.nn.functional.normalize(x.float(), dim=-1)


class ClipClapRelevance:
    name = "clip+clap"

    def __init__(self, clip, clip_tokenizer, image_processor, clap, clap_tokenizer, clap_features):
        self.clip, self.clip_tokenizer, self.image_processor = clip.eval(), clip_tokenizer, image_processor
        self.clap, self.clap_tokenizer, self.clap_features = clap.eval(), clap_tokenizer, clap_features

    @classmethod
    def from_folders(cls, clip_dir: str | Path, clap_dir: str | Path) -> ClipClapRelevance:
        from transformers import AutoFeatureExtractor, AutoTokenizer, ClapModel, CLIPModel
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        from ..errors import ModelNotFoundError

        for d in (clip_dir, clap_dir):
            if not (Path(d) / "config.json").is_file():
                raise ModelNotFoundError(f"{d} is not a saved model folder (no config.json); give local CLIP and CLAP "
                                         "folders (save_pretrained of the model, its tokenizer and processor).")
        kw = {"local_files_only": True}  # tokenizers and processors hold no weights; models load safetensors only
        return cls(CLIPModel.from_pretrained(str(clip_dir), use_safetensors=True, **kw),
                   AutoTokenizer.from_pretrained(str(clip_dir), use_safetensors=True, **kw),
                   CLIPImageProcessorPil.from_pretrained(str(clip_dir), use_safetensors=True, **kw),
                   ClapModel.from_pretrained(str(clap_dir), use_safetensors=True, **kw),
                   AutoTokenizer.from_pretrained(str(clap_dir), use_safetensors=True, **kw),
                   AutoFeatureExtractor.from_pretrained(str(clap_dir), use_safetensors=True, **kw))

    def _text(self, model, tokenizer, texts: list[str]) -> torch.Tensor:
        t = tokenizer(texts, padding=True, return_tensors="pt")
        t = {k: v for k, v in t.items() if k in ("input_ids", "attention_mask")}
        return _features(model.get_text_features(**t))

    @staticmethod
    def _standardise(items: torch.Tensor, words: torch.Tensor, k: int) -> torch.Tensor:
        """Mean over the ``k`` question words of (similarity - reference mean) / reference std, per item."""
        sims = items @ words.T
        ref = sims[:, k:]
        z = (sims[:, :k] - ref.mean(1, keepdim=True)) / ref.std(1, keepdim=True).clamp_min(1e-6)
        return z.mean(1).double()

    @torch.no_grad()
    def score(self, frames: np.ndarray, frame_times: np.ndarray, audio: np.ndarray | None, sample_rate: int,
              question: str = "") -> RelevanceScores:
        t0 = time.perf_counter()
        words = question_keywords(question)
        k = max(len(words), 1)
        query = words or ["thing"]
        pix = self.image_processor(list(np.asarray(frames)), return_tensors="pt")["pixel_values"]
        img = _features(self.clip.get_image_features(pixel_values=pix))
        txt = self._text(self.clip, self.clip_tokenizer, [f"a photo of a {w}" for w in (*query, *REFERENCE_WORDS)])
        frame_scores = self._standardise(img, txt, k)
        audio_scores = audio_times = torch.zeros(0, dtype=torch.float64)
        if audio is not None and len(audio):
            from scipy.signal import resample_poly

            sr = int(self.clap_features.sampling_rate)
            wav = resample_poly(np.asarray(audio, np.float64), sr, sample_rate).astype(np.float32)
            segs = np.array_split(wav, len(frames))
            feats = self.clap_features(segs, sampling_rate=sr, return_tensors="pt")
            aud = _features(self.clap.get_audio_features(
                **{k_: v for k_, v in feats.items() if k_ in ("input_features", "is_longer")}))
            txt_a = self._text(self.clap, self.clap_tokenizer,
                               [f"the sound of a {w}" for w in (*query, *REFERENCE_WORDS)])
            audio_scores = self._standardise(aud, txt_a, k)
            seg = len(audio) / sample_rate / len(frames)
            audio_times = torch.from_numpy((np.arange(len(frames)) + 0.5) * seg)
        return RelevanceScores(torch.as_tensor(np.asarray(frame_times, np.float64)), frame_scores, audio_times,
                               audio_scores, has_query=bool(words), estimator=self.name,
                               seconds=time.perf_counter() - t0)
