"""The Temporal Variation Map (TVMap): how much each block group's contribution changes per step.

``V[t, g] = ||r_g^t - r_g^{t-1}||_1 / ||h_g^t||_1`` where ``r_g^t`` is group ``g``'s residual
(its output minus its input, over every stream it updates) at step ``t`` and ``h_g^t`` its
output. Normalising by the residual stream rather than by the residual itself keeps the entries
of different groups in one unit (the error a reuse adds to the stream), which a *global* plan
over groups needs; docs/caching.md discusses the choice. ``V[0]`` has no previous step and is
set to ``V[1]``; planners always compute step 0.

Maps are stored on their own step grid and resampled to another step count along normalised
time, scaled by ``T_old / T_new`` (a per-step change shrinks with the step size).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np


@dataclasses.dataclass
class TVMap:
    """A ``[steps, groups]`` map with the group names it refers to."""

    values: np.ndarray
    groups: list[str]

    def __post_init__(self):
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.values.ndim != 2 or self.values.shape[1] != len(self.groups):
            raise ValueError(f"TVMap values must be [steps, {len(self.groups)}], got {self.values.shape}")

    @property
    def steps(self) -> int:
        return self.values.shape[0]

    def resample(self, steps: int) -> TVMap:
        return TVMap(resample(self.values, steps), list(self.groups))

    def to_dict(self) -> dict:
        return {"values": self.values.tolist(), "groups": list(self.groups)}

    @classmethod
    def from_dict(cls, d: dict) -> TVMap:
        return cls(np.asarray(d["values"]), list(d["groups"]))


def resample(values: np.ndarray, steps: int) -> np.ndarray:
    """Linear interpolation of a ``[T, G]`` map onto ``steps`` points of normalised time, rescaled."""
    values = np.asarray(values, dtype=np.float64)
    t_old = values.shape[0]
    if t_old == steps:
        return values.copy()
    x_old = np.linspace(0.0, 1.0, t_old)
    x_new = np.linspace(0.0, 1.0, steps)
    out = np.stack([np.interp(x_new, x_old, values[:, g]) for g in range(values.shape[1])], axis=1)
    return out * (t_old - 1) / max(1, steps - 1)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two maps over all cells (steps >= 1; step 0 is never planned)."""
    a = np.asarray(a, dtype=np.float64)[1:].ravel()
    b = np.asarray(b, dtype=np.float64)[1:].ravel()
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / den) if den > 0 else 0.0


def load_maps(path: str | os.PathLike) -> list[dict]:
    """Recorded maps, one JSON object per line (as ``kinegen calibrate`` writes them)."""
    from ..errors import ConfigError

    if not Path(path).is_file():
        raise ConfigError(f"{path} does not exist; give the maps.jsonl an earlier `kinegen calibrate` wrote.")
    records = []
    with open(path, errors="replace") as f:
        for i, line in enumerate(f, 1):
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {i} is not a JSON map record ({e}); give the maps.jsonl an "
                                  "earlier `kinegen calibrate` wrote.") from None
            if record is not None:
                records.append(record)
    return records
