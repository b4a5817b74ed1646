"""Training pieces: tokenizer, exact equivalence of the training cross-attention, resumable loops."""

from __future__ import annotations

import json

import pytest
import torch

from kinegen.models.shapes_t2v import (
    MAX_SEQUENCE_LENGTH,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
)
from kinegen.training.common import load_checkpoint, save_checkpoint
from kinegen.training.t2v import PaddedTextCrossAttention, encode_text_compact


def test_tokenizer_round_trips_through_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "A Red circle moving to the right on a gray background"
    assert again(text).input_ids == tok(text).input_ids
    assert 2 not in tok(text).input_ids  # every word of a caption is in the vocabulary
    assert tok("a red zebra").input_ids.count(2) == 1  # unknown words map to <unk>


def encode_text(tokenizer, text_encoder, prompts: list[str], max_length: int = MAX_SEQUENCE_LENGTH) -> torch.Tensor:
    """Text embeddings exactly as WanPipeline makes them: the encoder's states for the real tokens,
    zero-padded to ``max_length``."""
    enc = tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True, add_special_tokens=True,
                    return_attention_mask=True, return_tensors="pt")
    ids, mask = enc.input_ids.to(text_encoder.device), enc.attention_mask.to(text_encoder.device)
    states = text_encoder(ids, mask).last_hidden_state
    return states * mask[..., None].to(states.dtype)


def test_compact_cross_attention_equals_512_token_padding():
    torch.manual_seed(0)
    tok, te, tr = build_tokenizer(), build_text_encoder(128), build_transformer().eval()
    captions = ["a red circle moving right", "a small blue star shrinking on a checkered gray background"]
    x, t = torch.randn(2, 8, 3, 8, 8), torch.tensor([700.0, 50.0])
    with torch.no_grad():
        ref = tr(x, timestep=t, encoder_hidden_states=encode_text(tok, te, captions), return_dict=False)[0]
        proc = PaddedTextCrossAttention()
        for block in tr.blocks:
            block.attn2.set_processor(proc)
        compact, proc.pad_copies = encode_text_compact(tok, te, captions)
        out = tr(x, timestep=t, encoder_hidden_states=compact, return_dict=False)[0]
    assert compact.shape[1] < 20 and proc.pad_copies > 490
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_checkpoint_round_trip(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, {"m": model}, opt, step=7, extra={"note": "x"})
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    step, extra = load_checkpoint(tmp_path, {"m": fresh}, fresh_opt)
    assert step == 7 and extra == {"note": "x"}
    torch.testing.assert_close(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == 1
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_vae_training_resumes(tmp_path):
    from kinegen.training.configs import VAETrainConfig
    from kinegen.training.vae import train_vae

    cfg = VAETrainConfig(steps=2, batch_size=1, frames=5, crop=32, checkpoint_every=1, stats_clips=8)
    folder = train_vae(tmp_path, cfg)
    assert (folder / "config.json").is_file()
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 2
    cfg.steps = 3
    train_vae(tmp_path, cfg)  # resumes at step 2 and runs one more
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 3


def test_vae_decoder_only_fine_tune_keeps_the_latent_space(tmp_path):
    from diffusers import AutoencoderKLWan

    from kinegen.training.configs import VAETrainConfig
    from kinegen.training.vae import train_vae

    base = train_vae(tmp_path / "base", VAETrainConfig(steps=1, batch_size=1, frames=5, crop=32, stats_clips=8))
    with pytest.raises(ValueError, match="--init"):
        train_vae(tmp_path / "bad", VAETrainConfig(steps=1, decoder_only=True))
    cfg = VAETrainConfig(steps=2, batch_size=1, frames=5, crop=32, init=str(base), decoder_only=True, lr=1e-2)
    tuned = train_vae(tmp_path / "tuned", cfg)
    a, b = AutoencoderKLWan.from_pretrained(base), AutoencoderKLWan.from_pretrained(tuned)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa if k.startswith(("encoder.", "quant_conv.")))
    assert any(not torch.equal(sa[k], sb[k]) for k in sa if k.startswith("decoder."))
    assert a.config.latents_mean == b.config.latents_mean and a.config.latents_std == b.config.latents_std


