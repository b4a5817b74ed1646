"""The prompt-adherence classifier: which shape, colour and motion a video shows.

A small (2+1)D CNN over 17 frames at 64x64 with one head per attribute. It is trained on procedural
clips (``kinegen train adherence``) with blur, noise and colour jitter so that it also reads
generated videos, and it is how Kinegen measures whether a (possibly accelerated) generation
follows its prompt: ``kinegen eval adherence``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.shapes import COLOUR_NAMES, MOTIONS, SHAPES

INPUT_FRAMES, INPUT_SIZE = 17, 64


def _conv2d(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU())


def _conv3d(cin: int, cout: int, stride) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride, 1), nn.GroupNorm(8, cout), nn.ReLU())


class AdherenceClassifier(nn.Module):
    """``forward(video)`` with video ``[B, 3, 17, 64, 64]`` in [-1, 1] -> ``{head: logits}``.

    A per-frame 2D CNN (64 -> 8 px feature maps) feeds two branches: *appearance* (spatial max, then
    temporal mean) for shape and colour, and *motion* (3D convolutions over the stack of feature maps)
    for motion. A plain 3D CNN with global pooling learned colour and motion but stayed at chance on
    shape: small shapes need the full-resolution 2D stem and max pooling.
    """

    def __init__(self, width: int = 16):
        super().__init__()
        w = width
        self.frames = nn.Sequential(_conv2d(3, w, 1), _conv2d(w, w, 2), _conv2d(w, 2 * w, 1), _conv2d(2 * w, 2 * w, 2),
                                    _conv2d(2 * w, 4 * w, 2))
        self.motion = nn.Sequential(_conv3d(4 * w, 2 * w, (1, 2, 2)), _conv3d(2 * w, 2 * w, (2, 1, 1)),
                                    _conv3d(2 * w, 2 * w, (2, 2, 2)))
        self.heads = nn.ModuleDict({"shape": nn.Linear(4 * w, len(SHAPES)),
                                    "colour": nn.Linear(4 * w, len(COLOUR_NAMES)),
                                    "motion": nn.Linear(4 * w, len(MOTIONS))})

    def forward(self, video: torch.Tensor) -> dict[str, torch.Tensor]:
        b, c, t, h, w = video.shape
        maps = self.frames(video.transpose(1, 2).reshape(b * t, c, h, w))  # [B*T, C', 8, 8]
        maps = maps.reshape(b, t, *maps.shape[1:])
        appearance = maps.amax(dim=(3, 4)).mean(dim=1)
        m = self.motion(maps.transpose(1, 2))
        motion = torch.cat([m.mean(dim=(2, 3, 4)), m.amax(dim=(2, 3, 4))], dim=1)
        return {"shape": self.heads["shape"](appearance), "colour": self.heads["colour"](appearance),
                "motion": self.heads["motion"](motion)}


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
