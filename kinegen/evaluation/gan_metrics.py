"""GAN evaluation without downloads: features of a classifier trained on held-out procedural images.

- **FD** (Frechet distance, the FID formula on our classifier's penultimate features; not comparable
  with published FIDs) and **KID** (unbiased polynomial-kernel MMD^2), both through torchmetrics with
  the classifier as the feature extractor;
- **precision / recall** (Kynkaanniemi et al. 2019, k = 3 nearest neighbours in feature space);
- **class accuracy**: how often the classifier sees the class the generator was asked for;
- **mode coverage**: classes (modes) whose generated images are recognised as that class at least
  half the time, out of all classes;
- **class spread**: how much the generated images of one class vary (mean L1 between two of them) as a
  share of how much the real ones do (1 = as varied as the data; near 0 = one image per class);
- **backgrounds**: how far the generated images' background colours and textures are from the real
  images' (total variation over the colours, the textures and their 16 pairs, pooled and within each
  class; the share of backgrounds that are none of the data's; :mod:`kinegen.evaluation.gan_backgrounds`).

The Inception FID is added when torchmetrics finds its weights on disk (``fid_weights=PATH``).
The classifier is :class:`kinegen.models.gan_classifier.FeatureClassifier`, trained by
:mod:`kinegen.training.gan_classifier` and shipped in ``assets/models/gan-eval-classifier``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..data.shape_images import DEFAULT_CLASSES
from ..models.gan_classifier import FeatureClassifier
from .gan_backgrounds import compare_backgrounds


class _Extractor(nn.Module):
    """What torchmetrics calls: uint8 images in, features out."""

    def __init__(self, clf: FeatureClassifier):
        super().__init__()
        self.clf = clf
        self.num_features = clf.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.clf.features(x.float() / 127.5 - 1.0)


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall: fraction of fakes inside the real manifold and vice versa."""

    def radii(x):
        d = torch.cdist(torch.from_numpy(x), torch.from_numpy(x))
        return d.kthvalue(k + 1, dim=1).values  # the 0th neighbour is the point itself

    def inside(points, ref, ref_radii):
        d = torch.cdist(torch.from_numpy(points), torch.from_numpy(ref))
        return (d <= ref_radii[None]).any(1).float().mean().item()

    r_real, r_fake = radii(real), radii(fake)
    return inside(fake, real, r_real), inside(real, fake, r_fake)


def class_spread(images: np.ndarray, labels: np.ndarray) -> float:
    """Mean per-pixel L1 distance (0-255) between two images of the same class, over disjoint pairs of each
    class's images: how much the images of one class vary. A generator that draws one image per class
    scores near 0 whatever its class accuracy."""
    dists = []
    for c in np.unique(labels):
        x = images[labels == c].astype(np.float32)
        half = len(x) // 2
        if half:
            dists.append(np.abs(x[:half] - x[half:2 * half]).mean(axis=(1, 2, 3)))
    return float(np.concatenate(dists).mean()) if dists else float("nan")


