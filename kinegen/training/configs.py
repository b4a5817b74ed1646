"""Training settings, one dataclass per run (kept free of heavy imports so the CLI can list them)."""

from __future__ import annotations

import dataclasses

from ..models.mpgan_config import GANConfig


@dataclasses.dataclass
class VAETrainConfig:
    steps: int = 2200
    batch_size: int = 4
    lr: float = 5e-4
    frames: int = 9
    crop: int = 64
    stats_clips: int = 64  # clips measured for latents_mean/std at the end
    init: str | None = None  # start from this VAE folder instead of random weights
    decoder_only: bool = False  # train only the decoder (needs --init): latents, and so the transformer, unchanged
    object_weight: float = 4.0  # extra loss weight on object pixels
    first_frame_weight: float = 1.0  # loss weight of video frame 0 (the causal VAE codes it alone)
    first_frame_noise: float = 0.0  # max std of extra noise on latent frame 0 (units of latents_std); 0 = none
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 200


@dataclasses.dataclass
class T2VTrainConfig:
    vae: str = "runs/vae/vae"
    steps: int = 6000
    batch_size: int = 8
    lr: float = 5e-4
    dataset_clips: int = 3072
    frames: int = 17
    size: int = 128
    cfg_dropout: float = 0.1
    flow_shift: float = 3.0
    ema: float = 0.999
    object_weight: float = 4.0  # extra loss weight on latent pixels an object covers (0 = plain MSE)
    first_frame_weight: float = 1.0  # loss weight of latent frame 0 (the VAE decodes it most sensitively)
    init: str | None = None  # start from this pipeline folder's transformer and text encoder (a further stage)
    shape_weights: str = ""  # sample clips by their first shape more or less often, e.g. "star=2"
    sizes: str = ""  # further sizes and their share of steps, e.g. "256x33=0.6,384x57=0.1" (positions interpolated)
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 250


@dataclasses.dataclass
class ARTrainConfig:
    """Diffusion forcing of the bundled text-to-video model into a chunk-by-chunk one (docs/autoregressive.md)."""

    init: str = ""  # the pipeline folder to start from (default: the bundled kinegen-shapes-t2v)
    steps: int = 4000
    batch_size: int = 8
    lr: float = 2e-4
    dataset_windows: int = 2048  # training windows of long videos, encoded once
    frames: int = 33  # video frames per training window (4k + 1)
    size: int = 128
    chunk_frames: int = 2  # latent frames per chunk after the first (of one latent frame)
    offset_prob: float = 0.5  # share of windows starting later in the video than frame 0
    max_start: int = 208  # latest start frame of a window (a multiple of 4)
    teacher_forcing: bool = True  # each chunk denoised against the clean chunks before it, as the sampler runs
    clean_prob: float = 0.25  # without teacher forcing: share of chunks given no noise (clean history)
    cache_layout: bool = True  # train later windows after the sink at position 0, as the rolling cache holds them
    recycle_prob: float = 0.5  # share of steps whose clean history is the model's own estimate of it (error recycling)
    recycle_sigma: float = 0.5  # the highest noise level that estimate is made from
    context_noise: float = 0.0  # teacher forcing: the clean copy noised to this level, as the export commits chunks
    cfg_dropout: float = 0.1
    flow_shift: float = 3.0
    ema: float = 0.999
    guidance: float = 4.0  # the exported pipeline's default guidance scale (chosen by benchmarks/autoregressive.md)
    sink_frames: int = 1  # the exported pipeline's KV cache: a frame sink ...
    window_frames: int = 9  # ... and a rolling window, in latent frames
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 250


@dataclasses.dataclass
class DASATrainConfig:
    """Dynamics-guided distillation of a chunk-by-chunk model for DASA (docs/dasa.md, "Distillation")."""

    init: str = ""  # the chunk-by-chunk pipeline folder to distil (default: the bundled kinegen-shapes-ar)
    dasa: str = "keep=0.3,compute=reuse"  # the DASA settings the student runs with (as in --attention dasa:...)
    steps: int = 120  # rollouts, one optimizer step each
    lr: float = 3e-5
    frames: int = 41  # video frames per rollout (4k + 1)
    size: int = 128
    sample_steps: int = 20  # denoising steps per chunk, as the model samples
    loss_steps: int = 3  # denoising steps of each chunk after the first with a loss (drawn at random)
    guidance: float | None = None  # guidance scale of the rollouts (default: the model's)
    dynamic_weight: float = 4.0  # lambda in the loss weight 1 + lambda * dynamic
    train: str = "all"  # parameters trained: all, or attention (self-attention and its norm)
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 10


@dataclasses.dataclass
class AdherenceTrainConfig:
    steps: int = 2000
    batch_size: int = 16
    lr: float = 2e-3
    seed: int = 1
    max_minutes: float | None = None
    checkpoint_every: int = 200


# The GAN's starting learning rate per variant. MP: 3e-3 at our batch of 32 (EDM2's and R3GAN2's 1e-2 is
# for batches of 512-4096; at batch 32 it reached FD 125 against 96 for 3e-3 in benchmarks/gan.md).
# R3GAN: its paper's 2e-4.
GAN_DEFAULT_LR = {"mp": 3e-3, "r3gan": 2e-4}


