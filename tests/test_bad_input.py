"""Bad input at every entry point: a clear message that says what to do, exit status 2 and one `error:` line on
the command line, the project's own error type from the Python API, no traceback and no partial files.

Every case fails before a model runs (most before one loads); tests/test_fuzz.py fuzzes the parsers and validators.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest

import kinegen
from kinegen.cli import main
from kinegen.errors import ConfigError, InvalidRequestError, KinegenError, ModelNotFoundError
from kinegen.loading import ASSETS_DIR, resolve_model


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
    (["--cache", "nosuch"], "Unknown accelerator 'nosuch'. Valid names: dasa, dense-attention, faster, first-block"),
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


# ---------------------------------------------------------------------------- helpers


def _fails(capsys, argv: list[str], message: str) -> str:
    """Run the CLI: exit status 2, exactly one `error:` line, ``message`` in stderr, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1
    return err


def _usage_error(capsys, argv: list[str], message: str) -> None:
    """argparse's refusals (a missing flag, a bad choice or type): exit status 2 and its `error:` line."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err
    assert "Traceback" not in err


def _png_claiming(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width`` x ``height`` pixels (with almost no data): how an oversized upload or a
    decompression bomb looks to Pillow before it decodes anything."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))
    return path


@pytest.fixture
def gan_copy(tmp_path):
    """A copy of the bundled GAN's folder (4 MB): a real diffusers folder small enough to break in each test."""
    return Path(shutil.copytree(ASSETS_DIR / "models" / "kinegen-shapes-gan", tmp_path / "gan-copy"))


@pytest.fixture(scope="module")
def gan(load_tiny):
    """The bundled class-conditional GAN, loaded once."""
    return load_tiny("kinegen-shapes-gan")


# ---------------------------------------------------------------------------- kinegen generate


@pytest.mark.parametrize("args, message", [
    (["--class", "nosuch"], "unknown class 'nosuch'; valid classes: red circle, red square"),
    (["--class", "99"], "class index 99 is out of range 0..11"),
    (["--num-images", "0"], "num_images must be an integer between 1 and 1024; got 0."),
    (["--truncation", "2"], "truncation must be in (0, 1] (1 = off); got 2.0."),
    (["--truncation", "nan"], "truncation must be in (0, 1] (1 = off); got nan."),
    (["--upscale", "0"], "--upscale must be between 1 and 16; got 0."),
    (["--seed", "-1"], "seed must be a non-negative integer below 2**63 - 1024; got -1."),
    (["--steps", "4"], "--steps does not apply to kinegen-shapes-gan, a class-conditional GAN"),
    (["--texture", "wavy"], "unknown texture 'wavy'; valid textures: plain, checkered, striped, noisy."),
])
def test_cli_rejects_bad_gan_input(tmp_path, capsys, args, message):
    """`generate` for the class-conditional GAN: every flag's bad value named, no grid written."""
    _fails(capsys, ["generate", "--model", "kinegen-shapes-gan", "-o", str(tmp_path / "g.png"), *args], message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--device", "nosuch"], "Unknown device 'nosuch'; use auto, cpu, cuda, cuda:N or mps."),
    (["--dtype", "int8"], "Unknown dtype 'int8'; use one of: auto, float32"),
    (["--cache", "hva"], "hva is an attention accelerator; a cache accelerator was expected"),
    (["--attention", "first-block"], "first-block is a cache accelerator; an attention accelerator was expected"),
    (["--cache", "mag:ratios=abc"], "ratios must be auto, calibrate or numbers separated by '/'"),
    (["--heatmap", "h.png"], "--heatmap shows Map-Guided Caching's map and plan; add --cache mapguided."),
    (["--cache", "mapguided", "--heatmap", "h.svg"], "--heatmap writes a PNG; give a file name ending in .png"),
    (["--class", "red circle"], "--class does not apply to tiny-wan, a text-conditioned model"),
])
def test_cli_rejects_bad_loading_and_accelerator_flags(tmp_path, capsys, monkeypatch, args, message):
    """Loading and accelerator flags of `generate` fail with what to type instead, before anything runs."""
    monkeypatch.chdir(tmp_path)
    _fails(capsys, ["generate", "x", "--model", "tiny-wan", "--steps", "1", "-o", "o.mp4", *args], message)
    assert list(tmp_path.iterdir()) == []


def test_cli_model_that_is_a_file_or_a_broken_folder(tmp_path, capsys, gan_copy):
    """--model pointing at a file, or at a folder without model_index.json: said so, nothing written."""
    (tmp_path / "notes.txt").write_text("x")
    _fails(capsys, ["generate", "x", "--model", str(tmp_path / "notes.txt"), "-o", str(tmp_path / "o.mp4")],
           "notes.txt is a file; a model is a diffusers folder (with model_index.json)")
    (gan_copy / "model_index.json").unlink()
    err = _fails(capsys, ["generate", "--model", str(gan_copy), "-o", str(tmp_path / "g.png")],
                 "is incomplete; missing:\n  - model_index.json")
    assert "re-download it with `hf download" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gan-copy", "notes.txt"]


