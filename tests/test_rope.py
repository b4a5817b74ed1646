"""Position interpolation for Wan's RoPE (kinegen.models.rope) and the multi-size training that uses it."""

import json

import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from kinegen.errors import ConfigError
from kinegen.models.rope import (
    InterpolatedWanRoPE,
    install_position_interpolation,
    interpolated_positions,
    read_rope_file,
    write_rope_file,
)


def _latents(frames, side):  # [B, C, F, H, W] latents whose (1, 2, 2) patches make a frames x side x side grid
    return torch.zeros(1, 4, frames, 2 * side, 2 * side)


def test_reference_grid_is_wans_own_rope_bit_for_bit():
    base = WanRotaryPosEmbed(32, (1, 2, 2), 1024)
    rope = InterpolatedWanRoPE(base, (5, 8, 8))
    for a, b in zip(rope(_latents(5, 8)), base(_latents(5, 8)), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_denser_grids_sample_the_reference_positions():
    base = WanRotaryPosEmbed(32, (1, 2, 2), 1024)
    rope = InterpolatedWanRoPE(base, (5, 8, 8))
    cos_ref, sin_ref = (t.view(5, 8, 8, -1) for t in base(_latents(5, 8)))
    cos, sin = (t.view(9, 16, 16, -1) for t in rope(_latents(9, 16)))  # 2x in space, frames 0, 0.5, ..., 4
    assert cos.shape == (9, 16, 16, 32)
    # every second token sits on a reference position: frame 2k -> k, row/column 2i -> i
    torch.testing.assert_close(cos[::2, ::2, ::2], cos_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(sin[::2, ::2, ::2], sin_ref, rtol=0, atol=1e-12)
    # and the others between them, as a rotation by half the angle: cos(a/2)^2 = (1 + cos a) / 2 on the height part
    t, h = rope.t_dim, rope.h_dim
    half = cos[0, 1, 0, t:t + h]
    torch.testing.assert_close(half.square(), (1 + cos_ref[0, 1, 0, t:t + h]) / 2, rtol=0, atol=1e-6)


def test_positions_per_axis():
    assert interpolated_positions(24, 8, temporal=False).tolist() == pytest.approx([i / 3 for i in range(24)])
    assert interpolated_positions(15, 5, temporal=True).tolist() == pytest.approx([i * 4 / 14 for i in range(15)])
    assert interpolated_positions(1, 5, temporal=True).tolist() == [0.0]  # an image: one frame at 0


def test_install_is_idempotent_and_refuses_other_ropes(tmp_path):
    from kinegen.models.shapes_t2v import build_transformer

    transformer = build_transformer()
    rope = install_position_interpolation(transformer, (5, 8, 8))
    assert transformer.rope is rope and install_position_interpolation(transformer, (3, 4, 4)) is rope
    assert rope.reference_grid == (3, 4, 4)

    class Other(torch.nn.Module):
        rope = torch.nn.Identity()

    with pytest.raises(ConfigError, match="Wan's 3D RoPE"):
        install_position_interpolation(Other(), (5, 8, 8))


def test_rope_file_round_trip_and_bad_files(tmp_path):
    assert read_rope_file(tmp_path) is None
    write_rope_file(tmp_path, (5, 8, 8))
    assert read_rope_file(tmp_path) == (5, 8, 8)
    for bad in ('{"reference_grid": [5, 8]}', '{"reference_grid": [5, 8, 0]}', '[5, 8, 8]', "{oops",
                '{"reference_grid": [5, 8, true]}'):
        (tmp_path / "kinegen_rope.json").write_text(bad)
        with pytest.raises(ConfigError, match="kinegen_rope.json"):
            read_rope_file(tmp_path)


def test_parse_sizes():
    from kinegen.training.configs import T2VTrainConfig
    from kinegen.training.t2v import parse_sizes

    cfg = T2VTrainConfig(dataset_clips=6144, batch_size=8)
    base, mid, big = parse_sizes("256x33=0.6, 384x57=0.1", cfg)
    assert (base.size, base.frames, base.share, base.clips, base.batch_size) == (128, 17, pytest.approx(0.3), 6144, 8)
    assert (mid.size, mid.frames, mid.share, mid.tokens, mid.clips, mid.batch_size) == (256, 33, 0.6, 2304, 853, 1)
    assert (big.tokens, big.clips, big.batch_size, big.folder_name) == (8640, 228, 1, "latents_384x57")
    assert len(parse_sizes("", cfg)) == 1
    with pytest.raises(ValueError, match="at most 50000"):  # the sizes' seed ranges would overlap
        parse_sizes("256x33=0.5", T2VTrainConfig(dataset_clips=50_001))
    for bad, match in [("256x33", "SIZExFRAMES=SHARE"), ("250x33=0.5", "multiple of 16"), ("256x32=0.5", "4k"),
                       ("256x33=0", "above 0"), ("256x33=0.6,384x57=0.6", "more than 1"),
                       ("128x17=0.5", "twice"), ("256x33=0.3,256x33=0.3", "twice"), ("big=1", "SIZExFRAMES")]:
        with pytest.raises(ValueError, match=match):
            parse_sizes(bad, cfg)


def test_multi_size_training_exports_a_folder_that_loads_interpolated(tmp_path):
    from kinegen import load_pipeline
    from kinegen.loading import resolve_model
    from kinegen.training.configs import T2VTrainConfig
    from kinegen.training.t2v import train_t2v

    bundled = resolve_model("kinegen-shapes-t2v").folder
    cfg = T2VTrainConfig(vae=str(bundled / "vae"), init=str(bundled), steps=2, batch_size=2, lr=1e-4,
                         dataset_clips=2, frames=5, size=32, sizes="64x9=0.5")
    out = train_t2v(tmp_path / "run", cfg)
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("latents")) == [
        "latents", "latents_64x9"]
    assert json.loads((out / "kinegen_rope.json").read_text()) == {"reference_grid": [2, 2, 2]}
    pipe = load_pipeline(out, cache=False)
    assert isinstance(pipe.transformer.rope, InterpolatedWanRoPE) and pipe.transformer.rope.reference_grid == (2, 2, 2)
    # a further single-size stage from it keeps the interpolation; one from a folder without the file does not
    again = train_t2v(tmp_path / "again", T2VTrainConfig(vae=str(bundled / "vae"), init=str(out), steps=1,
                                                         batch_size=1, dataset_clips=1, frames=5, size=32))
    assert read_rope_file(again) == (2, 2, 2)
    plain = train_t2v(tmp_path / "plain", T2VTrainConfig(vae=str(bundled / "vae"), steps=1, batch_size=1,
                                                         dataset_clips=1, frames=5, size=32))
    assert read_rope_file(plain) is None
    assert type(load_pipeline(plain, cache=False).transformer.rope) is WanRotaryPosEmbed
