"""``kinegen train gan-classifier``: the GAN evaluation classifier, on held-out procedural images.

The images come from the held-out seed range of :mod:`kinegen.data.shape_images` (offset
``CLASSIFIER_SEEDS``), never from the GAN's training range nor from the metrics' reference images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..data.shape_images import CLASSIFIER_SEEDS, DEFAULT_CLASSES, HELD_OUT_SEED, batch, class_names
from ..models.gan_classifier import FeatureClassifier
from .configs import GANClassifierTrainConfig as _Defaults


def train_classifier(out_dir, steps: int = _Defaults.steps, batch_size: int = _Defaults.batch_size,
                     resolution: int = _Defaults.resolution, seed: int = _Defaults.seed, progress=None) -> dict:
    """Train :class:`FeatureClassifier` on held-out procedural images; save it; return its test accuracy.

    The settings are :class:`kinegen.training.configs.GANClassifierTrainConfig`'s fields.
    """
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    n_cls = len(DEFAULT_CLASSES)
    clf = FeatureClassifier(n_cls)
    opt = torch.optim.AdamW(clf.parameters(), lr=2e-3, weight_decay=1e-4)
    base = HELD_OUT_SEED + CLASSIFIER_SEEDS
    for step in range(steps):
        idx = np.arange(step * batch_size, (step + 1) * batch_size)
        labels = idx % n_cls
        x = torch.from_numpy(batch(base + idx, labels, resolution)).permute(0, 3, 1, 2).float() / 127.5 - 1
        for g in opt.param_groups:
            g["lr"] = 2e-3 * 0.5 * (1 + np.cos(np.pi * step / steps))
        loss = torch.nn.functional.cross_entropy(clf(x), torch.from_numpy(labels).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress and (step + 1) % 50 == 0:
            progress(step + 1, steps, float(loss))
    clf.eval()
    test_idx = np.arange(2048) + 500_000
    test_labels = test_idx % n_cls
    x = torch.from_numpy(batch(base + test_idx, test_labels, resolution)).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        acc = float((clf(x).argmax(1).numpy() == test_labels).mean())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in clf.state_dict().items()}, str(out / "model.safetensors"))
    meta = {"num_classes": n_cls, "classes": class_names(), "resolution": resolution, "steps": steps,
            "test_accuracy": acc, "features": clf.num_features}
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