def test_vae_first_frame_noise_lands_on_latent_frame_0_only():
    from kinegen.training.configs import VAETrainConfig
    from kinegen.training.vae import _latent_noise

    torch.manual_seed(0)
    mu = torch.randn(64, 4, 3, 8, 8)  # [B, C, latent frames, H, W], unit std
    std = torch.tensor([0.5, 1.0, 2.0, 4.0])
    base = _latent_noise(mu, VAETrainConfig(), std)
    assert base.std().item() == pytest.approx(0.05, rel=0.05)  # 0.05 of the latent's std everywhere
    noisy = _latent_noise(mu, VAETrainConfig(first_frame_noise=0.6), std)
    assert noisy[:, :, 1:].std().item() == pytest.approx(0.05, rel=0.05)  # later frames unchanged
    # frame 0: std per channel about latents_std x sqrt(E[U(0, 0.6)^2]) = latents_std x 0.346 (plus the 0.05)
    per_channel = noisy[:, :, 0].transpose(0, 1).flatten(1).std(1)
    expected = (std**2 * 0.6**2 / 3 + 0.05**2).sqrt()
    assert torch.allclose(per_channel, expected, rtol=0.1)


def test_vae_first_frame_weight_scales_frame_0_and_keeps_the_mean():
    from kinegen.training.configs import VAETrainConfig
    from kinegen.training.vae import _batch

    x, w = _batch(0, VAETrainConfig(batch_size=2, frames=5, crop=32))
    x8, w8 = _batch(0, VAETrainConfig(batch_size=2, frames=5, crop=32, first_frame_weight=6))
    assert torch.equal(x, x8)
    ratio = w8 / w  # per frame: 6 / 2 on frame 0 and 1 / 2 on the others (mean frame factor (6 + 4) / 5)
    assert torch.allclose(ratio[:, :, 0], torch.tensor(3.0)) and torch.allclose(ratio[:, :, 1:], torch.tensor(0.5))


def test_adherence_classifier_shapes():
    import numpy as np

    from kinegen.models.adherence import AdherenceClassifier, downsample_frames, prepare

    frames = torch.zeros(2, 9, 128, 96, 3, dtype=torch.uint8)
    frames[..., :48, 0] = 255  # left half red
    frames[..., 2] = (20 * torch.arange(9, dtype=torch.uint8)).view(1, 9, 1, 1)  # blue ramps up over time
    small = downsample_frames(frames)
    assert small.shape == (2, 9, 64, 64, 3) and small.dtype == torch.uint8
    assert (small[..., :32, 0] == 255).all() and (small[..., 32:, 0] == 0).all()  # 96 -> 64: 1.5 pixels a column
    x = prepare(small)
    assert x.shape == (2, 3, 17, 64, 64)
    torch.testing.assert_close(x[:, 0, :, :, :32], torch.ones(2, 17, 64, 32))  # [0, 255] -> [-1, 1]
    torch.testing.assert_close(x[:, 0, :, :, 32:], -torch.ones(2, 17, 64, 32))
    # 9 frames -> 17 by linear interpolation (half-pixel centres, clamped at the ends)
    pos = np.clip((np.arange(17) + 0.5) * 9 / 17 - 0.5, 0, 8)
    blue = np.interp(pos, np.arange(9), 20 * np.arange(9)) / 255 * 2 - 1
    torch.testing.assert_close(x[0, 2, :, 10, 10], torch.tensor(blue, dtype=torch.float32), atol=1e-5, rtol=0)
    logits = AdherenceClassifier()(x)
    assert {k: v.shape for k, v in logits.items()} == {"shape": (2, 4), "colour": (2, 7), "motion": (2, 8)}


def test_latent_object_masks_follow_the_vae_grid():
    from kinegen.data.shapes import render_mask, sample_clip
    from kinegen.training.t2v import latent_object_masks

    spec = sample_clip(5, num_objects=1)
    m = latent_object_masks([spec], 17, 128)
    assert m.shape == (1, 1, 5, 16, 16) and set(m.unique().tolist()) <= {0.0, 1.0}
    px = render_mask(spec, 17, 128, 128)
    # latent frame 2 stands for video frames 5-8: a latent pixel is on iff the object touches its 8x8 cell
    cell = px[5:9].max(0).reshape(16, 8, 16, 8).max((1, 3)) > 0.5
    assert (m[0, 0, 2].numpy() == cell).all() and 0 < cell.sum() < 100


