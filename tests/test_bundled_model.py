"""The text-to-video model trained here and shipped in assets/models/kinegen-shapes-t2v."""

from __future__ import annotations

import json

import numpy as np

import kinegen
from kinegen.loading import ASSETS_DIR
from kinegen.registry import DEFAULT_MODEL, MODELS

NAME = "kinegen-shapes-t2v"
FOLDER = ASSETS_DIR / "models" / NAME


def test_folder_is_complete_small_and_safetensors_only():
    index = json.loads((FOLDER / "model_index.json").read_text())
    for component in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert component in index and (FOLDER / component).is_dir(), component
    files = [p for p in FOLDER.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 50 * 2**20
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    assert {p.parent.name for p in files if p.suffix == ".safetensors"} == {"transformer", "vae", "text_encoder"}
    card = (FOLDER / "README.md").read_text()
    for heading in ("## Data", "## Training", "## Metrics", "## Limits"):
        assert heading in card


def test_plain_diffusers_and_transformers_load_it():
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    pipe = WanPipeline.from_pretrained(FOLDER)
    assert isinstance(pipe.transformer, WanTransformer3DModel)
    assert isinstance(pipe.vae, AutoencoderKLWan)
    assert isinstance(pipe.text_encoder, UMT5EncoderModel)
    assert isinstance(pipe.scheduler, UniPCMultistepScheduler)
    tok = AutoTokenizer.from_pretrained(FOLDER / "tokenizer")
    ids = tok("a red circle moving right").input_ids
    assert tok.unk_token_id not in ids


def test_it_is_the_default_model():
    assert DEFAULT_MODEL == NAME and MODELS[NAME].bundled == NAME


def test_default_generation_follows_the_prompt():
    from kinegen.evaluation.adherence import classify, load_classifier

    pipe = kinegen.load_pipeline(NAME, device="cpu")
    pipe.set_progress_bar_config(disable=True)
    result = kinegen.generate(pipe, "a red circle moving to the right on a gray background", seed=0)
    assert result.frames.shape == (17, 128, 128, 3)
    assert np.isfinite(result.frames).all() and result.frames.std() > 0.02
    pred = classify(load_classifier(), result.frames)
    assert pred["colour"] == "red" and pred["motion"] == "right", pred


def test_it_draws_the_prompt_at_a_larger_size():
    """One set of weights at several sizes: the folder declares its training grid (kinegen_rope.json), the loader
    interpolates RoPE positions onto it, and at 33 x 256 x 256 (4x the tokens) the prompt is still drawn."""
    from kinegen.evaluation.adherence import classify, load_classifier
    from kinegen.models.rope import InterpolatedWanRoPE, read_rope_file

    assert read_rope_file(FOLDER) == (5, 8, 8)
    pipe = kinegen.load_pipeline(NAME, device="cpu")
    assert isinstance(pipe.transformer.rope, InterpolatedWanRoPE)
    pipe.set_progress_bar_config(disable=True)
    result = kinegen.generate(pipe, "a blue square moving up on a black background", seed=0,
                              height=256, width=256, frames=33)
    assert result.frames.shape == (33, 256, 256, 3)
    pred = classify(load_classifier(), result.frames)
    assert pred == {"shape": "square", "colour": "blue", "motion": "up"}, pred
