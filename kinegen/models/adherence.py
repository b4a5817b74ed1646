"""The prompt-adherence classifier: which shape, colour and motion a video shows.

A small 3D CNN over 17 frames at 64x64 with one head per attribute. It is trained on procedural
clips (``kinegen train adherence``) with blur, noise and colour jitter so that it also reads
generated videos, and it is how Kinegen measures whether a (possibly accelerated) generation
follows its prompt: ``kinegen eval adherence``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.shapes import COLOUR_NAMES, MOTIONS, SHAPES

HEADS = {"shape": SHAPES, "colour": COLOUR_NAMES, "motion": MOTIONS}
INPUT_FRAMES, INPUT_SIZE = 17, 64


def _block(cin: int, cout: int, stride) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class AdherenceClassifier(nn.Module):
    """``forward(video)`` with video ``[B, 3, 17, 64, 64]`` in [-1, 1] -> ``{head: logits}``."""

    def __init__(self, width: int = 32):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv3d(3, w, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2)), nn.SiLU())
        self.body = nn.Sequential(_block(w, w, (1, 2, 2)), _block(w, 2 * w, (2, 2, 2)), _block(2 * w, 2 * w, 1),
                                  _block(2 * w, 4 * w, (2, 2, 2)), _block(4 * w, 4 * w, (2, 2, 2)))
        self.heads = nn.ModuleDict({k: nn.Linear(8 * w, len(v)) for k, v in HEADS.items()})

    def forward(self, video: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(self.stem(video))
        # Mean and max pooling: the shape covers a small part of the frame, and averaging alone dilutes it.
        h = torch.cat([h.mean(dim=(2, 3, 4)), h.amax(dim=(2, 3, 4))], dim=1)
        return {k: head(h) for k, head in self.heads.items()}


def prepare(frames: torch.Tensor) -> torch.Tensor:
    """Frames ``[B, F, H, W, 3]`` (uint8 or float in [0, 1]) -> classifier input ``[B, 3, 17, 64, 64]``.

    Time is resampled to 17 frames and space to 64x64 (area averaging), so videos of any length and
    size can be classified.
    """
    x = frames.float()
    if frames.dtype == torch.uint8:
        x = x / 255.0
    x = x.permute(0, 4, 1, 2, 3)  # B, 3, F, H, W
    x = F.interpolate(x, size=(INPUT_FRAMES, INPUT_SIZE, INPUT_SIZE), mode="trilinear", align_corners=False,
                      antialias=False) if x.shape[2:] != (INPUT_FRAMES, INPUT_SIZE, INPUT_SIZE) else x
    return x * 2.0 - 1.0


def downsample_frames(frames: torch.Tensor) -> torch.Tensor:
    """Area-downsample ``[B, F, H, W, 3]`` spatially to 64x64 before :func:`prepare` (keeps thin shapes)."""
    b, f, h, w, c = frames.shape
    if (h, w) == (INPUT_SIZE, INPUT_SIZE):
        return frames
    x = frames.float().reshape(b * f, h, w, c).permute(0, 3, 1, 2)
    x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="area")
    out = x.permute(0, 2, 3, 1).reshape(b, f, INPUT_SIZE, INPUT_SIZE, c)
    return out.round().clamp(0, 255).to(torch.uint8) if frames.dtype == torch.uint8 else out
