"""Omni thinkers (transformers' Qwen2.5-Omni and Qwen3-Omni): where their media are merged and how their tokens
are laid out, for token pruning (``kinegen.omniselect``).

These are transformers models, not diffusers pipelines, so they have their own small adapter: a frozen dataclass
per family, found by the thinker's class name. The pruning point is the same in both (reference note section 4.3):
the input of ``thinker.model.language_model``, after the audio, image and video embeddings have been scattered into
the sequence and the 3D positions computed.
"""

from __future__ import annotations

import dataclasses

from ..errors import UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class OmniAdapter:
    """One omni family.

    Attributes:
        thinker_classes: class names of the thinker (the model that reads media and writes text).
        wrapper_classes: class names of full models whose ``.thinker`` is such a thinker.
        deepstack: the language model also takes ``visual_pos_masks`` and ``deepstack_visual_embeds`` (Qwen3-Omni),
            which must be cut like the sequence.
        audio_pool: audio encoder tokens averaged into one LLM token after the last layer (Qwen2.5-Omni's
            stride-2 pool; 1 = none).
    """

    name: str
    thinker_classes: tuple[str, ...]
    wrapper_classes: tuple[str, ...]
    deepstack: bool = False
    audio_pool: int = 1

    def thinker(self, model):
        return model.thinker if type(model).__name__ in self.wrapper_classes else model

    def language_model(self, thinker):
        return thinker.model.language_model

    def audio_attention(self, thinker):
        """The self-attention of the audio encoder's last layer (whose received attention ranks audio tokens)."""
        return thinker.model.audio_tower.layers[-1].self_attn

    def token_ids(self, thinker) -> dict[str, int]:
        c = thinker.config
        return {"video": c.video_token_id, "audio": c.audio_token_id, "image": c.image_token_id}

    def ids_per_second(self, thinker) -> float:
        return float(thinker.config.position_id_per_seconds)

    def pooled_audio_lengths(self, feature_lengths):
        """Encoder tokens before the pool, per audio item, from mel lengths (two stride-2 convolutions)."""
        return (feature_lengths - 1) // 2 + 1


QWEN2_5_OMNI = OmniAdapter("qwen2_5_omni", ("Qwen2_5OmniThinkerForConditionalGeneration",),
                           ("Qwen2_5OmniForConditionalGeneration",), deepstack=False, audio_pool=2)
QWEN3_OMNI = OmniAdapter("qwen3_omni_moe", ("Qwen3OmniMoeThinkerForConditionalGeneration",),
                         ("Qwen3OmniMoeForConditionalGeneration",), deepstack=True, audio_pool=1)
OMNI_ADAPTERS = {a.name: a for a in (QWEN2_5_OMNI, QWEN3_OMNI)}


def get_omni_adapter(model) -> OmniAdapter:
    """The family of a thinker, a full omni model, or anything with such a ``.thinker``; the error lists them."""
    inner = getattr(model, "thinker", model)
    for name in {type(model).__name__, type(inner).__name__}:
        for a in OMNI_ADAPTERS.values():
            if name in a.thinker_classes or name in a.wrapper_classes:
                return a
    known = ", ".join(c for a in OMNI_ADAPTERS.values() for c in a.thinker_classes)
    raise UnsupportedModelError(f"{type(model).__name__} has no known point where media are merged before its "
                                f"language model, so its audio and video tokens cannot be pruned. Supported thinkers: "
                                f"{known} (or a model whose .thinker is one).")
