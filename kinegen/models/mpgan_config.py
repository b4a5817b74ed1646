"""The MP-GAN's network settings (:class:`GANConfig`), kept free of torch so that the training
settings and the CLI can read its defaults without importing the networks (:mod:`kinegen.models.mpgan`).
"""

from __future__ import annotations

import dataclasses
import math

G_TEXTURE_CONDITIONING = ("input", "stages")  # GANConfig.g_texture_conditioning
# GANConfig's fields that only the discriminator reads: a saved generator does not keep them.
D_ONLY_FIELDS = ("mbstd_group", "separate_class_head", "spectral_weight", "pixel_templates", "template_curvature")

# The MP switches of GANConfig, in order: all True is the MP-GAN, all False the R3GAN baseline.
MP_SWITCHES = ("weight_norm", "centering", "mp_lrelu", "mp_residual", "ff_heads", "free_transitions",
               "linear_extraction", "shared_class_init")


@dataclasses.dataclass
class GANConfig:
    """Sizes and the MP switches (all True = MP-GAN, all False = R3GAN baseline).

    The one place of the network's defaults: ``kinegen train gan``
    (:class:`kinegen.training.configs.GANTrainConfig`) and the saved generator
    (:class:`kinegen.pipelines.mpgan.MPGANGenerator`) take theirs from here.
    """

    resolution: int = 32
    num_classes: int = 12  # the procedural shapes' classes (kinegen.data.shape_images)
    widths: tuple[int, ...] = (128, 128, 128, 64)  # per stage, from 4x4 up to ``resolution``
    blocks_per_stage: int = 1
    group_channels: int = 32  # channels per group in the grouped 3x3 convolutions
    z_dim: int = 64
    embed_dim: int = 64
    weight_norm: bool = True
    centering: bool = True
    mp_lrelu: bool = True
    mp_residual: bool = True
    ff_heads: bool = True
    free_transitions: bool = True
    linear_extraction: bool = True
    shared_class_init: bool = True
    # Not an MP switch and D only: the minibatch standard deviation of Karras et al. (ProGAN, ICLR 2018, Sec. 3),
    # one feature channel over groups of this many images before D's head (StyleGAN2's epilogue); 0 = off
    # (R3GAN). Training lays batches out so that every group holds one class (docs/gan.md, "Training").
    mbstd_group: int = 0
    # D only: the label-matching term (``--class-weight``) trains a linear classifier of its own on D's pooled
    # features instead of the projection logits, so the projection is left to the adversarial loss.
    separate_class_head: bool = False
    # G only, not an MP switch: channels of a learned positional map added at every stage from 8x8 up
    # (:class:`PositionalMap`; Xu et al., "Positional Encoding as Spatial Inductive Bias in GANs", CVPR 2021).
    # The shapes data's checkered and striped backgrounds are fixed to the pixel grid, which G cannot place
    # without knowing where it draws (benchmarks/gan.md, "Backgrounds"). 0 = off (R3GAN).
    positional_channels: int = 0
    # G only: the positional maps are stored divided by this gain and used multiplied by it (an equalised learning
    # rate, Karras et al., ProGAN, ICLR 2018, Sec. 4.1), so an optimiser step moves them ``gain`` times as far. At 1
    # (the runs before 2026-12-06) a fine-tune at lr 2e-4 moved the unit-scale maps by 0.03 in 1,000 steps: they
    # stayed the random fields they started as, and G drew the patterns out of them with a mottled layer on top
    # (benchmarks/gan.md, "Positional maps that learn").
    positional_gain: float = 1.0
    # G only, not an MP switch: StyleGAN's noise inputs (Karras et al., CVPR 2019, Sec. 3.2) at every stage from 8x8
    # up: one Gaussian image per stage, added to the trunk with learned per-channel weights that start at 0
    # (:class:`~kinegen.models.mpgan.NoiseInput`). The images are part of G's latent (``latent_dim``: ``z`` first,
    # then the noise, 8x8 first), so that a seed keeps its image. For stochastic texture that ``z`` would have to
    # spend its few dimensions on: the shapes data's noisy backgrounds are independent blotches on an 8x8 grid.
    # False = off (R3GAN).
    noise_inputs: bool = False
    # G only: the noise inputs' weights per background-texture label (``num_textures`` rows, ours; StyleGAN has one
    # row). With one row the plain label, 55% of the shapes data and noise-free, pulls the shared weights to 0 although
    # D asks for the noise under the noisy label (benchmarks/gan.md, "Noise weights per texture"). False = one row.
    noise_per_texture: bool = False
    # G only: the noise inputs stop at this side (8 = the 8x8 stage alone); 0 = every stage from 8x8 (StyleGAN). The
    # shapes data's noisy backgrounds are blotches on an 8x8 grid, linearly upsampled; with inputs at 16x16 too G
    # drew them from the 16x16 noise, finer than the data's (benchmarks/gan.md, "The grain of the noise").
    noise_max_resolution: int = 0
    # G only: where G takes the texture label (``num_textures``). "input": a vector added to the class vector at G's
    # input (:class:`~kinegen.models.mpgan.TextureEmbedding`), the runs until 2026-12-06; the same z then draws
    # another background colour under each label, and the pattern labels lost black and navy (benchmarks/gan.md,
    # "Texture labels at every stage"). "stages": no input vector; the label scales each stage's positional map per
    # channel (:class:`~kinegen.models.mpgan.PositionalMap`, one gain row per label; BigGAN's conditioning at every
    # block, Brock et al., ICLR 2019, Sec. 3, reduced to the layers that draw textures), so z alone picks the colour.
    g_texture_conditioning: str = "input"
    # D only, not an MP switch: SSD-GAN's frequency-aware classifier (Chen et al., AAAI 2021, Sec. 3.3), a linear
    # classifier on the image's reduced spectrum added to D's logit with this weight (:func:`reduced_spectrum`,
    # :meth:`Discriminator.spectral_logit`). D's downsampling blurs away the faint high-frequency textures of the
    # shapes data, which no generator draws (benchmarks/gan.md, "Backgrounds"). 0 = off (R3GAN).
    spectral_weight: float = 0.0
    # D only, not an MP switch: this many learned full-resolution templates fixed to the pixel grid, whose
    # correlations with the image add a realness to D's logit (:class:`~kinegen.models.mpgan.PixelTemplates`;
    # ours). For the same backgrounds: a pattern fixed to the grid is one direction of pixel space. 0 = off (R3GAN).
    pixel_templates: int = 0
    # D only: the templates' realness less ``template_curvature / 2 * c_k^2`` per template, so that it peaks at a
    # finite correlation instead of rising without end (PixelTemplates); 0 = off (the runs before 2026-12-06).
    template_curvature: float = 0.0
    # Not an MP switch: the background texture as a second label of both networks (``num_textures`` of them;
    # 0 = off, R3GAN). G adds a texture vector to its class vector; D adds ``h . t_k / sqrt(dim)`` to its
    # projection logit (:class:`~kinegen.models.mpgan.TextureEmbedding`; Miyato & Koyama's projection, one more
    # label). Without a texture given, G draws one by its latent's first coordinate from ``texture_prior``, so a
    # seed keeps its image and the textures come at the data's shares. The shapes data's checkered and striped
    # backgrounds are a sixth of the images each and D's gradient at G's images does not ask for them
    # (benchmarks/gan.md, "What D's gradient asks G for").
    num_textures: int = 0
    texture_prior: tuple[float, ...] = ()
    # The texture tables are stored divided by this gain (an equalised learning rate; TextureEmbedding).
    texture_gain: float = 100.0

    def __post_init__(self):
        self.widths = tuple(int(w) for w in self.widths)
        stages = int(math.log2(self.resolution)) - 1
        if 2 ** (stages + 1) != self.resolution or self.resolution < 8:
            raise ValueError(f"resolution must be a power of two >= 8, got {self.resolution}")
        if len(self.widths) != stages:
            raise ValueError(f"widths needs one entry per stage (4x4 .. {self.resolution}x{self.resolution}): "
                             f"{stages}, got {len(self.widths)}")
        if self.mbstd_group < 0 or self.mbstd_group == 1:
            raise ValueError(f"mbstd_group is a group size of at least 2 (0 = off), got {self.mbstd_group}")
        if self.positional_channels < 0:
            raise ValueError(f"positional_channels is a number of channels (0 = off), got {self.positional_channels}")
        if not self.positional_gain > 0:
            raise ValueError(f"positional_gain must be > 0 (1 = the map's own learning rate), got "
                             f"{self.positional_gain}")
        if self.pixel_templates < 0:
            raise ValueError(f"pixel_templates is a number of templates (0 = off), got {self.pixel_templates}")
        if not self.template_curvature >= 0:
            raise ValueError(f"template_curvature must be >= 0 (0 = off), got {self.template_curvature}")
        if not self.spectral_weight >= 0:
            raise ValueError(f"spectral_weight is a weight >= 0 (0 = off), got {self.spectral_weight}")
        self.texture_prior = tuple(float(p) for p in self.texture_prior)
        if self.num_textures < 0 or len(self.texture_prior) != self.num_textures:
            raise ValueError(f"texture_prior needs one share per texture (num_textures={self.num_textures}); "
                             f"got {self.texture_prior}")
        if self.noise_per_texture and not (self.noise_inputs and self.num_textures):
            raise ValueError("noise_per_texture gives the noise inputs one weight row per texture label: it needs "
                             "noise_inputs and texture labels (num_textures > 0)")
        sides = [4 * 2**i for i in range(1, stages)]
        if self.noise_max_resolution and self.noise_max_resolution not in sides:
            raise ValueError(f"noise_max_resolution is the side of a stage from 8x8 ({', '.join(map(str, sides))}) "
                             f"or 0 (every stage); got {self.noise_max_resolution}")
        if self.noise_max_resolution and not self.noise_inputs:
            raise ValueError("noise_max_resolution limits the noise inputs: it needs noise_inputs")
        if self.g_texture_conditioning not in G_TEXTURE_CONDITIONING:
            raise ValueError(f"g_texture_conditioning must be one of {', '.join(G_TEXTURE_CONDITIONING)}; got "
                             f"{self.g_texture_conditioning!r}")
        if self.g_texture_conditioning == "stages" and not (self.num_textures and self.positional_channels):
            raise ValueError("g_texture_conditioning 'stages' scales the positional maps per texture label: it needs "
                             "texture labels (num_textures > 0) and positional_channels > 0")
        if not self.texture_gain > 0:
            raise ValueError(f"texture_gain must be above 0; got {self.texture_gain}")
        if self.num_textures and (min(self.texture_prior) <= 0 or abs(sum(self.texture_prior) - 1) > 1e-4):
            raise ValueError(f"texture_prior must be positive shares summing to 1; got {self.texture_prior}")
        if any(2 * w % self.group_channels for w in self.widths):
            raise ValueError("2 x every width must be a multiple of group_channels")
        if self.free_transitions:
            for a, b in zip(self.widths[:-1], self.widths[1:], strict=True):
                if a != b and (4 * b % a or 4 * b < a):
                    raise ValueError(f"free_transitions: a width change {a} -> {b} needs 4 x {b} to be a multiple "
                                     f"of {a} (e.g. 128 -> 64, 128 -> 96, 64 -> 64); change --widths or "
                                     "ablate free_transitions")

    @property
    def noise_resolutions(self) -> tuple[int, ...]:
        """The side of each stage's noise image (``noise_inputs``), 8x8 up to ``noise_max_resolution``; empty
        when off."""
        stages = int(math.log2(self.resolution)) - 1
        top = self.noise_max_resolution or self.resolution
        return tuple(4 * 2**i for i in range(1, stages) if 4 * 2**i <= top) if self.noise_inputs else ()

    @property
    def latent_dim(self) -> int:
        """G's latent: ``z_dim`` and, with ``noise_inputs``, one value per pixel of every stage's noise image."""
        return self.z_dim + sum(r * r for r in self.noise_resolutions)

    @classmethod
    def baseline(cls, **kw) -> GANConfig:
        return cls(**dict.fromkeys(MP_SWITCHES, False), **kw)
