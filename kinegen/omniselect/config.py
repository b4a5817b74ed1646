"""OmniSelect's settings: one dataclass, validated when built (``--prune omniselect:key=value,...``).

The reading of the method they follow is ../shared/reference/omniselect.md, section 2, and docs/omniselect.md.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

METHODS = ("omniselect", "uniform", "random", "video-only", "audio-only")
"""How the kept tokens are chosen. ``omniselect``: the regime from cross-modal relevance, per-time-group budgets
from the dominant modality's relevance, distinctive video tokens and most-attended audio tokens in each group
(section 2). The rest are the peers it is measured against at the same token budget: ``uniform`` (the same share of
every group of both modalities, evenly strided), ``random`` (a seeded random share of all audio and video tokens),
``video-only`` / ``audio-only`` (only that modality is pruned, as far as the budget needs; the other is kept whole)."""

AUDIO_SELECTIONS = ("attention", "distinct")
"""Which audio tokens of a group stay: those receiving the most ``attention`` in the audio encoder's last layer (the
paper's rule), or the most ``distinct`` ones by embedding similarity (the video rule, for encoders we cannot hook)."""


@dataclasses.dataclass
class OmniSelectConfig:
    """Modality-adaptive pruning of the audio and video tokens of an omni thinker's prefill (docs/omniselect.md).

    Attributes:
        keep: share of the audio and video tokens kept, in (0, 1]; text and special tokens are never pruned.
            1.0 keeps everything (the unpruned model, exactly).
        method: ``omniselect`` or a peer at the same budget (:data:`METHODS`).
        theta: regime margin (section 2, step 2): when the mean video and audio relevance logits differ by at most
            ``theta`` the regime is ``uniform``; otherwise the higher one is dominant. The paper's scripts use 2.
        group_seconds: length of a time group; Qwen2.5-Omni interleaves 2-second chunks, and a group is the video and
            audio tokens of one such chunk (Qwen3-Omni interleaves per token: groups are then time windows).
        iterations: refinement rounds of the budget allocation (step 4: rescale to the target, clamp to [0, 1]).
        minor_keep: share kept of the non-dominant modality (None: ``keep``).
        audio_select: :data:`AUDIO_SELECTIONS`.
        seed: seed of ``method=random``.
    """

    keep: float = 0.3
    method: str = "omniselect"
    theta: float = 2.0
    group_seconds: float = 2.0
    iterations: int = 5
    minor_keep: float | None = None
    audio_select: str = "attention"
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.keep <= 1.0:
            raise ConfigError(f"keep must be in (0, 1] (the share of audio and video tokens kept); got {self.keep}.")
        if self.minor_keep is not None and not 0.0 < self.minor_keep <= 1.0:
            raise ConfigError(f"minor_keep must be in (0, 1] or None; got {self.minor_keep}.")
        if self.method not in METHODS:
            raise ConfigError(f"Unknown method {self.method!r}; valid: {', '.join(METHODS)}.")
        if self.audio_select not in AUDIO_SELECTIONS:
            raise ConfigError(f"Unknown audio_select {self.audio_select!r}; valid: {', '.join(AUDIO_SELECTIONS)}.")
        if self.theta < 0:
            raise ConfigError(f"theta must be >= 0 (a margin in relevance logits); got {self.theta}.")
        if self.group_seconds <= 0:
            raise ConfigError(f"group_seconds must be > 0; got {self.group_seconds}.")
        if self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1; got {self.iterations}.")
