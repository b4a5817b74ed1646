"""The web app: its service rules directly, then the launched app driven by gradio_client and Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kinegen.apps.service import AppConfig, RateLimiter, Service
from kinegen.apps.tabs.history import HEADERS
from kinegen.errors import ConfigError, InvalidRequestError, KinegenError
from kinegen.generation import GenerationRequest


def _tiny_gan(path):
    from kinegen.data.shape_images import class_names
    from kinegen.models.mpgan import GANConfig
    from kinegen.pipelines import MPGANGenerator, MPGANPipeline

    # with texture labels, as the bundled GAN has (the web tab then offers its textures)
    cfg = GANConfig(resolution=16, widths=(64, 64, 32), num_classes=12, num_textures=4,
                    texture_prior=(0.55, 0.15, 0.15, 0.15), positional_channels=2, g_texture_conditioning="stages")
    gan = MPGANGenerator.from_gan_config(cfg, class_names())
    with torch.no_grad():
        gan.net.out_gain.fill_(1.0)
    MPGANPipeline(gan=gan).save_pretrained(path)
    return str(path)


def test_rate_limiter_is_a_sliding_window_per_user():
    now = [0.0]
    rl = RateLimiter(2, clock=lambda: now[0])
    rl.check("a")
    rl.check("a")
    rl.check("b")  # another user has their own budget
    with pytest.raises(InvalidRequestError, match="2 runs per minute.*try again in 60 s"):
        rl.check("a")
    now[0] = 61.0
    rl.check("a")
    RateLimiter(0).check("a")  # 0 = off


def test_service_bounds_accelerators_history_and_served_paths(tmp_path):
    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out", max_side=64,
                            max_frames=9, max_steps=4))
    with pytest.raises(InvalidRequestError, match="above this server's limit of 64"):
        svc.check_request(GenerationRequest(prompt="x", height=128))
    with pytest.raises(InvalidRequestError, match="limit of 4"):
        svc.check_request(GenerationRequest(prompt="x", steps=50))
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        svc.check_request(GenerationRequest(prompt=" "))
    with pytest.raises(InvalidRequestError, match="not offered by this server; choose one of: tiny-wan"):
        svc.pipeline("kinegen-shapes-t2v")
    assert svc.accelerator_specs("mapguided", " speedup=2 ", "none", "") == ["mapguided:speedup=2"]
    with pytest.raises(ConfigError, match="is an attention accelerator; a cache accelerator was expected"):
        svc.accelerator_specs("dense-attention")
    with pytest.raises(KinegenError, match="first-block"):  # unknown key: the error lists the valid ones
        svc.accelerator_specs("first-block", "treshold=0.1")

    out = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", seed=3), ["first-block:threshold=0.05"],
                       compare=True)
    assert svc.is_served(out["output"]) and svc.is_served(out["dense_output"]) and not svc.is_served("/etc/passwd")
    assert out["speedup"] > 0 and np.isfinite(out["psnr_db"]) and out["stats"][0]["name"] == "first-block"
    rows = svc.history_rows()
    assert rows[0][1:6] == ["generate", "tiny-wan", "a red circle", 3, "first-block:threshold=0.05"]
    # The history survives a restart; a line cut by a crash is skipped, not fatal.
    with open(tmp_path / "out" / "history.jsonl", "a") as f:
        f.write('{"time": "cut')
    again = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    assert again.history_rows() == rows
    entry = again.history_entry(rows[0][-1])
    assert entry["request"]["seed"] == 3 and json.dumps(entry)


def test_a_new_server_removes_previews_a_killed_one_left_behind(tmp_path):
    """Preview folders untouched for an hour belong to no run and go when a server starts; fresh ones stay (another
    server on the same folder may be writing them), and so do the outputs."""
    out = tmp_path / "out"
    stale, fresh = out / ".partial-old", out / ".partial-new"
    for folder in (stale, fresh):
        folder.mkdir(parents=True)
        (folder / "preview-0001.mp4").write_bytes(b"x")
    (out / "run.mp4").write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    Service(AppConfig(models=["tiny-wan-ar"], gan_models=[], output_dir=out))
    assert sorted(p.name for p in out.iterdir()) == [".partial-new", "run.mp4"]


def test_service_runs_an_autoregressive_model_chunk_by_chunk(tmp_path):
    """tiny-wan-ar through the service (no browser): valid frame counts for the Frames field, a count that does not
    split refused with the valid ones, the video growing chunk by chunk into previews that leave nothing behind, the
    per-chunk stats in the run info, and a stop between chunks that writes nothing."""
    import queue
    import threading

    from kinegen.apps.tabs.common import timing_markdown
    from kinegen.apps.tabs.generate import GrowingVideo, frames_field
    from kinegen.errors import RunCancelled
    from kinegen.media import read_video

    svc = Service(AppConfig(models=["tiny-wan-ar"], gan_models=[], output_dir=tmp_path / "out", max_frames=33))
    assert svc.frame_counts("tiny-wan-ar") == [1, 9, 17, 25, 33]
    field = frames_field(svc, "tiny-wan-ar", svc.model_defaults("tiny-wan-ar"))
    assert field["label"] == "Frames (8k+1)" and field["step"] == 8 and "1, 9, 17, 25, ... 33" in field["info"]
    with pytest.raises(InvalidRequestError, match="try num_frames 17 or 25"):
        svc.generate("tiny-wan-ar", GenerationRequest(prompt="a red circle", frames=21))

    events: queue.Queue = queue.Queue()
    grown = GrowingVideo(svc.partial_video("tiny-wan-ar"))
    seen, shown, steps = [], [], []

    def on_chunk(done, total, frames):
        seen.append((done, total, len(frames)))
        grown.on_chunk(events)(done, total, frames)
        shown.append(grown.show(done, "video", "image"))  # as the page's loop does, one chunk at a time
        steps.append(grown.status(1, 2))

    out = svc.generate("tiny-wan-ar", GenerationRequest(prompt="a red circle", frames=17), chunk_callback=on_chunk)
    assert seen == [(0, 3, 0), (1, 3, 1), (2, 3, 9), (3, 3, 17)]
    assert steps == ["Generating: chunk 1/3, step 1/2.", "Generating: chunk 2/3, step 1/2 (1 frame so far).",
                     "Generating: chunk 3/3, step 1/2 (9 frames so far).", "Generating: chunk 3/3, step 1/2 (17 "
                     "frames so far)."]
    assert grown.chunk_status(3) == "Generating: chunk 3/3 done, writing the video (17 frames)."
    assert "value" not in shown[0]["video"]  # nothing to show before the first chunk
    assert [read_video(s["video"]["value"]).shape[0] for s in shown[1:]] == [1, 9, 17]
    assert shown[2]["video"]["label"] == "Output so far: chunk 2/3, 9 frames"
    assert read_video(out["output"]).shape == (17, 32, 32, 3)
    grown.on_chunk(events)(2, 3, np.zeros((9, 32, 32, 3)))
    grown.on_chunk(events)(3, 3, np.zeros((17, 32, 32, 3)))
    assert "value" not in grown.show(2, "video", "image")["video"]  # a newer chunk waits: not written
    grown.close()
    assert grown.show(3, "video", "image") == {"video": {"__type__": "update"}}  # closed: nothing more written
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["history.jsonl", Path(out["output"]).name])

    chunks = out["chunks"]
    assert [c["frames"] for c in chunks] == [1, 8, 8] and [c["index"] for c in chunks] == [0, 1, 2]
    kv = [c["kv_bytes"] for c in chunks]
    assert kv[0] > 0 and kv == sorted(kv)  # the window (5 latent frames) is not full yet at 5 latent frames
    assert 0 < chunks[0]["ready_s"] < chunks[-1]["ready_s"] <= out["timings"]["total"]
    md = timing_markdown(out)
    assert "**Chunk by chunk**: 3 chunks; first frame after" in md and "| 3/3 | 9-16 |" in md

    cancel = threading.Event()
    with pytest.raises(RunCancelled):
        svc.generate("tiny-wan-ar", GenerationRequest(prompt="a red circle", frames=17, seed=1), cancel=cancel,
                     chunk_callback=lambda done, total, frames: done and cancel.set())
    assert len(svc.history_rows()) == 1 and len(list((tmp_path / "out").iterdir())) == 2

    # Its History row loads the run's settings with the Frames field of a chunk-by-chunk model.
    from kinegen.apps.tabs.generate import GenerateTab

    tab = GenerateTab(settings=[], outputs=[], caches=[], attentions=[], svc=svc)
    frames = tab.load(svc.history_entry(Path(out["output"]).name))[5]
    assert (frames["value"], frames["label"], frames["step"]) == (17, "Frames (8k+1)", 8)


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    from kinegen.apps.web import launch_app

    tmp = tmp_path_factory.mktemp("app")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AppConfig(models=["kinegen-shapes-t2v", "tiny-wan-ar"], gan_models=[_tiny_gan(tmp / "gan")],
                       output_dir=tmp / "out", max_steps=30)
    app = launch_app(config, port=port, prevent_thread_lock=True, quiet=True)
    yield app, f"http://127.0.0.1:{port}/", config
    app.close()


def test_app_generates_through_gradio_client_and_survives_bad_input(running_app, capfd, caplog):
    import logging

    from gradio_client import Client

    from kinegen.evaluation.adherence import classify, load_classifier
    from kinegen.media import read_video

    app, url, config = running_app
    client = Client(url, verbose=False)
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    # As docs/app.md says: named parameters, required ones marked, named outputs.
    required = {name: [p["parameter_name"] for p in ep["parameters"] if not p["parameter_has_default"]]
                for name, ep in api.items()}
    returns = {name: [r["label"] for r in ep["returns"]] for name, ep in api.items()}
    assert [p["parameter_name"] for p in api["/generate"]["parameters"]] == [
        "prompt", "seed", "negative_prompt", "model", "height", "width", "frames", "steps", "guidance", "cache",
        "cache_options", "attention", "attention_options"]
    assert required["/generate"] == ["prompt"] and returns["/generate"] == ["video"]
    assert required["/gan"] == ["classes"] and returns["/gan"] == ["grid", "info"]
    assert required["/profile"] == ["prompts", "configs"] and returns["/profile"] == ["table", "report"]
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="kinegen.app"):
        with pytest.raises(Exception, match="steps is above this server's limit of 30"):
            client.predict(prompt="a red circle moving right", seed=0, steps=500, api_name="/generate")
        with pytest.raises(Exception, match="frame counts of the form 4k"):
            client.predict(prompt="a red circle moving right", seed=0, frames=10, api_name="/generate")
    # the operator's log: one line per refused request, no traceback
    refused = [r.getMessage() for r in caplog.records if r.name == "kinegen.app"]
    assert refused[0] == "request refused: 500 steps is above this server's limit of 30." and len(refused) == 2
    assert "Traceback" not in capfd.readouterr().err
    result = client.predict(prompt="a red circle moving to the right on a gray background", seed=0,
                            api_name="/generate")
    assert isinstance(result, str)  # a local path to the mp4, as docs/app.md says
    path = result
    frames = read_video(path)
    assert frames.shape == (17, 128, 128, 3)
    pred = classify(load_classifier(), frames)
    assert pred["colour"] == "red" and pred["motion"] == "right"
    assert any(p.suffix == ".mp4" for p in config.output_dir.iterdir())  # written to the output folder
    grid, info = client.predict(classes=["blue star"], num_images=4, seed=0, truncation=0.5, texture="striped",
                                api_name="/gan")
    assert "4 images" in info and "Class: blue star" in info and "Backgrounds: striped" in info
    assert grid.endswith(".png")
    with pytest.raises(Exception, match="unknown texture 'wavy'; valid textures: plain, checkered, striped, noisy"):
        client.predict(classes=["blue star"], num_images=1, texture="wavy", api_name="/gan")
    rows = app.kinegen_service.history_rows()
    assert [r[1] for r in rows[:2]] == ["gan", "generate"]
    assert rows[0][5] == "one step, truncation 0.5" and rows[1][5] == "dense"  # no accelerators: a GAN has none


def _chromium() -> str | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("KINEGEN_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (KINEGEN_REQUIRE_CHROMIUM is set): apt-get install chromium")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)")
    return chromium


@pytest.fixture(scope="module")
def page(running_app):
    """The app in headless Chromium, driven by Playwright (its own browser download is not used)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = _chromium()
    _, url, _ = running_app
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        pg = browser.new_page(viewport={"width": 1280, "height": 1000})
        pg.set_default_timeout(60_000)
        pg.goto(url)
        yield pg
        browser.close()


