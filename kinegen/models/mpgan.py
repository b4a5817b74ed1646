"""Magnitude-preserving GAN networks (R3GAN lineage), with every change switchable for ablations.

The baseline is R3GAN's "config E" (Huang et al., NeurIPS 2024, Sec. 3): residual blocks of a
1x1 C->2C, a grouped 3x3 and a 1x1 2C->C convolution, no normalisation layers, He initialisation
with the Fix-up gain and a zero-initialised last layer, leaky ReLU (slope 0.2, gain sqrt(2/(1+a^2))),
a projection discriminator. The magnitude-preserving (MP) changes follow EDM2 (Karras et al., CVPR
2024, Sec. 3) and R3GAN's successor; each is one field of :class:`GANConfig`:

- ``weight_norm``: every convolution and linear layer uses ``w_hat = w / ||w||`` per output filter
  (EDM2 Eq. 47-48) and the stored weights are renormalised after every optimiser step
  (:func:`renormalize_`, forced weight normalisation), so the effective learning rate stays constant;
- ``centering``: filters are made zero-mean over their fan-in before normalising;
- ``mp_lrelu``: leaky ReLU divided by its output standard deviation for unit Gaussian input,
  ``gain = 1 / sqrt(((1 + a^2) - (1 - a)^2 / pi) / 2) = 1.5465`` for a = 0.2;
- ``mp_residual``: ``y_k = y_{k-1} + alpha_k f_k(y_{k-1} / sqrt(A_{k-1}))`` with per-channel
  ``alpha_k = tanh(v_k)`` (v_k = 0 at init) and the accumulated variance ``A_k = A_{k-1} + alpha_k^2``
  tracked analytically and divided out at every resolution change and before the heads;
- ``ff_heads``: feed-forward heads (G: a ones-augmented linear layer into a grouped 4x4 generative
  basis; D: a 1x1 expansion, a grouped 4x4 basis and a linear projection) instead of R3GAN's learned
  constant input and depthwise basis head;
- ``free_transitions``: width changes between stages without parameters, as R3GAN's successor makes
  them (G: repeat every channel ``4 C_out / C_in`` times, pixel shuffle, [1, 2, 1] low-pass; D: low-pass,
  pixel unshuffle, the mean over groups of ``4 C_in / C_out`` channels; binomial [1, 3, 3, 1] resampling
  where the widths are equal) instead of a learned 1x1 convolution after bilinear resampling;
- ``linear_extraction``: no activation after D's 1x1 RGB extraction layer (R3GAN's successor);
- ``shared_class_init``: both networks' class embeddings are rows of one centred, unit-RMS table
  (:class:`ClassEmbedding`) that start as the same vector, so G and D start unconditional and
  learn the classes apart (R3GAN's successor), instead of a linear layer on one-hot labels.

Not an MP switch: ``positional_channels`` gives G a learned positional map at every stage from 8x8 up
(:class:`PositionalMap`), off by default. Nor is ``spectral_weight``: SSD-GAN's linear classifier on the
image's reduced spectrum added to D's logit (:func:`reduced_spectrum`), off by default. Nor is ``num_textures``:
the background texture as a second projection label of both networks (:class:`TextureEmbedding`), off by default.
Nor is ``pixel_templates``: D's learned full-resolution templates (:class:`PixelTemplates`), off by default.

All switches off is the R3GAN baseline; all on is the MP-GAN. ``D.magnitudes`` records the RMS of
the discriminator's activations per stage (the diagnostic of docs/gan.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .mpgan_config import GANConfig

SLOPE = 0.2
LRELU_GAIN_R3GAN = math.sqrt(2 / (1 + SLOPE**2))  # 1.3868: unit second moment
LRELU_GAIN_MP = 1 / math.sqrt(((1 + SLOPE**2) - (1 - SLOPE) ** 2 / math.pi) / 2)  # 1.5465: unit std
WN_EPS = 1e-4


# ---------------------------------------------------------------------------- layers


def normalize(w: torch.Tensor, centering: bool) -> torch.Tensor:
    """Per output filter: optionally subtract the mean, then scale to norm sqrt(fan_in) (EDM2 Eq. 47)."""
    flat = w.flatten(1).float()
    if centering:
        flat = flat - flat.mean(1, keepdim=True)
    fan_in = flat.shape[1]
    norm = flat.norm(dim=1, keepdim=True) / math.sqrt(fan_in) + WN_EPS
    return (flat / norm).view_as(w).to(w.dtype)


class Conv(nn.Module):
    """A convolution (``kernel`` 1 is a linear layer on channels) in R3GAN or MP form.

    MP form: ``w_eff = normalize(w) / sqrt(fan_in)`` (unit-norm filters); a bias, when asked for,
    is one more input column fed by a constant-ones channel, so it is normalised with the filter.
    R3GAN form: plain weights with He init ``std = gain / sqrt(fan_in)`` and a separate bias.
    """

    def __init__(self, cin: int, cout: int, kernel: int = 1, groups: int = 1, bias: bool = False,
                 mp: bool = True, centering: bool = True, init_gain: float = 1.0, zero_init: bool = False):
        super().__init__()
        self.mp, self.centering, self.groups, self.kernel = mp, centering, groups, kernel
        self.bias_column = bias and mp and kernel == 1 and groups == 1
        cin_eff = cin + (1 if self.bias_column else 0)
        fan_in = cin_eff // groups * kernel * kernel
        w = torch.randn(cout, cin_eff // groups, kernel, kernel)
        if mp:
            self.weight = nn.Parameter(w)
        else:
            self.weight = nn.Parameter(torch.zeros_like(w) if zero_init else w * init_gain / math.sqrt(fan_in))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias and not mp else None

    def effective_weight(self) -> torch.Tensor:
        if not self.mp:
            return self.weight
        fan_in = self.weight[0].numel()
        return normalize(self.weight, self.centering) / math.sqrt(fan_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias_column:
            x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
        w = self.effective_weight().to(x.dtype)
        return F.conv2d(x, w, self.bias, padding=self.kernel // 2 if self.kernel % 2 else 0, groups=self.groups)

    @torch.no_grad()
    def renormalize_(self) -> None:
        """Forced weight normalisation: store the normalised weight (after each optimiser step)."""
        if self.mp:
            self.weight.copy_(normalize(self.weight, self.centering))


class Linear(Conv):
    """A linear layer as a 1x1 convolution on ``[N, C]`` inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x[:, :, None, None])[:, :, 0, 0]


