"""Prompt adherence: does a generated video show the shape, colour and motion its prompt names?

Prompts are drawn from the procedural caption distribution (single shapes), from the training
combinations or from the held-out ones (``kinegen.data.shapes.is_held_out``). Each prompt is
generated (optionally with accelerators) and the adherence classifier reads the video; the
result is the accuracy per attribute. The classifier itself is checked on clean procedural
clips, so its own error rate is known next to the model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..data.shapes import COLOUR_NAMES, MOTIONS, SHAPES, recaption, sample_clip
from ..errors import ModelNotFoundError

ATTRIBUTES = ("shape", "colour", "motion")


def load_classifier(folder: str | Path | None = None):
    """The adherence classifier shipped in assets/ (or from ``folder``)."""
    from safetensors.torch import load_file

    from ..loading import ASSETS_DIR
    from ..models.adherence import AdherenceClassifier

    folder = Path(folder) if folder else ASSETS_DIR / "models" / "adherence-classifier"
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelNotFoundError(f"No adherence classifier at {weights}. Train one with "
                                 "`kinegen train adherence --export assets/models/adherence-classifier`.")
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    model = AdherenceClassifier(**{k: config[k] for k in ("width",) if k in config})  # else its default
    model.load_state_dict(load_file(str(weights)))
    return model.eval()


@torch.no_grad()
def classify(classifier, frames: np.ndarray) -> dict[str, str]:
    """Predicted attributes of one video ``[F, H, W, 3]`` (float in [0, 1] or uint8)."""
    from ..models.adherence import downsample_frames, prepare

    x = torch.from_numpy(np.asarray(frames))
    if x.dtype != torch.uint8:
        x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    logits = classifier(prepare(downsample_frames(x[None])))
    names = {"shape": SHAPES, "colour": COLOUR_NAMES, "motion": MOTIONS}
    return {k: names[k][int(logits[k].argmax(1))] for k in ATTRIBUTES}


def adherence_prompts(n: int, split: str, seed: int = 0) -> list[tuple[str, dict[str, str]]]:
    """``n`` (prompt, true attributes) pairs of single shapes from ``split`` (``train`` or ``held_out``)."""
    out = []
    for i in range(n):
        spec = sample_clip(seed * 1_000_003 + 7_000_000 + i, split=split, num_objects=1)
        o = spec.primary
        out.append((recaption(spec, seed=i), {"shape": o.shape, "colour": o.colour, "motion": o.motion}))
    return out


def evaluate_adherence(pipe, n_prompts: int = 100, split: str = "train", seed: int = 0, classifier=None,
                       accelerators=(), progress=None, **request_fields) -> dict:
    """Generate ``n_prompts`` prompts of ``split`` and report per-attribute accuracy.

    Returns ``{"accuracy": {attr: float}, "n": int, "split": str, "records": [...]}``; each record has the
    prompt, the truth, the prediction and the seed used.
    """
    from ..generation import generate

    classifier = classifier or load_classifier()
    records = []
    for i, (prompt, truth) in enumerate(adherence_prompts(n_prompts, split, seed)):
        result = generate(pipe, prompt, seed=seed * 10_000 + i, accelerators=accelerators, **request_fields)
        pred = classify(classifier, result.frames)
        records.append({"prompt": prompt, "truth": truth, "prediction": pred, "seed": seed * 10_000 + i})
        if progress is not None:
            progress(i + 1, n_prompts)
    acc = {k: float(np.mean([r["truth"][k] == r["prediction"][k] for r in records])) for k in ATTRIBUTES}
    return {"split": split, "n": n_prompts, "accuracy": acc, "records": records}
