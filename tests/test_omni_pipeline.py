"""The small omni model's processor, the understanding pipeline, ``kinegen understand`` and ``kinegen eval omni``
on a random-weight thinker of the shipped architecture, and the tri-modal relevance scorer's plumbing."""

import json

import numpy as np
import pytest
import torch

from kinegen.cli import main
from kinegen.data.av_shapes import render_audio, render_frames, sample_av_clip
from kinegen.errors import InvalidRequestError, ModelNotFoundError
from kinegen.media_av import write_av


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from kinegen.training.omni import build_model

    model, proc = build_model(seed=0)
    folder = tmp_path_factory.mktemp("omni") / "model"
    model.save_pretrained(str(folder))
    proc.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    clip = sample_av_clip(5, num_objects=2)
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    write_av(path, render_frames(clip, np.arange(32) / 8), 8, render_audio(clip))
    return path


@pytest.fixture(scope="module")
def pipe(model_dir):
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline

    return OmniUnderstandingPipeline.load(model_dir, relevance="heuristic")


def test_processor_lays_clips_out_as_qwen2_5_omni_does(pipe):
    """The model's own TMRoPE index reads the layout back: audio tokens consecutive in time, each video grid's
    tokens at one time 25 ids (one second) after the last, chunks of 2 seconds interleaved."""
    clip = sample_av_clip(3)
    frames, audio = render_frames(clip, np.arange(8) * 0.5), render_audio(clip)
    x = pipe.processor(["what colour is the square?"], [frames], [audio])
    tok = pipe.processor.tokenizer
    ids = x["input_ids"][0]
    pos, _ = pipe.thinker.model.get_rope_index(ids[None], None, x["video_grid_thw"], x["attention_mask"], True,
                                                x["feature_attention_mask"].sum(-1), x["video_second_per_grid"])
    t, h, w = pos[:, 0]
    audio_at = ids == tok.convert_tokens_to_ids("<|AUDIO|>")
    video_at = ids == tok.convert_tokens_to_ids("<|VIDEO|>")
    assert int(audio_at.sum()) == 100 and int(video_at.sum()) == 4 * 64  # 4 s: 25 audio tokens/s, 8x8 per grid
    assert torch.equal(t[audio_at], h[audio_at]) and (t[audio_at].diff() == 1).all()
    start = int(t[audio_at][0])
    assert sorted(set((t[video_at] - start).tolist())) == [0, 25, 50, 75]
    # interleaving: the first chunk's video (grids 0 and 1), then its audio (ids 0..49), then the second chunk
    first_audio, first_late_video = audio_at.nonzero()[0], (video_at & (t - start >= 50)).nonzero()[0]
    assert (video_at & (t - start < 50)).nonzero()[-1] < first_audio < first_late_video


def test_understand_reports_pruning(pipe, video):
    full = pipe.understand(video, "which shape makes the high tone?", max_new_tokens=3)
    r = pipe.understand(video, "which shape makes the high tone?", prune="omniselect:keep=0.3", max_new_tokens=3)
    assert full.prune is None and full.media_kept == full.media_tokens == 356 and full.has_audio
    assert r.media_kept == round(0.3 * 356) and r.tokens_after == r.tokens_before - 356 + r.media_kept
    assert r.regime == "uniform"  # the heuristic estimator does not read the question
    assert r.video_kept_mask.shape == (256,) and r.video_grid == (4, 8, 8)
    assert r.timings["prefill_s"] > 0 and isinstance(r.answer, str)
    same = pipe.understand(video, "which shape makes the high tone?", prune="omniselect:keep=1.0", max_new_tokens=3)
    assert same.answer == full.answer  # keep=1 answers exactly as the unpruned model