def test_generate_tab_in_chromium_shows_table_warning_video_and_plan(page):
    """The run's information is a rendered table (not raw markdown) under the seed and an unknown-word warning; the
    128x128 video is shown at exactly 3x with hard pixel edges; the plan's picture carries no label over its title."""
    page.get_by_label("Prompt", exact=True).fill("a red dog moving right on a gray background")
    page.get_by_label("Cache", exact=True).click()
    page.get_by_role("option", name="mapguided", exact=True).click()
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_selector("#kinegen-info table")
    info = page.locator("#kinegen-info")
    text = info.inner_text()
    assert "Warning: kinegen-shapes-t2v does not know the prompt's words 'dog' (its tokenizer reads them as <unk>)" \
        in text
    assert "Seed 0." in text and "|---|" not in text
    stages = info.locator("tbody tr td:first-child").all_inner_texts()
    assert stages == ["text encoder", "transformer", "VAE decode", "other", "total"]
    video = page.locator("#kinegen-output video")
    page.wait_for_function("() => document.querySelector('#kinegen-output video').videoWidth > 0")
    box = video.bounding_box()
    vw, vh, rendering = video.evaluate("e => [e.videoWidth, e.videoHeight, getComputedStyle(e).imageRendering]")
    scale = min(box["width"] / vw, box["height"] / vh)  # object-fit: contain
    assert (vw, vh) == (128, 128) and scale == pytest.approx(3.0, abs=0.02) and rendering == "pixelated"
    heatmap = page.locator("#kinegen-heatmap")
    assert heatmap.locator("img").is_visible()
    assert heatmap.locator("[data-testid=block-label]").count() == 0 or \
        not heatmap.locator("[data-testid=block-label]").is_visible()