def test_object_masks_of_a_long_window_follow_its_vae_segments():
    """`kinegen train ar --object-weight`: a window coded in overlapping segments of 17 frames has its masks in the
    same layout, each segment's first latent frame from the segment's first video frame (the one shared)."""
    from kinegen.data.shapes import render_long_mask, sample_clip
    from kinegen.training.ar import segment_coverage
    from kinegen.training.t2v import latent_coverage

    mask = render_long_mask(sample_clip(3, num_objects=1), 33, 128, 128, start=48)
    m = segment_coverage(mask, 17, overlap=True)
    assert m.shape == (10, 16, 16) and m.dtype == torch.bool
    assert torch.equal(m[:5], latent_coverage(torch.from_numpy(mask[:17])))
    assert torch.equal(m[5], latent_coverage(torch.from_numpy(mask[16:17]))[0])  # frame 16 coded alone again
    assert torch.equal(m[6:], latent_coverage(torch.from_numpy(mask[16:33]))[1:])
    assert not torch.equal(m[1], m[4]) and 0 < m.sum() < m.numel() // 4  # the shape moves; it is small
    assert segment_coverage(mask, 0).shape == (9, 16, 16)  # no segments: one clip, 1 + 32 / 4 latent frames


def test_object_weighted_flow_loss():
    from kinegen.training.t2v import _flow_loss

    pred, target = torch.zeros(1, 1, 1, 2, 2), torch.tensor([1.0, 0, 0, 0]).view(1, 1, 1, 2, 2)
    mask = torch.tensor([1.0, 0, 0, 0]).view(1, 1, 1, 2, 2)
    assert _flow_loss(pred, target, None, 4.0) == pytest.approx(0.25)
    # the error sits on the object: weight 5 of a total 8
    assert _flow_loss(pred, target, mask, 4.0) == pytest.approx(5 / 8)
    assert _flow_loss(pred, target, 1 - mask, 4.0) == pytest.approx(1 / 16)
    # latent frame 0 weighted 3 against frame 1's 1: the error on frame 0 counts 3 of a total 4 weight units
    pred2, target2 = torch.zeros(1, 1, 2, 1, 1), torch.tensor([1.0, 0.0]).view(1, 1, 2, 1, 1)
    assert _flow_loss(pred2, target2, None, 4.0, first_frame_weight=3.0) == pytest.approx(3 / 4)
    assert _flow_loss(pred2, target2, torch.ones(1, 1, 2, 1, 1), 4.0, first_frame_weight=3.0) == pytest.approx(3 / 4)


def test_relinked_image_latents_carry_no_loss():
    """`kinegen train ar --relink-loss false`: in windows of overlapping segments the image latents the pipeline
    re-encodes rather than generates (every segment's first latent frame but the video's first) get no loss."""
    from kinegen.training.ar import relinked_frames
    from kinegen.training.common import frame_weights, object_weights, weighted_mse

    # a window from frame 0 (3 segments of 5 latent frames), and a later one after the sink (frame 0 of the batch)
    assert torch.nonzero(relinked_frames(15, 5, after_sink=False))[:, 0].tolist() == [5, 10]
    assert torch.nonzero(relinked_frames(16, 5, after_sink=True))[:, 0].tolist() == [1, 6, 11]
    pred = torch.zeros(1, 1, 3, 1, 1)
    target = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1, 1)

    def loss(mask, frame_weight):
        return weighted_mse(pred, target, object_weights(mask, 4.0), frame_weights(frame_weight, pred))

    assert loss(None, None) == pytest.approx(14 / 3)
    skip = torch.tensor([1.0, 0.0, 1.0])  # the relinked frame 1 without loss (--relink-loss false)
    assert loss(None, skip) == pytest.approx(5)
    mask = torch.tensor([1.0, 0.0, 0.0]).view(1, 1, 3, 1, 1)  # object weight 4 on frame 0: weights 5, 0, 1
    assert loss(mask, skip) == pytest.approx(14 / 6)
    # --relink-weight 3: frame 1 counts 3 times (1 + 3 * 4 + 9) / 5
    assert loss(None, torch.tensor([1.0, 3.0, 1.0])) == pytest.approx(22 / 5)
    # every weight zero (a batch of clean chunks only): no loss, not a division by zero
    assert loss(None, torch.zeros(3)) == 0


