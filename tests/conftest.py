"""Shared fixtures: tiny random pipelines built in code (no downloads), loaded once per session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402

TINY = ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox", "tiny-flux"]
VIDEO_TINY = ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox"]


def _load(name):
    import kinegen

    pipe = kinegen.load_pipeline(name, device="cpu")
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def load_tiny():
    """``load_tiny(name)`` -> the cached tiny pipeline (progress bars off)."""
    return _load


@pytest.fixture(scope="session")
def wan(load_tiny):
    return load_tiny("tiny-wan")


@pytest.fixture(scope="session")
def flux(load_tiny):
    return load_tiny("tiny-flux")