# ---------------------------------------------------------------------------- kinegen profile


def test_profile_needs_a_config(tmp_path, capsys):
    """A missing --config is argparse's usage error (status 2), not a traceback."""
    _usage_error(capsys, ["profile", "--prompt", "x", "--output", str(tmp_path / "p")],
                 "the following arguments are required: --config/-c")


@pytest.mark.parametrize("args, message", [
    (["--config", "nosuch"], "Unknown accelerator 'nosuch'. Valid names: dasa, dense-attention, faster, first-block"),
    (["--config", "+"], "Empty configuration '+'."),
    (["--config", "first-block+mag"], "Only one cache accelerator at a time; got first-block, mag."),
    (["--config", "first-block:threshold=-1"], "first-block: threshold must be >= 0"),
    (["--config", "dense", "--repeats", "0"], "--seeds and --repeats must be at least 1 and --warmup at least 0."),
    (["--config", "dense", "--seeds", "0"], "--seeds and --repeats must be at least 1"),
    (["--config", "dense", "--warmup", "-1"], "--warmup at least 0"),
    (["--config", "dense", "--steps", "0"], "steps must be an integer between 1 and 1000; got 0."),
])
def test_profile_rejects_bad_input_before_loading(tmp_path, capsys, args, message):
    """Every `profile` setting is checked before the model loads; no report folder is made."""
    _fails(capsys, ["profile", "--prompt", "x", "--model", "tiny-wan", "--output", str(tmp_path / "p"), *args],
           message)
    assert list(tmp_path.iterdir()) == []


def test_profile_output_that_is_a_file(tmp_path, capsys):
    """--output naming an existing file: refused before loading, the file untouched."""
    (tmp_path / "report").write_text("not a folder")
    _fails(capsys, ["profile", "--prompt", "x", "--config", "dense", "--model", "tiny-wan", "--output",
                    str(tmp_path / "report")], "is a file; give a folder for the report.")
    assert (tmp_path / "report").read_text() == "not a folder"


# ---------------------------------------------------------------------------- kinegen calibrate


@pytest.fixture
def prompt_files(tmp_path):
    """Prompt files: four good prompts, an empty file, a binary file and a folder."""
    (tmp_path / "four.txt").write_text("a red circle\na blue square\na yellow star\na red triangle\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81 not text")
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("prompts, args, message", [
    ("missing.txt", [], "prompt file {tmp}/missing.txt does not exist; give a text file with one prompt per line."),
    ("folder", [], "prompt file {tmp}/folder is a folder; give a text file with one prompt per line."),
    ("empty.txt", [], "empty.txt has 0 prompts; calibration needs at least 4 (50 or more is better)."),
    ("binary.txt", [], "binary.txt is not UTF-8 text; give a text file with one prompt per line."),
    ("four.txt", ["--group-size", "0"], "--seeds and --group-size at least 1"),
    ("four.txt", ["--held-out", "1"], "--held-out must be in [0, 1)"),
    ("four.txt", ["--train-steps", "0"], "--train-steps must be at least 1."),
    ("four.txt", ["--maps", "{tmp}/none.jsonl"], "--maps {tmp}/none.jsonl does not exist; give the maps.jsonl"),
    ("four.txt", ["--output", "{tmp}/four.txt"], "is a file; give a folder for the predictor."),
    ("four.txt", ["--steps", "0"], "steps must be an integer between 1 and 1000; got 0."),
])
def test_calibrate_rejects_bad_input_before_loading(prompt_files, capsys, prompts, args, message):
    """`calibrate`: bad prompt files and settings fail before the model loads; no predictor folder is made."""
    tmp = str(prompt_files)
    before = sorted(p.name for p in prompt_files.iterdir())
    _fails(capsys, ["calibrate", "--model", "tiny-wan", "--prompts", f"{tmp}/{prompts}", "--output", f"{tmp}/pred",
                    *[a.format(tmp=tmp) for a in args]], message.format(tmp=tmp))
    assert sorted(p.name for p in prompt_files.iterdir()) == before


# ---------------------------------------------------------------------------- kinegen train