def test_profile_tab_in_chromium_keeps_headers_on_one_line(page):
    """A profile from the page: the model's steps are filled in, header cells stay one line (the table scrolls
    sideways), plots are shown whole."""
    page.get_by_role("tab", name="Profile").click()
    assert page.get_by_label("Steps (the model's default is filled in)").input_value() == "20"
    page.get_by_label("Configurations (one per line; join with + to combine)").fill("first-block:threshold=0.05")
    page.get_by_label("Steps (the model's default is filled in)").fill("2")
    page.get_by_role("button", name="Run profile").click()
    page.wait_for_selector("#kinegen-profile-table table", timeout=300_000)  # dense and one configuration, 2 runs each
    heights = page.locator("#kinegen-profile-table th").evaluate_all(
        "es => es.map(e => e.getBoundingClientRect().height)")
    assert len(heights) >= 8 and max(heights) - min(heights) < 1  # 'config' and 'transformer speedup' alike
    configs = page.locator("#kinegen-profile-table tbody tr td:first-child").all_inner_texts()
    assert configs == ["dense", "first-block:threshold=0.05"]
    fits = page.locator("#kinegen-plots img").evaluate_all("es => es.map(e => getComputedStyle(e).objectFit)")
    assert fits and set(fits) == {"contain"}


