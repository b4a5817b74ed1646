"""``kinegen-shapes-omni``: a small Qwen2.5-Omni thinker trained here, and the processor that feeds it.

The network is transformers' own ``Qwen2_5OmniThinkerForConditionalGeneration`` (its vision and audio encoders, its
TMRoPE language model) at a small size; only the tokenizer (word-level, over the procedural questions' words) and the
sizes are ours. :class:`OmniProcessor` lays a clip and a question out exactly as ``Qwen2_5OmniProcessor`` does with
``load_audio_from_video=True`` (frames in 2-frame temporal patches, 25 audio tokens per second, video and audio
interleaved in 2-second chunks between ``<|vision_bos|><|audio_bos|>`` and ``<|audio_eos|><|vision_eos|>``, a chat
turn around it), without the torchvision-based video processor: frames are resized and patchified here in the
flat order of Qwen2-VL's image processor.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import InvalidRequestError

SPECIAL_TOKENS = ("<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>",
                  "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>", "<|vision_eos|>")
CHAT_WORDS = ("user", "assistant", "\n")
WORD_PATTERN = r"<\|[A-Za-z_]+\|>|<pad>|<unk>|[a-z]+|[0-9]+|[?.,!']|\n"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2-VL's image normalisation (OpenAI CLIP)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PROCESSOR_FILE = "kinegen_omni_processor.json"


def build_word_tokenizer(words: list[str]):
    """A word-level tokenizer over ``words`` plus the Qwen-Omni special tokens (unknown words become ``<unk>``)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *CHAT_WORDS, *words]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated")
    return _wrap_word_tokenizer(tok)


def _wrap_word_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
        additional_special_tokens=list(SPECIAL_TOKENS[2:]))


def shapes_omni_config(vocab_size: int, tokenizer=None):
    """The thinker's configuration: 4-layer vision encoder (patch 4, 2x2 merge: 8 pixels per token), 3-layer audio
    encoder (32 mel bins), 4-layer language model of width 128; special token ids from ``tokenizer``."""
    from transformers import Qwen2_5OmniThinkerConfig

    ids = {}
    if tokenizer is not None:
        t = tokenizer.convert_tokens_to_ids
        ids = dict(audio_token_index=t("<|AUDIO|>"), image_token_index=t("<|IMAGE|>"), video_token_index=t("<|VIDEO|>"),
                   audio_start_token_id=t("<|audio_bos|>"), audio_end_token_id=t("<|audio_eos|>"),
                   vision_start_token_id=t("<|vision_bos|>"), vision_end_token_id=t("<|vision_eos|>"))
    return Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=32, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=256,
                          d_model=96, output_dim=128, n_window=100, max_source_positions=1500),
        vision_config=dict(depth=4, hidden_size=96, intermediate_size=256, num_heads=4, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=32, out_hidden_size=128,
                           fullatt_block_indexes=[1, 3]),
        text_config=dict(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}),
        position_id_per_seconds=25, seconds_per_chunk=2, **ids)


@dataclasses.dataclass
class OmniProcessorConfig:
    """How clips become tensors: the frame size and patching of the vision encoder, the mel bins of the audio one."""

    frame_size: int = 64
    patch_size: int = 4
    merge_size: int = 2
    temporal_patch_size: int = 2
    fps: float = 2.0
    n_mels: int = 32
    sample_rate: int = 16000
    position_id_per_seconds: int = 25
    seconds_per_chunk: float = 2.0
    max_question_tokens: int = 40