@pytest.mark.parametrize("args, message", [
    (["vae", "--run", "afile"], "--run afile is a file; give a folder (a new one, or an earlier run's to continue"),
    (["vae", "--export", "afile"], "--export afile is a file; give a folder (for the exported model)."),
    (["vae", "--steps", "0"], "--steps must be at least 1; got 0."),
    (["vae", "--batch-size", "0"], "--batch-size must be at least 1; got 0."),
    (["ar", "--context-noise", "1"], "--context-noise must be 0 to 0.99; got 1.0."),
    (["ar", "--context-noise", "0.2", "--teacher-forcing", "false"], "--context-noise noises the clean history"),
    (["ar", "--rollout-prob", "0.5", "--teacher-forcing", "false"], "--rollout-prob gives teacher forcing a history"),
    (["ar", "--rollout-prob", "1.5"], "--rollout-prob must be 0 to 1; got 1.5."),
    (["ar", "--rollout-prob", "0.5", "--frames", "21"], "--rollout-prob needs windows of at least 4 chunks (two real"),
    (["ar", "--segment-frames", "8"], "--segment-frames must be 4k + 1 frames whose k latent frames after the first"),
    (["ar", "--segment-frames", "13"], "--segment-frames must be 4k + 1 frames whose k latent frames after the first"),
    (["ar", "--segment-frames", "17"], "--frames and --max-start must be whole numbers of segments of --segment-fr"),
    (["ar", "--segment-frames", "17", "--frames", "34", "--max-start", "204", "--rollout-prob", "0.5"],
     "--rollout-prob does not support --segment-frames yet"),
    (["ar", "--segment-frames", "17", "--segment-overlap", "true", "--frames", "34", "--max-start", "204"],
     "with --segment-overlap, segments of 17 frames start every 16: --frames must be 1 + a multiple of 16"),
    (["ar", "--segment-overlap", "true"], "--segment-overlap overlaps VAE segments: give --segment-frames too"),
    (["ar", "--frames", "31"], "--frames must be 1 + 4 * 2 * k (the VAE codes 4 frames per latent frame"),
    (["ar", "--frames", "37"], "--frames must be 1 + 4 * 2 * k (the VAE codes 4 frames per latent frame"),
    (["ar", "--window-frames", "1"], "--window-frames 1 is smaller than a chunk (--chunk-frames 2)"),
    (["ar", "--sink-frames", "9"], "window_frames (9) must be larger than sink_frames"),
    (["ar", "--relink-recycle", "0.5"], "--relink-recycle re-encodes the segment starts of a recycled history: it"),
    (["ar", "--relink-recycle", "2"], "--relink-recycle must be 0 to 1; got 2.0."),
    (["ar", "--relink-weight", "4"], "--relink-weight weights the loss on the image latents the pipeline re-encodes"),
    (["ar", "--relink-weight", "-1"], "--relink-weight must be at least 0; got -1.0."),
    (["ar", "--later-history-segments", "1"], "--later-history-segments and --later-share are about batches of"),
    (["ar", "--later-share", "0.7", "--segment-frames", "17", "--frames", "34", "--max-start", "204",
      "--offset-prob", "0"], "--later-history-segments and --later-share are about batches of windows that start"),
    (["ar", "--later-share", "1.5"], "--later-share must be 0 to 1; got 1.5."),
    (["ar", "--segment-frames", "17", "--segment-overlap", "true", "--frames", "33", "--max-start", "192",
      "--later-history-segments", "2"], "--later-history-segments must leave a segment of the window to train"),
    (["vae", "--lr", "nan"], "--lr must be at least 0; got nan."),
    (["vae", "--crop", "100"], "--crop must be 8 to 64; got 100."),
    (["vae", "--decoder-only", "true"], "--decoder-only fine-tunes a trained VAE's decoder: pass --init VAE_FOLDER."),
    (["vae", "--init", "nope"], "--init nope is not a folder; give a folder an earlier run exported."),
    (["adherence", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1; got 0."),
    (["adherence", "--max-minutes", "-1"], "--max-minutes must be a number of minutes above 0"),
    (["t2v"], "--vae runs/vae/vae is not a folder; train one with `kinegen train vae`."),
    (["t2v", "--vae", "vaedir", "--cfg-dropout", "2"], "--cfg-dropout must be 0 to 1; got 2.0."),
    (["t2v", "--vae", "vaedir", "--shape-weights", "blob=2"], "--shape-weights 'blob=2': expected SHAPE=WEIGHT pairs"),
    (["t2v", "--vae", "vaedir", "--init", "vaedir"], "--init vaedir: vaedir/transformer/diffusion_pytorch_model"),
    (["t2v", "--vae", "vaedir", "--sizes", "256x32=0.5"], "--sizes: '256x32=0.5' needs a size that is a multiple"),
    (["t2v", "--vae", "vaedir", "--sizes", "256x33=0.7,384x57=0.5"], "the shares add up to more than 1"),
    (["gan", "--variant", "nosuch"], "variant must be 'mp' or 'r3gan', got 'nosuch'."),
    (["gan", "--widths", "abc"], "widths must be integers separated by commas, e.g. 128,128,128,64; got 'abc'."),
    (["gan", "--resolution", "12"], "GAN settings: resolution must be a power of two >= 8, got 12"),
    (["gan", "--variant", "r3gan", "--texture-labels", "true", "--g-texture-conditioning", "nosuch"],
     "GAN settings: --g-texture-conditioning must be one of input, stages; got 'nosuch'"),
    (["gan", "--noise-inputs", "true", "--noise-max-resolution", "12"],
     "GAN settings: --noise-max-resolution is the side of a stage from 8x8 (8, 16, 32) or 0 (every stage); got 12"),
    (["gan", "--ablate", "nosuch"], "ablate: unknown switch 'nosuch'; valid: weight_norm"),
    (["gan", "--ema-sigma-rels", "0.5"], "ema_sigma_rels must be numbers in (0, 0.28) separated by commas"),
    (["gan", "--data", "nosuch"], "data must be 'shapes' or 'imagefolder:PATH', got 'nosuch'."),
    (["gan", "--data", "imagefolder:nope"], "imagefolder: nope is not a folder."),
    (["gan-classifier", "--resolution", "3"], "--resolution must be at least 8; got 3."),
])
def test_train_rejects_bad_settings_before_any_work(tmp_path, capsys, monkeypatch, args, message):
    """`train`: a bad setting or folder fails at once; no run folder (not even an empty one) is made."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "vaedir").mkdir()
    extra = ["--dataset-images", "24"] if args[0] == "gan" else []  # the GAN's data is made before its checks
    _fails(capsys, ["train", *args, "--steps", "1", *extra] if "--steps" not in args else ["train", *args], message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "vaedir"]


def test_train_flag_types_are_usage_errors(capsys):
    """Flag values of the wrong type and unknown subcommands: argparse's one-line usage errors."""
    _usage_error(capsys, ["train", "vae", "--steps", "abc"], "argument --steps: invalid int value: 'abc'")
    _usage_error(capsys, ["train", "vae", "--decoder-only", "maybe"], "expected true or false, got 'maybe'")
    _usage_error(capsys, ["train", "nosuch"], "invalid choice: 'nosuch'")


# ---------------------------------------------------------------------------- kinegen eval, models


@pytest.mark.parametrize("args, message", [
    (["adherence", "--prompts", "0"], "--prompts must be at least 1 (100 or more for a stable estimate)."),
    (["adherence", "--model", "tiny-wan", "--cache", "nosuch"], "Unknown accelerator 'nosuch'"),
    (["adherence", "--model", "tiny-wan", "--classifier", "{tmp}/nope"], "No adherence classifier at {tmp}/nope"),
    (["gan", "--model", "{tmp}/nope"], "The folder {tmp}/nope does not exist."),
    (["gan", "--model", "tiny-wan"], "tiny-wan is not a class-conditional GAN here; `kinegen eval gan` takes"),
    (["gan", "--model", "kinegen-shapes-gan", "--images", "10"], "--images must be at least 24 (two per class)"),
    (["gan", "--model", "kinegen-shapes-gan", "--classifier", "{tmp}/nope"], "no GAN evaluation classifier in"),
])
def test_eval_rejects_bad_input(tmp_path, capsys, args, message):
    """`eval adherence|gan`: bad counts, models and classifier folders named before any evaluation."""
    tmp = str(tmp_path)
    _fails(capsys, ["eval", *[a.format(tmp=tmp) for a in args], "-o", f"{tmp}/m.json"], message.format(tmp=tmp))
    assert list(tmp_path.iterdir()) == []


def test_eval_gan_folder_with_a_broken_config(tmp_path, capsys, gan_copy):
    """A component's config.json that is not JSON: one line naming the file and what to do."""
    (gan_copy / "gan" / "config.json").write_text("{not json")
    _fails(capsys, ["eval", "gan", "--model", str(gan_copy), "--images", "24"],
           "gan/config.json' is not a valid JSON file. Restore the folder from the original checkpoint")


def test_eval_and_models_usage_errors(capsys):
    """Bad choices, missing required flags and unknown flags: argparse's usage errors, status 2."""
    _usage_error(capsys, ["eval", "adherence", "--split", "nosuch"], "invalid choice: 'nosuch' (choose from")
    _usage_error(capsys, ["eval", "gan"], "the following arguments are required: --model/-m")
    _usage_error(capsys, ["models", "--nosuch"], "unrecognized arguments: --nosuch")


def test_models_json_is_json(capsys):
    """`kinegen models --json` prints a JSON list and nothing else on stdout."""
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"tiny-wan", "kinegen-shapes-gan"} <= {r["name"] for r in rows}


# ---------------------------------------------------------------------------- kinegen app


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test instead of starting a server if a bad flag ever gets through."""
    import kinegen.apps.web as web

    def launch(*a, **k):
        raise AssertionError("the app was launched despite a bad flag")

    monkeypatch.setattr(web, "launch_app", launch)


@pytest.mark.parametrize("args, message", [
    (["--auth", "alice"], "--auth takes USER:PASSWORD with both parts non-empty."),
    (["--auth", ":secret"], "--auth takes USER:PASSWORD with both parts non-empty."),
    (["--concurrency", "0"], "concurrency and max_queue must be at least 1."),
    (["--max-queue", "0"], "concurrency and max_queue must be at least 1."),
    (["--rate-limit", "-1"], "rate_limit must be 0 (off) or a positive number of runs per minute."),
    (["--port", "70000"], "--port must be between 1 and 65535; got 70000."),
    (["--auth-file", "{tmp}"], "--auth-file {tmp} is a folder; give a text file of USER:PASSWORD lines."),
    (["--auth-file", "{tmp}/none"], "--auth-file {tmp}/none does not exist; give a text file"),
    (["--auth-file", "{tmp}/binary"], "cannot be read (it is not UTF-8 text); give a readable text file"),
    (["--output-dir", "{tmp}/binary"], "--output-dir {tmp}/binary is a file; give a folder for the outputs."),
    (["--models", "nosuch"], "Unknown model 'nosuch'. Registered models:"),
    (["--models", "kinegen-shapes-gan"], "--models kinegen-shapes-gan: it is a class-conditional GAN; give it with "
                                         "--gan-models."),
    (["--gan-models", "tiny-wan"], "--gan-models tiny-wan: it is not a class-conditional GAN; give it with --models."),
])
def test_app_rejects_bad_flags_before_starting(tmp_path, capsys, no_launch, args, message):
    """`app`: logins, limits, ports, files and model lists are checked before a server starts."""
    tmp = str(tmp_path)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00alice:secret")
    argv = ["app", "--models", "tiny-wan", "--gan-models", *[a.format(tmp=tmp) for a in args]]
    _fails(capsys, argv, message.format(tmp=tmp))


def test_app_unreadable_auth_file(tmp_path, capsys, monkeypatch, no_launch):
    """An --auth-file the server may not read (permissions): said so; simulated, as tests may run as root."""
    users = tmp_path / "users"
    users.write_text("alice:secret\n")
    real = Path.read_text

    def read_text(self, *a, **k):
        if self == users:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    _fails(capsys, ["app", "--models", "tiny-wan", "--gan-models", "--auth-file", str(users)],
           f"--auth-file {users} cannot be read (Permission denied); give a readable text file")


# ---------------------------------------------------------------------------- Python API arguments


@pytest.mark.parametrize("field, value, message", [
    ("prompt", None, "The prompt is empty; describe what to generate"),
    ("prompt", "x" * 2001, "The prompt has 2001 characters; the limit is 2000."),
    ("negative_prompt", 5, "The negative prompt must be text; got int."),
    ("steps", "2", "steps must be an integer between 1 and 1000; got '2'."),
    ("steps", True, "steps must be an integer between 1 and 1000; got True."),
    ("steps", 2.0, "steps must be an integer between 1 and 1000; got 2.0."),
    ("frames", -1, "frames must be an integer between 1 and 1025; got -1."),
    ("height", 10**9, "height must be a positive integer up to 4096; got 1000000000."),
    ("width", "64", "width must be a positive integer up to 4096; got '64'."),
    ("guidance", float("nan"), "guidance must be a number between 0 and 100; got nan."),
    ("guidance", float("inf"), "guidance must be a number between 0 and 100; got inf."),
    ("guidance", True, "guidance must be a number between 0 and 100; got True."),
    ("guidance", 10**400, "guidance must be a number between 0 and 100; got 1000"),
    ("true_cfg_scale", "3", "true_cfg_scale must be a number between 0 and 100; got '3'."),
    ("seed", -1, "seed must be an integer between 0 and 2**63 - 1; got -1."),
    ("seed", 2**64, "seed must be an integer between 0 and 2**63 - 1; got 18446744073709551616."),
    ("seed", 1.5, "seed must be an integer between 0 and 2**63 - 1; got 1.5."),
    ("image", 5, "image must be a file path or a PIL image; got int."),
])
def test_request_fields_of_the_wrong_type_or_range(field, value, message):
    """GenerationRequest (what kinegen.generate/prepare build): wrong types and ranges, InvalidRequestError."""
    with pytest.raises(InvalidRequestError) as e:
        kinegen.GenerationRequest(**{"prompt": "x", field: value})
    assert message in str(e.value)


def test_generate_and_prepare_arguments(wan, gan):
    """Unknown fields, pipelines not loaded by Kinegen and GANs given a prompt: named, before anything runs."""
    with pytest.raises(InvalidRequestError, match="Unknown request field\\(s\\) nosuch; valid fields: prompt, "):
        kinegen.generate(wan, "x", nosuch=1)
    with pytest.raises(InvalidRequestError, match="Unknown request field\\(s\\) nosuch"):
        kinegen.prepare(wan, "x", nosuch=1)
    with pytest.raises(InvalidRequestError, match="was not loaded with kinegen.load_pipeline\\(\\)"):
        kinegen.prepare(object(), "x")
    with pytest.raises(InvalidRequestError, match="is a class-conditional GAN: it takes class names, not prompts"):
        kinegen.prepare(gan, "x")
    with pytest.raises(InvalidRequestError, match="tiny-wan generates from prompts; use kinegen.generate"):
        kinegen.generate_class_images(wan, "red circle")


def test_one_accelerator_spec_given_as_a_string(wan):
    """accelerators="first-block" is one accelerator, not one per letter ("Unknown accelerator 'f'")."""
    result = kinegen.generate(wan, "x", steps=1, accelerators="first-block")
    assert [a["name"] for a in result.accelerators] == ["first-block"]


@pytest.mark.parametrize("labels, kwargs, message", [
    ("nosuch", {}, "unknown class 'nosuch'; valid classes: red circle"),
    (99, {}, "class index 99 is out of range 0..11."),
    (1.5, {}, "unknown class 1.5; valid classes"),
    (["red circle", None], {}, "unknown class None; valid classes"),
    (None, {"num_images": "2"}, "num_images must be an integer between 1 and 1024; got '2'."),
    (None, {"num_images": 10**6}, "num_images must be an integer between 1 and 1024"),
    (None, {"truncation": float("nan")}, "truncation must be in (0, 1] (1 = off); got nan."),
    (None, {"seed": -1}, "seed must be a non-negative integer below 2**63 - 1024; got -1."),
])
def test_generate_class_images_rejects_bad_labels(gan, labels, kwargs, message):
    """generate_class_images: labels that are no class (any type), bad counts, truncations and seeds."""
    with pytest.raises(InvalidRequestError) as e:
        kinegen.generate_class_images(gan, labels, **{"num_images": 2, **kwargs})
    assert message in str(e.value)


@pytest.mark.parametrize("model, kwargs, message", [
    (5, {}, "A model is a registered name (wan2.1-t2v-1.3b"),
    ("", {}, "a local diffusers folder or a hub id (owner/name); got ''."),
    ("nosuch", {}, "Unknown model 'nosuch'. Registered models:"),
    ("~nosuch-user-kinegen/model", {}, "The folder ~nosuch-user-kinegen/model does not exist."),
    ("tiny-wan", {"device": "nosuch"}, "Unknown device 'nosuch'; use auto, cpu, cuda, cuda:N or mps."),
    ("tiny-wan", {"device": ""}, "Unknown device ''"),
    ("tiny-wan", {"dtype": "int8"}, "Unknown dtype 'int8'; use one of: auto, float32"),
    ("tiny-wan", {"device": "cpu", "cpu_offload": "x"}, "cpu_offload must be 'model', 'sequential' or False"),
    ("tiny-wan", {"device": "cpu", "cpu_offload": [1]}, "cpu_offload must be 'model', 'sequential' or False"),
])
def test_load_pipeline_rejects_bad_arguments(model, kwargs, message):
    """load_pipeline: bad names, folders, devices, dtypes and offload modes fail before anything is built."""
    with pytest.raises(KinegenError) as e:
        kinegen.load_pipeline(model, cache=False, **kwargs)
    assert message in str(e.value)


def test_accelerate_rejects_bad_specs(wan, gan):
    """accelerate(): unknown keys, two caches, families without a transformer and foreign objects."""
    from kinegen.accelerators.catalog import accelerate

    with pytest.raises(ConfigError, match="first-block: unknown key 'nope'. Valid keys: threshold."):
        accelerate(wan, "first-block:nope=1")
    with pytest.raises(ConfigError, match="Only one cache accelerator at a time; got first-block, mag."):
        accelerate(wan, "first-block", "mag")
    with pytest.raises(ConfigError, match="first-block does not apply to mpgan models"):
        accelerate(gan, "first-block")
    with pytest.raises(KinegenError, match="Kinegen does not know how to drive"):
        accelerate(object(), "first-block")


# ---------------------------------------------------------------------------- spec strings


@pytest.mark.parametrize("spec, kind, message", [
    ("", None, "An accelerator spec must be a non-empty string such as 'first-block:threshold=0.08'."),
    ("nosuch", None, "Unknown accelerator 'nosuch'. Valid names: dasa, dense-attention, faster, first-block"),
    ("first-block:threshold", None, "first-block: expected key=value, got 'threshold'."),
    ("first-block:threshold=", None, "first-block: threshold='' is not a valid float."),
    ("first-block:threshold=nan", None, "first-block: threshold='nan' is not a valid float."),
    ("first-block:threshold=1,threshold=2", None, "first-block: threshold is given twice; give it once."),
    ("mag:ratios=abc", None, "mag: ratios must be auto, calibrate or numbers separated by '/'; got 'abc'"),
    ("hva:q_window=1-2", None, "hva: q_window must be three positive integers (frames, rows, cols); got (1, 2)"),
    ("hva:min_keys=1e3", None, "hva: min_keys='1e3' is not a valid int."),
    ("taylorseer:use_lite_mode=maybe", None, "taylorseer: use_lite_mode='maybe' is not a valid bool."),
    ("pab:low=5,high=1", None, "0 <= low < high are required"),
    ("mapguided:speedup=0.5", None, "mapguided: speedup must be >= 1 (1 = no caching), got 0.5"),
    ("dense-attention:backend=nosuch", None, "dense-attention: backend must be one of"),
    ("hva", "cache", "hva is an attention accelerator; a cache accelerator was expected"),
    (5, None, "int is not a registered accelerator config; pass a spec string"),
])
def test_parse_spec_rejects_bad_specs(spec, kind, message):
    """parse_spec (every --cache/--attention/--config, the app, the API): each mistake named with the fix."""
    from kinegen.accelerators.catalog import parse_spec

    with pytest.raises(ConfigError) as e:
        parse_spec(spec, kind=kind)
    assert message in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("", "Empty configuration ''."),
    (" + ", "Empty configuration '+'."),
    ("first-block+mag", "Only one cache accelerator at a time; got first-block, mag."),
    ("dense+first-block", "Unknown accelerator 'dense'."),
    (5, "A configuration is text such as 'dense' or 'first-block:threshold=0.08+hva'; got int."),
])
def test_parse_config_rejects_bad_configs(text, message):
    """parse_config (profile --config, the app's Profile tab): empty, clashing and non-text configurations."""
    from kinegen.profiling.runner import parse_config

    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert message in str(e.value)


# ---------------------------------------------------------------------------- model folders and config files


@pytest.mark.parametrize("breakage, message", [
    ("no index", "is incomplete; missing:\n  - model_index.json"),
    ("no component", "is incomplete; missing:\n  - gan/ (kinegen.pipelines.mpgan.MPGANGenerator)"),
    ("index not JSON", "missing:\n  - a valid model_index.json (Expecting"),
    ("index a list", "a valid model_index.json (it holds a JSON object naming the pipeline and its components)"),
    ("unknown class", "holds a NoSuchPipeline, which Kinegen does not drive. Supported pipelines: AnyFlowFAR"),
    ("no class", "model_index.json names no pipeline class (its \"_class_name\" is None); copy model_index.json"),
    ("config not JSON", "gan/config.json' is not a valid JSON file. Restore the folder from the original checkpoint"),
])
def test_broken_model_folders(gan_copy, breakage, message):
    """A folder missing parts or with unreadable files: ModelNotFoundError naming the part and what to do."""
    index = gan_copy / "model_index.json"
    if breakage == "no index":
        index.unlink()
    elif breakage == "no component":
        shutil.rmtree(gan_copy / "gan")
    elif breakage == "index not JSON":
        index.write_text("{oops")
    elif breakage == "index a list":
        index.write_text("[1, 2]")
    elif breakage in ("unknown class", "no class"):
        data = json.loads(index.read_text())
        if breakage == "no class":
            del data["_class_name"]
        else:
            data["_class_name"] = "NoSuchPipeline"
        index.write_text(json.dumps(data))
    else:
        (gan_copy / "gan" / "config.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError) as e:
        kinegen.load_pipeline(str(gan_copy), device="cpu", cache=False)
    assert message in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("{oops", "kinegen_defaults.json is not valid JSON (Expecting"),
    ("[128]", "kinegen_defaults.json must hold a JSON object with keys among height, width, frames"),
    ('{"sampler": "euler"}', "unknown keys ['sampler']; valid keys: height, width"),
    ('{"height": "tall"}', "height must be a positive integer, got 'tall'; fix or delete the file."),
    ('{"steps": 2.5}', "steps must be a positive integer, got 2.5; fix or delete the file."),
    ('{"frames": -9}', "frames must be a positive integer, got -9"),
    ('{"width": 1e999}', "width must be a positive integer, got inf"),
    ('{"fps": true}', "fps must be a positive integer, got True"),
    ('{"guidance": NaN}', "guidance must be a number >= 0, got nan"),
])
def test_malformed_generation_defaults(gan_copy, capsys, tmp_path, text, message):
    """A folder's kinegen_defaults.json malformed or wrong-typed: ConfigError, and the CLI stops before loading."""
    (gan_copy / "kinegen_defaults.json").write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve_model(gan_copy)
    assert message in str(e.value)
    _fails(capsys, ["generate", "--model", str(gan_copy), "-o", str(tmp_path / "g.png")], message)
    assert not (tmp_path / "g.png").exists()


@pytest.fixture
def predictor_copy(tmp_path):
    """A copy of the shipped Map Predictor folder (1 MB), to break."""
    return Path(shutil.copytree(ASSETS_DIR / "predictors" / "kinegen-shapes-t2v", tmp_path / "predictor"))


@pytest.mark.parametrize("change, message", [
    ("{oops", "config.json is not a valid Map Predictor config: Expecting property name"),
    ("[1]", "config.json is not a valid Map Predictor config: it must hold a JSON object. Recalibrate with"),
    ({"text_dim": "big"}, "config.json is not a valid Map Predictor config"),
    ({"hidden": -1}, "config.json is not a valid Map Predictor config"),
    ({"text_dim": None}, "config.json is not a valid Map Predictor config"),
    ("no weights", "is not a Map Predictor folder (needs config.json and model.safetensors)"),
])
def test_malformed_predictor_folder(predictor_copy, change, message):
    """A Map Predictor folder's config.json malformed or wrong-typed: ConfigError with how to recalibrate."""
    from kinegen.models.map_predictor import MapPredictor

    cfg = predictor_copy / "config.json"
    if change == "no weights":
        (predictor_copy / "model.safetensors").unlink()
    elif isinstance(change, dict):
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **change}))
    else:
        cfg.write_text(change)
    with pytest.raises(ConfigError) as e:
        MapPredictor.load(predictor_copy)
    assert message in str(e.value)


