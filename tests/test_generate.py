"""Generation end to end through the Python API and the CLI, on tiny pipelines of every family."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import kinegen
from kinegen.cli import main
from kinegen.media import read_video


@pytest.mark.parametrize("model, fields, shape, calls_per_step", [
    ("tiny-wan", dict(frames=5, height=48, width=80), (5, 48, 80, 3), 2),  # CFG: conditional + unconditional call
    ("tiny-hunyuanvideo", dict(frames=9, height=32, width=48), (9, 32, 48, 3), 1),  # guidance embedded
    ("tiny-cogvideox", dict(frames=17, height=48, width=32), (17, 48, 32, 3), 1),  # CFG batched in one call
    ("tiny-flux", dict(height=48, width=32), (1, 48, 32, 3), 1),  # guidance embedded
])
def test_api_generates_requested_shape(load_tiny, model, fields, shape, calls_per_step):
    pipe = load_tiny(model)
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(lambda *_: seen.append(1))
    try:
        result = kinegen.generate(pipe, "a red circle moving right", seed=0, steps=3, **fields)
    finally:
        hook.remove()
    assert result.frames.shape == shape
    assert result.frames.dtype == np.float32
    assert 0.0 <= result.frames.min() and result.frames.max() <= 1.0 and result.frames.std() > 0.01
    assert result.timings["transformer_calls"] == len(seen) == 3 * calls_per_step
    assert result.request.steps == 3 and (result.request.height, result.request.width) == shape[1:3]
    t = result.timings
    assert t["total"] >= t["transformer"] > 0
    assert t["total"] == pytest.approx(t["text_encoder"] + t["transformer"] + t["vae_decode"] + t["other"], rel=1e-6)


def test_same_seed_same_output_different_seed_different(wan):
    a = kinegen.generate(wan, "a red circle", seed=7, steps=3).frames
    b = kinegen.generate(wan, "a red circle", seed=7, steps=3).frames
    c = kinegen.generate(wan, "a red circle", seed=8, steps=3).frames
    d = kinegen.generate(wan, "a blue square", seed=7, steps=3).frames
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a, d), "the prompt must reach the transformer"


def test_step_callback_sees_every_step(wan):
    steps = []
    kinegen.generate(wan, "a red circle", steps=4, step_callback=lambda i, n, latents: steps.append((i, n)))
    assert steps == [(0, 4), (1, 4), (2, 4), (3, 4)]


@pytest.mark.parametrize("model, args, frames, size", [
    ("tiny-wan", ["--frames", "9", "--height", "32", "--width", "64"], 9, (32, 64)),
    ("tiny-hunyuanvideo", ["--frames", "5"], 5, (32, 32)),
    ("tiny-cogvideox", ["--frames", "9", "--height", "48"], 9, (48, 32)),
])
def test_cli_writes_a_decodable_mp4(model, args, frames, size, tmp_path, capsys):
    out = tmp_path / "clip.mp4"
    rc = main(["generate", "a red circle moving right", "--model", model, "--steps", "3", "-o", str(out), *args])
    assert rc == 0
    video = read_video(out)
    assert video.shape == (frames, *size, 3)
    printed = capsys.readouterr()
    assert f"wrote {out}" in printed.out and "transformer" in printed.out
    assert "random weights" in printed.err  # tiny models say what they are
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]


def test_cli_writes_png_for_image_models(tmp_path):
    from PIL import Image

    out = tmp_path / "img.png"
    assert main(["generate", "a red circle", "--model", "tiny-flux", "--steps", "2", "--height", "48", "-o",
                 str(out)]) == 0
    assert Image.open(out).size == (32, 48)


def test_cli_cache_flag_and_json_summary(tmp_path, capsys):
    out = tmp_path / "c.mp4"
    rc = main(["generate", "a red circle", "--model", "tiny-wan", "--steps", "4", "--cache",
               "first-block:threshold=0.9", "--json", "-o", str(out)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accelerators"] == [{"name": "first-block", "config": {"threshold": 0.9}}]
    assert set(summary["timings_s"]) >= {"load", "text_encoder", "transformer", "vae_decode", "total", "write"}
    assert read_video(out).shape[0] == 9


def test_cli_prints_accelerator_settings_and_stats_for_people(tmp_path, capsys):
    from kinegen.text import settings_text, stat_items

    assert settings_text({"speedup": 2.0, "max_error": None, "reuse": "residual", "sensitivity": True,
                          "predictor": ""}) == "speedup=2,reuse=residual,sensitivity=true"
    assert stat_items({"name": "x", "config": {}, "warning": "w", "chosen_speedup": 1.23456, "steps": 8,
                       "map": [[1.0]], "capped": None}) == [("chosen_speedup", "1.23"), ("steps", "8")]
    out = tmp_path / "v.mp4"
    assert main(["generate", "a red circle", "--model", "tiny-wan", "--steps", "4", "-o", str(out),
                 "--cache", "mapguided:speedup=2,max_error=inf,map=recorded"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("accelerator mapguided:"))
    assert "speedup=2,max_error=inf,reuse=residual,map=recorded" in lines[head] and "{" not in lines[head]
    stats = lines[head + 1:]
    assert len(stats) > 10 and "  max_error: inf" in stats
    assert any(line.startswith("  chosen_speedup: ") and float(line.split(": ")[1]) > 1 for line in stats)
    assert all(line.startswith("  ") and ": " in line and "[" not in line for line in stats)


def test_cli_default_output_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "A Red Circle!", "--model", "tiny-wan", "--steps", "2", "--seed", "4"]) == 0
    assert (tmp_path / "a-red-circle-seed4.mp4").is_file()


def test_generate_help_lists_every_accelerator_of_each_kind():
    from kinegen.accelerators.catalog import list_accelerators
    from kinegen.cli import generate

    assert set(generate.CACHE_NAMES) == {a.name for a in list_accelerators("cache")}
    assert set(generate.ATTENTION_NAMES) == {a.name for a in list_accelerators("attention")}


def test_installed_entry_point_help():
    done = subprocess.run([sys.executable, "-m", "kinegen.cli", "generate", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for flag in ["--model", "--output", "--seed", "--height", "--width", "--frames", "--steps", "--guidance",
                 "--negative-prompt", "--cache", "--attention"]:
        assert flag in done.stdout
    assert "hva,svg2,kmeans-sparse,dense-attention" in "".join(done.stdout.split())  # argparse wraps at hyphens