def test_silent_video_and_bad_questions(pipe, tmp_path):
    silent = write_av(tmp_path / "silent.mp4", render_frames(sample_av_clip(1), np.arange(16) / 4), 4)
    r = pipe.understand(silent, "what colour is the circle?", prune="omniselect:keep=0.5", max_new_tokens=2)
    assert not r.has_audio and r.media_tokens == 4 * 64
    with pytest.raises(InvalidRequestError, match="at most 40"):
        pipe.understand(silent, "what " * 60 + "?")
    with pytest.raises(InvalidRequestError, match="empty"):
        pipe.understand(silent, "  ")
    with pytest.raises(Exception, match=r"keep must be in \(0, 1\]"):
        pipe.understand(silent, "what colour is the circle?", prune="omniselect:keep=0")


def test_cli_answers_as_json(model_dir, video, capsys):
    assert main(["understand", str(video), "-q", "how many clicks are there?", "-m", str(model_dir),
                 "--prune", "omniselect:keep=0.45,method=random", "--relevance", "heuristic", "--json",
                 "--max-new-tokens", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["media_kept"] == round(0.45 * 356) and out["prune"]["method"] == "random"
    assert main(["understand", str(video), "-m", str(model_dir)]) == 2
    assert "--question" in capsys.readouterr().err
    assert main(["understand", str(video), "-q", "what?", "-m", str(model_dir / "missing")]) == 2
    assert "bundled omni model" in capsys.readouterr().err


def test_eval_omni_counts_every_question(model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "omni", "-m", str(model_dir), "--clips", "2", "--relevance", "heuristic",
                 "--prune", "omniselect:keep=0.3", "-o", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["questions"] == len([x for x in r["records"] if x["needs"] != "describe"]) > 10
    assert set(r["by_need"]) <= {"video", "audio", "both"} and 0.25 < r["mean_media_keep"] < 0.35


def test_missing_models_are_named():
    from kinegen.pipelines.omni_understand import resolve_omni_folder

    with pytest.raises(ModelNotFoundError, match="kinegen-shapes-omni"):
        resolve_omni_folder("no-such-model")


def test_trimodal_scores_frames_and_sounds_in_one_space(tmp_path):
    from kinegen.omniselect.trimodal import TriModalModel, TriModalRelevance, content_vocabulary

    torch.manual_seed(0)
    scorer = TriModalRelevance(TriModalModel(content_vocabulary()))
    scorer.save_pretrained(tmp_path / "scorer")
    again = TriModalRelevance.load(tmp_path / "scorer")
    clip = sample_av_clip(2, num_objects=2)
    frames, audio = render_frames(clip, np.arange(8) * 0.5), render_audio(clip)
    s = again.score(frames, np.arange(8) * 0.5, audio, 16000, "which shape makes the high tone?")
    assert s.has_query and s.frame_scores.shape == (8,) and s.audio_scores.shape == (8,)
    assert torch.allclose(s.frame_scores, scorer.score(frames, np.arange(8) * 0.5, audio, 16000,
                                                       "which shape makes the high tone?").frame_scores)
    assert not again.score(frames, np.arange(8) * 0.5, None, 16000, "what is it?").has_query


def test_service_understands_uploads_within_its_bounds(model_dir, video, tmp_path):
    from kinegen.apps.service import AppConfig, Service

    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], omni_models=[str(model_dir)], output_dir=tmp_path,
                            max_upload_seconds=10, rate_limit=2))
    out = svc.understand(str(model_dir), str(video), "what colour is the square?", "omniselect:keep=0.3")
    assert out["media_kept"] == round(0.3 * 356) and out["picture"].endswith(".png")
    assert (tmp_path / "history.jsonl").read_text().count('"understand"') == 1
    with pytest.raises(InvalidRequestError, match="limit is 1 s"):
        Service(AppConfig(models=["tiny-wan"], gan_models=[], omni_models=[str(model_dir)], output_dir=tmp_path,
                          max_upload_seconds=1)).understand(str(model_dir), str(video), "what?")
    with pytest.raises(InvalidRequestError, match="offers the omni models"):
        svc.understand("kinegen-shapes-omni", str(video), "what?")
    with pytest.raises(InvalidRequestError, match="Upload a video"):
        svc.understand(str(model_dir), None, "what?")
    with pytest.raises(Exception, match="keep must be in"):
        svc.understand(str(model_dir), str(video), "what?", "omniselect:keep=2")
    svc.understand(str(model_dir), str(video), "what?")
    with pytest.raises(Exception, match="(?i)rate|minute"):
        svc.understand(str(model_dir), str(video), "what?")