def test_history_tab_in_chromium_fits_and_a_row_shows_its_run(page, running_app):
    """Every column of the History table is inside the page; clicking a generation's row opens the Generate tab
    with that run's video and settings."""
    svc = running_app[0].kinegen_service
    rows = svc.history_rows()
    i = next(k for k, r in enumerate(rows) if r[1] == "generate")
    page.get_by_role("tab", name="History").click()
    page.get_by_role("button", name="Refresh").click()
    table = page.locator("#kinegen-history")
    cell = table.locator(f"[data-testid=cell-{i}-7]")
    cell.wait_for()
    right = table.bounding_box()["x"] + table.bounding_box()["width"]
    for c in range(8):
        box = table.locator(f"[data-testid=cell-{i}-{c}]").bounding_box()
        assert box["x"] + box["width"] <= right + 1, f"column {HEADERS[c]} is cut off"
    assert table.locator(f"[data-testid=cell-{i}-6]").inner_text().strip() == str(rows[i][6])
    table.locator(f"[data-testid=cell-{i}-3]").click()
    page.wait_for_function("() => (document.querySelector('#kinegen-info') || {}).innerText?.includes('From the "
                           "History')")
    assert page.get_by_role("tab", selected=True).inner_text() == "Generate"
    assert page.locator("#kinegen-output video").get_attribute("src").endswith(rows[i][7])
    assert page.get_by_label("Prompt", exact=True).input_value() == rows[i][3]


