"""The GAN evaluation classifier: a small CNN whose penultimate features the GAN metrics compare.

Trained on held-out procedural images (``kinegen train gan-classifier``,
:mod:`kinegen.training.gan_classifier`); read by :mod:`kinegen.evaluation.gan_metrics`.
"""

from __future__ import annotations

import torch
from torch import nn


class FeatureClassifier(nn.Module):
    """A small CNN: three stride-2 stages, global pooling, a ``features``-wide penultimate layer."""

    def __init__(self, num_classes: int, width: int = 32, features: int = 128):
        super().__init__()

        def stage(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1, stride=2), nn.GroupNorm(8, cout), nn.SiLU())

        self.body = nn.Sequential(stage(3, width), stage(width, 2 * width), stage(2 * width, 4 * width))
        self.proj = nn.Linear(4 * width, features)
        self.head = nn.Linear(features, num_classes)
        self.num_features = features

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: images in [-1, 1], ``[N, 3, H, W]``."""
        return torch.nn.functional.silu(self.proj(self.body(x).mean((2, 3))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