def test_the_understand_tab_answers_through_the_api(model_dir, video, tmp_path):
    import socket

    from gradio_client import Client, handle_file

    from kinegen.apps.service import AppConfig
    from kinegen.apps.web import launch_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AppConfig(models=["tiny-wan"], gan_models=[], omni_models=[str(model_dir)], output_dir=tmp_path)
    app = launch_app(config, port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        answer, info, picture, _ = client.predict(str(model_dir), handle_file(str(video)),
                                                  "which shape makes the high tone?", "omniselect", 0.3,
                                                  api_name="/understand")
        assert isinstance(answer, str) and "kept 107 (30%)" in info and picture.endswith(".png")
        with pytest.raises(Exception, match="Ask a question"):
            client.predict(str(model_dir), handle_file(str(video)), " ", "none", 0.3,
                           api_name="/understand")
    finally:
        app.close()


def test_clip_clap_backend_standardises_two_spaces(tmp_path):
    """Local CLIP and CLAP folders (tiny random ones here): scores in reference-word standard deviations, so frames
    and sounds compare; the folders load without a network."""
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, CLIPConfig, CLIPModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from kinegen.models.tiny import char_tokenizer
    from kinegen.pipelines.omni_understand import load_relevance

    torch.manual_seed(0)
    text = dict(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=64)
    clip = CLIPModel(CLIPConfig(text_config=text, vision_config=dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
        patch_size=8), projection_dim=16))
    clap = ClapModel(ClapConfig(text_config={**text, "projection_dim": 16}, projection_dim=16, audio_config=dict(
        window_size=4, num_mel_bins=16, spec_size=64, patch_size=2, patch_stride=(2, 2), depths=[1, 1],
        num_attention_heads=[2, 2], hidden_size=32, patch_embeds_hidden_size=16, projection_dim=16,
        enable_fusion=False)))
    for model, proc, name in ((clip, CLIPImageProcessorPil(size={"shortest_edge": 32},
                                                           crop_size={"height": 32, "width": 32}), "clip"),
                              (clap, ClapFeatureExtractor(feature_size=16, sampling_rate=48000, max_length_s=1,
                                                          hop_length=480, truncation="rand_trunc"), "clap")):
        model.save_pretrained(str(tmp_path / name))
        proc.save_pretrained(str(tmp_path / name))
        char_tokenizer(64).save_pretrained(str(tmp_path / name))
    scorer = load_relevance(f"clip-clap:{tmp_path / 'clip'},{tmp_path / 'clap'}")
    clip_ = sample_av_clip(4, num_objects=2)
    frames, audio = render_frames(clip_, np.arange(8) * 0.5), render_audio(clip_)
    s = scorer.score(frames, np.arange(8) * 0.5, audio, 16000, "what colour is the star?")
    assert s.has_query and s.frame_scores.shape == s.audio_scores.shape == (8,)
    assert torch.isfinite(s.frame_scores).all() and s.frame_scores.abs().max() < 10  # standard deviations
    with pytest.raises(InvalidRequestError, match="two folders"):
        load_relevance(f"clip-clap:{tmp_path / 'clip'}")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_relevance(f"clip-clap:{tmp_path},{tmp_path / 'clap'}")