def lrelu(x: torch.Tensor, mp: bool) -> torch.Tensor:
    return F.leaky_relu(x, SLOPE) * (LRELU_GAIN_MP if mp else LRELU_GAIN_R3GAN)


class ClassEmbedding(Conv):
    """A table of class vectors, each a centred unit-RMS row (R3GAN's successor's class embedder).

    Stored as the filters of a 1x1 convolution ``embed_dim -> num_classes`` so that forced weight
    normalisation treats every row as a filter; every row starts as the same random vector.
    """

    def __init__(self, num_classes: int, embed_dim: int):
        super().__init__(embed_dim, num_classes, 1, mp=True, centering=True)
        with torch.no_grad():
            self.weight.copy_(self.weight[:1].expand_as(self.weight))

    def forward(self, class_labels: torch.Tensor) -> torch.Tensor:
        return normalize(self.weight, self.centering).flatten(1)[class_labels]


class TextureEmbedding(nn.Module):
    """A table of background-texture vectors (``GANConfig.num_textures``), zero at the start so that a network
    fine-tuned with texture labels starts as the one it was; stored divided by ``gain`` (an equalised learning
    rate: Adam moves the stored values by about the learning rate per step, so with a fine-tune's 2e-4 the
    vectors can reach the unit size of the class vectors in tens of steps rather than thousands)."""

    def __init__(self, num_textures: int, embed_dim: int, gain: float):
        super().__init__()
        self.gain = gain
        self.weight = nn.Parameter(torch.zeros(num_textures, embed_dim))

    def forward(self, textures: torch.Tensor) -> torch.Tensor:
        return self.gain * self.weight[textures]


def texture_of_latent(z: torch.Tensor, prior: tuple[float, ...]) -> torch.Tensor:
    """The texture a latent draws when none is given: ``z[:, 0]``'s normal CDF bucketed by the prior's cumulative
    shares, so standard normal latents draw the textures at the prior's shares and a seed keeps its texture."""
    u = 0.5 * (1 + torch.erf(z[:, 0].float() / math.sqrt(2)))
    edges = torch.tensor(prior, device=z.device).cumsum(0)[:-1]
    return torch.bucketize(u, edges, right=True)


