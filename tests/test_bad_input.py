"""Bad input: a clear message, exit status 2, and no output file left behind."""

from __future__ import annotations

import pytest

import kinegen
from kinegen.cli import main
from kinegen.errors import InvalidRequestError


@pytest.mark.parametrize("args, message", [
    (["--height", "100"], "height 100 is not a multiple of 16"),
    (["--width", "8"], "width must be at least 16"),
    (["--height", "0"], "height must be a positive integer"),
    (["--frames", "8"], "frame counts of the form 4k + 1 (set by how its VAE compresses time); 8 is not one. "
                        "Try 5 or 9"),
    (["--frames", "0"], "frames must be an integer between 1 and 1025"),
    (["--steps", "0"], "steps must be an integer between 1 and 1000"),
    (["--steps", "100000"], "steps must be an integer between 1 and 1000"),
    (["--guidance", "nan"], "guidance must be a number between 0 and 100"),
    (["--seed", "-1"], "seed must be an integer"),
    (["--cache", "nosuch"], "Unknown accelerator 'nosuch'. Valid names: first-block"),
    (["--cache", "first-block:foo=1"], "unknown key 'foo'. Valid keys: threshold"),
    (["--cache", "mag:threshold=high"], "threshold='high' is not a valid float"),
    (["--true-cfg-scale", "3"], "true_cfg_scale applies to guidance-distilled models"),
    (["--image", "x.png"], "does not take an input image"),
])
def test_cli_rejects_bad_generation_input(tmp_path, capsys, args, message):
    out = tmp_path / "o.mp4"
    rc = main(["generate", "a red circle", "-o", str(out), "--steps", "2", *args] if "--steps" not in args
              else ["generate", "a red circle", "-o", str(out), *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(tmp_path, capsys, prompt):
    assert main(["generate", prompt, "-o", str(tmp_path / "o.mp4")]) == 2
    assert "The prompt is empty" in capsys.readouterr().err


def test_output_paths(tmp_path, capsys):
    assert main(["generate", "x", "-o", str(tmp_path / "missing" / "o.mp4")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
    assert main(["generate", "x", "-o", str(tmp_path / "o.png")]) == 2
    assert "must end with .mp4 for a video model" in capsys.readouterr().err
    assert main(["generate", "x", "-o", str(tmp_path)]) == 2
    assert "must end with .mp4" in capsys.readouterr().err
    assert main(["generate", "x", "--model", "tiny-flux", "-o", str(tmp_path / "o.mp4")]) == 2
    assert "must end with .png or .jpg" in capsys.readouterr().err
    assert main(["generate", "x", "--model", "tiny-flux", "--frames", "5", "-o", str(tmp_path / "o.png")]) == 2
    assert "generates images; drop --frames" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_unknown_model(tmp_path, capsys):
    assert main(["generate", "x", "--model", "nope", "-o", str(tmp_path / "o.mp4")]) == 2
    assert "Unknown model 'nope'. Registered models:" in capsys.readouterr().err


def test_failure_mid_run_leaves_no_file(tmp_path, monkeypatch, wan):
    """If anything fails after the run started (here: the encoder), nothing is written."""
    import kinegen.media as media

    def broken(*a, **k):
        raise RuntimeError("encoder died")

    monkeypatch.setattr(media.imageio_ffmpeg if hasattr(media, "imageio_ffmpeg") else __import__("imageio_ffmpeg"),
                        "write_frames", broken)
    result = kinegen.generate(wan, "a red circle", steps=2)
    with pytest.raises(RuntimeError, match="encoder died"):
        result.save(tmp_path / "o.mp4")
    assert list(tmp_path.iterdir()) == []


def test_api_raises_typed_errors(wan):
    with pytest.raises(InvalidRequestError, match="not a multiple of 16"):
        kinegen.generate(wan, "x", height=72)
    with pytest.raises(InvalidRequestError, match="between 1 and 1000"):
        kinegen.generate(wan, "x", steps=0)


def test_profile_rejects_bad_configs_before_running(tmp_path, capsys):
    rc = main(["profile", "--prompt", "x", "--config", "first-block:nope=1", "--output", str(tmp_path / "p")])
    assert rc == 2
    assert "unknown key 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_cogvideox_frames_are_8k_plus_1(load_tiny):
    with pytest.raises(InvalidRequestError, match="form 8k \\+ 1.*Try 9 or 17"):
        kinegen.generate(load_tiny("tiny-cogvideox"), "x", frames=13)
