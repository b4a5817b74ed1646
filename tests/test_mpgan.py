"""MP-GAN networks: the magnitude-preserving formulas, each switch, and the R3GAN baseline form."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from kinegen.models.mpgan import (
    LRELU_GAIN_MP,
    LRELU_GAIN_R3GAN,
    ClassEmbedding,
    Conv,
    Discriminator,
    GANConfig,
    Generator,
    downsample_free,
    lrelu,
    renormalize_,
    upsample_free,
)
from kinegen.models.mpgan_config import MP_SWITCHES

SMALL = dict(resolution=16, widths=(64, 64, 32), num_classes=4)


def test_mp_leaky_relu_has_unit_std_and_r3gan_gain_unit_second_moment():
    x = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0))
    assert LRELU_GAIN_MP == pytest.approx(1.5465, abs=1e-4) and LRELU_GAIN_R3GAN == pytest.approx(1.3868, abs=1e-4)
    assert lrelu(x, mp=True).std().item() == pytest.approx(1.0, abs=3e-3)
    assert lrelu(x, mp=False).square().mean().item() == pytest.approx(1.0, abs=3e-3)


def test_mp_conv_uses_centred_unit_norm_filters_and_forced_renormalisation():
    conv = Conv(8, 16, 3, mp=True, centering=True)
    w = conv.effective_weight().flatten(1)
    torch.testing.assert_close(w.norm(dim=1), torch.ones(16), atol=1e-3, rtol=0)
    torch.testing.assert_close(w.mean(1), torch.zeros(16), atol=1e-6, rtol=0)
    with torch.no_grad():
        conv.weight.mul_(7.0).add_(0.3)  # what an optimiser step might do
    renormalize_(conv)
    stored = conv.weight.flatten(1)
    torch.testing.assert_close(stored.norm(dim=1), torch.full((16,), math.sqrt(72.0)), rtol=1e-3, atol=0)
    x = torch.randn(64, 8, 12, 12)
    assert conv(x).std().item() == pytest.approx(1.0, abs=0.1)  # unit-variance input keeps unit variance


@pytest.mark.parametrize("mp", [True, False])
def test_networks_run_and_switch_all_changes(mp):
    cfg = GANConfig(**SMALL) if mp else GANConfig.baseline(**SMALL)
    g, d = Generator(cfg), Discriminator(cfg)
    z, c = torch.randn(5, cfg.z_dim), torch.tensor([0, 1, 2, 3, 0])
    img = g(z, c)
    assert img.shape == (5, 3, 16, 16)
    d.track_magnitudes = True
    logits = d(img, c)
    assert logits.shape == (5,) and torch.isfinite(logits).all()
    assert len(d.magnitudes) == len(cfg.widths)
    convs = [m for m in g.modules() if isinstance(m, Conv)]
    assert all(m.mp == mp for m in convs)
    assert (g.out_gain is not None) == mp and hasattr(g, "head1") == mp and hasattr(g, "const") == (not mp)
    assert (len(g.transitions) == 0) == mp and isinstance(d.class_embed, ClassEmbedding) == mp
    # R3GAN2's shared class init: at initialisation every class has the same embedding, so neither G's image nor
    # D's projection logit depends on the class yet; the baseline's embeddings differ from the start
    other = torch.tensor([1, 2, 3, 0, 3])
    img2 = g(z, other)
    assert torch.equal(img2, img) == mp and torch.equal(d(img, other), logits) == mp


def test_free_transitions_resample_without_parameters():
    x = torch.randn(2, 8, 4, 4)
    up = upsample_free(x, 6)  # 8 -> 6 channels: each channel 3 times, as 2x2 sub-pixels, then low-passed
    assert up.shape == (2, 6, 8, 8)
    shuffled = torch.nn.functional.pixel_shuffle(x.repeat_interleave(3, dim=1), 2)
    # output channel 0's sub-pixels are copies 1-3 of input channel 0 and copy 1 of channel 1 ...
    torch.testing.assert_close(shuffled[:, 0, :2, :2].flatten(1), torch.stack([x[:, 0, 0, 0]] * 3 + [x[:, 1, 0, 0]], 1))
    # ... blurred by [1, 2, 1] x [1, 2, 1] / 16
    k = torch.tensor([1.0, 2.0, 1.0])
    k = torch.outer(k, k) / 16
    torch.testing.assert_close(up[:, :, 3, 3], (shuffled[:, :, 2:5, 2:5] * k).sum((-1, -2)))
    # a constant stays constant away from the border, at both widths
    ones = torch.ones(1, 8, 4, 4)
    assert torch.allclose(upsample_free(ones, 6)[..., 1:-1, 1:-1], torch.tensor(1.0))
    assert torch.allclose(upsample_free(ones, 8)[..., 1:-1, 1:-1], torch.tensor(1.0))
    # equal widths: the [1, 3, 3, 1] binomial interpolation is bilinear upsampling away from the border
    bilinear = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    torch.testing.assert_close(upsample_free(x, 8)[..., 1:-1, 1:-1], bilinear[..., 1:-1, 1:-1])
    ramp = torch.ones(2, 6, 8, 8) * torch.arange(6.0).view(1, 6, 1, 1)
    down = downsample_free(ramp, 8)
    assert down.shape == (2, 8, 4, 4)  # 6 channels x 4 sub-pixels = 24, averaged in groups of 3
    torch.testing.assert_close(down[0, :, 1, 1], torch.tensor([0, 0.6667, 1.3333, 2, 3, 3.6667, 4.3333, 5]),
                               atol=1e-4, rtol=0)
    assert downsample_free(x, 8).shape == (2, 8, 2, 2)
    assert torch.allclose(downsample_free(torch.ones(1, 8, 8, 8), 8)[..., 1:-1, 1:-1], torch.tensor(1.0))
    with pytest.raises(ValueError, match="free_transitions: a width change 96 -> 64"):
        GANConfig(resolution=16, widths=(96, 96, 64))
    GANConfig(resolution=16, widths=(96, 96, 64), free_transitions=False)  # learned 1x1 transitions: any widths


def test_class_embeddings_start_as_one_vector_and_stay_unit_rms():
    emb = ClassEmbedding(5, 16)
    rows = emb(torch.arange(5))
    torch.testing.assert_close(rows, rows[:1].expand(5, 16))  # every class starts the same (R3GAN2)
    torch.testing.assert_close(rows.square().mean(1), torch.ones(5), atol=1e-3, rtol=0)
    torch.testing.assert_close(rows.mean(1), torch.zeros(5), atol=1e-5, rtol=0)  # centred
    with torch.no_grad():
        emb.weight.add_(torch.randn_like(emb.weight))
    renormalize_(emb)
    rows = emb(torch.arange(5))
    assert (rows[0] - rows[1]).abs().max() > 0.1
    torch.testing.assert_close(rows.square().mean(1), torch.ones(5), atol=1e-3, rtol=0)


def test_generators_saved_before_the_r3gan2_switches_load_as_built(tmp_path):
    from kinegen.pipelines.mpgan import MPGANGenerator

    old = dict(resolution=16, num_classes=4, widths=[64, 64, 32], class_names=list("abcd"))
    gen = MPGANGenerator(**old)  # a config.json without the three switches
    assert not gen.net.cfg.free_transitions and len(gen.net.transitions) == 2
    gen.save_pretrained(tmp_path / "g")
    again = MPGANGenerator.from_pretrained(tmp_path / "g")
    z, c = torch.randn(2, 64), torch.tensor([0, 3])
    torch.testing.assert_close(again(z, c), gen(z, c))


@pytest.mark.parametrize("mp", [True, False])
def test_positional_maps_start_as_a_no_op_then_place_what_g_draws(mp):
    kw = {**SMALL, "positional_channels": 4}
    cfg, plain_cfg = (GANConfig(**kw), GANConfig(**SMALL)) if mp else (GANConfig.baseline(**kw),
                                                                       GANConfig.baseline(**SMALL))
    torch.manual_seed(0)
    g, plain = Generator(cfg), Generator(plain_cfg)
    assert [m.map.shape for m in g.positional] == [(4, 8, 8), (4, 16, 16)]  # every stage from 8x8 up
    missing = plain.load_state_dict(g.state_dict(), strict=False)
    assert missing.missing_keys == [] and all(k.startswith("positional.") for k in missing.unexpected_keys)
    z, c = torch.randn(3, cfg.z_dim), torch.tensor([0, 1, 2])
    torch.testing.assert_close(g(z, c), plain(z, c))  # a no-op at the start, in both forms
    g(z, c).square().mean().backward()
    learns = g.positional[0].gain_logit if mp else g.positional[0].proj.weight
    assert learns.grad.abs().sum() > 0
    with torch.no_grad():  # once learned, the same features drawn at another place come out differently
        for m in g.positional:
            (m.gain_logit if mp else m.proj.weight).normal_()
        assert (g(z, c) - plain(z, c)).abs().max() > 1e-2
    gen_cfg = dict(resolution=16, num_classes=4, widths=[64, 64, 32], positional_channels=4)
    from kinegen.pipelines.mpgan import MPGANGenerator

    assert len(MPGANGenerator(**gen_cfg).net.positional) == 2
    assert len(MPGANGenerator(**{**gen_cfg, "positional_channels": 0}).net.positional) == 0


def test_positional_gain_keeps_the_maps_unit_scale_and_multiplies_how_far_a_step_moves_them():
    cfgs = [GANConfig.baseline(**SMALL, positional_channels=4, positional_gain=g) for g in (1.0, 100.0)]
    moved = []
    for cfg in cfgs:
        torch.manual_seed(0)
        g = Generator(cfg)
        p0 = g.positional[1].encoding().detach().clone()
        assert 0.8 < float(p0.std()) < 1.2  # P starts as a unit-scale random field at any gain
        assert torch.allclose(g.positional[1].map * cfg.positional_gain, p0)
        with torch.no_grad():
            g.positional[1].proj.weight.normal_()  # so that P has a gradient
        opt = torch.optim.Adam([g.positional[1].map], lr=1e-3)
        g(torch.randn(4, cfg.z_dim), torch.tensor([0, 1, 2, 3])).square().mean().backward()
        opt.step()
        moved.append(float((g.positional[1].encoding() - p0).abs().mean()))
    # Adam's first step moves each stored entry by about lr; P moves gain times that
    assert moved[0] == pytest.approx(1e-3, rel=0.05) and moved[1] == pytest.approx(0.1, rel=0.05)
    with pytest.raises(ValueError, match="positional_gain"):
        GANConfig(positional_channels=4, positional_gain=0)


@pytest.mark.parametrize("mp", [True, False])
def test_noise_inputs_start_as_a_no_op_then_vary_the_image_with_the_latents_noise_part(mp):
    from kinegen.models.mpgan import draw_latents, split_latent

    make = GANConfig if mp else GANConfig.baseline
    cfg, plain_cfg = make(**SMALL, noise_inputs=True), make(**SMALL)
    assert cfg.noise_resolutions == (8, 16) and cfg.latent_dim == cfg.z_dim + 64 + 256
    assert plain_cfg.noise_resolutions == () and plain_cfg.latent_dim == plain_cfg.z_dim
    torch.manual_seed(0)
    g, plain = Generator(cfg), Generator(plain_cfg)
    plain.load_state_dict(g.state_dict(), strict=False)
    latent = draw_latents(3, cfg, torch.Generator().manual_seed(0))
    z, noise = split_latent(latent, cfg)
    assert [n.shape for n in noise] == [(3, 1, 8, 8), (3, 1, 16, 16)]
    # z comes first and is what a generator without noise inputs draws from the same seed
    torch.testing.assert_close(z, draw_latents(3, plain_cfg, torch.Generator().manual_seed(0)))
    c = torch.tensor([0, 1, 2])
    torch.testing.assert_close(g(latent, c), plain(z, c))  # weights at 0: a no-op
    g(latent, c).square().mean().backward()
    assert g.noise[0].weight.grad.abs().sum() > 0
    with torch.no_grad():
        for m in g.noise:
            m.weight.fill_(0.05)
        other = torch.cat([z, torch.randn(3, cfg.latent_dim - cfg.z_dim)], dim=1)  # same z, other noise
        assert (g(other, c) - g(latent, c)).abs().max() > 1e-2
        torch.testing.assert_close(g(latent, c), g(latent.clone(), c))  # a latent keeps its image
    with pytest.raises(ValueError, match="latents of 384 values"):
        g(z, c)


@pytest.mark.parametrize("mp", [True, False])
def test_noise_per_texture_gives_each_texture_label_its_own_noise_weights(mp):
    from kinegen.models.mpgan import draw_latents, split_latent

    make = GANConfig if mp else GANConfig.baseline
    tex = dict(num_textures=4, texture_prior=(0.55, 0.15, 0.15, 0.15))
    cfg = make(**SMALL, **tex, noise_inputs=True, noise_per_texture=True)
    torch.manual_seed(0)
    g = Generator(cfg)
    assert g.noise[0].weight.shape == (4, 64)
    latent = draw_latents(4, cfg, torch.Generator().manual_seed(0))
    z, _ = split_latent(latent, cfg)
    other = torch.cat([z, torch.randn(4, cfg.latent_dim - cfg.z_dim)], dim=1)  # same z, other noise images
    c = torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        for m in g.noise:
            m.weight[3].fill_(0.05)  # only the last texture label (the shapes data's "noisy") draws noise
        for t, varies in ((0, False), (3, True)):
            textures = torch.full((4,), t)
            change = (g(other, c, textures) - g(latent, c, textures)).abs().max()
            assert (change > 1e-2) if varies else (change < 1e-6)
    # the gradient reaches only the rows of the labels in the batch
    g(latent, c, torch.tensor([3, 3, 1, 1])).square().mean().backward()
    grad = g.noise[0].weight.grad.abs().sum(1)
    assert grad[0] == 0 and grad[2] == 0 and grad[1] > 0 and grad[3] > 0
    with pytest.raises(ValueError, match="noise_per_texture"):
        make(**SMALL, noise_inputs=True, noise_per_texture=True)
    with pytest.raises(ValueError, match="noise_per_texture"):
        make(**SMALL, **tex, noise_per_texture=True)


@pytest.mark.parametrize("mp", [True, False])
def test_noise_max_resolution_keeps_the_noise_inputs_of_the_stages_up_to_it(mp):
    from kinegen.models.mpgan import draw_latents, split_latent

    make = GANConfig if mp else GANConfig.baseline
    cfg = make(**SMALL, noise_inputs=True, noise_max_resolution=8)
    assert cfg.noise_resolutions == (8,) and cfg.latent_dim == cfg.z_dim + 64
    torch.manual_seed(0)
    g = Generator(cfg)
    assert len(g.noise) == 1 and g.noise[0].weight.shape == (64,)
    latent = draw_latents(2, cfg, torch.Generator().manual_seed(0))
    z, noise = split_latent(latent, cfg)
    assert [n.shape for n in noise] == [(2, 1, 8, 8)]
    c = torch.tensor([0, 1])
    with torch.no_grad():
        g.noise[0].weight.fill_(0.05)
        other = torch.cat([z, torch.randn(2, 64)], dim=1)  # same z, another 8x8 noise image
        assert (g(other, c) - g(latent, c)).abs().max() > 1e-2
    assert make(**SMALL, noise_inputs=True, noise_max_resolution=16).noise_resolutions == (8, 16)
    for bad in (4, 12, 32):
        with pytest.raises(ValueError, match=r"noise_max_resolution is the side of a stage from 8x8 \(8, 16\)"):
            make(**SMALL, noise_inputs=True, noise_max_resolution=bad)
    with pytest.raises(ValueError, match="it needs noise_inputs"):
        make(**SMALL, noise_max_resolution=8)


@pytest.mark.parametrize("mp", [True, False])
def test_texture_labels_at_g_stages_scale_the_positional_maps_and_leave_the_input_alone(mp):
    make = GANConfig if mp else GANConfig.baseline
    tex = dict(num_textures=4, texture_prior=(0.55, 0.15, 0.15, 0.15), positional_channels=4)
    torch.manual_seed(0)
    g = Generator(make(**SMALL, **tex, g_texture_conditioning="stages"))
    assert g.texture_embed is None and g.positional[0].texture_scale.shape == (4, 64)
    with torch.no_grad():
        for m in g.positional:  # make the maps' contribution visible (R3GAN form: W starts at 0)
            m.proj.weight.normal_()
            if m.gain_logit is not None:
                m.gain_logit.fill_(1.0)
    z, c = torch.randn(3, g.cfg.latent_dim), torch.tensor([0, 1, 2])
    drawn = {t: g(z, c, torch.full((3,), t)) for t in range(4)}
    torch.testing.assert_close(drawn[0], drawn[3])  # every scale at 1: the label changes nothing yet
    with torch.no_grad():
        for m in g.positional:
            m.texture_scale[1].fill_(-0.1)  # s = 1 - 10 x 0.1 = 0: label 1 draws without the maps
        before = {t: g(z, c, torch.full((3,), t)) for t in (0, 1)}
        for m in g.positional:
            m.proj.weight.normal_()  # other maps
        torch.testing.assert_close(g(z, c, torch.full((3,), 1)), before[1])
        assert (g(z, c, torch.full((3,), 0)) - before[0]).abs().max() > 1e-2
    g(z, c, torch.tensor([2, 2, 2])).square().mean().backward()
    grad = g.positional[0].texture_scale.grad.abs().sum(1)
    assert grad[2] > 0 and grad[0] == 0 and grad[1] == 0 and grad[3] == 0
    with pytest.raises(ValueError, match="g_texture_conditioning"):
        make(**SMALL, positional_channels=4, g_texture_conditioning="stages")  # no texture labels
    with pytest.raises(ValueError, match="g_texture_conditioning must be one of input, stages"):
        make(**SMALL, **tex, g_texture_conditioning="everywhere")

    from kinegen.models.mpgan import SPECTRUM_EPS, reduced_spectrum

    flat = torch.full((2, 3, 32, 32), 0.3)
    s = reduced_spectrum(flat)
    assert s.shape == (2, 24)  # rings 0 .. round(16 sqrt 2) = 23
    assert s[0, 0] > 0 and torch.allclose(s[:, 1:], torch.full((2, 23), math.log(SPECTRUM_EPS)))
    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    checker = ((yy // 4 + xx // 4) % 2).float() * 0.1  # 4-pixel cells: frequency (4, 4), ring round(4 sqrt 2) = 6
    s = reduced_spectrum(flat + checker)
    assert int(s[0, 1:].argmax()) + 1 == 6
    rgb = flat.clone()
    rgb[:, 0] += checker  # luminance: a pattern in one channel is a third of it in all three
    torch.testing.assert_close(reduced_spectrum(rgb), reduced_spectrum(flat + checker / 3))


@pytest.mark.parametrize("mp", [True, False])
def test_spectral_classifier_starts_as_a_no_op_then_adds_its_logit(mp):
    from kinegen.models.mpgan import Discriminator, reduced_spectrum

    make = GANConfig if mp else GANConfig.baseline
    torch.manual_seed(0)
    d, plain = Discriminator(make(**SMALL, spectral_weight=2.0)), Discriminator(make(**SMALL))
    res = plain.load_state_dict(d.state_dict(), strict=False)
    assert res.missing_keys == [] and res.unexpected_keys == ["spectral.weight"]
    x, y = torch.randn(3, 3, 16, 16), torch.tensor([0, 1, 2])
    torch.testing.assert_close(d(x, y), plain(x, y))  # zero at the start: the spatial D exactly
    d(x, y).sum().backward()
    assert d.spectral.weight.grad.abs().sum() > 0
    with torch.no_grad():
        d.spectral.weight.normal_()
        expected = plain(x, y) + 2.0 * (reduced_spectrum(x) @ d.spectral.weight.T)[:, 0]
        torch.testing.assert_close(d(x, y), expected)
        assert (d(x, y) - plain(x, y)).abs().max() > 1e-2
        torch.testing.assert_close(d.logits_for_label_matching(x, y)[0], expected)
    assert Discriminator(make(**SMALL)).spectral is None


def test_pixel_templates_add_their_realness_and_score_a_pattern_fixed_to_the_grid():
    from kinegen.models.mpgan import TEMPLATE_A, TEMPLATE_GAIN, Discriminator

    torch.manual_seed(0)
    d, plain = Discriminator(GANConfig.baseline(**SMALL, pixel_templates=2)), Discriminator(GANConfig.baseline(**SMALL))
    res = plain.load_state_dict(d.state_dict(), strict=False)
    assert res.missing_keys == [] and sorted(res.unexpected_keys) == ["templates.templates", "templates.weight"]
    x, y = torch.randn(3, 3, 16, 16), torch.tensor([0, 1, 2])
    t = d.templates.templates.detach().flatten(1)
    c = (x - x.mean((2, 3), keepdim=True)).flatten(1) @ (t / t.norm(dim=1, keepdim=True)).T
    # at the start b = 0: sum_k a sqrt(c_k^2 + eps) on top of the D without templates
    torch.testing.assert_close(d(x, y), plain(x, y) + TEMPLATE_A * (c.square() + 1e-4).sqrt().sum(1))
    d(x, y).sum().backward()
    assert d.templates.weight.grad.abs().sum() > 0 and d.templates.templates.grad.abs().sum() > 0
    # a checker fixed to the grid as template 0: the logit rises by a |<x - mean, T>| at either sign of the pattern,
    # and b tells the signs apart
    checker = ((torch.arange(16)[:, None] // 4 + torch.arange(16)[None] // 4) % 2).float().expand(3, 16, 16)
    with torch.no_grad():
        d.templates.templates[0] = checker - checker.mean()
        d.templates.templates[1] = torch.randn(3, 16, 16)
        flat = torch.full((1, 3, 16, 16), 0.3)
        on = flat + 0.1 * (checker - checker.mean())
        off = flat - 0.1 * (checker - checker.mean())
        norm = float((checker - checker.mean()).norm())
        lab = torch.tensor([0])

        def part(z):
            return d(z, lab) - plain(z, lab)

        c1 = float(d.templates.correlations(on)[0, 1])  # the random template's part, the same for +-pattern
        assert abs(c1) < 0.1 * norm
        expected = TEMPLATE_A * (((0.1 * norm) ** 2 + 1e-4) ** 0.5 + (c1 ** 2 + 1e-4) ** 0.5)
        torch.testing.assert_close(part(on), torch.tensor([expected]), atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(part(off), torch.tensor([expected]), atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(part(flat), torch.tensor([2 * TEMPLATE_A * 1e-2]), atol=1e-5, rtol=1e-4)
        d.templates.weight[0] = 0.5 / TEMPLATE_GAIN
        assert float(part(on) - part(off)) == pytest.approx(2 * 0.5 * 0.1 * norm, rel=1e-3)
        torch.testing.assert_close(d.logits_for_label_matching(on, lab)[0], d(on, lab))
    assert Discriminator(GANConfig.baseline(**SMALL)).templates is None
    # R1/R2 do not see the templates' part: the penalties are the D without templates'
    from kinegen.training.gan_loss import discriminator_loss

    real, fake = torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)
    labels = torch.tensor([0, 1, 2, 3])
    _, with_t = discriminator_loss(d, real, fake, labels, 1.0)
    _, without = discriminator_loss(plain, real, fake, labels, 1.0)
    for penalty in ("r1", "r2"):
        assert with_t[penalty] == pytest.approx(without[penalty], rel=1e-5)
    assert with_t["d_real"] != pytest.approx(without["d_real"], rel=1e-3)
    with pytest.raises(ValueError, match="pixel_templates"):
        GANConfig(pixel_templates=-1)


def test_pixel_templates_under_texture_labels_weigh_the_correlations_per_label(tmp_path):
    from safetensors.torch import load_file

    from kinegen.models.mpgan import TEMPLATE_GAIN, Discriminator
    from kinegen.training.gan import train_gan

    torch.manual_seed(0)
    kw = dict(num_textures=4, texture_prior=(0.55, 0.15, 0.15, 0.15))
    d = Discriminator(GANConfig.baseline(**SMALL, pixel_templates=2, **kw))
    assert d.templates.texture_weight.shape == (4, 2) and d.templates.texture_weight.abs().sum() == 0
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    t = torch.tensor([0, 1, 2, 3])
    base = d(x, y, t)
    with torch.no_grad():
        d.templates.texture_weight[1, 0] = 0.5 / TEMPLATE_GAIN  # label 1 (checkered) rewards template 0
    c0 = d.templates.correlations(x)[:, 0].detach()
    moved = (d(x, y, t) - base).detach()
    torch.testing.assert_close(moved, torch.tensor([0.0, 0.5 * float(c0[1]), 0.0, 0.0]), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(d.logits_for_label_matching(x, y, t)[0], d(x, y, t))
    d(x, y, t).sum().backward()
    assert d.templates.texture_weight.grad[1, 0] != 0
    # with a curvature q the realness loses q/2 c^2 per template, so along a template it peaks instead of rising
    curved = Discriminator(GANConfig.baseline(**SMALL, pixel_templates=2, template_curvature=2.0, **kw))
    curved.load_state_dict(d.state_dict())
    c = d.templates.correlations(x).detach()
    torch.testing.assert_close(curved(x, y, t), (d(x, y, t) - c.square().sum(1)).detach())
    with torch.no_grad():
        curved.templates.templates.copy_(torch.randn(2, 3, 16, 16))
        curved.templates.weight.zero_()
        curved.templates.texture_weight.zero_()
        curved.templates.texture_weight[1, 0] = 2.0 / TEMPLATE_GAIN  # b = 2: the peak at c = (b + a) / q = 1.25
        unit = curved.templates.templates[0] / curved.templates.templates[0].norm()
        scores = [float(curved.templates(s * unit[None], torch.tensor([1]))) for s in (0.5, 1.25, 3.0, 10.0)]
    assert scores[1] > scores[0] and scores[1] > scores[2] > scores[3]
    with pytest.raises(ValueError, match="template_curvature"):
        GANConfig(template_curvature=-1)
    # a run with templates continued with texture labels: the per-label table starts at 0 and trains
    train_gan(tmp_path / "a", _tiny_train(variant="r3gan", pixel_templates=2))
    train_gan(tmp_path / "b", _tiny_train(variant="r3gan", pixel_templates=2, texture_labels=True,
                                          init=str(tmp_path / "a")))
    db = load_file(str(tmp_path / "b" / "checkpoint" / "discriminator.safetensors"))
    assert db["templates.texture_weight"].shape == (4, 2) and db["templates.texture_weight"].abs().sum() > 0


def test_textures_drawn_from_the_latent_follow_the_prior():
    from kinegen.models.mpgan import texture_of_latent

    z = torch.randn(40_000, 8, generator=torch.Generator().manual_seed(0))
    t = texture_of_latent(z, (0.55, 0.15, 0.15, 0.15))
    shares = torch.bincount(t, minlength=4).float() / len(t)
    torch.testing.assert_close(shares, torch.tensor([0.55, 0.15, 0.15, 0.15]), atol=0.01, rtol=0)
    assert texture_of_latent(torch.tensor([[-3.0], [0.0], [0.5], [3.0]]), (0.55, 0.15, 0.15, 0.15)).tolist() == [
        0, 0, 1, 3]  # Phi(0) = 0.5 is plain (below 0.55), Phi(0.5) = 0.69 checkered (0.55-0.70), far right noisy


@pytest.mark.parametrize("mp", [True, False])
def test_texture_labels_start_as_a_no_op_then_condition_both_networks(mp):
    make = GANConfig if mp else GANConfig.baseline
    kw = dict(num_textures=4, texture_prior=(0.55, 0.15, 0.15, 0.15))
    torch.manual_seed(0)
    g, plain_g = Generator(make(**SMALL, **kw)), Generator(make(**SMALL))
    d, plain_d = Discriminator(make(**SMALL, **kw)), Discriminator(make(**SMALL))
    for net, plain in ((g, plain_g), (d, plain_d)):
        res = plain.load_state_dict(net.state_dict(), strict=False)
        assert res.missing_keys == [] and res.unexpected_keys == ["texture_embed.weight"]
    z, c, t = torch.randn(4, g.cfg.z_dim), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3])
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(g(z, c, t), plain_g(z, c))  # zero at the start: the networks they were
    torch.testing.assert_close(d(x, c, t), plain_d(x, c))
    (g(z, c, t).square().mean() + d(x, c, t).sum()).backward()
    assert g.texture_embed.weight.grad.abs().sum() > 0 and d.texture_embed.weight.grad.abs().sum() > 0
    with torch.no_grad():
        g.texture_embed.weight.normal_(std=0.01)
        d.texture_embed.weight.normal_(std=0.01)
        other = (t + 1) % 4
        assert (g(z, c, t) - g(z, c, other)).abs().max() > 1e-2  # the texture label changes the image
        h = d.features(x)
        expected = (h * (d.class_table()[c] + 100.0 * d.texture_embed.weight[t])).sum(1) / math.sqrt(64)
        torch.testing.assert_close(d(x, c, t), expected)  # D(x, y, k) = h . (e_y + t_k) / sqrt(dim)
        torch.testing.assert_close(d(x, c), plain_d(x, c))  # without textures: the class term alone
        torch.testing.assert_close(g(z, c), g(z, c, texture_of(z)))  # by default each latent draws its own
    with pytest.raises(ValueError, match="no texture labels"):
        plain_g(z, c, t)
    with pytest.raises(ValueError, match="texture_prior"):
        GANConfig(num_textures=2, texture_prior=(0.5,))
    with pytest.raises(ValueError, match="summing to 1"):
        GANConfig(num_textures=2, texture_prior=(0.5, 0.6))


def texture_of(z):
    from kinegen.models.mpgan import texture_of_latent

    return texture_of_latent(z, (0.55, 0.15, 0.15, 0.15))


def test_gan_training_with_texture_labels_from_an_earlier_run(tmp_path):
    from safetensors.torch import load_file

    from kinegen.data.shape_images import _image_spec
    from kinegen.data.shapes import TEXTURES
    from kinegen.errors import ConfigError
    from kinegen.pipelines import MPGANPipeline
    from kinegen.training.gan import ShapesData, train_gan

    data = ShapesData(16, 200)
    idx = np.arange(40)
    assert [TEXTURES[int(t)] for t in data.textures(idx)] == [
        _image_spec(int(i), int(i) % 12).texture for i in idx]
    assert len(set(data.textures(idx).tolist())) > 1
    train_gan(tmp_path / "a", _tiny_train(variant="r3gan"))
    out = train_gan(tmp_path / "b", _tiny_train(variant="r3gan", texture_labels=True, init=str(tmp_path / "a")))
    gb = load_file(str(tmp_path / "b" / "checkpoint" / "generator.safetensors"))
    db = load_file(str(tmp_path / "b" / "checkpoint" / "discriminator.safetensors"))
    assert gb["texture_embed.weight"].abs().sum() > 0 and db["texture_embed.weight"].abs().sum() > 0  # trained
    pipe = MPGANPipeline.from_pretrained(out)
    assert pipe.texture_names == list(TEXTURES)
    a = pipe(class_labels=[0, 0], seeds=[3, 4], output_type="pt").images
    b = pipe(class_labels=[0, 0], seeds=[3, 4], output_type="pt", textures=["striped", 0]).images
    assert a.shape == b.shape == (2, 3, 16, 16)
    drawn = texture_of(torch.stack([torch.randn(pipe.gan.config.z_dim, generator=torch.Generator().manual_seed(s))
                                    for s in (3, 4)]))
    forced = pipe(class_labels=[0, 0], seeds=[3, 4], output_type="pt", textures=drawn.tolist()).images
    torch.testing.assert_close(a, forced)  # a seed draws its texture from its own latent
    with pytest.raises(ValueError, match="valid textures: plain, checkered, striped, noisy"):
        pipe(class_labels=[0], textures="wavy")
    with pytest.raises(ValueError, match="without texture labels"):
        MPGANPipeline.from_pretrained(tmp_path / "a" / "pipeline")(class_labels=[0], textures="plain")
    with pytest.raises(ConfigError, match="keep --texture-labels"):
        train_gan(tmp_path / "c", _tiny_train(variant="r3gan", init=str(tmp_path / "b")))
    with pytest.raises(ConfigError, match="shapes data"):
        train_gan(tmp_path / "d", _tiny_train(variant="r3gan", texture_labels=True, data=f"imagefolder:{tmp_path}"))
    # noise inputs with a weight row per texture label: saved, exported and drawn per label; kept by a fine-tune
    noisy = dict(variant="r3gan", texture_labels=True, noise_inputs=True)
    out_n = train_gan(tmp_path / "n", _tiny_train(**noisy, noise_per_texture=True, noise_weight_init=0.5, steps=1,
                                                  init=str(tmp_path / "b")))
    pipe_n = MPGANPipeline.from_pretrained(out_n)
    assert all(m.weight.shape == (4, m.weight.shape[1]) for m in pipe_n.gan.net.noise)
    a, b = (pipe_n(class_labels=[0, 1], seeds=[3, 4], textures="noisy", output_type="pt").images for _ in range(2))
    torch.testing.assert_close(a, b)
    with pytest.raises(ConfigError, match="keep --noise-per-texture true"):
        train_gan(tmp_path / "e", _tiny_train(**noisy, init=str(tmp_path / "n")))
    # a fine-tune with the noise at 8x8 only drops the 16x16 noise input and keeps the 8x8 one as trained
    out_8 = train_gan(tmp_path / "n8", _tiny_train(**noisy, noise_per_texture=True, noise_max_resolution=8, steps=1,
                                                    lr=1e-12, init=str(tmp_path / "n")))
    g8 = load_file(str(tmp_path / "n8" / "checkpoint" / "generator.safetensors"))
    gn = load_file(str(tmp_path / "n" / "checkpoint" / "generator.safetensors"))
    assert "noise.1.weight" in gn and "noise.1.weight" not in g8
    torch.testing.assert_close(g8["noise.0.weight"], gn["noise.0.weight"], atol=1e-6, rtol=0)
    assert MPGANPipeline.from_pretrained(out_8).gan.net.cfg.latent_dim == pipe_n.gan.net.cfg.z_dim + 64
    with pytest.raises(ConfigError, match="--noise-max-resolution limits the noise inputs"):
        train_gan(tmp_path / "e", _tiny_train(variant="r3gan", noise_max_resolution=8))
    with pytest.raises(ConfigError, match="--texture-labels true too"):
        train_gan(tmp_path / "e", _tiny_train(variant="r3gan", noise_inputs=True, noise_per_texture=True))
    # the texture label moved from G's input to its stages: G's texture vectors are dropped, its maps get scales
    staged = dict(variant="r3gan", texture_labels=True, positional_channels=4, g_texture_conditioning="stages")
    out_s = train_gan(tmp_path / "s", _tiny_train(**staged, positional_gain=1.0, init=str(tmp_path / "b"), steps=1))
    gs = load_file(str(tmp_path / "s" / "checkpoint" / "generator.safetensors"))
    assert "texture_embed.weight" not in gs and gs["positional.0.texture_scale"].shape[0] == 4
    assert MPGANPipeline.from_pretrained(out_s)(class_labels=[0], seeds=[3], textures="striped",
                                                output_type="pt").images.shape == (1, 3, 16, 16)
    with pytest.raises(ConfigError, match="keep --g-texture-conditioning stages"):
        train_gan(tmp_path / "e", _tiny_train(variant="r3gan", texture_labels=True, positional_channels=4,
                                              init=str(tmp_path / "s")))
    with pytest.raises(ConfigError, match="--positional-channels too"):
        train_gan(tmp_path / "e", _tiny_train(variant="r3gan", texture_labels=True, g_texture_conditioning="stages"))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        GANConfig(resolution=24)
    with pytest.raises(ValueError, match="one entry per stage"):
        GANConfig(resolution=32, widths=(64, 64))
    with pytest.raises(ValueError, match="positional_channels"):
        GANConfig(positional_channels=-1)
    with pytest.raises(ValueError, match="spectral_weight"):
        GANConfig(spectral_weight=-0.5)


def test_post_hoc_ema_reconstructs_an_untracked_profile():
    from kinegen.training.phema import PowerEMA, reconstruct, sigma_rel_to_gamma

    assert sigma_rel_to_gamma(0.05) == pytest.approx(16.97, abs=0.05)  # EDM2's gamma for sigma_rel 0.05
    module = torch.nn.Linear(1, 1, bias=False)
    tracked, direct = PowerEMA(module, (0.05, 0.10)), PowerEMA(module, (0.07,))
    snapshots = []
    rng = torch.Generator().manual_seed(0)
    for step in range(1, 2001):
        with torch.no_grad():  # a drifting, noisy weight
            module.weight.fill_(step / 100 + 0.3 * float(torch.randn((), generator=rng)))
        tracked.update(module, step)
        direct.update(module, step)
        if step % 100 == 0:
            for gamma, ema in zip(tracked.gammas, tracked.modules, strict=True):
                snapshots.append((step, gamma, {k: v.clone() for k, v in ema.state_dict().items()}))
    got = reconstruct(snapshots, 0.07)["weight"].item()
    want = direct.modules[0].weight.item()
    assert got == pytest.approx(want, rel=2e-3)
    assert abs(got - tracked.modules[0].weight.item()) > 10 * abs(got - want)


def test_r1_r2_penalties_reach_the_discriminator_weights_through_the_double_backward():
    from kinegen.training.gan_loss import discriminator_loss, generator_loss

    cfg = GANConfig(**SMALL)
    g, d = Generator(cfg), Discriminator(cfg)
    real = torch.randn(4, 3, 16, 16)
    labels = torch.tensor([0, 1, 2, 3])
    fake = g(torch.randn(4, cfg.z_dim), labels)
    d.zero_grad()
    with_pen, stats = discriminator_loss(d, real, fake, labels, gamma=10.0)
    with_pen.backward()
    grad_pen = d.from_rgb.weight.grad.clone()
    d.zero_grad()
    discriminator_loss(d, real, fake, labels, gamma=0.0)[0].backward()
    assert stats["r1"] > 0 and stats["r2"] > 0
    assert not torch.allclose(grad_pen, d.from_rgb.weight.grad)  # the penalty changes D's gradient
    g_loss, _ = generator_loss(d, real, g(torch.randn(4, cfg.z_dim), labels), labels)
    g_loss.backward()
    assert g.out_gain.grad is not None and torch.isfinite(g_loss)


@pytest.mark.parametrize("mp", [True, False])
def test_class_logits_are_the_projection_logit_under_every_class(mp):
    cfg = GANConfig(**SMALL) if mp else GANConfig.baseline(**SMALL)
    torch.manual_seed(0)
    d = Discriminator(cfg)
    with torch.no_grad():  # classes apart (the shared start makes every class's logit equal)
        d.class_embed.weight.add_(torch.randn_like(d.class_embed.weight))
    x = torch.randn(3, 3, 16, 16)
    every = d.class_logits(x)
    assert every.shape == (3, 4) and every.std() > 0
    for c in range(4):
        torch.testing.assert_close(d(x, torch.full((3,), c)), every[:, c], atol=1e-5, rtol=0)


def test_label_matching_term_adds_lambda_times_cross_entropy_to_both_losses():
    import torch.nn.functional as F

    from kinegen.training.gan_loss import discriminator_loss, generator_loss

    cfg = GANConfig(**SMALL)
    torch.manual_seed(1)
    g, d = Generator(cfg), Discriminator(cfg)
    with torch.no_grad():
        d.class_embed.weight.add_(torch.randn_like(d.class_embed.weight))
    real, labels = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    fake = g(torch.randn(4, cfg.z_dim), labels).detach()
    plain, _ = discriminator_loss(d, real, fake, labels, gamma=0.1)
    with_cls, stats = discriminator_loss(d, real, fake, labels, gamma=0.1, class_weight=2.0)
    ce_real = F.cross_entropy(d.class_logits(real), labels)
    assert stats["d_cls"] == pytest.approx(float(ce_real), rel=1e-5)
    assert float((with_cls - plain).detach()) == pytest.approx(2.0 * float(ce_real), rel=1e-4)
    g_plain, _ = generator_loss(d, real, fake, labels)
    g_cls, gstats = generator_loss(d, real, fake, labels, class_weight=0.5)
    ce_fake = F.cross_entropy(d.class_logits(fake), labels)
    assert float((g_cls - g_plain).detach()) == pytest.approx(0.5 * float(ce_fake), rel=1e-4)
    assert gstats["g_cls"] > 0


def test_label_matching_teaches_the_discriminator_to_prefer_the_true_class():
    """Only the label-matching term trains D here: two classes that differ by where a bright square sits (as
    shapes differ from blobs only at their edges). Before, D cannot prefer either label; after, the true one."""
    from kinegen.training.gan_loss import discriminator_loss

    cfg = GANConfig(resolution=8, widths=(32, 32), num_classes=2)
    torch.manual_seed(0)
    d = Discriminator(cfg)
    opt = torch.optim.Adam(d.parameters(), lr=3e-3, betas=(0.0, 0.99))

    def images(n, seed):
        gen = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, 2, (n,), generator=gen)
        x = 0.3 * torch.randn(n, 3, 8, 8, generator=gen)
        for i, y in enumerate(labels.tolist()):
            x[i, :, 1:4, 1:4] += 1.0 if y == 0 else 0.0
            x[i, :, 4:7, 4:7] += 1.0 if y == 1 else 0.0
        return x, labels

    def preference(x, labels):
        with torch.no_grad():
            return float((d(x, labels) > d(x, 1 - labels)).float().mean())

    test_x, test_y = images(200, 99)
    before = preference(test_x, test_y)
    for step in range(60):
        x, y = images(32, step)
        loss, _ = discriminator_loss(d, x, torch.zeros_like(x), y, gamma=0.0, class_weight=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        renormalize_(d)
    assert before == 0.0  # the shared start: both classes score the same, so the true one never wins
    assert preference(test_x, test_y) > 0.95


def _tiny_train(**kw):
    from kinegen.training.configs import GANTrainConfig

    base = dict(steps=2, batch_size=4, resolution=16, widths="64,64,32", snapshot_every=1, magnitude_every=1,
                checkpoint_every=1)
    return GANTrainConfig(**{**base, **kw})


def test_load_run_discriminator_rebuilds_the_checkpointed_d(tmp_path):
    from safetensors.torch import load_file

    from kinegen.errors import ConfigError
    from kinegen.training.gan import load_run_discriminator, train_gan

    train_gan(tmp_path / "run", _tiny_train(variant="r3gan"))
    net, d = load_run_discriminator(tmp_path / "run")
    assert net.resolution == 16 and net.widths == (64, 64, 32) and not d.training
    saved = load_file(str(tmp_path / "run" / "checkpoint" / "discriminator.safetensors"))
    assert saved.keys() == d.state_dict().keys()
    assert all(torch.equal(v, d.state_dict()[k]) for k, v in saved.items())
    with pytest.raises(ConfigError, match="no checkpoint/discriminator.safetensors"):
        load_run_discriminator(tmp_path)


def test_gan_training_resumes_and_exports_a_post_hoc_ema(tmp_path):
    import json

    from kinegen.training.gan import train_gan

    out = train_gan(tmp_path / "run", _tiny_train())
    meta_path = tmp_path / "run" / "run.json"  # a run begun before D's newer fields existed still resumes
    meta = json.loads(meta_path.read_text())
    del meta["network"]["mbstd_group"], meta["network"]["separate_class_head"]
    meta_path.write_text(json.dumps(meta))
    out = train_gan(tmp_path / "run", _tiny_train(steps=3))
    logs = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert logs[-1]["step"] == 3 and "mag_0" in logs[-1] and logs[-1]["r1"] > 0  # resumed, not restarted
    assert [r["step"] for r in logs] == [2, 3]
    from kinegen.pipelines import MPGANPipeline

    pipe = MPGANPipeline.from_pretrained(out)
    assert pipe.class_names[0] == "red circle" and len(pipe.class_names) == 12
    from kinegen.errors import ConfigError

    with pytest.raises(ConfigError, match="another network configuration"):
        train_gan(tmp_path / "run", _tiny_train(steps=4, widths="64,32,32"))


def test_gan_training_with_the_label_matching_term_logs_both_class_losses(tmp_path):
    import json

    from kinegen.training.gan import train_gan

    train_gan(tmp_path / "run", _tiny_train(class_weight=1.0))
    logs = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    # 12 classes, all scored alike at the shared start: cross-entropy log(12) = 2.48 at first
    assert logs[0]["d_cls"] == pytest.approx(math.log(12), abs=0.05) and logs[-1]["g_cls"] > 0
    plain = tmp_path / "plain"
    train_gan(plain, _tiny_train())
    assert "d_cls" not in json.loads((plain / "log.jsonl").read_text().splitlines()[-1])
    d_only = tmp_path / "d-only"  # --g-class-share 0: D learns the classes, G gets no cross-entropy
    train_gan(d_only, _tiny_train(class_weight=1.0, g_class_share=0.0))
    last = json.loads((d_only / "log.jsonl").read_text().splitlines()[-1])
    assert "d_cls" in last and "g_cls" not in last


@pytest.mark.parametrize("mp", [True, False])
def test_label_matching_logits_come_from_the_projection_or_a_head_of_their_own(mp):
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    base = SMALL if mp else {**SMALL, **dict.fromkeys(MP_SWITCHES, False)}
    torch.manual_seed(0)
    d = Discriminator(GANConfig(**base))
    own, every = d.logits_for_label_matching(x, y)
    assert torch.allclose(own, d(x, y), atol=1e-5) and torch.allclose(every, d.class_logits(x), atol=1e-5)
    torch.manual_seed(0)
    d = Discriminator(GANConfig(**base, separate_class_head=True))
    own, every = d.logits_for_label_matching(x, y)
    assert torch.allclose(own, d(x, y), atol=1e-5) and every.shape == (4, 4)
    assert not torch.allclose(every, d.class_logits(x), atol=1e-3)  # not the projection
    every.sum().backward()
    assert d.class_head.weight.grad is not None and d.class_embed.weight.grad is None


def test_gan_training_with_a_separate_class_head(tmp_path):
    import json

    from kinegen.errors import ConfigError
    from kinegen.training.gan import train_gan

    out = train_gan(tmp_path / "run", _tiny_train(class_weight=1.0, g_class_share=0.0, separate_class_head=True))
    last = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[-1])
    assert last["d_cls"] > 0 and (out / "model_index.json").is_file()
    with pytest.raises(ConfigError, match="set --class-weight"):
        train_gan(tmp_path / "r2", _tiny_train(separate_class_head=True))


def test_diversity_term_is_the_bounded_image_to_latent_distance_ratio():
    from kinegen.training.gan_loss import diversity_term

    z, z2 = torch.zeros(2, 4), torch.ones(2, 4)  # mean |z - z2| = 1
    a = torch.zeros(2, 3, 2, 2)
    b = torch.stack([torch.full((3, 2, 2), 0.5), torch.full((3, 2, 2), 3.0)])  # ratios 0.5 and 3
    assert float(diversity_term(a, b, z, z2, bound=1.0)) == pytest.approx((0.5 + 1.0) / 2)  # 3 is bounded to 1
    assert float(diversity_term(a, b, z, z2, bound=5.0)) == pytest.approx((0.5 + 3.0) / 2)


def test_diversity_term_makes_the_generator_use_z():
    """Maximising the term alone, a generator's images of one label move apart between latents."""
    from kinegen.training.gan_loss import diversity_term

    cfg = GANConfig(**SMALL)
    torch.manual_seed(0)
    g = Generator(cfg)
    opt = torch.optim.Adam(g.parameters(), lr=3e-3, betas=(0.0, 0.99))
    labels = torch.tensor([0, 1, 2, 3] * 2)

    def ratio(seed):
        gen = torch.Generator().manual_seed(seed)
        z, z2 = torch.randn(8, cfg.z_dim, generator=gen), torch.randn(8, cfg.z_dim, generator=gen)
        return diversity_term(g(z, labels), g(z2, labels), z, z2, bound=10.0)

    with torch.no_grad():
        before = float(ratio(99))
    for step in range(30):
        loss = -ratio(step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        renormalize_(g)
    with torch.no_grad():
        assert float(ratio(99)) > 1.5 * before


def test_gan_training_with_the_diversity_term_logs_it(tmp_path):
    import json

    from kinegen.training.gan import train_gan

    train_gan(tmp_path / "run", _tiny_train(diversity_weight=1.0))
    logs = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(r["g_div"] > 0 for r in logs)
    plain = tmp_path / "plain"
    train_gan(plain, _tiny_train())
    assert "g_div" not in json.loads((plain / "log.jsonl").read_text().splitlines()[-1])


def test_sliced_wasserstein_compares_sets_rank_by_rank():
    from kinegen.training.gan_loss import sliced_wasserstein

    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    a = torch.tensor([[0.0], [1.0], [2.0]])
    assert float(sliced_wasserstein(a, a[[2, 0, 1]], 8, gen())) == 0.0  # the same set in another order
    assert float(sliced_wasserstein(a, a + 1, 8, gen())) == pytest.approx(1.0)  # in 1D: sorted, squared, mean
    x = torch.randn(64, 5, generator=gen())
    assert float(sliced_wasserstein(x, x.flip(0), 16, gen())) == pytest.approx(0.0, abs=1e-10)
    assert float(sliced_wasserstein(x, 2 * x, 16, gen())) > 0.1


def test_spectrum_term_asks_for_the_mixture_not_its_mean():
    """Real batch: a quarter of the images carry a checker, the rest are plain. Fakes drawn the same way (other
    noise) score far below fakes that all carry a quarter-strength checker, the mean real spectrum's answer;
    and its gradient reaches the images."""
    from kinegen.training.gan_loss import spectrum_term

    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    checker = ((yy // 4 + xx // 4) % 2).float() * 2 - 1

    def batch(seed, strengths):
        noise = 0.01 * torch.randn(len(strengths), 3, 32, 32, generator=torch.Generator().manual_seed(seed))
        return noise + 0.12 * torch.tensor(strengths).view(-1, 1, 1, 1) * checker

    mixture = [1.0] * 8 + [0.0] * 24
    real = batch(0, mixture)
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    for space in ("rings", "frequencies"):
        same = float(spectrum_term(batch(1, mixture), real, gen(), space=space))
        faint = float(spectrum_term(batch(1, [0.25] * 32), real, gen(), space=space))
        assert faint > 5 * same, space
        fake = batch(2, [0.25] * 32).requires_grad_(True)
        spectrum_term(fake, real, gen(), space=space).backward()
        assert fake.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="rings, frequencies"):
        spectrum_term(real, real, gen(), space="2d")


def test_frequency_spectrum_puts_the_checker_at_its_frequencies():
    """A 4-pixel checker on 32x32 has period 8 along both axes: its power sits at (4, 4) and (-4, 4) of the
    real 2D FFT (and their odd harmonics), where a flat image has none; the ring mean spreads that over 40
    frequencies of ring 6."""
    from kinegen.models.mpgan import SPECTRUM_EPS, frequency_spectrum

    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    checker = (((yy // 4 + xx // 4) % 2).float() * 2 - 1).expand(1, 3, 32, 32)
    s = frequency_spectrum(0.1 * checker).view(32, 17)
    flat = frequency_spectrum(torch.zeros(1, 3, 32, 32)).view(32, 17)
    torch.testing.assert_close(flat, torch.full_like(flat, math.log(SPECTRUM_EPS)))
    peak = s.flatten().topk(2).indices.tolist()
    assert sorted(divmod(i, 17) for i in peak) == [(4, 4), (28, 4)]  # row -4 is row 28


def test_gan_training_with_the_spectrum_term_logs_it(tmp_path):
    import json

    from kinegen.training.gan import train_gan

    train_gan(tmp_path / "run", _tiny_train(spectrum_match=1.0))
    logs = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(r["g_spec"] > 0 for r in logs)


def test_minibatch_stddev_is_the_spread_across_each_group():
    from kinegen.models.mpgan import minibatch_stddev

    x = torch.zeros(4, 2, 1, 1)
    x[2] = 2.0  # groups {0, 2} (0 and 2 apart: std 1) and {1, 3} (identical: std 0)
    out = minibatch_stddev(x, group=2)
    assert out.shape == (4, 3, 1, 1) and torch.equal(out[:, :2], x)
    assert out[:, 2, 0, 0].tolist() == pytest.approx([1.0, 1e-4, 1.0, 1e-4], abs=1e-6)
    assert minibatch_stddev(x[:1], group=4).shape == (1, 3, 1, 1)  # a smaller batch is one group
    with pytest.raises(ValueError, match="multiple of the group size"):
        minibatch_stddev(torch.zeros(6, 2, 1, 1), group=4)


def test_gan_training_with_minibatch_stddev_groups_each_class_and_exports_a_generator(tmp_path):
    import numpy as np

    from kinegen.errors import ConfigError
    from kinegen.pipelines import MPGANPipeline
    from kinegen.training.gan import ShapesData, train_gan

    data = ShapesData(16, pool=1000)
    idx = data.grouped_indices(np.random.default_rng(0), 32, 4)
    labels = data.batch(idx)[1].view(4, 8)
    assert (labels == labels[0]).all() and len(set(labels[0].tolist())) > 1  # one class per group, several groups
    out = train_gan(tmp_path / "run", _tiny_train(mbstd_group=4, batch_size=8))
    d = Discriminator(GANConfig(**{**SMALL, "mbstd_group": 4}))
    assert d(torch.randn(8, 3, SMALL["resolution"], SMALL["resolution"]), torch.arange(8) % 4).shape == (8,)
    assert MPGANPipeline.from_pretrained(out)(class_labels=[0], output_type="pt").images.shape[0] == 1
    with pytest.raises(ConfigError, match="multiple of --mbstd-group"):
        train_gan(tmp_path / "r2", _tiny_train(mbstd_group=3, batch_size=8))
    with pytest.raises(ConfigError, match="at least 2"):
        train_gan(tmp_path / "r3", _tiny_train(mbstd_group=1, batch_size=8))


def test_gan_training_with_positional_maps_saves_them_with_the_generator(tmp_path):
    from kinegen.pipelines import MPGANPipeline
    from kinegen.training.gan import train_gan

    out = train_gan(tmp_path / "run", _tiny_train(variant="r3gan", positional_channels=4))
    pipe = MPGANPipeline.from_pretrained(out)
    assert pipe.gan.config.positional_channels == 4 and len(pipe.gan.net.positional) == 2
    assert pipe.gan.net.positional[0].proj.weight.abs().sum() > 0  # trained away from its zero start
    assert pipe(class_labels=[0, 1], output_type="pt").images.shape == (2, 3, 16, 16)


def test_gan_training_starts_from_another_runs_networks_and_may_add_positional_maps_and_spectra(tmp_path):
    from safetensors.torch import load_file

    from kinegen.errors import ConfigError
    from kinegen.training.gan import train_gan

    train_gan(tmp_path / "a", _tiny_train(variant="r3gan"))
    out = train_gan(tmp_path / "b", _tiny_train(variant="r3gan", positional_channels=4, spectral_weight=1.0,
                                                pixel_templates=2, init=str(tmp_path / "a"), steps=1, lr=1e-12))
    a, b = (tmp_path / "a" / "checkpoint", tmp_path / "b" / "checkpoint")
    ga, gb = load_file(str(a / "generator.safetensors")), load_file(str(b / "generator.safetensors"))
    assert set(gb) - set(ga) == {k for k in gb if k.startswith("positional.")} != set()
    for k, v in ga.items():  # one step at lr 1e-12: the weights are the first run's
        torch.testing.assert_close(gb[k], v, rtol=0, atol=1e-6)
    da, db = load_file(str(a / "discriminator.safetensors")), load_file(str(b / "discriminator.safetensors"))
    assert all(torch.allclose(db[k], v, atol=1e-6) for k, v in da.items())
    assert set(db) - set(da) == {"spectral.weight", "templates.templates", "templates.weight"}
    logged = json.loads((tmp_path / "b" / "log.jsonl").read_text().splitlines()[-1])
    assert {"d_spec_real", "d_spec_fake", "d_tmpl_real", "d_tmpl_fake"} <= set(logged)
    from kinegen.pipelines import MPGANPipeline

    config = MPGANPipeline.from_pretrained(out).gan.config
    assert "spectral_weight" not in config and "pixel_templates" not in config  # D only: not in G's config
    with pytest.raises(ConfigError, match="--spectral-weight"):
        train_gan(tmp_path / "e", _tiny_train(variant="r3gan", spectral_weight=-1.0))
    with pytest.raises(ConfigError, match="differs in widths"):
        train_gan(tmp_path / "c", _tiny_train(variant="r3gan", widths="64,32,32", init=str(tmp_path / "a")))
    with pytest.raises(ConfigError, match="no GAN checkpoint"):
        train_gan(tmp_path / "d", _tiny_train(variant="r3gan", init=str(tmp_path)))
    for name in "cde":  # refused before anything is written
        assert not (tmp_path / name).exists()
    # a fine-tune may raise the maps' learning-rate gain: the loaded maps are rescaled, G draws what it drew
    out_f = train_gan(tmp_path / "f", _tiny_train(variant="r3gan", positional_channels=4, positional_gain=50.0,
                                                  noise_inputs=True, spectral_weight=1.0, pixel_templates=2,
                                                  init=str(tmp_path / "b"), steps=1, lr=1e-12))
    pb, pf = (MPGANPipeline.from_pretrained(o).gan.net for o in (out, out_f))
    for mb, mf in zip(pb.positional, pf.positional, strict=True):
        torch.testing.assert_close(mf.encoding(), mb.encoding(), rtol=1e-5, atol=1e-5)
        assert float(mf.map.abs().mean()) < float(mb.map.abs().mean()) / 40  # stored at 1/50 the scale
    assert len(pf.noise) == 2 and all(float(m.weight.abs().max()) < 1e-6 for m in pf.noise)  # added, at 0
    train_gan(tmp_path / "g", _tiny_train(variant="r3gan", noise_inputs=True, noise_weight_init=0.5, steps=1,
                                          lr=1e-12))
    gg = load_file(str(tmp_path / "g" / "checkpoint" / "generator.safetensors"))
    noise_w = [v for k, v in gg.items() if k.startswith("noise.")]
    assert len(noise_w) == 2 and all(torch.allclose(10 * w, torch.full_like(w, 0.5)) for w in noise_w)  # gain x stored
    with pytest.raises(ConfigError, match="--noise-inputs true"):
        train_gan(tmp_path / "h", _tiny_train(variant="r3gan", noise_weight_init=0.5))
    pipe_f = MPGANPipeline.from_pretrained(out_f)
    a, b = (pipe_f(class_labels=[0, 1], seeds=[3, 4], output_type="pt").images for _ in range(2))
    torch.testing.assert_close(a, b)  # a seed keeps its image: the noise images come from the seed too


def test_discriminator_class_margins_start_at_zero_with_shared_class_embeddings():
    from kinegen.models.mpgan import Discriminator
    from kinegen.models.mpgan_config import GANConfig
    from kinegen.training.gan import ShapesData, discriminator_diagnostics

    data = ShapesData(32, 100)
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(12)
    swapped = data.other_shape(labels, gen)
    for y, o in zip(data.classes, swapped.tolist(), strict=True):  # same colour, another shape
        assert data.classes[o].split()[0] == y.split()[0] and data.classes[o] != y
    real, labels = data.batch(np.arange(12))
    torch.manual_seed(0)
    shared = discriminator_diagnostics(Discriminator(GANConfig()), data, real, labels, gen)
    assert shared["d_margin_class"] == 0 and shared["d_margin_shape"] == 0  # every class starts as one vector
    assert shared["d_win_class"] == 0 and shared["d_win_shape"] == 0  # ties are not wins
    assert len([k for k in shared if k.startswith("mag_")]) == 4
    linear = discriminator_diagnostics(Discriminator(GANConfig(shared_class_init=False)), data, real, labels, gen)
    assert abs(linear["d_margin_class"]) > 1e-4


def test_gan_training_evaluates_its_ema_against_held_out_images(tmp_path):
    import json

    from kinegen.errors import ConfigError
    from kinegen.training.gan import train_gan

    train_gan(tmp_path / "run", _tiny_train(resolution=32, widths="32,32,32,32", eval_every=1, eval_images=24))
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["ema_sigma_rel"] == 0.10
    for r in rows:
        assert 0 <= r["class_accuracy"] <= 1 and r["fd"] > 0 and 0 <= r["modes_covered"] <= 12
        assert set(r["fake_textures"]) == {"plain", "checkered", "striped", "noisy", "other"}
        assert sum(r["fake_textures"].values()) == pytest.approx(1.0)
    assert rows[0]["class_accuracy"] < 0.5  # two steps of training draw no class
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {"d_margin_shape", "d_margin_class", "d_win_shape", "d_win_class"} <= set(log[-1])
    folder = tmp_path / "imgs"
    folder.mkdir()
    from PIL import Image

    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(folder / "a.png")
    with pytest.raises(ConfigError, match="--data shapes"):
        train_gan(tmp_path / "r2", _tiny_train(data=f"imagefolder:{folder}", resolution=32, widths="32,32,32,32",
                                               eval_every=1))
    assert not (tmp_path / "r2").exists()  # refused before anything is written


def test_gan_training_stopped_by_its_time_box_before_a_snapshot_still_exports(tmp_path):
    import json

    from kinegen.training.gan import train_gan

    out = train_gan(tmp_path / "run", _tiny_train(steps=5, snapshot_every=100, max_minutes=1e-9))
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == 1
    assert [p.name for p in sorted((tmp_path / "run" / "snapshots").iterdir())][0].startswith("0000001_")
    assert (out / "model_index.json").is_file()


def test_gan_training_starts_the_generator_output_gain_where_asked(tmp_path):
    from safetensors.torch import load_file

    from kinegen.training.gan import train_gan

    for init in (1.0, 0.0):
        train_gan(tmp_path / f"g{init}", _tiny_train(steps=1, lr=1e-12, out_gain_init=init))
        gain = load_file(str(tmp_path / f"g{init}" / "checkpoint" / "generator.safetensors"))["out_gain"]
        assert abs(float(gain) - init) < 1e-6


def test_gan_image_folder_errors(tmp_path):
    import numpy as np
    from PIL import Image

    from kinegen.errors import ConfigError
    from kinegen.training.gan import train_gan

    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no images"):
        train_gan(tmp_path / "r1", _tiny_train(data=f"imagefolder:{tmp_path / 'empty'}"))
    mixed = tmp_path / "mixed" / "cats"
    mixed.mkdir(parents=True)
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(mixed / "a.png")
    Image.fromarray(np.zeros((20, 16, 3), np.uint8)).save(mixed / "b.png")
    with pytest.raises(ConfigError, match="mixed sizes"):
        train_gan(tmp_path / "r2", _tiny_train(data=f"imagefolder:{tmp_path / 'mixed'}"))
    (mixed / "b.png").unlink()
    Image.fromarray(np.full((16, 16, 3), 200, np.uint8)).save(mixed / "b.png")
    out = train_gan(tmp_path / "r3", _tiny_train(data=f"imagefolder:{tmp_path / 'mixed'}"))
    assert (out / "model_index.json").is_file()


def test_pipeline_saves_loads_and_is_batch_independent(tmp_path):
    import numpy as np

    from kinegen.data.shape_images import class_names
    from kinegen.pipelines import MPGANGenerator, MPGANPipeline

    gan = MPGANGenerator.from_gan_config(GANConfig(resolution=16, widths=(64, 64, 32), num_classes=12), class_names())
    with torch.no_grad():
        gan.net.out_gain.fill_(1.0)
    MPGANPipeline(gan=gan).save_pretrained(tmp_path / "p")
    pipe = MPGANPipeline.from_pretrained(tmp_path / "p")
    batch = pipe(class_labels=["red circle", 3, "Blue Star"], seeds=[5, 6, 7], output_type="np").images
    alone = pipe(class_labels="blue star", seeds=7, output_type="np").images
    assert batch.shape == (3, 16, 16, 3) and 0 <= batch.min() and batch.max() <= 1
    np.testing.assert_allclose(batch[2], alone[0], atol=1e-5)
    assert not np.allclose(batch[0], batch[1])
    pt = pipe(class_labels=[0, 0], seeds=[1, 2], output_type="pt", truncation=0.5).images
    assert pt.shape == (2, 3, 16, 16)
    assert len(pipe(seeds=0).images) == 12  # every class once
    with pytest.raises(ValueError, match="valid classes: red circle, red square"):
        pipe(class_labels="green moon")
    with pytest.raises(ValueError, match="2 seeds for 3 images"):
        pipe(class_labels=[0, 1, 2], seeds=[1, 2])


def test_gan_metrics_tell_real_images_from_noise():
    import numpy as np

    from kinegen.data.shape_images import HELD_OUT_SEED, batch
    from kinegen.evaluation.gan_metrics import evaluate_images
    from kinegen.models.gan_classifier import FeatureClassifier

    torch.manual_seed(0)
    clf = FeatureClassifier(12)  # untrained: random features still separate these
    n = 96
    labels = np.arange(n) % 12
    real = batch(np.arange(n) + HELD_OUT_SEED, labels, 32)
    other = batch(np.arange(n) + HELD_OUT_SEED + 5000, labels, 32)
    noise = (np.random.default_rng(0).random((n, 32, 32, 3)) * 255).astype(np.uint8)
    same = evaluate_images(clf, real, labels, other, labels, kid_subset=48)
    bad = evaluate_images(clf, real, labels, noise, labels, kid_subset=48)
    assert same["fd"] < bad["fd"] / 3 and same["kid"] < bad["kid"]
    assert same["precision"] > 0.5 > bad["precision"] and same["recall"] > 0.5 > bad["recall"]
    assert same["modes"] == 12 and same["n_real"] == same["n_fake"] == n
    for m in (same, bad):  # 8 images of each class: the accuracy is the mean of the per-class accuracies
        per_class = np.array(m["per_class_accuracy"])
        assert m["class_accuracy"] == pytest.approx(per_class.mean())
        assert m["modes_covered"] == int((per_class >= 0.5).sum())
    with torch.no_grad():  # ... and the classifier's reading of the generated (here: other real) images
        pred = clf(torch.from_numpy(other).permute(0, 3, 1, 2).float() / 127.5 - 1).argmax(1).numpy()
    assert same["class_accuracy"] == pytest.approx((pred == labels).mean())
    # Class spread: other real images vary as much as the real ones; one image per class does not vary.
    one_each = np.repeat(other[:12], n // 12, axis=0)
    collapsed = evaluate_images(clf, real, labels, one_each, np.repeat(labels[:12], n // 12), kid_subset=48)
    assert 0.8 < same["class_spread"] < 1.25 and collapsed["class_spread"] == 0.0


def test_bundled_gan_evaluation_classifier_knows_the_classes():
    import numpy as np

    from kinegen.data.shape_images import HELD_OUT_SEED, REFERENCE_SEEDS, batch
    from kinegen.evaluation.gan_metrics import load_classifier

    clf = load_classifier()
    labels = np.arange(96) % 12
    x = torch.from_numpy(batch(HELD_OUT_SEED + REFERENCE_SEEDS + np.arange(96), labels, 32))
    with torch.no_grad():
        pred = clf(x.permute(0, 3, 1, 2).float() / 127.5 - 1).argmax(1).numpy()
    assert (pred == labels).mean() >= 0.95


def _tiny_pipeline_folder(path, **cfg):
    from kinegen.data.shape_images import class_names
    from kinegen.pipelines import MPGANGenerator, MPGANPipeline

    gan = MPGANGenerator.from_gan_config(GANConfig(resolution=16, widths=(64, 64, 32), num_classes=12, **cfg),
                                         class_names())
    with torch.no_grad():
        gan.net.out_gain.fill_(1.0)
    MPGANPipeline(gan=gan).save_pretrained(path)
    return path


def test_generate_class_images_from_a_folder_and_its_errors(tmp_path):
    import numpy as np

    import kinegen
    from kinegen.errors import InvalidRequestError

    pipe = kinegen.load_pipeline(_tiny_pipeline_folder(tmp_path / "gan"), cache=False)
    res = kinegen.generate_class_images(pipe, ["red circle", "blue star"], num_images=5, seed=3)
    assert res.images.shape == (5, 16, 16, 3) and res.seeds == [3, 4, 5, 6, 7]
    assert res.class_names == ["red circle", "blue star", "red circle", "blue star", "red circle"]
    one = kinegen.generate_class_images(pipe, "blue star", num_images=1, seed=6)
    np.testing.assert_allclose(res.images[3], one.images[0], atol=1e-5)  # seed and class decide the image
    grid = res.grid(upscale=2)  # one column per requested class: 2 columns, 3 rows
    assert grid.shape == (2 + 3 * (32 + 2), 2 + 2 * (32 + 2), 3)
    np.testing.assert_allclose(grid[2 + 34:2 + 34 + 32:2, 2 + 34:2 + 34 + 32:2], res.images[3])  # row 2: blue star
    assert res.grid(columns=5).shape == (2 + 18, 2 + 5 * 18, 3)
    repeated = kinegen.generate_class_images(pipe, ["red circle", "red circle", "blue star"], num_images=7)
    assert repeated.grid().shape[1] == 2 + 3 * 18  # the requested list's length, not the distinct classes
    assert one.grid().shape == (20, 20, 3)  # one class: a square-ish grid
    out = res.save(tmp_path / "grid.png")
    assert out.is_file()
    with pytest.raises(InvalidRequestError, match="valid classes: red circle"):
        kinegen.generate_class_images(pipe, "green moon")
    with pytest.raises(InvalidRequestError, match="num_images"):
        kinegen.generate_class_images(pipe, num_images=0)
    with pytest.raises(InvalidRequestError, match="class-conditional GAN"):
        kinegen.generate(pipe, "a red circle")
    with pytest.raises(InvalidRequestError, match="trained without texture labels; leave the texture out"):
        kinegen.generate_class_images(pipe, "blue star", texture="striped")


def test_generate_class_images_with_a_texture(tmp_path):
    import kinegen
    from kinegen.errors import InvalidRequestError

    tex = dict(num_textures=4, texture_prior=(0.55, 0.15, 0.15, 0.15), positional_channels=2,
               g_texture_conditioning="stages")
    pipe = kinegen.load_pipeline(_tiny_pipeline_folder(tmp_path / "gan", **tex), cache=False)
    with torch.no_grad():
        for m in pipe.gan.net.positional:  # the label reaches the image only through the maps: make them count
            m.proj.weight.normal_()
            m.gain_logit.fill_(1.0)  # MP form: the maps' gain starts at tanh(0) = 0
            m.texture_scale[3].fill_(0.5)
    res = kinegen.generate_class_images(pipe, "blue star", num_images=2, seed=3, texture="Noisy")
    assert res.texture == "noisy"
    expected = pipe(class_labels=["blue star"] * 2, seeds=[3, 4], textures="noisy", output_type="np").images
    torch.testing.assert_close(torch.from_numpy(res.images), torch.from_numpy(expected))
    plain = kinegen.generate_class_images(pipe, "blue star", num_images=2, seed=3, texture="plain")
    assert abs(plain.images - res.images).max() > 1e-3
    assert kinegen.generate_class_images(pipe, "blue star", num_images=1).texture is None  # each seed's own
    with pytest.raises(InvalidRequestError, match="unknown texture 'wavy'; valid textures: plain, checkered"):
        kinegen.generate_class_images(pipe, "blue star", texture="wavy")


def test_cli_generate_writes_a_gan_grid_and_refuses_text_flags(tmp_path, capsys):
    from PIL import Image

    from kinegen.cli import main

    folder = str(_tiny_pipeline_folder(tmp_path / "gan"))
    out = tmp_path / "grid.png"
    assert main(["generate", "--model", folder, "--class", "red circle", "--num-images", "16", "-o", str(out)]) == 0
    assert Image.open(out).size == (2 + 4 * (64 + 2),) * 2  # 4x4 grid of 16x16 images upscaled 4x
    assert main(["generate", "--model", folder, "--class", "red circle", "--steps", "4"]) == 2
    assert "--steps does not apply" in capsys.readouterr().err
    assert main(["generate", "a red circle", "--model", "tiny-wan", "--class", "red circle"]) == 2
    assert "--class does not apply to tiny-wan" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-wan"]) == 2
    assert "needs a prompt" in capsys.readouterr().err