class ResidualBlock(nn.Module):
    """1x1 C->2C, act, grouped 3x3, act, 1x1 2C->C; added to the trunk (R3GAN Fig. 3)."""

    def __init__(self, c: int, cfg: GANConfig, num_blocks_total: int):
        super().__init__()
        mp, cen = cfg.weight_norm, cfg.centering
        fixup = LRELU_GAIN_R3GAN * num_blocks_total ** (-1 / (2 * 3 - 2))
        self.cfg = cfg
        self.conv1 = Conv(c, 2 * c, 1, bias=True, mp=mp, centering=cen, init_gain=fixup)
        self.conv2 = Conv(2 * c, 2 * c, 3, groups=2 * c // cfg.group_channels, mp=mp, centering=cen, init_gain=fixup)
        self.conv3 = Conv(2 * c, c, 1, mp=mp, centering=cen, zero_init=True)
        self.alpha_logit = nn.Parameter(torch.zeros(c)) if cfg.mp_residual else None

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        a = self.cfg.mp_lrelu
        return self.conv3(lrelu(self.conv2(lrelu(self.conv1(x), a)), a))

    def forward(self, x: torch.Tensor, var: float) -> tuple[torch.Tensor, float | torch.Tensor]:
        """Returns the new trunk and its tracked variance (1.0 throughout for the R3GAN form)."""
        if self.alpha_logit is None:
            return x + self.branch(x), var
        alpha = torch.tanh(self.alpha_logit)
        y = x + alpha.view(1, -1, 1, 1) * self.branch(_unit(x, var))
        return y, var + alpha.detach() ** 2


def _unit(x: torch.Tensor, var) -> torch.Tensor:
    """Divide out the tracked variance (a float, per channel ``[C]``, or per image and channel ``[N, C]``)."""
    if isinstance(var, float):
        return x / math.sqrt(var)
    return x / _as_map(var.sqrt())


def _as_map(v: torch.Tensor) -> torch.Tensor:
    """A per-channel ``[C]`` or per-image ``[N, C]`` (or ``[1, C]``) tensor shaped to scale feature maps
    ``[N, C, H, W]``."""
    return v.view(1, -1, 1, 1) if v.dim() == 1 else v[:, :, None, None]


def _stages(widths, cfg: GANConfig) -> tuple[nn.ModuleList, nn.ModuleList]:
    """Residual blocks per stage, and the learned 1x1 width changes between stages (none if free)."""
    total = cfg.blocks_per_stage * len(widths)
    stages = nn.ModuleList(nn.ModuleList(ResidualBlock(c, cfg, total) for _ in range(cfg.blocks_per_stage))
                           for c in widths)
    if cfg.free_transitions:
        return stages, nn.ModuleList()
    transitions = nn.ModuleList(Conv(a, b, 1, mp=cfg.weight_norm, centering=cfg.centering)
                                for a, b in zip(widths[:-1], widths[1:], strict=True))
    return stages, transitions


def _binomial(taps: list[float], x: torch.Tensor) -> torch.Tensor:
    """A separable, normalised binomial kernel ``outer(taps, taps) / sum^2`` as a depthwise filter bank."""
    t = torch.tensor(taps, dtype=x.dtype, device=x.device)
    k = torch.outer(t, t) / t.sum() ** 2
    return k.expand(x.shape[1], 1, *k.shape)


def lowpass(x: torch.Tensor) -> torch.Tensor:
    """The [1, 2, 1] x [1, 2, 1] / 16 blur at the current resolution (R3GAN2's in-place resampling filter)."""
    return F.conv2d(x, _binomial([1, 2, 1], x), padding=1, groups=x.shape[1])


def upsample_free(x: torch.Tensor, cout: int) -> torch.Tensor:
    """Twice the resolution and ``cout`` channels without parameters (``free_transitions``, in G).

    Equal widths: interpolation with the [1, 3, 3, 1] binomial filter (bilinear). Otherwise every channel is
    repeated ``4 cout / cin`` times, the copies are laid out as the 2x2 sub-pixels (pixel shuffle) and
    low-passed with [1, 2, 1] so that the copies do not leave a 2x2 block pattern.
    """
    cin = x.shape[1]
    if cin == cout:
        return F.conv_transpose2d(x, 4 * _binomial([1, 3, 3, 1], x), stride=2, padding=1, groups=cin)
    return lowpass(F.pixel_shuffle(x.repeat_interleave(4 * cout // cin, dim=1), 2))


def downsample_free(x: torch.Tensor, cout: int) -> torch.Tensor:
    """Half the resolution and ``cout`` channels without parameters (``free_transitions``, in D).

    Equal widths: the [1, 3, 3, 1] binomial filter at stride 2. Otherwise a [1, 2, 1] low-pass, the 2x2
    sub-pixels become channels (pixel unshuffle), and consecutive groups of ``4 cin / cout`` of them are
    averaged.
    """
    n, cin, h, w = x.shape
    if cin == cout:
        return F.conv2d(x, _binomial([1, 3, 3, 1], x), stride=2, padding=1, groups=cin)
    x = F.pixel_unshuffle(lowpass(x), 2)
    return x.view(n, cout, 4 * cin // cout, h // 2, w // 2).mean(2)


# ---------------------------------------------------------------------------- generator


class PositionalMap(nn.Module):
    """A learned positional encoding ``P [C, r, r]`` added to G's trunk at one resolution through a 1x1
    projection: ``x + g * W P`` (Xu et al., CVPR 2021: an explicit positional encoding at every scale;
    adding ``W P`` is concatenating ``P`` to the features before the next linear layer).

    A translation-equivariant G (bilinear or binomial resampling, 3x3 convolutions) knows where it draws only
    near the borders, through the zero padding; a pattern fixed to the pixel grid needs ``P``. It starts as a
    no-op: R3GAN form ``W = 0`` (``g = 1``); MP form, whose normalised ``W`` cannot be 0, a per-channel
    ``g = tanh(v)`` with ``v = 0``, the trunk's variance then tracked as in :class:`ResidualBlock`.

    With ``GANConfig.g_texture_conditioning == "stages"`` each image's texture label ``t`` scales ``W P`` per
    channel by ``s_t = 1 + TEXTURE_SCALE_GAIN * u_t`` (``u`` stored, 0 at the start: every label draws what it did).
    """

    def __init__(self, channels: int, resolution: int, width: int, cfg: GANConfig):
        super().__init__()
        self.lr_gain = cfg.positional_gain  # P = lr_gain * map: an equalised learning rate (GANConfig)
        self.map = nn.Parameter(torch.randn(channels, resolution, resolution) / self.lr_gain)
        self.proj = Conv(channels, width, 1, mp=cfg.weight_norm, centering=cfg.centering, zero_init=True)
        self.gain_logit = nn.Parameter(torch.zeros(width)) if cfg.weight_norm else None
        by_texture = cfg.g_texture_conditioning == "stages"
        self.texture_scale = nn.Parameter(torch.zeros(cfg.num_textures, width)) if by_texture else None

    def encoding(self) -> torch.Tensor:
        """``P [C, r, r]``: the stored map times its learning-rate gain (unit scale at initialisation)."""
        return self.map * self.lr_gain

    def gains(self, textures: torch.Tensor | None) -> torch.Tensor | None:
        """The per-channel factor on ``W P``: ``[1, C]``, ``[N, C]`` per texture label, or None (1)."""
        gain = None if self.gain_logit is None else torch.tanh(self.gain_logit)[None]
        if self.texture_scale is None:
            return gain
        if textures is None:
            raise ValueError("these positional maps are scaled per texture label: give the textures.")
        s = 1 + TEXTURE_SCALE_GAIN * self.texture_scale[textures]
        return s if gain is None else gain * s

    def forward(self, x: torch.Tensor, var: float | torch.Tensor, textures: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, float | torch.Tensor]:
        p = self.proj(self.encoding()[None].to(x.dtype))
        gain = self.gains(textures)
        if gain is None:
            return x + p, var
        x = x + _as_map(gain).to(x.dtype) * p
        return x, var if self.gain_logit is None else var + gain.detach() ** 2  # variance tracked in MP form only


# The per-texture scales of the positional maps are stored as ``u`` in ``s = 1 + gain * u`` (an equalised learning
# rate as for TextureEmbedding): at a fine-tune's lr of 2e-4 a scale can reach 0 or 2 within 500 steps.
TEXTURE_SCALE_GAIN = 10.0


# The noise weights are stored divided by this gain (an equalised learning rate, as for TextureEmbedding): at a
# fine-tune's lr of 2e-4 Adam can take them to order 1 in hundreds of steps where their gradient has a sign. At
# exactly 0 it has none on average (the noise then does not reach D's score), hence ``--noise-weight-init``.
NOISE_GAIN = 10.0


class NoiseInput(nn.Module):
    """StyleGAN's noise input (Karras et al., CVPR 2019, Sec. 3.2): a one-channel Gaussian image ``n [N, 1, r, r]``
    broadcast to every channel with a learned per-channel weight, ``x + w n``. ``w`` starts at 0, so a generator
    fine-tuned with noise inputs starts as the one it was (``kinegen train gan --noise-weight-init`` starts new ones
    elsewhere). With ``GANConfig.noise_per_texture`` there is one row of weights per texture label and each image
    takes its label's row (ours). MP form: ``w = tanh(v)`` as in :class:`PositionalMap`, the trunk's variance then
    grows by ``w^2`` (the noise is independent of the features): per image where the rows differ."""

    def __init__(self, width: int, cfg: GANConfig):
        super().__init__()
        self.mp = cfg.weight_norm
        self.per_texture = cfg.noise_per_texture
        self.weight = nn.Parameter(torch.zeros(cfg.num_textures, width) if self.per_texture else torch.zeros(width))

    def weights(self, textures: torch.Tensor | None) -> torch.Tensor:
        """``w``: ``[1, C]`` with one row, else ``[N, C]``, each image's texture label's row."""
        w = NOISE_GAIN * self.weight
        if not self.per_texture:
            w = w[None]
        elif textures is None:
            raise ValueError("these noise inputs have a weight row per texture label: give the textures.")
        else:
            w = w[textures]
        return torch.tanh(w) if self.mp else w

    def forward(self, x: torch.Tensor, var: float | torch.Tensor, noise: torch.Tensor,
                textures: torch.Tensor | None = None) -> tuple[torch.Tensor, float | torch.Tensor]:
        w = self.weights(textures)
        if self.mp:
            var = var + w.detach() ** 2
        return x + _as_map(w).to(x.dtype) * noise.to(x.dtype), var


def draw_latents(n: int, cfg: GANConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` standard normal latents ``[n, latent_dim]``: ``z`` for all of them first, then the noise images, so that
    a generator's ``z`` from a seed is the same with or without noise inputs."""
    z = torch.randn(n, cfg.z_dim, generator=generator)
    extra = cfg.latent_dim - cfg.z_dim
    return torch.cat([z, torch.randn(n, extra, generator=generator)], dim=1) if extra else z


def split_latent(latent: torch.Tensor, cfg: GANConfig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(z [N, z_dim], [noise image [N, 1, r, r] per stage from 8x8])`` from G's latent ``[N, latent_dim]``."""
    if latent.shape[1] != cfg.latent_dim:
        raise ValueError(f"the generator takes latents of {cfg.latent_dim} values (z_dim {cfg.z_dim}"
                         + (" and its noise images" if cfg.noise_inputs else "") + f"), got {latent.shape[1]}")
    z, start, noise = latent[:, :cfg.z_dim], cfg.z_dim, []
    for r in cfg.noise_resolutions:
        noise.append(latent[:, start:start + r * r].reshape(-1, 1, r, r))
        start += r * r
    return z, noise


class Generator(nn.Module):
    """Class-conditional generator: z and a class embedding -> 4x4 features -> stages -> RGB."""

    def __init__(self, cfg: GANConfig):
        super().__init__()
        self.cfg = cfg
        mp, cen = cfg.weight_norm, cfg.centering
        c0 = cfg.widths[0]
        if cfg.shared_class_init:
            self.embed = ClassEmbedding(cfg.num_classes, cfg.embed_dim)
        else:
            self.embed = Linear(cfg.num_classes, cfg.embed_dim, mp=mp, centering=False)
        cond = cfg.z_dim + cfg.embed_dim
        if cfg.ff_heads:
            self.head1 = Linear(cond, 2 * c0, bias=True, mp=mp, centering=cen, init_gain=LRELU_GAIN_R3GAN)
            self.head2 = Linear(2 * c0, c0 * 16, mp=mp, centering=cen, init_gain=LRELU_GAIN_R3GAN)
            self.head3 = Conv(c0, c0, 1, mp=mp, centering=cen)
        else:
            self.const = nn.Parameter(torch.randn(c0, 4, 4))
            self.modulation = Linear(cond, c0, bias=True, mp=mp, centering=cen)
        self.stages, self.transitions = _stages(cfg.widths, cfg)
        # one positional map per stage from 8x8 up (stage i is 4 * 2^i pixels wide); none when off
        self.positional = nn.ModuleList(PositionalMap(cfg.positional_channels, 4 * 2**i, c, cfg)
                                        for i, c in enumerate(cfg.widths) if i and cfg.positional_channels)
        # one noise input per stage of ``cfg.noise_resolutions`` (8x8 up to noise_max_resolution); none when off
        self.noise = nn.ModuleList(NoiseInput(c, cfg) for c in cfg.widths[1:1 + len(cfg.noise_resolutions)])
        self.to_rgb = Conv(cfg.widths[-1], 3, 1, bias=True, mp=mp, centering=False)
        self.texture_embed = (TextureEmbedding(cfg.num_textures, cfg.embed_dim, cfg.texture_gain)
                              if cfg.num_textures and cfg.g_texture_conditioning == "input" else None)
        # A learned output gain, initialised to 1 as in R3GAN's successor. (EDM2's denoiser starts its
        # output gain at 0; here that gain was still +-0.05 after 1,000 steps and G had grown its last
        # features ~11x instead: docs/gan.md.)
        self.out_gain = nn.Parameter(torch.ones(())) if mp else None

    def label_vector(self, class_labels: torch.Tensor) -> torch.Tensor:
        if self.cfg.shared_class_init:
            return self.embed(class_labels)  # already unit RMS
        onehot = F.one_hot(class_labels, self.cfg.num_classes).to(self.embed.weight.dtype)
        e = self.embed(onehot * math.sqrt(self.cfg.num_classes))
        return e / e.square().mean(1, keepdim=True).add(1e-8).sqrt()

    def texture_labels(self, z: torch.Tensor, textures: torch.Tensor | None) -> torch.Tensor | None:
        """The textures to draw: the given ones, else each latent's own (:func:`texture_of_latent`); None
        without texture labels."""
        if not self.cfg.num_textures:
            if textures is not None:
                raise ValueError("this generator has no texture labels (num_textures=0); leave textures out.")
            return None
        return texture_of_latent(z, self.cfg.texture_prior) if textures is None else textures

    def forward(self, latent: torch.Tensor, class_labels: torch.Tensor, textures: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Images ``[N, 3, r, r]`` from latents ``[N, cfg.latent_dim]`` (``z``, then any noise images)."""
        cfg = self.cfg
        z, noise = split_latent(latent, cfg)
        label = self.label_vector(class_labels)
        textures = self.texture_labels(z, textures)
        if self.texture_embed is not None:
            label = label + self.texture_embed(textures).to(label.dtype)
        cond = torch.cat([z, label], dim=1)
        if cfg.ff_heads:
            h = lrelu(self.head1(cond), cfg.mp_lrelu)
            x = lrelu(self.head2(h), cfg.mp_lrelu).view(-1, cfg.widths[0], 4, 4)
            x = self.head3(x)
        else:
            x = self.const[None] * self.modulation(cond)[:, :, None, None]
        var: float | torch.Tensor = 1.0
        for i, blocks in enumerate(self.stages):
            if i and self.cfg.positional_channels:
                x, var = self.positional[i - 1](x, var, textures)
            if 0 < i <= len(self.noise):
                x, var = self.noise[i - 1](x, var, noise[i - 1], textures)
            for block in blocks:
                x, var = block(x, var)
            if i + 1 < len(self.stages):
                x = _unit(x, var)
                var = 1.0
                if cfg.free_transitions:
                    x = upsample_free(x, cfg.widths[i + 1])
                else:
                    x = self.transitions[i](F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        x = self.to_rgb(_unit(x, var))
        if self.out_gain is not None:
            x = x * self.out_gain
        return x


# ---------------------------------------------------------------------------- discriminator


def minibatch_stddev(x: torch.Tensor, group: int) -> torch.Tensor:
    """Append one channel: the standard deviation across a group of images, averaged over channels and pixels.

    Karras et al., ProGAN (ICLR 2018), Sec. 3, in StyleGAN2's grouped form: image ``i`` is grouped with
    ``i + n/group``, ``i + 2 n/group``, ... (``n`` must be a multiple of ``group``; smaller batches form one
    group). A generator that draws one image for every ``z`` gives its groups a standard deviation near 0,
    which D can see; D alone, scoring one image at a time, cannot.
    """
    n, c, h, w = x.shape
    g = min(group, n)
    if n % g:
        raise ValueError(f"minibatch stddev: the batch ({n}) must be a multiple of the group size ({g}).")
    y = x.float().view(g, n // g, c, h, w)
    sd = (y.var(0, unbiased=False) + 1e-8).sqrt().mean((1, 2, 3))  # [n/g]
    return torch.cat([x, sd.to(x.dtype).repeat(g).view(n, 1, 1, 1).expand(n, 1, h, w)], dim=1)


# Added to the power before the log: below the data's textures' peaks (checkered ~0.07 at ring 6, striped ~0.8 at
# ring 23 of 32x32) and well above a plain background's floor (~5e-4), so R1/R2 do not meet the log's steep end.
SPECTRUM_EPS = 1e-2


def spectrum_rings(size: int) -> torch.Tensor:
    """The ring of every frequency of a ``size x size`` 2D FFT: its distance from DC, rounded, ``[size * size]``."""
    f = torch.fft.fftfreq(size) * size
    return (f[:, None].square() + f[None, :].square()).sqrt().round().long().flatten()


def reduced_spectrum(x: torch.Tensor, eps: float = SPECTRUM_EPS) -> torch.Tensor:
    """SSD-GAN's reduced spectrum (Chen et al., AAAI 2021, Sec. 3.3): the power spectrum of the image's luminance
    (the mean of its channels), averaged over rings of equal spatial frequency (azimuthal integration) and taken
    as a log, ``[N, rings]`` from DC out to the corners. Differentiable, so R1/R2 see it too."""
    gray = x.float().mean(1)
    power = torch.fft.fft2(gray, norm="ortho").abs().square().flatten(1)  # [N, H*W]
    rings = spectrum_rings(gray.shape[-1]).to(x.device)
    n = int(rings.max()) + 1
    total = power.new_zeros(len(x), n).index_add_(1, rings, power)
    return torch.log(total / torch.bincount(rings, minlength=n).to(power.dtype) + eps).to(x.dtype)


def frequency_spectrum(x: torch.Tensor, eps: float = SPECTRUM_EPS) -> torch.Tensor:
    """The log power of every spatial frequency of the image's luminance, ``[N, H * (W // 2 + 1)]`` (the real 2D
    FFT's half plane): the reduced spectrum before its rings are averaged, so a texture's few peaks (the
    checker's, the stripes' along their direction) stay apart from every other frequency at their distance."""
    power = torch.fft.rfft2(x.float().mean(1), norm="ortho").abs().square().flatten(1)
    return torch.log(power + eps).to(x.dtype)


# The weight of a pixel template's energy ``sqrt(c^2 + eps)`` in D's logit: fixed, not learned. Learned (from 0 or
# from 0.25), it random-walked within 0.05 of 0 in fine-tunes of 50-300 steps: while the templates are random its
# gradient has no sign, and the templates' own gradient is proportional to it. Fixed, each template is turned
# towards a direction along which real images have more energy than G's, whatever the sign.
TEMPLATE_A = 0.5
# ``b``, the learned weight of the signed ``c`` (which phase of a pattern), is stored divided by this gain (an
# equalised learning rate, as for TextureEmbedding).
TEMPLATE_GAIN = 100.0
# The templates are used at unit norm, so their stored scale is their learning rate's inverse: at this scale an
# Adam step of 2e-4 turns a template by a few percent, at 1 (randn) by 0.02% and a fine-tune never learns one.
TEMPLATE_INIT_STD = 5e-3


class PixelTemplates(nn.Module):
    """D's full-resolution view fixed to the pixel grid (``GANConfig.pixel_templates``; ours, not from a paper).

    ``K`` learned templates ``T_k`` ``[3, H, W]``, each used at unit norm, correlated with the image less its
    per-channel mean: ``c_k = <x - mean(x), T_k>``; the realness ``sum_k a sqrt(c_k^2 + eps) + b_k c_k`` is added to
    every logit ``D(x, y)``, unconditionally, with ``a = TEMPLATE_A`` fixed and ``b`` learned from 0. D's
    convolutions and pooling are translation-equivariant and average a faint pattern away by 4x4; a pattern fixed
    to the pixel grid (the shapes data's checkered and striped backgrounds, benchmarks/gan.md "Backgrounds") is
    one direction of pixel space, which one template can hold, and then D's gradient at G's images points straight
    at it. The templates start random, so at the start they add about as much to a real image's logit as to a
    fake's.

    With texture labels (``num_textures``; :class:`TextureEmbedding`) ``b`` depends on the image's texture label
    too, ``b_k + b_{t,k}`` (the second table learned from 0): a projection of the correlations on the label, so
    that D can ask a fake labelled checkered for the checker and one labelled plain for none, rather than every
    fake for a little of it (a realness convex in ``c`` cannot score a mixture of patterned and plain images
    above a faint pattern on all of them).

    With ``curvature`` ``q > 0`` each template's realness loses ``q / 2 c_k^2``: without it the realness only rises
    with ``|c_k|`` (convex), so D can never tell G it has drawn too much of a template, and G, asked for a
    template's pattern, overshoots without end (benchmarks/gan.md, "Pixel templates under texture labels"); with
    it, D's realness along ``c_k`` peaks at ``(b +- a) / q``, which D moves to where the real images are."""

    def __init__(self, num_templates: int, resolution: int, num_textures: int = 0, curvature: float = 0.0):
        super().__init__()
        self.curvature = curvature
        self.templates = nn.Parameter(TEMPLATE_INIT_STD * torch.randn(num_templates, 3, resolution, resolution))
        self.weight = nn.Parameter(torch.zeros(num_templates))  # b / TEMPLATE_GAIN
        # b_{t,k} / TEMPLATE_GAIN, per texture label
        self.texture_weight = nn.Parameter(torch.zeros(num_textures, num_templates)) if num_textures else None

    def correlations(self, x: torch.Tensor) -> torch.Tensor:
        """``c_k``, ``[N, K]``."""
        t = self.templates / self.templates.flatten(1).norm(dim=1).clamp_min(1e-8).view(-1, 1, 1, 1)
        x = x.to(t.dtype)
        return torch.einsum("nchw,kchw->nk", x - x.mean((2, 3), keepdim=True), t)

    def forward(self, x: torch.Tensor, textures: torch.Tensor | None = None) -> torch.Tensor:
        """The realness ``[N]``; ``textures`` (the images' texture labels) where the templates have per-label
        weights, else None (then the shared ``b`` alone)."""
        c = self.correlations(x)
        b = self.weight
        if textures is not None and self.texture_weight is not None:
            b = b + self.texture_weight[textures]
        r = TEMPLATE_A * (c.square() + 1e-4).sqrt() + TEMPLATE_GAIN * b * c
        if self.curvature:
            r = r - self.curvature / 2 * c.square()
        return r.sum(1)


class Discriminator(nn.Module):
    """Projection discriminator mirroring the generator; ``magnitudes`` holds per-stage activation RMS."""

    def __init__(self, cfg: GANConfig):
        super().__init__()
        self.cfg = cfg
        mp, cen = cfg.weight_norm, cfg.centering
        self.widths = widths = cfg.widths[::-1]  # from full resolution down to 4x4
        self.from_rgb = Conv(3, widths[0], 1, bias=True, mp=mp, centering=False, init_gain=LRELU_GAIN_R3GAN)
        self.stages, self.transitions = _stages(widths, cfg)
        c4 = widths[-1]
        cin = c4 + (1 if cfg.mbstd_group else 0)  # the minibatch-stddev channel
        if cfg.ff_heads:
            self.head1 = Conv(cin, 2 * c4, 1, bias=True, mp=mp, centering=cen, init_gain=LRELU_GAIN_R3GAN)
            self.basis = Conv(2 * c4, 2 * c4, 4, groups=2 * c4 // cfg.group_channels, mp=mp, centering=cen,
                              init_gain=LRELU_GAIN_R3GAN)
            self.head2 = Linear(2 * c4, cfg.embed_dim, mp=mp, centering=cen)
        else:
            self.basis = Conv(cin, cin, 4, groups=cin, mp=mp, centering=cen)
            self.head2 = Linear(cin, cfg.embed_dim, mp=mp, centering=cen)
        if cfg.shared_class_init:
            self.class_embed = ClassEmbedding(cfg.num_classes, cfg.embed_dim)
        else:
            self.class_embed = Linear(cfg.num_classes, cfg.embed_dim, mp=mp, centering=False,
                                      init_gain=1 / math.sqrt(cfg.embed_dim) * math.sqrt(cfg.num_classes))
        pooled_dim = 2 * c4 if cfg.ff_heads else cin
        self.class_head = Linear(pooled_dim, cfg.num_classes, bias=True, mp=mp, centering=False) \
            if cfg.separate_class_head else None
        # SSD-GAN's frequency-aware classifier, zero at the start (so a fine-tune starts from the spatial D)
        self.spectral = None
        if cfg.spectral_weight:
            self.spectral = nn.Linear(int(spectrum_rings(cfg.resolution).max()) + 1, 1, bias=False)
            nn.init.zeros_(self.spectral.weight)
        self.texture_embed = (TextureEmbedding(cfg.num_textures, cfg.embed_dim, cfg.texture_gain)
                              if cfg.num_textures else None)
        self.templates = (PixelTemplates(cfg.pixel_templates, cfg.resolution, cfg.num_textures,
                                         cfg.template_curvature) if cfg.pixel_templates else None)
        self.magnitudes: list[float] = []
        self.track_magnitudes = False

    def spectral_logit(self, x: torch.Tensor) -> torch.Tensor | float:
        """``w C(phi(x))``, ``[N]``: SSD-GAN's spectral realness (Sec. 3.3), added to every logit ``D(x, y)``.

        SSD-GAN mixes ``lambda D(x) + (1 - lambda) C(phi(x))``; here D keeps its own scale and ``w`` weighs
        ``C`` (the same family up to D's learned scale), so that ``spectral_weight`` 0 is R3GAN's D exactly.
        ``C`` is unconditional: the textures do not depend on the class."""
        if self.spectral is None:
            return 0.0
        return self.cfg.spectral_weight * self.spectral(reduced_spectrum(x).to(self.spectral.weight.dtype))[:, 0]

    def template_logit(self, x: torch.Tensor, textures: torch.Tensor | None = None) -> torch.Tensor | float:
        """The pixel templates' realness (:class:`PixelTemplates`; under the texture labels where given), ``[N]``;
        0 without them."""
        return 0.0 if self.templates is None else self.templates(x, textures)

    def class_free_logit(self, x: torch.Tensor, textures: torch.Tensor | None = None) -> torch.Tensor | float:
        """What D adds to the class projection, the part that does not depend on the class: the spectral and
        template parts (the templates' under the texture label, where given)."""
        return self.spectral_logit(x) + self.template_logit(x, textures)

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk and the head up to the 4x4 basis: one vector per image, the input of the last linear layer."""
        cfg = self.cfg
        mags = []
        x = self.from_rgb(x)
        if not cfg.linear_extraction:
            x = lrelu(x, cfg.mp_lrelu)
        var: float | torch.Tensor = 1.0
        for i, blocks in enumerate(self.stages):
            for block in blocks:
                x, var = block(x, var)
            x = _unit(x, var)
            var = 1.0
            if self.track_magnitudes:  # per-channel RMS over space, mean over channels and batch
                mags.append(float(x.detach().square().mean((2, 3)).sqrt().mean()))
            if i + 1 < len(self.stages):
                if cfg.free_transitions:
                    x = downsample_free(x, self.widths[i + 1])
                else:
                    x = self.transitions[i](F.avg_pool2d(x, 2))
        if cfg.mbstd_group:
            x = minibatch_stddev(x, cfg.mbstd_group)
        if cfg.ff_heads:
            h = lrelu(self.head1(x), cfg.mp_lrelu)
            h = lrelu(self.basis(h), cfg.mp_lrelu)[:, :, 0, 0]
        else:
            h = self.basis(x)[:, :, 0, 0]
        if self.track_magnitudes:
            self.magnitudes = mags
        return h

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The image's embedding ``h`` ``[N, embed_dim]``: :meth:`pooled` and the last linear layer."""
        return self.head2(self.pooled(x))

    def project(self, h: torch.Tensor, class_labels: torch.Tensor, textures: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``D(x, y) = h . e_y / sqrt(dim)`` from the embedding ``h``; with texture labels
        ``h . (e_y + t_k) / sqrt(dim)`` (``textures`` None: the class term alone)."""
        e = self.class_table().to(h.dtype)[class_labels]
        if textures is not None:
            if self.texture_embed is None:
                raise ValueError("this discriminator has no texture labels (num_textures=0); leave textures out.")
            e = e + self.texture_embed(textures).to(h.dtype)
        return (h * e).sum(1) / math.sqrt(self.cfg.embed_dim)

    def logits_for_label_matching(self, x: torch.Tensor, class_labels: torch.Tensor,
                                  textures: torch.Tensor | None = None):
        """``(D(x, y), logits [N, num_classes])`` in one forward: the logits the label-matching term trains.

        The projection logits under every class (:meth:`class_logits`), or with ``separate_class_head`` a
        linear classifier of its own on :meth:`pooled`, which leaves the projection to the adversarial loss.
        """
        p = self.pooled(x)
        h = self.head2(p)
        own = self.project(h, class_labels, textures) + self.class_free_logit(x, textures)
        return own, (self.class_head(p) if self.class_head is not None else self.project_all(h))

    def project_all(self, h: torch.Tensor) -> torch.Tensor:
        """``h . e_c / sqrt(dim)`` under every class ``c``, ``[N, num_classes]``."""
        return h @ self.class_table().to(h.dtype).T / math.sqrt(self.cfg.embed_dim)

    def class_table(self) -> torch.Tensor:
        """Every class's embedding ``e_c``, ``[num_classes, embed_dim]``."""
        cfg = self.cfg
        if cfg.shared_class_init:
            return normalize(self.class_embed.weight, self.class_embed.centering).flatten(1)
        eye = torch.eye(cfg.num_classes, device=self.class_embed.weight.device)
        return self.class_embed(eye * math.sqrt(cfg.num_classes))

    def class_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The projection logit under every class, ``[N, num_classes]``: ``D(x, c) = h(x) . e_c / sqrt(dim)``
        (Miyato & Koyama 2018, without the unconditional term, as in R3GAN). Read as a classifier's logits,
        they are what the label-matching term of ``kinegen train gan --class-weight`` trains (Han et al. 2021)."""
        return self.project_all(self.features(x))

    def forward(self, x: torch.Tensor, class_labels: torch.Tensor, textures: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The projection logit ``D(x, y)`` of each image under its own label (and texture, when given; plus
        :meth:`class_free_logit`: the spectral and pixel-template parts where they are on), ``[N]``."""
        return self.project(self.features(x), class_labels, textures) + self.class_free_logit(x, textures)


def renormalize_(module: nn.Module) -> None:
    """Forced weight normalisation of every MP layer in ``module`` (call after each optimiser step)."""
    for m in module.modules():
        if isinstance(m, Conv):
            m.renormalize_()