def test_sparse_attention_stats_become_a_block_pattern_picture(tmp_path):
    """Any attention accelerator that reports ``density`` and ``block_pattern`` gets its picture in the page."""
    import dataclasses

    from kinegen.accelerators.base import ACCELERATORS, AcceleratorHandle, register_accelerator

    @dataclasses.dataclass
    class FakeSparse:
        density: float = 0.25

    def apply(pipe, config, run):
        pattern = [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]]
        return AcceleratorHandle("fake-sparse", config, lambda: None,
                                 lambda: {"density": config.density, "block_pattern": pattern})

    register_accelerator("fake-sparse", FakeSparse, apply, kind="attention", summary="test only")
    try:
        svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path))
        out = svc.generate("tiny-wan", GenerationRequest(prompt="a dot", steps=2), ["fake-sparse"])
        assert out["block_pattern"].endswith("-blocks.png") and svc.is_served(out["block_pattern"])
    finally:
        del ACCELERATORS["fake-sparse"]


def test_app_login_is_required_when_auth_is_set(tmp_path):
    from gradio_client import Client

    from kinegen.apps.web import launch_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = launch_app(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path, auth=[("alice", "pw")]),
                     port=port, prevent_thread_lock=True, quiet=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(Exception):  # noqa: B017 (gradio_client raises its own errors for a refused login)
            Client(url, verbose=False)
        client = Client(url, auth=("alice", "pw"), verbose=False)
        out = client.predict(prompt="a red circle", seed=1, steps=2, api_name="/generate")
        assert (out["video"] if isinstance(out, dict) else out).endswith(".mp4")
    finally:
        app.close()


def test_an_accelerator_warning_heads_the_run_info():
    """A speed served differently from the request (the fidelity bound) is said above the timing table."""
    from kinegen.apps.tabs.common import timing_markdown

    out = {"timings": {"text_encoder": 0.1, "transformer": 1.0, "vae_decode": 0.2, "other": 0.0, "total": 1.3,
                       "transformer_calls": 40},
           "stats": [{"name": "mapguided", "config": {}, "chosen_speedup": 1.9,
                      "warning": "mapguided: served at 1.93x"}]}
    md = timing_markdown(out)
    assert md.startswith("**Warning:** mapguided: served at 1.93x\n\n| stage | seconds |")
    assert "chosen_speedup=1.9" in md and md.count("served at") == 1


