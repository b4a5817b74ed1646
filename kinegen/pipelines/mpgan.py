"""One-step class-conditional image generation with the MP-GAN, as a diffusers pipeline.

    pipe = MPGANPipeline.from_pretrained("assets/models/kinegen-shapes-gan")
    images = pipe(class_labels=["red circle", 3], seeds=[0, 1]).images

The generator is a diffusers ``ModelMixin`` (``config.json`` + safetensors), so the pipeline saves and
loads offline with ``save_pretrained`` / ``from_pretrained``. One seed draws one latent from its own
random generator, so an image depends on its seed and class only, not on the batch it was made in.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from diffusers import DiffusionPipeline
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput

from ..models.mpgan import Generator
from ..models.mpgan_config import D_ONLY_FIELDS, GANConfig

_NET = GANConfig  # the defaults below are GANConfig's, except the three R3GAN2 switches


class MPGANGenerator(ModelMixin, ConfigMixin):
    """The MP-GAN (or R3GAN baseline) generator with its class names, loadable by diffusers."""

    @register_to_config
    def __init__(self, resolution: int = _NET.resolution, num_classes: int = _NET.num_classes,
                 widths: tuple = _NET.widths, blocks_per_stage: int = _NET.blocks_per_stage,
                 group_channels: int = _NET.group_channels, z_dim: int = _NET.z_dim, embed_dim: int = _NET.embed_dim,
                 weight_norm: bool = _NET.weight_norm, centering: bool = _NET.centering, mp_lrelu: bool = _NET.mp_lrelu,
                 mp_residual: bool = _NET.mp_residual, ff_heads: bool = _NET.ff_heads, free_transitions: bool = False,
                 linear_extraction: bool = False, shared_class_init: bool = False,
                 positional_channels: int = 0, positional_gain: float = 1.0, noise_inputs: bool = False,
                 noise_per_texture: bool = False, noise_max_resolution: int = 0,
                 g_texture_conditioning: str = "input",
                 num_textures: int = 0, texture_prior: tuple = (), texture_gain: float = _NET.texture_gain,
                 class_names: list | None = None, texture_names: list | None = None):
        # The three R3GAN2 switches default to off here so that generators saved before they existed
        # (their config.json lacks them) load as they were built; new ones save them explicitly.
        super().__init__()
        fields = {f.name for f in dataclasses.fields(GANConfig)}
        self.net = Generator(GANConfig(**{k: v for k, v in locals().items() if k in fields}))

    @classmethod
    def from_gan_config(cls, cfg: GANConfig, class_names: list[str]) -> MPGANGenerator:
        kw = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in D_ONLY_FIELDS}
        textures = None
        if cfg.num_textures:  # texture labels are trained on the shapes data only (kinegen train gan)
            from ..data.shapes import TEXTURES

            textures = list(TEXTURES)
        return cls(**{**kw, "widths": list(cfg.widths), "texture_prior": list(cfg.texture_prior)},
                   class_names=list(class_names), texture_names=textures)

    def forward(self, z: torch.Tensor, class_labels: torch.Tensor, textures: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.net(z, class_labels, textures)


@dataclasses.dataclass
class MPGANPipelineOutput(BaseOutput):
    images: list | np.ndarray | torch.Tensor


def truncated_normal(shape, generator: torch.Generator, bound: float = 2.0) -> torch.Tensor:
    """Standard normal samples redrawn until inside ``[-bound, bound]`` (BigGAN's truncation trick)."""
    z = torch.randn(shape, generator=generator)
    bad = z.abs() > bound
    while bad.any():
        z[bad] = torch.randn(int(bad.sum()), generator=generator)
        bad = z.abs() > bound
    return z


class MPGANPipeline(DiffusionPipeline):
    """``pipe(class_labels, seeds=..., truncation=1.0, output_type="pil")`` -> one image per (label, seed)."""

    model_cpu_offload_seq = "gan"

    def __init__(self, gan: MPGANGenerator):
        super().__init__()
        self.register_modules(gan=gan)

    @property
    def class_names(self) -> list[str]:
        names = self.gan.config.class_names
        return list(names) if names else [str(i) for i in range(self.gan.config.num_classes)]

    @property
    def texture_names(self) -> list[str]:
        """The background textures this generator takes as labels (empty: none)."""
        return list(getattr(self.gan.config, "texture_names", None) or [])

    def get_texture_ids(self, textures, n: int) -> list[int]:
        """One texture index per image from a name, an index or a list of ``n`` of them; a clear error otherwise."""
        names = self.texture_names
        if not names:
            raise ValueError("this generator was trained without texture labels; leave the texture out.")
        one = isinstance(textures, (int, str, np.integer))
        items = [textures] * n if one else list(textures)
        if len(items) != n:
            raise ValueError(f"got {len(items)} textures for {n} images; give one, or one per image.")
        out = []
        for t in items:
            if isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= int(t) < len(names):
                out.append(int(t))
            elif isinstance(t, str) and t.strip().lower() in names:
                out.append(names.index(t.strip().lower()))
            else:
                raise ValueError(f"unknown texture {t!r}; valid textures: {', '.join(names)}.")
        return out

    def get_label_ids(self, labels) -> list[int]:
        """Class indices from names or indices; unknown ones raise a ValueError listing the valid names."""
        names = self.class_names
        lookup = {n.lower(): i for i, n in enumerate(names)}
        out = []
        one = isinstance(labels, (int, str)) or not hasattr(labels, "__iter__")  # 1.5 is one (unknown) class
        for label in [labels] if one else list(labels):
            if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
                if not 0 <= int(label) < len(names):
                    raise ValueError(f"class index {label} is out of range 0..{len(names) - 1}.")
                out.append(int(label))
            elif isinstance(label, str) and label.strip().lower() in lookup:
                out.append(lookup[label.strip().lower()])
            else:
                raise ValueError(f"unknown class {label!r}; valid classes: {', '.join(names)}.")
        return out

    @torch.no_grad()
    def __call__(self, class_labels=None, num_images_per_label: int = 1, seeds=None,
                 generator: torch.Generator | list[torch.Generator] | None = None, truncation: float = 1.0,
                 textures=None, batch_size: int = 64, output_type: str = "pil", return_dict: bool = True):
        """Generate images.

        Args:
            class_labels: an index, a class name, a list of them, or None (every class once).
            num_images_per_label: images per label (their seeds follow each other).
            seeds: one int per image (or one int: the first seed); each seed draws its own latent.
            generator: instead of seeds, a torch.Generator (or one per image) to draw latents from.
            truncation: 1.0 = no truncation; below 1, latents are redrawn inside +-2 and scaled by it
                (higher fidelity, less variety; a heuristic, R3GAN has no mapping network).
            textures: for a generator trained with texture labels (``texture_names``), the background: a name,
                an index, or one per image; None: each latent draws its own at the training data's shares (the
                same for a seed whatever the truncation).
            batch_size: images per generator forward (the result does not depend on it).
            output_type: "pil", "np" (``[N, H, W, 3]`` in [0, 1]) or "pt" (``[N, 3, H, W]`` in [0, 1]).
        """
        if output_type not in ("pil", "np", "pt"):
            raise ValueError(f"output_type must be 'pil', 'np' or 'pt', got {output_type!r}.")
        if not 0.0 < truncation <= 1.0:
            raise ValueError(f"truncation must be in (0, 1], got {truncation}.")
        ids = self.get_label_ids(range(len(self.class_names)) if class_labels is None else class_labels)
        ids = [i for i in ids for _ in range(num_images_per_label)]
        n = len(ids)
        z_dim = self.gan.config.z_dim
        if generator is not None:
            gens = generator if isinstance(generator, list) else [generator] * n
            if len(gens) != n:
                raise ValueError(f"got {len(gens)} generators for {n} images.")
        else:
            if seeds is None:
                seeds = int(torch.randint(0, 2**31 - 1, ()).item())
            seeds = [int(seeds) + i for i in range(n)] if isinstance(seeds, (int, np.integer)) else list(seeds)
            if len(seeds) != n:
                raise ValueError(f"got {len(seeds)} seeds for {n} images.")
            gens = [torch.Generator().manual_seed(s) for s in seeds]
        zs = torch.stack([truncated_normal((z_dim,), g) * truncation if truncation < 1 else
                          torch.randn(z_dim, generator=g) for g in gens])
        extra = self.gan.net.cfg.latent_dim - z_dim  # noise inputs' images: drawn after z, never truncated
        if extra:
            zs = torch.cat([zs, torch.stack([torch.randn(extra, generator=g) for g in gens])], dim=1)
        labels = torch.tensor(ids, dtype=torch.long)
        tex = None
        if textures is not None:
            tex = torch.tensor(self.get_texture_ids(textures, n), dtype=torch.long)
        elif self.texture_names:  # drawn from the latent before truncation scaled it
            from ..models.mpgan import texture_of_latent

            tex = texture_of_latent(zs / truncation, tuple(self.gan.config.texture_prior))
        device, dtype = self.gan.device, self.gan.dtype
        out = torch.cat([self.gan(zs[i:i + batch_size].to(device, dtype), labels[i:i + batch_size].to(device),
                                  None if tex is None else tex[i:i + batch_size].to(device))
                         for i in range(0, n, batch_size)])
        images = (out.float().clamp(-1, 1) + 1) / 2
        if output_type == "pt":
            result = images.cpu()
        else:
            result = images.permute(0, 2, 3, 1).cpu().numpy()
            if output_type == "pil":
                result = self.numpy_to_pil(result)
        return MPGANPipelineOutput(images=result) if return_dict else (result,)