@torch.no_grad()
def evaluate_images(clf: FeatureClassifier, real: np.ndarray, real_labels: np.ndarray, fake: np.ndarray,
                    fake_labels: np.ndarray, kid_subset: int = 500, fid_weights: str | None = None) -> dict:
    """All metrics for uint8 ``[N, H, W, 3]`` real and generated images with their class labels."""
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.kid import KernelInceptionDistance

    clf = clf.eval()
    ext = _Extractor(clf)
    to_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).permute(0, 3, 1, 2)  # noqa: E731
    fd = FrechetInceptionDistance(feature=ext, normalize=False)
    subset = min(kid_subset, len(real), len(fake))
    kid = KernelInceptionDistance(feature=ext, subset_size=subset, normalize=False)
    for arr, is_real in ((real, True), (fake, False)):
        for i in range(0, len(arr), 256):
            fd.update(to_t(arr[i:i + 256]), real=is_real)
            kid.update(to_t(arr[i:i + 256]), real=is_real)
    kid_mean, kid_std = kid.compute()
    feats = lambda a: torch.cat([ext(to_t(a[i:i + 256])) for i in range(0, len(a), 256)])  # noqa: E731
    f_real, f_fake = feats(real), feats(fake)
    prec, rec = precision_recall(f_real.numpy().astype(np.float64), f_fake.numpy().astype(np.float64))
    pred = torch.cat([clf.head(f_fake[i:i + 256]).argmax(1) for i in range(0, len(f_fake), 256)]).numpy()
    num_classes = clf.head.out_features
    per_class = [float((pred[fake_labels == c] == c).mean()) if (fake_labels == c).any() else float("nan")
                 for c in range(num_classes)]
    out = {"fd": float(fd.compute()), "kid": float(kid_mean), "kid_std": float(kid_std), "precision": prec,
           "recall": rec, "class_accuracy": float((pred == fake_labels).mean()),
           "modes_covered": int(sum(a >= 0.5 for a in per_class if a == a)), "modes": num_classes,
           "per_class_accuracy": per_class, "n_real": len(real), "n_fake": len(fake)}
    out["class_spread"] = class_spread(fake, fake_labels) / max(class_spread(real, real_labels), 1e-8)
    bg = compare_backgrounds(real, fake, fake_labels)
    out.update({f"background_{k}": bg[k] for k in ("colour_tv", "texture_tv", "pair_tv", "colour_tv_by_class",
                                                   "texture_tv_by_class", "other", "missed_pairs")})
    out["backgrounds"] = {"real": bg["real"], "fake": bg["fake"]}
    if fid_weights:
        fid = FrechetInceptionDistance(feature=2048, feature_extractor_weights_path=fid_weights)
        for arr, is_real in ((real, True), (fake, False)):
            for i in range(0, len(arr), 64):
                fid.update(to_t(arr[i:i + 64]), real=is_real)
        out["inception_fid"] = float(fid.compute())
    return out


# ---------------------------------------------------------------------------- the bundled classifier and a pipeline


def load_classifier(folder=None) -> FeatureClassifier:
    """The GAN evaluation classifier shipped in assets/ (or from ``folder``)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from ..errors import ConfigError
    from ..loading import ASSETS_DIR

    folder = Path(folder) if folder else Path(ASSETS_DIR) / "models" / "gan-eval-classifier"
    if not (folder / "model.safetensors").is_file():
        raise ConfigError(f"no GAN evaluation classifier in {folder}; train one with "
                          "`kinegen train gan-classifier --run DIR`.")
    meta = json.loads((folder / "config.json").read_text())
    clf = FeatureClassifier(meta["num_classes"], features=meta.get("features", 128))
    clf.load_state_dict(load_file(str(folder / "model.safetensors")))
    return clf.eval()


def reference_images(n_images: int, resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """The held-out real images the GAN metrics compare against: uint8 ``[N, H, W, 3]``, classes balanced, and
    their labels (never seen by the GAN or the evaluation classifier)."""
    from ..data.shape_images import HELD_OUT_SEED, REFERENCE_SEEDS, batch

    labels = np.arange(n_images) % len(DEFAULT_CLASSES)
    return batch(HELD_OUT_SEED + REFERENCE_SEEDS + np.arange(n_images), labels, resolution), labels


def evaluate_pipeline(pipe, n_images: int = 1200, classifier=None, seed: int = 0, fid_weights=None) -> dict:
    """Generate ``n_images`` (classes balanced) and compare them with as many held-out real images."""
    from ..data.shape_images import class_names
    from ..errors import ConfigError

    names = pipe.class_names
    if names != class_names():
        raise ConfigError("kinegen eval gan measures models trained on the procedural shapes (classes "
                          f"{', '.join(class_names())}); this model's classes are {', '.join(names[:6])}...")
    clf = classifier or load_classifier()
    real, labels = reference_images(n_images, pipe.gan.config.resolution)
    fake = pipe(class_labels=labels.tolist(), seeds=[seed * 1_000_003 + i for i in range(n_images)],
                output_type="np").images
    fake = (fake * 255).round().astype(np.uint8)
    return evaluate_images(clf, real, labels, fake, labels, fid_weights=fid_weights)
