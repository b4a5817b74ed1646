"""The web app: its service rules directly, then the launched app driven by gradio_client and Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import numpy as np
import pytest
import torch

from kinegen.apps.service import AppConfig, RateLimiter, Service
from kinegen.errors import ConfigError, InvalidRequestError, KinegenError
from kinegen.generation import GenerationRequest


def _tiny_gan(path):
    from kinegen.data.shape_images import class_names
    from kinegen.models.mpgan import GANConfig
    from kinegen.pipelines import MPGANGenerator, MPGANPipeline

    gan = MPGANGenerator.from_gan_config(GANConfig(resolution=16, widths=(64, 64, 32), num_classes=12), class_names())
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


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    from kinegen.apps.web import launch_app

    tmp = tmp_path_factory.mktemp("app")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AppConfig(models=["kinegen-shapes-t2v"], gan_models=[_tiny_gan(tmp / "gan")], output_dir=tmp / "out",
                       max_steps=30)
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
    params = [p["parameter_name"] for p in client.view_api(return_format="dict")["named_endpoints"]["/generate"]
              ["parameters"]]
    assert params[:2] == ["prompt", "seed"] and "cache" in params
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
    grid, info, history = client.predict(model=config.gan_models[0], classes=["blue star"], num_images=4, seed=0,
                                         truncation=1.0, api_name="/gan")
    assert "4 images" in info and grid.endswith(".png")
    assert [r[1] for r in history["data"][:2]] == ["gan", "generate"]


def test_generate_tab_screenshot_in_headless_chromium(running_app, tmp_path):
    from PIL import Image

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("KINEGEN_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (KINEGEN_REQUIRE_CHROMIUM is set): apt-get install chromium")
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)")
    _, url, _ = running_app
    shot = tmp_path / "generate.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,1000", "--virtual-time-budget=15000", f"--screenshot={shot}", url],
                   check=True, capture_output=True, timeout=120)
    img = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert img.shape == (1000, 1280)
    # A rendered page (text, inputs, buttons), not a blank or error screen: many distinct grey levels.
    assert img.std() > 10 and len(np.unique(img)) > 50


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