@dataclasses.dataclass
class GANTrainConfig:
    """``resolution`` and ``widths`` default to :class:`kinegen.models.mpgan_config.GANConfig`'s, and the
    default variant ``mp`` is its switches (all on); the rest of the network is GANConfig's defaults."""

    data: str = "shapes"  # "shapes" or "imagefolder:PATH"
    variant: str = "mp"  # "mp" (all magnitude-preserving changes) or "r3gan" (baseline)
    ablate: str = ""  # MP switches to turn off, comma-separated, e.g. "centering,mp_lrelu" (docs/gan.md)
    resolution: int = GANConfig.resolution  # image size, a power of two >= 8
    widths: str = ",".join(map(str, GANConfig.widths))  # channels per stage, 4x4 up (until 2026-11-30: 128,128,96,64)
    steps: int = 3000
    batch_size: int = 32
    lr: float = 0.0  # 0 = the variant's default (MP 3e-3, R3GAN 2e-4), decayed 10x by a cosine to the end
    gamma: float = 1.0  # R1/R2 weight at the start, decayed 10x by a cosine
    class_weight: float = 0.0  # label-matching term (D classifies real images, G its own); 0 = R3GAN's loss alone
    g_class_share: float = 1.0  # G's label-matching weight as a share of class_weight (1 = D's; 0 = D's side only)
    diversity_weight: float = 0.0  # diversity-sensitive term for G (two z per label); 0 = R3GAN's loss alone
    diversity_bound: float = 0.3  # its bound tau: image L1 per unit of latent L1 (the shapes data's own: 0.32)
    spectrum_match: float = 0.0  # G's sliced-Wasserstein match of its batch's reduced spectra to the reals'; 0 = off
    spectrum_space: str = "rings"  # its spectra: "rings" (reduced, log power per ring) or "frequencies" (2D, each)
    separate_class_head: bool = False  # the label-matching term trains a classifier head of D's own, not the projection
    positional_channels: int = 0  # G's learned positional map per stage from 8x8 (Xu et al. 2021); 0 = off
    positional_gain: float = 1.0  # those maps' learning-rate gain (stored / gain, used x gain; ProGAN's equalised lr)
    noise_inputs: bool = False  # G's StyleGAN noise inputs, one Gaussian image per stage from 8x8 (Karras et al. 2019)
    noise_per_texture: bool = False  # their weights per texture label (needs --texture-labels; benchmarks/gan.md)
    noise_max_resolution: int = 0  # the last stage with a noise input (8 = 8x8 only); 0 = every stage from 8x8
    g_texture_conditioning: str = "input"  # where G takes the texture label: "input" or "stages" (benchmarks/gan.md)
    noise_weight_init: float = 0.0  # their per-channel weights at step 0 where new (0 is a saddle: benchmarks/gan.md)
    spectral_weight: float = 0.0  # weight of D's SSD-GAN classifier on the reduced spectrum (Chen et al. 2021); 0 = off
    pixel_templates: int = 0  # D's learned full-resolution templates fixed to the pixel grid (ours); 0 = off
    template_curvature: float = 0.0  # their realness less q/2 c^2 per template, so that it peaks; 0 = off
    texture_labels: bool = False  # the background texture as a second label of G and D (shapes data); off = R3GAN
    init: str | None = None  # start G and D from this GAN run's checkpoint (a fine-tune; may add the four above)
    mbstd_group: int = 0  # D's minibatch stddev over groups of this many images of one class (ProGAN); 0 = off
    dataset_images: int = 20000  # procedural images (the "shapes" data) drawn from a fixed pool
    out_gain_init: float = 1.0  # MP generator's learned output gain at step 0 (runs before 2026-11-30: 0)
    ema_sigma_rels: str = "0.05,0.10"
    snapshot_every: int = 250
    magnitude_every: int = 50  # D's per-stage magnitudes and its class margins on real images, into log.jsonl
    eval_every: int = 0  # 0 = off; else every N steps G's EMA's class accuracy, FD, KID... into eval.jsonl (shapes)
    eval_images: int = 600  # generated and held-out real images per evaluation during training
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 250


@dataclasses.dataclass
class GANClassifierTrainConfig:
    steps: int = 800
    batch_size: int = 64
    resolution: int = 32
    seed: int = 0


@dataclasses.dataclass
class OmniTrainConfig:
    """The small omni model ``kinegen-shapes-omni`` (docs/omniselect.md, "The omni model")."""

    steps: int = 4000
    batch_size: int = 16
    lr: float = 1e-3
    describe_share: float = 0.1  # share of questions that ask for a caption ("describe the video.")
    both_weight: float = 2.0  # questions that need picture and sound drawn this many times as often
    probe_weight: float = 1.0  # the encoder probes' loss (kinegen.training.omni, "Encoder probes")
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 200


@dataclasses.dataclass
class RelevanceTrainConfig:
    """The tri-modal relevance scorer OmniSelect reads (docs/omniselect.md, "Relevance")."""

    steps: int = 1500
    batch_size: int = 64  # clips per step: one frame and one half-second audio segment of each
    lr: float = 2e-3
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 250