class OmniProcessor:
    """Questions and clips (frames with their sound) -> the thinker's keyword arguments, Qwen2.5-Omni's layout."""

    def __init__(self, tokenizer, config: OmniProcessorConfig | None = None):
        from transformers import WhisperFeatureExtractor

        self.tokenizer = tokenizer
        self.config = config or OmniProcessorConfig()
        self.feature_extractor = WhisperFeatureExtractor(feature_size=self.config.n_mels,
                                                         sampling_rate=self.config.sample_rate)

    # ------------------------------------------------------------------ saving

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(folder))
        (folder / PROCESSOR_FILE).write_text(json.dumps(dataclasses.asdict(self.config), indent=1))

    @classmethod
    def load(cls, folder: str | Path) -> OmniProcessor:
        """The processor :meth:`save_pretrained` wrote (the word tokenizer rebuilt from its ``tokenizer.json``)."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        cfg = OmniProcessorConfig(**json.loads((folder / PROCESSOR_FILE).read_text()))
        return cls(_wrap_word_tokenizer(Tokenizer.from_file(str(folder / "tokenizer.json"))), cfg)

    # ------------------------------------------------------------------ media

    def video_patches(self, frames: np.ndarray) -> tuple[torch.Tensor, list[int]]:
        """uint8 ``[N, H, W, 3]`` -> flat patches ``[t * h * w, 3 * T * p * p]`` and the grid ``[t, h, w]``."""
        import cv2

        c = self.config
        f = np.asarray(frames)
        if f.ndim != 4 or f.shape[-1] != 3:
            raise InvalidRequestError(f"frames must be [N, H, W, 3]; got {f.shape}")
        if len(f) % c.temporal_patch_size:  # the processor pads with the last frame
            f = np.concatenate([f, np.repeat(f[-1:], c.temporal_patch_size - len(f) % c.temporal_patch_size, 0)])
        s = c.frame_size
        if f.shape[1:3] != (s, s):
            f = np.stack([cv2.resize(x, (s, s), interpolation=cv2.INTER_AREA) for x in f])
        x = (f.astype(np.float32) / 255.0 - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)
        x = x.transpose(0, 3, 1, 2)  # [N, C, H, W]
        p, m, tp = c.patch_size, c.merge_size, c.temporal_patch_size
        gt, gh, gw = len(x) // tp, s // p, s // p
        x = x.reshape(gt, tp, 3, gh // m, m, p, gw // m, m, p)
        # (t, gh/m, gw/m, m, m, C, T, p, p): the flat order of Qwen2-VL's processors
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return torch.from_numpy(np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * tp * p * p))), [gt, gh, gw]

    def audio_token_count(self, n_mel_frames: int) -> int:
        after_conv = (n_mel_frames - 1) // 2 + 1
        return (after_conv - 2) // 2 + 1

    def media_text(self, grid: list[int], n_audio: int | None) -> str:
        """The placeholder tokens of one clip: video and audio interleaved in chunks (no audio: video alone)."""
        c = self.config
        per_grid = grid[1] * grid[2] // c.merge_size ** 2
        if n_audio is None:
            return "<|vision_bos|>" + "<|VIDEO|>" * (grid[0] * per_grid) + "<|vision_eos|>"
        ids_per_chunk = int(c.position_id_per_seconds * c.seconds_per_chunk)
        grid_t = (np.arange(grid[0]) * (c.temporal_patch_size / c.fps) * c.position_id_per_seconds).astype(int)
        audio_t = np.arange(n_audio)
        chunks = max(int(grid_t.max()) // ids_per_chunk if len(grid_t) else 0,
                     (n_audio - 1) // ids_per_chunk if n_audio else 0) + 1
        parts = ["<|vision_bos|><|audio_bos|>"]
        for k in range(chunks):
            nv = int(((grid_t // ids_per_chunk) == k).sum()) * per_grid
            na = int(((audio_t // ids_per_chunk) == k).sum())
            parts.append("<|VIDEO|>" * nv + "<|AUDIO|>" * na)
        parts.append("<|audio_eos|><|vision_eos|>")
        return "".join(parts)

    # ------------------------------------------------------------------ the call

    def prompt(self, media: str, question: str) -> str:
        return f"<|im_start|>user\n{media}{question}<|im_end|>\n<|im_start|>assistant\n"

    def check_question(self, question: str) -> None:
        n = len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        if not question.strip():
            raise InvalidRequestError("The question is empty.")
        if n > self.config.max_question_tokens:
            raise InvalidRequestError(f"The question is {n} tokens long; this model takes at most "
                                      f"{self.config.max_question_tokens}. Ask a shorter question.")

    def __call__(self, questions: list[str], frames: list[np.ndarray], audio: list[np.ndarray | None],
                 answers: list[str] | None = None) -> dict:
        """One batch (left-padded). With ``answers``, the answer and ``<|im_end|>`` follow each prompt and
        ``labels`` mark them (everything else is -100)."""
        if not (len(questions) == len(frames) == len(audio)):
            raise ValueError("questions, frames and audio must have the same length")
        with_audio = [a is not None and len(a) > 0 for a in audio]
        if any(with_audio) and not all(with_audio):
            raise InvalidRequestError("A batch mixes clips with and without sound; send them in separate batches.")
        patches, grids, texts = [], [], []
        feats = None
        if all(with_audio):
            feats = self.feature_extractor([np.asarray(a, np.float32) for a in audio],
                                           sampling_rate=self.config.sample_rate, return_attention_mask=True,
                                           padding="longest", return_tensors="pt")
        for i, (q, f) in enumerate(zip(questions, frames, strict=True)):
            self.check_question(q)
            p, g = self.video_patches(f)
            patches.append(p)
            grids.append(g)
            n_audio = self.audio_token_count(int(feats["attention_mask"][i].sum())) if feats is not None else None
            texts.append(self.prompt(self.media_text(g, n_audio), q))
        ids, labels = [], []
        for i, t in enumerate(texts):
            prompt_ids = self.tokenizer(t, add_special_tokens=False)["input_ids"]
            if answers is None:
                ids.append(prompt_ids)
                continue
            ans = self.tokenizer(answers[i] + "<|im_end|>", add_special_tokens=False)["input_ids"]
            ids.append(prompt_ids + ans)
            labels.append([-100] * len(prompt_ids) + ans)
        L = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        out = {
            "input_ids": torch.tensor([[pad] * (L - len(x)) + x for x in ids]),
            "attention_mask": torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in ids]),
            "pixel_values_videos": torch.cat(patches),
            "video_grid_thw": torch.tensor(grids),
            "video_second_per_grid": torch.full((len(grids),), self.config.temporal_patch_size / self.config.fps),
            "use_audio_in_video": feats is not None,
        }
        if feats is not None:
            out["input_features"] = feats["input_features"]
            out["feature_attention_mask"] = feats["attention_mask"]
        if answers is not None:
            out["labels"] = torch.tensor([[-100] * (L - len(x)) + x for x in labels])
        return out

    def decode(self, ids) -> str:
        """Generated ids -> text (stops at ``<|im_end|>``; punctuation joined to the word before it).

        The word tokenizer's pre-tokenizer keeps the spaces between words as pieces of their own, which become
        ``<unk>`` in training and generation alike; they are dropped here."""
        toks = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        words = []
        for t in toks:
            if t in ("<|im_end|>", "<pad>"):
                break
            if t != "<unk>":
                words.append(t)
        return re.sub(r" ([?.,!])", r"\1", " ".join(words)).strip()
