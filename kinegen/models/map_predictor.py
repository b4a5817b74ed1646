"""The Map Predictor of Map-Guided Caching: a TVMap from what is known before denoising starts.

Inputs (one feature vector per run, built by :func:`features_of_call` from the first transformer
call, see the "input features" section below): the prompt embedding (mean of the text encoder's
non-padding tokens), the initial noise (per-channel mean and standard deviation of the
transformer's first input, which for FLUX Kontext includes the reference latent), and four
scalars: log frames, log tokens per frame, steps / 50 and guidance / 10.

Output: ``log V`` on a fixed grid of ``steps_ref`` points of normalised time by ``groups``,
as a learned average map plus a rank-``r`` correction ``U(x) W``: per-run temporal coefficients
``U(x)`` from an MLP on the features, over a learned basis ``W`` of group patterns (the low-rank
head of docs/caching.md); the run's map is resampled from it to the run's step count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError

NUM_SCALARS = 4


@dataclasses.dataclass
class MapPredictorConfig:
    """Shape of the network and what it was trained for (checked before use)."""

    text_dim: int
    latent_channels: int
    groups: int
    steps_ref: int = 32
    hidden: int = 128
    rank: int = 4
    # what the predictor belongs to
    model_key: str = ""
    transformer_class: str = ""
    group_names: list[str] = dataclasses.field(default_factory=list)
    group_size: int = 1
    trained_sizes: list[list[int]] = dataclasses.field(default_factory=list)  # [frames, height, width]
    trained_steps: list[int] = dataclasses.field(default_factory=list)
    # guidance scales of the calibration runs; empty = not recorded (no check). Outside their range the
    # predicted maps do not hold (benchmarks/caching.md: at guidance 6 the shipped predictor, calibrated at 4,
    # predicted two thirds of the true drift), so map=auto records the map instead.
    trained_guidance: list[float] = dataclasses.field(default_factory=list)
    metrics: dict = dataclasses.field(default_factory=dict)
    # how much an error made at each step moves the final output, per unit of map drift, on normalised
    # time (kinegen.training.calibrate.measure_sensitivity); empty when not measured
    sensitivity: list[float] = dataclasses.field(default_factory=list)
    # a few weights of the transformer it was calibrated on (weights_fingerprint); empty = not recorded
    transformer_fingerprint: list[float] = dataclasses.field(default_factory=list)

    @property
    def feature_dim(self) -> int:
        return self.text_dim + 2 * self.latent_channels + NUM_SCALARS


# ---------------------------------------------------------------------------- input features


@dataclasses.dataclass(frozen=True)
class RunFeatures:
    """The predictor's input for one run, with the token grid and text width it was built from."""

    vector: torch.Tensor  # [feature_dim], on the CPU
    grid: tuple[int, int, int]  # (frames, height, width) in tokens
    text_dim: int


def mean_text_embedding(enc: torch.Tensor | None) -> torch.Tensor:
    """Mean over non-padding tokens (zero rows are padding in Wan) and over the batch."""
    if enc is None:
        raise ConfigError("mapguided: the transformer call has no encoder_hidden_states to predict a map from.")
    enc = enc.detach().float()
    if enc.ndim == 2:
        enc = enc[None]
    keep = (enc.abs().sum(-1, keepdim=True) > 0).float()
    return ((enc * keep).sum(1) / keep.sum(1).clamp_min(1.0)).mean(0)


def latent_channel_stats(latents: torch.Tensor, latent_format: str) -> torch.Tensor:
    """Per-channel mean and std of the first transformer input, averaged over the batch."""
    x = latents.detach().float()
    cdim = {"BCFHW": 1, "BFCHW": 2, "BNC": 2}[latent_format]
    x = x.movedim(cdim, -1).reshape(x.shape[0], -1, x.shape[cdim])
    return torch.cat([x.mean(1).mean(0), x.std(1).mean(0)])


def run_features(grid: tuple[int, int, int], steps: int, guidance: float, text: torch.Tensor,
                 latent_stats: torch.Tensor) -> torch.Tensor:
    """The input vector: text embedding, latent statistics, then the ``NUM_SCALARS`` scalars."""
    f, h, w = grid
    scalars = torch.tensor([math.log1p(f), math.log1p(h * w), steps / 50.0, guidance / 10.0])
    return torch.cat([text.cpu(), latent_stats.cpu(), scalars]).float()