def test_cli_with_a_broken_predictor_writes_nothing(predictor_copy, tmp_path, capsys):
    """--cache mapguided:predictor=DIR with a broken config: one error line, no video."""
    (predictor_copy / "config.json").write_text("[1]")
    _fails(capsys, ["generate", "x", "--model", "tiny-wan", "--steps", "2", "--cache",
                    f"mapguided:predictor={predictor_copy}", "-o", str(tmp_path / "o.mp4")],
           "is not a valid Map Predictor config: it must hold a JSON object")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictor"]


def test_malformed_maps_file(tmp_path):
    """`calibrate --maps` with a file that is not maps.jsonl: ConfigError naming the line."""
    from kinegen.caching.tvmap import load_maps

    (tmp_path / "maps.jsonl").write_text('{"prompt": "x"}\n{cut off\n')
    with pytest.raises(ConfigError, match="maps.jsonl line 2 is not a JSON map record"):
        load_maps(tmp_path / "maps.jsonl")
    with pytest.raises(ConfigError, match="does not exist; give the maps.jsonl an earlier `kinegen calibrate` wrote"):
        load_maps(tmp_path / "none.jsonl")


# ---------------------------------------------------------------------------- input images (uploads)


@pytest.fixture(scope="module")
def kontext(load_tiny):
    """The tiny FLUX Kontext editing model (takes an input image), loaded once."""
    return load_tiny("tiny-flux-kontext")