def test_stop_in_chromium_cancels_the_run_and_frees_the_model(page, running_app):
    """Stop ends a run at its next step: the model's lock is free again, nothing is written, the server serves on."""
    import time

    from gradio_client import Client

    app, url, config = running_app
    svc = app.kinegen_service
    lock = svc._locks["kinegen-shapes-t2v"]
    files, runs = sorted(os.listdir(config.output_dir)), len(svc.history_rows())
    page.get_by_role("tab", name="Generate").click()
    page.get_by_label("Prompt", exact=True).fill("a green square moving down on a white background")
    page.get_by_role("button", name="Generate", exact=True).click()
    deadline = time.time() + 60
    while not lock.locked() and time.time() < deadline:  # the run has the model
        time.sleep(0.05)
    assert lock.locked()
    page.get_by_role("button", name="Stop", exact=True).click()
    deadline = time.time() + 30
    while lock.locked() and time.time() < deadline:
        time.sleep(0.05)
    assert not lock.locked()
    time.sleep(2)
    assert sorted(os.listdir(config.output_dir)) == files and len(svc.history_rows()) == runs
    path = Client(url, verbose=False).predict(prompt="a red circle moving right", steps=2, api_name="/generate")
    assert path.endswith(".mp4")


def test_autoregressive_model_in_chromium_grows_the_video_chunk_by_chunk(page, running_app, monkeypatch):
    """tiny-wan-ar from the page: the Frames field offers its counts (8k+1), the status line reads "chunk i/n,
    step j/k", the output video grows chunk by chunk in sight (a new preview after each chunk, no progress overlay
    over it), then the final video and the per-chunk table; the previews are gone afterwards."""
    import time

    app, url, config = running_app
    svc = app.kinegen_service
    generate = svc.generate

    def slower(*args, chunk_callback=None, **kw):  # a slower model: time for the page to show every chunk
        def on_chunk(*chunk):
            chunk_callback(*chunk)
            time.sleep(0.8)

        return generate(*args, chunk_callback=on_chunk, **kw)

    monkeypatch.setattr(svc, "generate", slower)
    page.get_by_role("tab", name="Generate").click()
    page.locator("input[aria-label='Model']:visible").click()  # the Profile tab, visited before, has one too
    page.get_by_role("option", name="tiny-wan-ar", exact=True).click()
    frames = page.get_by_label("Frames (8k+1)")  # relabelled for the model's chunks
    frames.wait_for()
    assert frames.input_value() == "17" and frames.get_attribute("step") == "8"
    frames.fill("33")
    page.get_by_label("Prompt", exact=True).fill("a red circle moving right")
    page.get_by_label("Cache", exact=True).click()  # an earlier test chose mapguided, which wan_ar refuses
    page.get_by_role("option", name="none", exact=True).click()
    page.evaluate("""() => {
        const seen = window.kinegenSeen = {texts: new Set(), srcs: []};
        const grab = () => {
            for (const m of document.body.innerText.matchAll(/(Generating: |Output so far: )chunk [^\\n|]*/g))
                seen.texts.add(m[0].trim());
            const out = document.querySelector('#kinegen-output');
            const src = out.querySelector('video')?.getAttribute('src');
            if (src && seen.srcs[seen.srcs.length - 1] !== src) {
                seen.srcs.push(src);  // a new video: is Gradio's status drawn over it a moment later?
                setTimeout(() => {
                    const cover = [...out.querySelectorAll('.wrap.default')].map(w => getComputedStyle(w))
                        .some(st => st.opacity > 0.5 && st.backgroundColor !== 'rgba(0, 0, 0, 0)');
                    if (cover && src.includes('preview-')) seen.covered = (seen.covered || 0) + 1;
                }, 300);
            }
        };
        new MutationObserver(grab).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                           attributes: true, attributeFilter: ['src']});
    }""")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("() => document.querySelector('#kinegen-info')?.innerText.includes('Chunk by chunk')",
                           timeout=120_000)
    texts, srcs, covered = page.evaluate("() => [[...window.kinegenSeen.texts], window.kinegenSeen.srcs, "
                                         "window.kinegenSeen.covered || 0]")
    assert "Generating: chunk 1/5, step 1/2." in texts, texts
    assert any(t.startswith("Generating: chunk 5/5, step 2/2 (25 frames so far)") for t in texts), texts
    grown = [t for t in texts if t.startswith("Output so far: chunk")]
    previews = [s for s in srcs if "preview-" in s]
    assert len(previews) >= 3 and len(grown) >= 3, (srcs, texts)  # the video grew chunk by chunk
    assert covered == 0  # and was in sight as it grew
    out = svc.history_rows()[0][-1]
    page.wait_for_function("() => document.querySelector('#kinegen-output video').videoWidth > 0")
    video = page.locator("#kinegen-output video")
    assert video.get_attribute("src").endswith(out) and video.evaluate("e => e.videoWidth") == 32
    stages = page.locator("#kinegen-info table").nth(1).locator("tbody tr td:first-child").all_inner_texts()
    assert stages == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert not [p for p in os.listdir(config.output_dir) if p.startswith(".partial")]