def features_of_call(adapter, transformer: nn.Module, call: dict, steps: int,
                     guidance_scale: float | None) -> RunFeatures:
    """The predictor's input from the first transformer call of a run.

    ``call`` holds the call's arguments by name (``hidden_states``, ``encoder_hidden_states``, ...);
    ``adapter`` is the model family's :class:`kinegen.adapters.ModelAdapter` (token grid, latent
    layout). A run without guidance counts as guidance 1.
    """
    grid = tuple(int(x) for x in adapter.token_layout(transformer, call).grid)
    text = mean_text_embedding(call.get("encoder_hidden_states"))
    stats = latent_channel_stats(call["hidden_states"], adapter.latent_format)
    guidance = float(guidance_scale if guidance_scale is not None else 1.0)
    return RunFeatures(run_features(grid, steps, guidance, text, stats), grid, int(text.numel()))


# ---------------------------------------------------------------------------- the predictor


def weights_fingerprint(module: nn.Module, n: int = 256) -> list[float]:
    """One weight from each of up to ``n`` parameter tensors (evenly spaced in name order; the middle
    element of each): enough to tell a retrained or fine-tuned transformer from the one a predictor
    was calibrated on, and the same whether the weights were loaded in fp32, bf16 or fp16."""
    named = sorted(module.named_parameters(), key=lambda kv: kv[0])
    if not named:
        return []
    picks = [named[round(i * (len(named) - 1) / max(1, n - 1))] for i in range(min(n, len(named)))]
    return [float(p.detach().reshape(-1)[p.numel() // 2]) for _, p in picks]


def fingerprints_match(a: list[float], b: list[float]) -> bool:
    """Equal up to half-precision rounding (relative 1e-2)."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-2 * max(abs(x), abs(y)) + 1e-6 for x, y in zip(a, b, strict=True))


class MapPredictor(nn.Module):
    """``log V_hat[b, s, g] = M[s, g] + sum_r U[b, s, r] W[r, g]`` with ``U = MLP(features)``.

    The MLP's last layer starts at zero (the prediction starts at the average map) while ``W`` starts
    random, so the correction receives gradient from the first step (two zero factors would not).
    """

    def __init__(self, config: MapPredictorConfig):
        super().__init__()
        self.config = config
        c = config
        self.register_buffer("feature_mean", torch.zeros(c.feature_dim))
        self.register_buffer("feature_std", torch.ones(c.feature_dim))
        self.mean_log_map = nn.Parameter(torch.zeros(c.steps_ref, c.groups))
        self.net = nn.Sequential(
            nn.Linear(c.feature_dim, c.hidden), nn.SiLU(),
            nn.Linear(c.hidden, c.hidden), nn.SiLU(),
            nn.Linear(c.hidden, c.rank * c.steps_ref),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.group_basis = nn.Parameter(torch.randn(c.rank, c.groups) / math.sqrt(c.rank))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = ((features - self.feature_mean) / self.feature_std).clamp(-5.0, 5.0)
        u = self.net(x).view(-1, c.steps_ref, c.rank)
        return self.mean_log_map + u @ self.group_basis

    # -- files ----------------------------------------------------------------------

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``folder`` (atomically, file by file)."""
        from safetensors.torch import save_file

        from ..media import atomic_path, atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / "model.safetensors") as tmp:
            save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(tmp))
        atomic_write_text(folder / "config.json", json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> MapPredictor:
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg_path, weights = folder / "config.json", folder / "model.safetensors"
        if not cfg_path.is_file() or not weights.is_file():
            raise ConfigError(f"{folder} is not a Map Predictor folder (needs config.json and model.safetensors); "
                              "train one with `kinegen calibrate --model M --prompts FILE`.")
        try:
            fields = {f.name for f in dataclasses.fields(MapPredictorConfig)}
            raw = json.loads(cfg_path.read_text())
            if not isinstance(raw, dict):
                raise ValueError("it must hold a JSON object")
            config = MapPredictorConfig(**{k: v for k, v in raw.items() if k in fields})
            model = cls(config)  # wrong-typed or negative sizes fail here
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(f"{cfg_path} is not a valid Map Predictor config: {e}. Recalibrate with "
                              "`kinegen calibrate --model M --prompts FILE`.") from None
        try:
            model.load_state_dict(load_file(str(weights)))
        except RuntimeError as e:
            raise ConfigError(f"{weights} does not match its config.json: {e}") from None
        return model.eval()
