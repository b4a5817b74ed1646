"""``kinegen train gan``: the R3GAN recipe for the MP-GAN (or the R3GAN baseline), resumable.

Per step (Huang et al. 2024, Sec. 3; EDM2 for the MP parts):

1. D step on a real batch and a generated batch: relativistic pairing loss plus ``gamma/2`` times
   the R1 and R2 penalties through the double backward (:mod:`kinegen.training.gan_loss`).
2. G step: the relativistic loss the other way round, on fresh latents.
3. After each optimiser step, forced weight normalisation of every MP layer; then the power-function
   EMAs of G are updated (:mod:`kinegen.training.phema`), and their snapshots saved now and then so
   that any EMA length can be reconstructed after training.

Schedules (cosine over the run): learning rate and ``gamma`` from their start values to a tenth,
Adam's beta2 from 0.9 to 0.99 (beta1 = 0). Every ``magnitude_every`` steps the discriminator's
per-stage activation RMS on real images is logged (the magnitude diagnostic), with its class margins:
how much higher D scores a real image under its own class than under another one (``d_margin_class``)
and, on the shapes data, than under the same colour with another shape (``d_margin_shape``), and how
often it does (``d_win_class``, ``d_win_shape``). A projection discriminator can only teach the generator
a class distinction that it makes itself.
Every ``eval_every`` steps G's EMA is measured against held-out images (:class:`TrainingEval`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..models.mpgan import NOISE_GAIN, Discriminator, Generator, draw_latents, renormalize_
from ..models.mpgan_config import MP_SWITCHES, GANConfig
from .common import Progress, TimeBox, load_checkpoint
from .configs import GAN_DEFAULT_LR, GANTrainConfig
from .gan_loss import SPECTRUM_SPACES, discriminator_loss, diversity_term, generator_loss, spectrum_term
from .phema import PowerEMA


def network_config(cfg: GANTrainConfig, num_classes: int) -> GANConfig:
    try:
        widths = tuple(int(w) for w in str(cfg.widths).replace("/", ",").split(",") if w.strip())
    except ValueError:
        raise ConfigError(f"widths must be integers separated by commas, e.g. 128,128,128,64; got "
                          f"{cfg.widths!r}.") from None
    if cfg.variant not in GAN_DEFAULT_LR:
        raise ConfigError(f"variant must be 'mp' or 'r3gan', got {cfg.variant!r}.")
    if cfg.spectrum_space not in SPECTRUM_SPACES:
        raise ConfigError(f"--spectrum-space must be one of {', '.join(SPECTRUM_SPACES)}; got {cfg.spectrum_space!r}.")
    flags = {k: cfg.variant == "mp" for k in MP_SWITCHES}
    for name in filter(None, (a.strip() for a in cfg.ablate.split(","))):
        if name not in MP_SWITCHES:
            raise ConfigError(f"ablate: unknown switch {name!r}; valid: {', '.join(MP_SWITCHES)}.")
        flags[name] = False
    if cfg.g_texture_conditioning == "stages" and not (cfg.texture_labels and cfg.positional_channels):
        raise ConfigError("--g-texture-conditioning stages scales G's positional maps per texture label: set "
                          "--texture-labels true and --positional-channels too.")
    if cfg.noise_weight_init and not cfg.noise_inputs:
        raise ConfigError("--noise-weight-init sets the noise inputs' weights: set --noise-inputs true too.")
    if cfg.noise_per_texture and not (cfg.noise_inputs and cfg.texture_labels):
        raise ConfigError("--noise-per-texture gives the noise inputs a weight row per texture label: set "
                          "--noise-inputs true and --texture-labels true too.")
    if cfg.separate_class_head and not cfg.class_weight:
        raise ConfigError("--separate-class-head is the label-matching term's classifier: set --class-weight too.")
    if cfg.mbstd_group and cfg.batch_size % cfg.mbstd_group:
        raise ConfigError(f"--batch-size ({cfg.batch_size}) must be a multiple of --mbstd-group ({cfg.mbstd_group}).")
    prior = ()
    if cfg.texture_labels:
        from ..data.shape_images import TEXTURE_PRIOR

        prior = TEXTURE_PRIOR
    try:
        return GANConfig(resolution=cfg.resolution, num_classes=num_classes, widths=widths,
                         mbstd_group=cfg.mbstd_group, separate_class_head=cfg.separate_class_head,
                         positional_channels=cfg.positional_channels, positional_gain=cfg.positional_gain,
                         noise_inputs=cfg.noise_inputs, noise_per_texture=cfg.noise_per_texture,
                         noise_max_resolution=cfg.noise_max_resolution,
                         g_texture_conditioning=cfg.g_texture_conditioning,
                         spectral_weight=cfg.spectral_weight,
                         pixel_templates=cfg.pixel_templates, template_curvature=cfg.template_curvature,
                         num_textures=len(prior), texture_prior=prior, **flags)
    except ValueError as e:
        raise ConfigError(f"GAN settings: {_as_flags(str(e))}") from None


def _as_flags(message: str) -> str:
    """A GANConfig error in the words of ``kinegen train gan``: each field that is a flag, as that flag."""
    names = sorted((f.name for f in dataclasses.fields(GANTrainConfig) if "_" in f.name), key=len, reverse=True)
    return re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


# ---------------------------------------------------------------------------- data


class ShapesData:
    """The procedural shape images (:mod:`kinegen.data.shape_images`), rendered on the fly."""

    def __init__(self, resolution: int, pool: int):
        from ..data.shape_images import DEFAULT_CLASSES, class_names

        self.resolution, self.pool = resolution, pool
        self.classes = class_names(DEFAULT_CLASSES)
        self._pairs = DEFAULT_CLASSES

    def other_shape(self, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """For each label, a class of the same colour and another shape (chosen at random)."""
        out = []
        for y in labels.tolist():
            colour, shape = self._pairs[y]
            same = [i for i, (c, s) in enumerate(self._pairs) if c == colour and s != shape]
            out.append(same[int(torch.randint(len(same), (1,), generator=gen))])
        return torch.tensor(out, dtype=labels.dtype)

    def grouped_indices(self, rng: np.random.Generator, n: int, group: int) -> np.ndarray:
        """``n`` pool indices whose images ``i, i + n/group, ...`` share a class (for D's minibatch stddev)."""
        k = len(self.classes)
        labels = np.tile(rng.integers(0, k, n // group), group)
        return rng.integers(0, self.pool // k, n) * k + labels

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        from ..data.shape_images import batch

        idx = indices % self.pool
        labels = idx % len(self.classes)
        imgs = batch(idx, labels, self.resolution)
        return _to_tensor(imgs), torch.from_numpy(labels).long()

    def textures(self, indices: np.ndarray) -> torch.Tensor:
        """The background texture (an index in ``kinegen.data.shapes.TEXTURES``) of each image of :meth:`batch`."""
        from ..data.shape_images import image_texture

        idx = indices % self.pool
        return torch.tensor([image_texture(int(i), int(i) % len(self.classes)) for i in idx], dtype=torch.long)


class FolderData:
    """Images in ``PATH/<class>/*.png|jpg|...`` (or directly in ``PATH``: one class), all one size."""

    EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

    def __init__(self, path: str, resolution: int):
        from PIL import Image

        root = Path(path)
        if not root.is_dir():
            raise ConfigError(f"imagefolder: {root} is not a folder.")
        subdirs = sorted(p for p in root.iterdir() if p.is_dir())
        groups = [(d.name, sorted(f for f in d.iterdir() if f.suffix.lower() in self.EXTS)) for d in subdirs]
        groups = [(n, fs) for n, fs in groups if fs]
        if not groups:
            files = sorted(f for f in root.iterdir() if f.suffix.lower() in self.EXTS)
            groups = [("image", files)] if files else []
        if not groups:
            raise ConfigError(f"imagefolder: no images ({', '.join(self.EXTS)}) in {root} or its subfolders.")
        images, labels, sizes = [], [], {}
        for label, (_, files) in enumerate(groups):
            for f in files:
                with Image.open(f) as im:
                    arr = np.asarray(im.convert("RGB"))
                sizes.setdefault(arr.shape[:2], f)
                images.append(arr)
                labels.append(label)
        if len(sizes) > 1:
            examples = "; ".join(f"{w}x{h} ({p.name})" for (h, w), p in list(sizes.items())[:3])
            raise ConfigError(f"imagefolder: images have mixed sizes ({examples}); resize them all to "
                              f"{resolution}x{resolution} first.")
        (h, w) = next(iter(sizes))
        if (h, w) != (resolution, resolution):
            raise ConfigError(f"imagefolder: images are {w}x{h} but --resolution is {resolution}; resize the "
                              "images or pass --resolution to match (a power of two).")
        self.images = np.stack(images)
        self.labels = np.asarray(labels)
        self.classes = [n for n, _ in groups]
        self.pool = len(self.images)

    def grouped_indices(self, rng: np.random.Generator, n: int, group: int) -> np.ndarray:
        """``n`` indices whose images ``i, i + n/group, ...`` share a class (for D's minibatch stddev)."""
        first = rng.integers(0, self.pool, n // group)
        same = [rng.choice(np.flatnonzero(self.labels == self.labels[i]), group - 1) for i in first]
        return np.concatenate([first[None], np.stack(same).T]).reshape(-1)

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = indices % self.pool
        return _to_tensor(self.images[idx]), torch.from_numpy(self.labels[idx]).long()


def _to_tensor(imgs: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def make_data(cfg: GANTrainConfig):
    if cfg.texture_labels and cfg.data != "shapes":
        raise ConfigError("--texture-labels needs the shapes data (its images know their background texture); "
                          f"got --data {cfg.data}.")
    if cfg.data == "shapes":
        return ShapesData(cfg.resolution, cfg.dataset_images)
    if cfg.data.startswith("imagefolder:"):
        return FolderData(cfg.data.split(":", 1)[1], cfg.resolution)
    raise ConfigError(f"data must be 'shapes' or 'imagefolder:PATH', got {cfg.data!r}.")


# ---------------------------------------------------------------------------- training


def ema_sigmas(cfg: GANTrainConfig) -> tuple[float, ...]:
    """``ema_sigma_rels`` ("0.05,0.10") as numbers, each a valid relative EMA width."""
    from .phema import sigma_rel_to_gamma

    try:
        sigmas = tuple(float(s) for s in cfg.ema_sigma_rels.split(","))
        for s in sigmas:
            sigma_rel_to_gamma(s)
    except ValueError:
        raise ConfigError(f"ema_sigma_rels must be numbers in (0, 0.28) separated by commas, e.g. 0.05,0.10; got "
                          f"{cfg.ema_sigma_rels!r}.") from None
    return sigmas


def start_from_run(init: Path, net: GANConfig, g: Generator, d: Discriminator) -> None:
    """Load G and D from another run's checkpoint (``--init RUN``): a fine-tune with a fresh optimiser and
    schedule. The networks must be the run's, except that G may add positional maps (``positional_channels``) or
    change their learning-rate gain (``positional_gain``: the loaded maps are rescaled to draw the same), add
    noise inputs (``noise_inputs``, ``noise_per_texture``) or drop those above ``noise_max_resolution``, and move
    the texture label from G's input to its stages (``g_texture_conditioning``: G's texture vectors are dropped),
    D the spectral classifier (``spectral_weight``) and pixel templates (``pixel_templates``), and both texture
    labels (``num_textures``), which then start as they are at initialisation (a no-op, except for the pixel
    templates: random, at a small weight)."""
    from safetensors.torch import load_file

    ckpt = init / "checkpoint"
    if not (ckpt / "generator.safetensors").is_file() or not (ckpt / "discriminator.safetensors").is_file():
        raise ConfigError(f"--init {init}: no GAN checkpoint there (checkpoint/generator.safetensors and "
                          "discriminator.safetensors); give the --run folder of an earlier kinegen train gan.")
    src = load_run_config(init)
    if src.positional_channels and src.positional_channels != net.positional_channels:
        raise ConfigError(f"--init {init} has {src.positional_channels} positional channels; use the same number.")
    if src.spectral_weight and src.spectral_weight != net.spectral_weight:
        raise ConfigError(f"--init {init} has --spectral-weight {src.spectral_weight}; use the same weight.")
    if src.pixel_templates and src.pixel_templates != net.pixel_templates:
        raise ConfigError(f"--init {init} has --pixel-templates {src.pixel_templates}; use the same number.")
    if src.num_textures and src.num_textures != net.num_textures:
        raise ConfigError(f"--init {init} was trained with texture labels; keep --texture-labels true.")
    if src.noise_inputs and not net.noise_inputs:
        raise ConfigError(f"--init {init} has noise inputs; keep --noise-inputs true.")
    if src.g_texture_conditioning == "stages" and net.g_texture_conditioning != "stages":
        raise ConfigError(f"--init {init} takes the texture label at G's stages; keep --g-texture-conditioning stages.")
    if src.noise_inputs and src.noise_per_texture != net.noise_per_texture:
        rows = "a weight row per texture label" if src.noise_per_texture else "one weight row"
        raise ConfigError(f"--init {init} has noise inputs with {rows}; keep --noise-per-texture "
                          f"{str(src.noise_per_texture).lower()}.")
    if dataclasses.replace(src, positional_channels=net.positional_channels, positional_gain=net.positional_gain,
                           noise_inputs=net.noise_inputs, noise_per_texture=net.noise_per_texture,
                           noise_max_resolution=net.noise_max_resolution,
                           g_texture_conditioning=net.g_texture_conditioning,
                           spectral_weight=net.spectral_weight,
                           pixel_templates=net.pixel_templates, template_curvature=net.template_curvature,
                           num_textures=net.num_textures,
                           texture_prior=net.texture_prior, texture_gain=net.texture_gain) != net:
        diff = [f.name for f in dataclasses.fields(net) if getattr(src, f.name) != getattr(net, f.name)]
        raise ConfigError(f"--init {init} is another network (it differs in {', '.join(diff)}); give the same "
                          "--variant, --widths and switches as that run (only --positional-channels, --spectral-weight "
                          "and --pixel-templates may be added, --positional-gain and --template-curvature set, "
                          "--noise-inputs, --noise-per-texture and --texture-labels turned on, "
                          "--noise-max-resolution set, and --g-texture-conditioning set to stages).")
    missing_d, unexpected_d = d.load_state_dict(load_file(str(ckpt / "discriminator.safetensors")), strict=False)
    new_d = ("spectral.weight", "texture_embed.weight", "templates.templates", "templates.weight",
             "templates.texture_weight")
    if unexpected_d or any(k not in new_d for k in missing_d):
        raise ConfigError(f"--init {init}: its discriminator's weights do not fit (missing {missing_d}, unexpected "
                          f"{unexpected_d}).")
    g_state = load_file(str(ckpt / "generator.safetensors"))
    if net.g_texture_conditioning == "stages":
        g_state.pop("texture_embed.weight", None)  # from input to stages: G's texture vectors are dropped
    dropped = [k for k in g_state if k.startswith("noise.") and int(k.split(".")[1]) >= len(g.noise)]
    for k in dropped:  # a lower --noise-max-resolution: the noise inputs of the stages above it are dropped
        del g_state[k]
    for k in [k for k in g_state if k.startswith("positional.") and k.endswith(".map")]:
        g_state[k] = g_state[k] * (src.positional_gain / net.positional_gain)  # the same P under the new gain
    missing, unexpected = g.load_state_dict(g_state, strict=False)
    if unexpected or any(not k.startswith(("positional.", "noise.")) and k != "texture_embed.weight" for k in missing):
        raise ConfigError(f"--init {init}: its generator's weights do not fit (missing {missing}, unexpected "
                          f"{unexpected}).")
    step = json.loads((ckpt / "state.json").read_text())["step"] if (ckpt / "state.json").is_file() else "?"
    positional = [k for k in missing if k.startswith("positional.") and not k.endswith("texture_scale")]
    new = ([f"{len(positional)} positional tensors"] * bool(positional)
           + ["the noise inputs"] * any(k.startswith("noise.") for k in missing)
           + ["the spectral classifier"] * ("spectral.weight" in missing_d)
           + ["the pixel templates (random)"] * ("templates.weight" in missing_d)
           + ["the texture labels"] * ("texture_embed.weight" in missing_d)
           + ["the per-texture scales of the positional maps"] * any(k.endswith("texture_scale") for k in missing))
    print(f"starting from {init} (its step {step})" + (f"; {' and '.join(new)} start as initialised" if new else "")
          + (f"; its noise inputs above {net.noise_max_resolution}x{net.noise_max_resolution} are dropped"
             if dropped else ""), flush=True)


def _cos(step: int, total: int) -> float:
    return 0.5 * (1 + math.cos(math.pi * min(step / max(total, 1), 1.0)))


def train_gan(run_dir: str | Path, cfg: GANTrainConfig) -> Path:
    """Train or resume; returns the folder of the exported generator (EMA reconstructed post hoc)."""
    from safetensors.torch import save_file

    run_dir = Path(run_dir)
    data = make_data(cfg)
    net = network_config(cfg, len(data.classes))
    sigmas = ema_sigmas(cfg)
    if cfg.eval_every < 0:
        raise ConfigError(f"--eval-every is a number of steps (0 = off); got {cfg.eval_every}.")
    evaluator = TrainingEval(run_dir, cfg, data, sigmas, net) if cfg.eval_every else None
    meta_path = run_dir / "run.json"
    # fields added since the run began take their defaults, as when the run was made
    if meta_path.is_file() and load_run_config(run_dir) != net:
        raise ConfigError(f"{run_dir} holds a run with another network configuration; use a new --run folder.")
    torch.manual_seed(cfg.seed)
    g, d = Generator(net), Discriminator(net)
    if g.out_gain is not None:
        with torch.no_grad():
            g.out_gain.fill_(cfg.out_gain_init)
    with torch.no_grad():  # new noise inputs (an --init run's own, and a resumed run's, are loaded over this)
        for m in g.noise:
            m.weight.fill_(cfg.noise_weight_init / NOISE_GAIN)
    if cfg.init and not (run_dir / "checkpoint" / "state.json").is_file():  # a resumed run keeps its own state
        start_from_run(Path(cfg.init), net, g, d)
    run_dir.mkdir(parents=True, exist_ok=True)  # after the settings are known to be good: no empty run folders
    if not meta_path.is_file():
        meta = {"train": dataclasses.asdict(cfg), "network": dataclasses.asdict(net), "classes": data.classes}
        meta_path.write_text(json.dumps(meta, indent=2))
    ema = PowerEMA(g, sigmas)  # the EMAs start again from G (at step 1 they are G)
    lr0 = cfg.lr or GAN_DEFAULT_LR[cfg.variant]
    opt_g = torch.optim.Adam(g.parameters(), lr=lr0, betas=(0.0, 0.9), eps=1e-8)
    opt_d = torch.optim.Adam(d.parameters(), lr=lr0, betas=(0.0, 0.9), eps=1e-8)

    class _Both(torch.optim.Optimizer):  # one object for save/load_checkpoint
        def __init__(self):
            self.param_groups = []

        def state_dict(self):
            return {"g": opt_g.state_dict(), "d": opt_d.state_dict()}

        def load_state_dict(self, sd):
            opt_g.load_state_dict(sd["g"])
            opt_d.load_state_dict(sd["d"])

    both = _Both()
    modules = {"generator": g, "discriminator": d, **{f"ema_{s}": m for s, m in zip(sigmas, ema.modules,
                                                                                       strict=True)}}
    step, _ = load_checkpoint(run_dir, modules, both)
    print(f"GAN ({cfg.variant}): G {sum(p.numel() for p in g.parameters()) / 1e6:.2f}M, "
          f"D {sum(p.numel() for p in d.parameters()) / 1e6:.2f}M parameters, {len(data.classes)} classes; "
          f"starting at step {step}", flush=True)
    snaps = run_dir / "snapshots"
    snaps.mkdir(exist_ok=True)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rng = np.random.default_rng([cfg.seed, step])
        if net.mbstd_group:  # fakes take the reals' labels, so D's groups hold one class, real or fake
            idx = data.grouped_indices(rng, cfg.batch_size, net.mbstd_group)
        else:
            idx = rng.integers(0, 2**31 - 1, cfg.batch_size)
        real, labels = data.batch(idx)
        textures = data.textures(idx) if net.num_textures else None  # fakes are drawn with the reals' textures
        c = _cos(step, cfg.steps)
        lr, gamma, beta2 = lr0 * (0.1 + 0.9 * c), cfg.gamma * (0.1 + 0.9 * c), 0.99 - 0.09 * c
        for opt in (opt_g, opt_d):
            for group in opt.param_groups:
                group["lr"], group["betas"] = lr, (0.0, beta2)
        # D step
        with torch.no_grad():
            fake = g(draw_latents(cfg.batch_size, net, gen), labels, textures)
        loss_d, stats = discriminator_loss(d, real, fake, labels, gamma, cfg.class_weight, textures)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        renormalize_(d)
        # G step
        z = draw_latents(cfg.batch_size, net, gen)
        fake = g(z, labels, textures)
        d.requires_grad_(False)  # the backward then skips D's weight gradients (about a tenth of a step)
        loss_g, gstats = generator_loss(d, real, fake, labels, cfg.class_weight * cfg.g_class_share, textures)
        if cfg.diversity_weight:
            z2 = draw_latents(cfg.batch_size, net, gen)
            div = diversity_term(fake, g(z2, labels, textures), z, z2, cfg.diversity_bound)
            loss_g = loss_g - cfg.diversity_weight * div
            gstats["g_div"] = float(div.detach())
        if cfg.spectrum_match:
            spec = spectrum_term(fake, real, gen, space=cfg.spectrum_space)
            loss_g = loss_g + cfg.spectrum_match * spec
            gstats["g_spec"] = float(spec.detach())
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        d.requires_grad_(True)
        opt_g.step()
        renormalize_(g)
        step += 1
        ema.update(g, step)
        values = {"loss_d": float(loss_d.detach()), **stats, **gstats}
        if step % cfg.magnitude_every == 0 or step == 1:
            values.update(discriminator_diagnostics(d, data, real, labels, gen))
        progress.update(step, **values)
        if evaluator is not None and (step % cfg.eval_every == 0 or step >= cfg.steps):
            evaluator(ema.modules[evaluator.ema_index], step)
        stop = box.after_step(run_dir, modules, both, step)
        # A time box that stops the run before its first snapshot still leaves one, so that it exports.
        if step % cfg.snapshot_every == 0 or step >= cfg.steps or (stop and not any(snaps.iterdir())):
            for s, m in zip(sigmas, ema.modules, strict=True):
                save_file({k: v.contiguous() for k, v in m.state_dict().items()},
                          str(snaps / f"{step:07d}_{s:.3f}.safetensors"))
        if stop:
            break
    progress.close()
    return export_generator(run_dir, net, data.classes, sigmas)


@torch.no_grad()
def discriminator_diagnostics(d, data, real: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> dict:
    """D's per-stage magnitudes on ``real`` and its class margins: the mean of ``D(x, y) - D(x, y')`` with
    ``y'`` another class (``d_margin_class``) or, on the shapes data, the same colour with another shape
    (``d_margin_shape``), and how often that difference is positive (``d_win_*``: 0.5 is chance, 1 is a D that
    always prefers the true label; unlike the margin it compares across networks of different output scales).
    A D that does not tell two classes apart cannot teach G to draw them apart. ``real`` is the batch D has just
    stepped on, so these read high; ``benchmarks/gan_discriminator_labels.py`` measures on held-out images."""
    k = len(data.classes)
    d.track_magnitudes = True
    every = d.class_logits(real)  # one forward: D(x, c) for every class c
    d.track_magnitudes = False
    out = {f"mag_{i}": m for i, m in enumerate(d.magnitudes)}
    own = every.gather(1, labels[:, None])[:, 0]
    swaps = {}
    if k > 1:
        swaps["class"] = (labels + torch.randint(1, k, labels.shape, generator=gen)) % k
    if hasattr(data, "other_shape"):
        swaps["shape"] = data.other_shape(labels, gen)
    for name, other in swaps.items():
        diff = own - every.gather(1, other[:, None])[:, 0]
        out[f"d_margin_{name}"] = float(diff.mean())  # in D's units, which differ between networks
        out[f"d_win_{name}"] = float((diff > 0).float().mean())  # scale-free: 0.5 = D ignores the label
    return out


def load_run_config(run_dir: str | Path) -> GANConfig:
    """The network configuration a run was trained with (``RUN/run.json``), to rebuild its G or D."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a GAN run folder (no run.json); pass a folder made by kinegen train gan.")
    net = json.loads(path.read_text())["network"]
    return GANConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in net.items()})


def load_run_discriminator(run_dir: str | Path) -> tuple[GANConfig, Discriminator]:
    """A run's network configuration and its checkpointed discriminator (``RUN/checkpoint``), in eval mode."""
    from safetensors.torch import load_model

    path = Path(run_dir) / "checkpoint" / "discriminator.safetensors"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {path.relative_to(run_dir)}; pass the --run folder of kinegen train gan.")
    net = load_run_config(run_dir)
    d = Discriminator(net).eval()
    load_model(d, str(path))
    return net, d


EVAL_FIELDS = ("class_accuracy", "modes_covered", "fd", "kid", "precision", "recall", "class_spread",
               "background_pair_tv", "background_colour_tv_by_class", "background_other")


class GeneratorEval:
    """One generator measured as ``kinegen eval gan`` measures a model, at a smaller sample.

    ``n_images`` images, classes balanced, from fixed latents (seed 7), against as many held-out real images
    with the bundled evaluation classifier (:mod:`kinegen.evaluation.gan_metrics`). Calling it returns
    :func:`~kinegen.evaluation.gan_metrics.evaluate_images`' whole dict.
    """

    def __init__(self, n_images: int, resolution: int, net: GANConfig):
        from ..evaluation.gan_metrics import load_classifier, reference_images

        if n_images < 24:
            raise ConfigError(f"an evaluation needs at least 24 images (two per class); got {n_images}.")
        self.classifier = load_classifier()
        self.real, self.labels = reference_images(n_images, resolution)
        self.z = draw_latents(n_images, net, torch.Generator().manual_seed(7))

    @torch.no_grad()
    def __call__(self, g) -> dict:
        from ..evaluation.gan_metrics import evaluate_images

        labels = torch.from_numpy(self.labels).long()
        fake = torch.cat([g(self.z[i:i + 200], labels[i:i + 200]) for i in range(0, len(labels), 200)])
        fake = ((fake.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        return evaluate_images(self.classifier, self.real, self.labels, fake, self.labels)


class TrainingEval:
    """Class accuracy, FD, KID, precision, recall, class spread and backgrounds of G's EMA during training.

    Every ``eval_every`` steps the EMA of the tracked ``sigma_rel`` nearest the export's 0.08 is measured by a
    :class:`GeneratorEval` of ``eval_images`` images. One JSON line per evaluation goes into ``RUN/eval.jsonl``:
    the curves over training.
    """

    def __init__(self, run_dir: Path, cfg: GANTrainConfig, data, sigmas, net: GANConfig, target_sigma: float = 0.08):
        if not isinstance(data, ShapesData):
            raise ConfigError("--eval-every measures with the shapes evaluation classifier, so it needs --data shapes; "
                              "set --eval-every 0 for image-folder data.")
        self.path = run_dir / "eval.jsonl"
        self.ema_index = min(range(len(sigmas)), key=lambda i: abs(sigmas[i] - target_sigma))
        self.sigma = sigmas[self.ema_index]
        self.measure = GeneratorEval(cfg.eval_images, cfg.resolution, net)

    def __call__(self, g, step: int) -> dict:
        m = self.measure(g)
        row = {"step": step, "ema_sigma_rel": self.sigma, **{k: m[k] for k in EVAL_FIELDS},
               "fake_textures": m["backgrounds"]["fake"]["textures"]}  # share of each texture, and "other"
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"eval at step {step}: class accuracy {m['class_accuracy']:.3f}, modes {m['modes_covered']}, "
              f"FD {m['fd']:.1f}, KID {m['kid']:.2f}, precision {m['precision']:.2f}, recall {m['recall']:.2f}, "
              f"class spread {m['class_spread']:.2f}, backgrounds TV {m['background_pair_tv']:.2f} "
              f"({m['background_colour_tv_by_class']:.2f} colour within a class)", flush=True)
        return row


def export_generator(run_dir: Path, net: GANConfig, classes: list[str], sigmas, target_sigma: float = 0.08) -> Path:
    """Reconstruct G's EMA at ``target_sigma`` from the snapshots; save it as an MPGANPipeline folder."""
    from safetensors.torch import load_file

    from ..pipelines.mpgan import MPGANGenerator, MPGANPipeline
    from .phema import reconstruct, sigma_rel_to_gamma

    snaps = []
    for f in sorted((run_dir / "snapshots").glob("*.safetensors")):
        step_s, sigma_s = f.stem.split("_")
        snaps.append((int(step_s), sigma_rel_to_gamma(float(sigma_s)), load_file(str(f))))
    if not snaps:
        raise ConfigError(f"{run_dir} has no EMA snapshots yet; train for at least --snapshot-every steps.")
    gan = MPGANGenerator.from_gan_config(net, classes)
    gan.net.load_state_dict(reconstruct(snaps, target_sigma))
    out = run_dir / "pipeline"
    MPGANPipeline(gan=gan.eval()).save_pretrained(out, safe_serialization=True)
    (out / "ema.json").write_text(json.dumps({"ema_sigma_rel": target_sigma, "snapshots": len(snaps)}) + "\n")
    return out
