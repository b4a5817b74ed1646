"""Media I/O: round trips, odd sizes, atomic writes."""

from __future__ import annotations

import numpy as np
import pytest

from kinegen.media import atomic_path, read_video, write_image, write_video


def test_video_round_trip_keeps_count_size_and_content(tmp_path):
    frames = np.zeros((7, 32, 48, 3), np.float32)
    frames[:, :, :24, 0] = 1.0  # left half red
    path = write_video(tmp_path / "v.mp4", frames, fps=8)
    video = read_video(path)
    assert video.shape == (7, 32, 48, 3)
    assert video[:, :, :20, 0].mean() > 240 and video[:, :, 28:, 0].mean() < 15


def test_odd_sizes_are_padded_to_even(tmp_path):
    video = read_video(write_video(tmp_path / "v.mp4", np.full((3, 15, 17, 3), 0.5, np.float32)))
    assert video.shape == (3, 16, 18, 3)


def test_ffmpeg_is_started_without_python_in_the_forked_child(tmp_path, monkeypatch):
    """A ``preexec_fn`` runs Python between fork and exec, which can deadlock in a threaded server (the web app
    writes from a worker thread); the writer must start ffmpeg without one."""
    import subprocess

    import imageio_ffmpeg._io

    seen = []

    class Recording(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get("preexec_fn"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(imageio_ffmpeg._io.subprocess, "Popen", Recording)
    assert read_video(write_video(tmp_path / "v.mp4", np.zeros((2, 16, 16, 3), np.float32))).shape[0] == 2
    assert seen == [None]


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "x.png") as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_image_written_with_normal_permissions(tmp_path):
    path = write_image(tmp_path / "i.png", np.zeros((8, 8, 3), np.float32))
    assert path.stat().st_mode & 0o044  # readable by others, unlike mkstemp's 0600