def test_later_windows_first_segments_are_history_only():
    """`kinegen train ar --later-history-segments N`: in a batch of later windows (the sink first, then segments of
    5 latent frames) the window's first N segments carry no loss; the sink and the frames after them are untouched."""
    from kinegen.training.ar import history_only_frames

    assert torch.nonzero(history_only_frames(16, 5, 1, after_sink=True))[:, 0].tolist() == [1, 2, 3, 4, 5]
    assert torch.nonzero(history_only_frames(16, 5, 2, after_sink=True))[:, 0].tolist() == list(range(1, 11))
    assert torch.nonzero(history_only_frames(15, 5, 1, after_sink=False))[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert not history_only_frames(16, 5, 0, after_sink=True).any()


def test_later_share_refuses_a_dataset_without_such_windows():
    """`--later-share` asking for batches of later windows from data that has none says what to change."""
    from kinegen.errors import ConfigError
    from kinegen.training.ar import segment_batch
    from kinegen.training.configs import ARTrainConfig

    cfg = ARTrainConfig(frames=49, segment_frames=17, segment_overlap=True, max_start=192, later_share=1.0)
    latents, starts = torch.zeros(4, 1, 15, 2, 2), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ConfigError, match="none of the 4 windows does: raise --dataset-windows"):
        segment_batch(latents, None, starts, cfg, 5, torch.arange(9), torch.Generator().manual_seed(0))
    starts[1:] = 16  # with some, a batch is all later windows, after no sink here: their own positions from 5
    idx, x0, positions, ids = segment_batch(latents, None, starts, cfg, 5, torch.arange(9),
                                            torch.Generator().manual_seed(0))
    assert (starts[idx] == 16).all() and positions[0].tolist() == list(range(5, 20))


def test_recycled_history_reencodes_segment_starts_as_the_pipeline_does():
    """`kinegen train ar --relink-recycle P`: a later segment's image latent in a recycled history is its previous
    segment's last frame decoded and encoded again, exactly what the pipeline commits there (`_relink`), one
    boundary after the other; the rest of the window, and an image latent whose segment before is not in the
    window (the first after the sink), stay."""
    import kinegen
    from kinegen.training.ar import reencoded_boundaries

    pipe = kinegen.load_pipeline("tiny-wan-ar")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, pipe.transformer.config.in_channels, 11, 4, 4, generator=gen)  # sink + 2 segments of 5
    out = reencoded_boundaries(pipe.vae, x, 5, after_sink=True)
    changed = [f for f in range(11) if not torch.equal(out[:, :, f], x[:, :, f])]
    assert changed == [6]
    torch.testing.assert_close(out[:, :, 6:7], pipe._relink(x[:, :, 1:6]))
    out = reencoded_boundaries(pipe.vae, x[:, :, 1:], 5, after_sink=False)  # a window from frame 0: 5 is the start
    assert [f for f in range(10) if not torch.equal(out[:, :, f], x[:, :, 1 + f])] == [5]
    three = torch.cat([x[:, :, 1:], x[:, :, 1:6]], dim=2)  # three segments: the third starts from the remade second
    out = reencoded_boundaries(pipe.vae, three, 5, after_sink=False)
    second = torch.cat([pipe._relink(three[:, :, :5]), three[:, :, 6:10]], dim=2)
    torch.testing.assert_close(out[:, :, 10:11], pipe._relink(second))
    assert not torch.allclose(out[:, :, 10:11], pipe._relink(three[:, :, 5:10]))
    # --relink-recycle below 1: only the windows picked are remade
    some = reencoded_boundaries(pipe.vae, x, 5, after_sink=True, rows=torch.tensor([1]))
    assert torch.equal(some[0], x[0])
    torch.testing.assert_close(some[1], reencoded_boundaries(pipe.vae, x, 5, after_sink=True)[1])


def test_train_export_replaces_the_folder_whole(tmp_path):
    from kinegen.cli import main
    from kinegen.evaluation.adherence import load_classifier

    dest = tmp_path / "models" / "clf"
    for steps in (1, 2):
        assert main(["train", "adherence", "--run", str(tmp_path / f"run{steps}"), "--steps", str(steps),
                     "--batch-size", "2", "--export", str(dest)]) == 0
        config = json.loads((dest / "config.json").read_text())
        assert config["trained_steps"] == steps and config["batch_size"] == 2
    assert sorted(p.name for p in dest.parent.iterdir()) == ["clf"]  # no temporary or old copies left
    load_classifier(dest)


