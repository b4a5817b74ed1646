"""DASA's dynamics-guided distillation (issue 21, item 1, fourth part): ``kinegen train dasa`` on tiny-wan-ar."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import kinegen
from kinegen.dasa import DASAConfig
from kinegen.dasa.run import DASARun
from kinegen.loading import write_generation_defaults
from kinegen.pipelines import WanAutoregressivePipeline
from kinegen.training.configs import DASATrainConfig
from kinegen.training.dasa import distillation_loss, dynamic_weight_map, rollout_losses

SMALL = ["--frames", "17", "--size", "32", "--sample-steps", "4", "--loss-steps", "2",
         "--dasa", "keep=0.3,ema=0,low=1,dilate=1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-ar")
    pipe = kinegen.load_pipeline("tiny-wan-ar")  # chunks of 1, 2, 2: DASA acts from the third
    pipe.save_pretrained(path, safe_serialization=True)
    write_generation_defaults(path, height=32, width=32, frames=17, steps=2, guidance=3.0)
    return path


def _gaps(folder, dasa: str) -> list[float]:
    pipe = WanAutoregressivePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.requires_grad_(True)
    teacher = copy.deepcopy(pipe.transformer).requires_grad_(False)
    cfg = DASATrainConfig(frames=17, size=32, sample_steps=4, loss_steps=4, guidance=3.0, dasa=dasa)
    from kinegen.training.dasa import _dasa_config

    losses = rollout_losses(pipe, DASARun(_dasa_config(dasa, DASAConfig)), teacher, "a red circle", cfg,
                            torch.Generator().manual_seed(0), np.random.default_rng(0))
    grads = [p.grad for p in pipe.transformer.parameters() if p.grad is not None]
    return losses, grads


def test_dense_student_matches_the_teacher_exactly(folder):
    """keep=1.0 is the dense pipeline bit for bit, so the student is the teacher: every loss is 0."""
    losses, grads = _gaps(folder, "keep=1.0")
    assert len(losses) == 2 * 4  # the chunks after the first, every step
    assert losses == [0.0] * len(losses)
    assert all(float(g.abs().max()) == 0.0 for g in grads)


def test_rollouts_start_each_later_segment_as_the_pipeline_does(folder):
    """With overlapping VAE segments the pipeline re-encodes the last frame shown as the next segment's image latent
    instead of generating it: so does the rollout, and that chunk carries no loss (9 frames, then 8 more: chunks of
    1, 2, then the re-encoded 1 and 2, so 2 chunks x 4 steps), and the dense student is still the teacher."""
    pipe = WanAutoregressivePipeline.from_pretrained(folder, segment_frames=9, segment_overlap=True)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.check_frames(17) == [1, 2, 1, 2] and pipe.relinks(3)
    teacher = copy.deepcopy(pipe.transformer).requires_grad_(False)
    pipe.transformer.requires_grad_(True)
    cfg = DASATrainConfig(frames=17, size=32, sample_steps=4, loss_steps=4, guidance=3.0, dasa="keep=1.0")
    relinked = []
    relink = pipe._relink
    pipe._relink = lambda segment, last_frame=None: relinked.append(segment.shape[2]) or relink(segment, last_frame)
    run = DASARun(DASAConfig(keep=1.0))
    losses = rollout_losses(pipe, run, teacher, "a red circle", cfg, torch.Generator().manual_seed(0),
                            np.random.default_rng(0))
    assert relinked == [3] and losses == [0.0] * 8


def test_compressed_student_has_a_gap_and_gradients(folder):
    losses, grads = _gaps(folder, "keep=0.3,ema=0,low=1,dilate=1")
    assert all(np.isfinite(losses)) and max(losses) > 0
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0


def test_loss_weights_dynamic_places():
    dyn = torch.tensor([[True, False], [False, False]])
    w = dynamic_weight_map(dyn, (2, 2), 4.0)
    assert w.shape == (1, 1, 1, 4, 4)
    assert w[0, 0, 0, :2, :2].eq(5.0).all() and w[0, 0, 0, 2:].eq(1.0).all() and w[0, 0, 0, :2, 2:].eq(1.0).all()
    assert dynamic_weight_map(None, (2, 2), 4.0).eq(1.0).all()
    s, t = torch.zeros(1, 1, 1, 4, 4), torch.zeros(1, 1, 1, 4, 4)
    s[..., 0, 0] = 1.0  # an error of 1 on one dynamic pixel
    assert distillation_loss(s, t, 0.5, w).item() == pytest.approx(0.25 * 5.0 / w.sum().item())
    s2 = torch.zeros(1, 1, 1, 4, 4)
    s2[..., 3, 3] = 1.0  # the same error on a static pixel weighs 5x less
    assert distillation_loss(s, t, 0.5, w).item() == pytest.approx(5 * distillation_loss(s2, t, 0.5, w).item())


def test_train_dasa_exports_and_resumes(folder, tmp_path, capsys):
    from kinegen.cli import main

    run = tmp_path / "run"
    assert main(["train", "dasa", "--run", str(run), "--init", str(folder), "--steps", "2", *SMALL]) == 0
    out = run / "pipeline"
    pipe = WanAutoregressivePipeline.from_pretrained(out)  # a chunk-by-chunk pipeline like its --init
    assert pipe.config.chunk_frames == 2
    recipe = json.loads((out / "distill.json").read_text())
    assert recipe["dasa"] == "keep=0.3,ema=0,low=1,dilate=1" and recipe["trained_steps"] == 2
    assert json.loads((out / "kinegen_defaults.json").read_text())["guidance"] == 3.0
    before = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    after = load_file(str(out / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    capsys.readouterr()
    assert main(["train", "dasa", "--run", str(run), "--init", str(folder), "--steps", "3", *SMALL]) == 0
    assert "starting at step 2" in capsys.readouterr().out
    assert json.loads((out / "distill.json").read_text())["trained_steps"] == 3


@pytest.mark.parametrize("flags, message", [
    (["--train", "mlp"], "--train must be all or attention"),
    (["--frames", "10"], "--frames must be 4k + 1"),
    (["--loss-steps", "9", "--sample-steps", "4"], "cannot exceed --sample-steps"),
    (["--dasa", "keep=2"], "keep"),
    (["--dasa", "speed=2"], "speed"),
])
def test_bad_settings_are_refused_before_any_work(tmp_path, capsys, flags, message):
    from kinegen.cli import main

    assert main(["train", "dasa", "--run", str(tmp_path / "run"), *flags]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