def test_understand_tab_in_chromium_answers_and_captions_into_generate(model_dir, video, tmp_path):
    """Upload, ask, see the answer, the regime line and the kept-token picture; the caption button fills the
    Generate tab's prompt with the video's caption and switches to it."""
    import os
    import shutil
    import socket

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("KINEGEN_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (KINEGEN_REQUIRE_CHROMIUM is set): apt-get install chromium")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from kinegen.apps.service import AppConfig
    from kinegen.apps.web import launch_app
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AppConfig(models=["tiny-wan"], gan_models=[], omni_models=[str(model_dir)], output_dir=tmp_path)
    app = launch_app(config, port=port, prevent_thread_lock=True, quiet=True)
    expected_caption = OmniUnderstandingPipeline.load(model_dir, relevance=None).caption(video)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_role("tab", name="Understand").click()
            page.locator("#kinegen-understand-video input[type=file]").set_input_files(str(video))
            page.locator("#kinegen-understand-video video").wait_for()
            page.get_by_role("button", name="Answer").click()
            page.wait_for_function("() => (document.querySelector('#kinegen-understand-info') || {}).innerText"
                                   "?.includes('kept')")
            assert "kept 107 (30%)" in page.locator("#kinegen-understand-info").inner_text()
            page.locator("#kinegen-understand-picture img").wait_for()
            page.get_by_role("button", name="Caption into the Generate prompt").click()
            page.wait_for_function("() => document.querySelector('[role=tab][aria-selected=true]')?.innerText"
                                   " === 'Generate'")
            assert page.get_by_label("Prompt", exact=True).input_value() == expected_caption
            browser.close()
    finally:
        app.close()


def test_the_bundled_scorer_reads_what_the_question_is_about():
    """kinegen-shapes-trimodal: a question about the picture scores frames above sounds, one about the sound the
    other way, and within a clip the frames of the shape asked about score higher than the others'."""
    from kinegen.data.av_shapes import bounce_times
    from kinegen.omniselect.trimodal import load_bundled_scorer

    scorer = load_bundled_scorer()
    clip = next(c for c in (sample_av_clip(s, "held_out", num_objects=2) for s in range(100))
                if any(bounce_times(o) for o in c.objects))
    times = np.linspace(0, 3.9, 8)
    frames, audio = render_frames(clip, times), render_audio(clip)
    first, second = clip.objects
    s = scorer.score(frames, times, audio, 16000, f"what colour is the {second.shape}?")
    a, v = s.means()
    assert v > a
    on = torch.tensor([second.t_on <= t < second.t_off for t in times])
    assert s.frame_scores[on].mean() > s.frame_scores[~on].mean() + 1
    a, v = scorer.score(frames, times, audio, 16000, "how many clicks are there?").means()
    assert a > v


def test_bundled_omni_model_answers_from_the_clip(tmp_path):
    """kinegen-shapes-omni on held-out clips it never saw: the sound questions right, the rest well above chance
    (about 25%), and blanking the media costs the answers (it reads the clip, not the question's prior)."""
    from kinegen.evaluation.omni import evaluate_omni
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline

    pipe = OmniUnderstandingPipeline.load("kinegen-shapes-omni", relevance="heuristic")
    r = evaluate_omni(pipe, n_clips=6, split="held_out", seed=3, captions=False)
    assert r["by_template"]["pitch"] == r["by_template"]["tones"] == 1.0
    assert r["by_need"]["audio"] >= 0.7 and r["accuracy"] >= 0.45
    clip = sample_av_clip(7, "held_out")
    frames, audio = render_frames(clip, np.arange(8) * 0.5), render_audio(clip)
    q = "is the tone low, middle or high?" if len(clip.objects) == 1 else "which tone comes first?"
    x = pipe.processor([q], [frames], [audio])
    silent = pipe.processor([q], [np.zeros_like(frames)], [np.zeros_like(audio)])
    with torch.no_grad():
        p, p_blank = (pipe.thinker(**inp).logits[0, -1].softmax(-1) for inp in (x, silent))
    answer = pipe.processor.tokenizer.convert_tokens_to_ids(clip.objects[0].pitch)
    assert p[answer] > 0.9 and p_blank[answer] < 0.7
    write_av(tmp_path / "clip.mp4", render_frames(clip, np.arange(32) / 8), 8, audio, 16000)
    caption = pipe.caption(str(tmp_path / "clip.mp4"))  # words only: the spaces' <unk> pieces are dropped
    assert "<unk>" not in caption and clip.objects[0].colour in caption.split(), caption