def test_t2v_further_stage_starts_from_a_saved_pipeline(tmp_path):
    from safetensors.torch import load_file

    from kinegen.loading import resolve_model
    from kinegen.training.configs import T2VTrainConfig
    from kinegen.training.t2v import train_t2v

    bundled = resolve_model("kinegen-shapes-t2v").folder
    cfg = T2VTrainConfig(vae=str(bundled / "vae"), init=str(bundled), steps=1, batch_size=1, lr=0.0, dataset_clips=2,
                         frames=5, size=32, shape_weights="star=2")
    out = train_t2v(tmp_path, cfg)
    name = "transformer/diffusion_pytorch_model.safetensors"
    a, b = load_file(bundled / name), load_file(out / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # lr 0: the init comes back out
    with pytest.raises(FileNotFoundError, match="--init"):
        train_t2v(tmp_path / "bad", T2VTrainConfig(vae=str(bundled / "vae"), init=str(tmp_path / "nowhere"), steps=1,
                                                   dataset_clips=1, frames=5, size=32))


def test_t2v_shape_weights():
    from kinegen.data.shapes import sample_clip
    from kinegen.training.t2v import clip_sampling_weights, parse_shape_weights

    specs = [sample_clip(s) for s in range(40)]
    assert parse_shape_weights("star=2, circle=0") == {"star": 2.0, "circle": 0.0}
    w = clip_sampling_weights(specs, parse_shape_weights("star=2, circle=0"))
    assert [float(x) for x in w] == [{"star": 2.0, "circle": 0.0}.get(s.primary.shape, 1.0) for s in specs]
    assert torch.equal(clip_sampling_weights(specs, parse_shape_weights("")), torch.ones(40, dtype=torch.float64))
    for bad in ("hexagon=2", "star", "star=x", "star=-1", "star=nan"):
        with pytest.raises(ValueError, match="shape-weights"):
            parse_shape_weights(bad)
    with pytest.raises(ValueError, match="no clip"):
        parse_shape_weights("star=0,circle=0,square=0,triangle=0")


def test_omni_and_relevance_training_resume_and_export_loadable_folders(tmp_path, capsys):
    """`kinegen train omni` and `kinegen train relevance`: a step, a resume, an export the pipeline loads."""
    from kinegen.cli import main
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline

    for steps in (1, 2):
        assert main(["train", "relevance", "--run", str(tmp_path / "rel"), "--steps", str(steps), "--batch-size", "4",
                     "--export", str(tmp_path / "scorer")]) == 0
        assert main(["train", "omni", "--run", str(tmp_path / "omni"), "--steps", str(steps), "--batch-size", "2",
                     "--export", str(tmp_path / "model")]) == 0
    for run in ("rel", "omni"):
        assert json.loads((tmp_path / run / "log.jsonl").read_text().splitlines()[-1])["step"] == 2
    pipe = OmniUnderstandingPipeline.load(tmp_path / "model", relevance=str(tmp_path / "scorer"))
    assert type(pipe.relevance).__name__ == "TriModalRelevance"
    assert main(["train", "omni", "--run", str(tmp_path / "bad"), "--describe-share", "2"]) == 2
    assert "--describe-share must be 0 to 1" in capsys.readouterr().err


def test_omni_encoder_probe_labels_follow_the_clip():
    """The probes' per-second labels: what is on screen, its tone, and the clicks the generator placed."""
    from kinegen.data.av_shapes import AV_MOTIONS, PITCHES, bounce_times, sample_av_clip
    from kinegen.data.shapes import COLOURS, SHAPES
    from kinegen.training.omni import PROBES, frame_times, second_labels

    seen_two = seen_bounce = False
    for seed in range(40):
        clip = sample_av_clip(seed, "train")
        times = frame_times(clip)
        lab = second_labels(clip, times)
        assert set(lab) == set(PROBES) and len(lab["colour"]) == len(times) // 2 == 4 and len(lab["pitch"]) == 4
        for k, (_, n) in PROBES.items():
            assert all(0 <= y < n for y in lab[k])
        first = clip.objects[0]
        assert lab["colour"][0] == list(COLOURS).index(first.colour) + 1
        assert lab["shape"][0] == list(SHAPES).index(first.shape) + 1
        assert lab["motion"][0] == AV_MOTIONS.index(first.motion) + 1
        assert lab["pitch"][0] == list(PITCHES).index(first.pitch) + 1
        clicks = sum(len(bounce_times(o)) for o in clip.objects)
        assert sum(lab["clicks"]) == clicks or max(lab["clicks"]) == 2  # two or more in a second count as two
        if len(clip.objects) == 2:
            seen_two = True
            assert lab["shape"][-1] == list(SHAPES).index(clip.objects[1].shape) + 1
        seen_bounce |= clicks > 0
    assert seen_two and seen_bounce