@pytest.fixture
def bad_images(tmp_path):
    """An image folder, a text file named .png, oversized and bomb-sized headers, and a truncated PNG."""
    from PIL import Image

    (tmp_path / "folder.png").mkdir()
    (tmp_path / "text.png").write_text("hello")
    _png_claiming(tmp_path / "huge.png", 5000, 4000)
    _png_claiming(tmp_path / "bomb.png", 30000, 30000)
    Image.new("RGB", (64, 64), "red").save(tmp_path / "whole.png")
    data = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    return tmp_path


@pytest.mark.parametrize("name, message", [
    ("folder.png", "folder.png is a folder; give an image file (PNG, JPEG or WebP)."),
    ("text.png", "text.png is not an image file Pillow can read; give a PNG, JPEG or WebP image."),
    ("huge.png", "huge.png is larger than 4096x4096 pixels; resize it first."),
    ("bomb.png", "bomb.png is larger than 4096x4096 pixels; resize it first."),
    ("cut.png", "cut.png is damaged (image file is truncated); give a whole PNG, JPEG or WebP image."),
    ("missing.png", "missing.png does not exist."),
])
def test_bad_input_images(kontext, bad_images, name, message):
    """--image / an uploaded file for an editing model: each kind of bad file named, before the model runs."""
    with pytest.raises(InvalidRequestError) as e:
        kinegen.prepare(kontext, "make it blue", image=str(bad_images / name))
    assert message in str(e.value)


def test_cli_bad_input_image_writes_nothing(kontext, bad_images, capsys):
    """`generate --image` with a folder: one error line, no output image."""
    _fails(capsys, ["generate", "make it blue", "--model", "tiny-flux-kontext", "--image",
                    str(bad_images / "folder.png"), "-o", str(bad_images / "out.png")], "is a folder; give an image")
    assert not (bad_images / "out.png").exists()