def test_kinegen_app_flags_auth_file_concurrency_and_max_queue(tmp_path, monkeypatch):
    """`kinegen app --auth-file F --concurrency 1 --max-queue 1`: the file's logins work (others do not), and with
    one run going and one waiting, a third request is turned away by the queue, while the first two finish."""
    import logging

    from gradio_client import Client

    from kinegen.apps import web
    from kinegen.cli import main

    launched, real_launch = {}, web.launch_app

    def launch(config, **kw):  # the real launch, without blocking the test
        launched["config"], launched["app"] = config, real_launch(config, **kw, prevent_thread_lock=True, quiet=True)
        return launched["app"]

    monkeypatch.setattr(web, "launch_app", launch)
    (tmp_path / "users").write_text("# the team\nalice:pw1\n\nbob:pw2\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handlers = list(logging.getLogger("kinegen").handlers)
    try:
        assert main(["app", "--port", str(port), "--models", "tiny-wan", "--gan-models", "--output-dir",
                     str(tmp_path / "out"), "--auth-file", str(tmp_path / "users"), "--concurrency", "1",
                     "--max-queue", "1"]) == 0
        config = launched["config"]
        assert config.auth == [("alice", "pw1"), ("bob", "pw2")] and (config.concurrency, config.max_queue) == (1, 1)
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(Exception):  # noqa: B017 (gradio_client's own error for a refused login)
            Client(url, auth=("alice", "pw2"), verbose=False)
        clients = [Client(url, auth=("bob", "pw2"), verbose=False) for _ in range(3)]
        slow = dict(prompt="a red circle", height=64, width=64, frames=17, steps=60)
        from gradio_client.utils import Status

        def submitted(i, until):  # submit, then wait until the server has the job in one of the ``until`` states
            job = clients[i].submit(seed=i, api_name="/generate", **slow)
            deadline = time.monotonic() + 60
            while until and job.status().code not in until and time.monotonic() < deadline:
                time.sleep(0.05)
            return job

        # one at a time, so that the first is running and the second waiting before the third arrives (submitted
        # together on a busy machine, the second and third could both find the first still queued)
        running = (Status.PROCESSING, Status.PROGRESS, Status.ITERATING, Status.FINISHED)
        jobs = [submitted(0, running), submitted(1, (Status.IN_QUEUE, *running)), submitted(2, ())]
        outcomes = []
        for job in jobs:
            try:
                outcomes.append(job.result(timeout=120))
            except Exception as e:  # noqa: BLE001 (gradio_client raises its own errors)
                outcomes.append(e)
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert len(refused) == 1 and "Queue is full" in str(refused[0])
        assert sum(isinstance(o, str) and o.endswith(".mp4") for o in outcomes) == 2
    finally:
        if "app" in launched:
            launched["app"].close()
        logging.getLogger("kinegen").handlers[:] = handlers
