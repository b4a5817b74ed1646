"""Videos with sound, in and out: what audio-video understanding reads (``kinegen understand``, the Understand tab).

:func:`read_av` samples frames the way the Qwen-Omni processors do (``qwen-omni-utils``: 2 frames per second, a
count rounded down to a multiple of 2 and kept between 4 and 768, spread evenly over the video) and reads the whole
sound track as 16 kHz mono. decord's ``AVReader``/``AudioReader`` read where decord is installed, PyAV otherwise (or
when decord fails); a file without sound gives ``audio=None``. AAC adds a few hundred samples of padding at the end,
which is cut to the stream's duration. Files that are too big, too long, not videos, or broken are refused with an
:class:`InvalidRequestError` that says which limit, before any frame is decoded where the header allows.

:func:`write_av` writes frames and a mono track as an H.264 + AAC mp4, atomically.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from .errors import InvalidRequestError
from .media import atomic_path, to_uint8

SAMPLE_RATE = 16000
FRAME_FACTOR = 2  # the vision encoder's temporal patch
MIN_FRAMES, MAX_FRAMES = 4, 768


@dataclasses.dataclass
class AVInput:
    """Sampled frames (uint8 ``[N, H, W, 3]``) with their times in seconds, and the sound track (float32 mono in
    [-1, 1], or None for a silent file)."""

    frames: np.ndarray
    frame_times: np.ndarray
    audio: np.ndarray | None
    sample_rate: int
    duration: float
    reader: str

    @property
    def has_audio(self) -> bool:
        return self.audio is not None and len(self.audio) > 0


def sample_frame_indices(total: int, video_fps: float, fps: float = 2.0, max_frames: int = MAX_FRAMES) -> np.ndarray:
    """Which of ``total`` frames to keep: ``fps`` per second, a multiple of 2 between 4 and ``max_frames``, evenly
    spread (the qwen-omni-utils rule)."""
    if total < 1:
        raise InvalidRequestError("The video has no frames.")
    n = total / max(video_fps, 1e-6) * fps
    n = int(n // FRAME_FACTOR * FRAME_FACTOR)
    n = min(max(n, MIN_FRAMES), max(max_frames // FRAME_FACTOR * FRAME_FACTOR, MIN_FRAMES))
    return np.linspace(0, total - 1, n).round().astype(int)


def read_av(path: str | os.PathLike, fps: float = 2.0, size: int | None = None, max_seconds: float = 300.0,
            max_bytes: int = 200 * 2**20, max_frames: int = MAX_FRAMES, sample_rate: int = SAMPLE_RATE) -> AVInput:
    """Frames sampled at ``fps`` (resized to ``size`` x ``size`` if given) and the whole sound track.

    Raises:
        InvalidRequestError: the file is missing, larger than ``max_bytes``, longer than ``max_seconds``, has no
            video stream, or cannot be decoded.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidRequestError(f"No such file: {p}.")
    n_bytes = p.stat().st_size
    if n_bytes > max_bytes:
        raise InvalidRequestError(f"{p.name} is {n_bytes / 2**20:.1f} MB; the limit is {max_bytes / 2**20:.1f} MB. "
                                  "Cut or re-encode it first.")
    if n_bytes == 0:
        raise InvalidRequestError(f"{p.name} is empty.")
    try:
        import decord  # noqa: F401

        out = _read_decord(p, fps, max_seconds, max_frames, sample_rate)
    except InvalidRequestError:
        raise
    except Exception:  # ImportError or a decord failure: PyAV reads it (or says why not)
        out = _read_pyav(p, fps, max_seconds, max_frames, sample_rate)
    if size is not None:
        import cv2

        out.frames = np.stack([cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA) for f in out.frames])
    return out


def _check_duration(name: str, duration: float, max_seconds: float) -> None:
    if duration > max_seconds:
        raise InvalidRequestError(f"{name} lasts {duration:.1f} s; the limit is {max_seconds:.0f} s. Cut it first.")


def _read_decord(p: Path, fps, max_seconds, max_frames, sample_rate) -> AVInput:
    import decord

    vr = decord.VideoReader(str(p), ctx=decord.cpu(0))
    video_fps = float(vr.get_avg_fps())
    duration = len(vr) / video_fps
    _check_duration(p.name, duration, max_seconds)
    idx = sample_frame_indices(len(vr), video_fps, fps, max_frames)
    frames = vr.get_batch(list(idx)).asnumpy()
    audio = None
    try:
        ar = decord.AudioReader(str(p), ctx=decord.cpu(0), sample_rate=sample_rate, mono=True)
        audio = ar[:].asnumpy()[0].astype(np.float32)[: int(round(ar.duration() * sample_rate))]
    except Exception:  # decord raises when there is no audio stream
        audio = None
    return AVInput(frames, idx / video_fps, audio, sample_rate, duration, "decord")


def _read_pyav(p: Path, fps, max_seconds, max_frames, sample_rate) -> AVInput:
    import av

    try:
        with av.open(str(p)) as container:
            if not container.streams.video:
                raise InvalidRequestError(f"{p.name} has no video stream (audio without video is not supported; "
                                          "give a video, or a still image with the sound as a video).")
            vs = container.streams.video[0]
            video_fps = float(vs.average_rate or 25)
            duration = (float(container.duration) / 1e6 if container.duration
                        else float(vs.frames or 0) / video_fps)
            _check_duration(p.name, duration, max_seconds)
            decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        idx = sample_frame_indices(len(decoded), video_fps, fps, max_frames)
        frames = np.stack([decoded[i] for i in idx])
        audio = _pyav_audio(p, sample_rate)
    except InvalidRequestError:
        raise
    except Exception as e:
        raise InvalidRequestError(f"Cannot read {p.name} as a video ({type(e).__name__}: {e}); is it a whole, "
                                  "playable video file?") from None
    return AVInput(frames, idx / video_fps, audio, sample_rate, duration, "pyav")


def _pyav_audio(p: Path, sample_rate: int) -> np.ndarray | None:
    import av

    with av.open(str(p)) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        chunks = []
        for frame in container.decode(audio=0):
            for r in resampler.resample(frame):
                chunks.append(r.to_ndarray().reshape(-1))
        for r in resampler.resample(None):
            chunks.append(r.to_ndarray().reshape(-1))
        if not chunks:
            return None
        audio = np.concatenate(chunks).astype(np.float32)
        if stream.duration and stream.time_base:
            audio = audio[: int(round(float(stream.duration * stream.time_base) * sample_rate))]
        return audio


def write_av(path: str | os.PathLike, frames: np.ndarray, fps: int, audio: np.ndarray | None = None,
             sample_rate: int = SAMPLE_RATE, crf: int = 18) -> Path:
    """``frames`` ``[F, H, W, 3]`` (float in [0, 1] or uint8, even sizes) and an optional mono track as an mp4
    (H.264 + AAC), atomically."""
    import av

    frames = to_uint8(np.asarray(frames))
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(f"frames must be [F, H, W, 3] with even H and W; got {frames.shape}")
    path = Path(path)
    with atomic_path(path) as tmp:
        with av.open(str(tmp), "w", format="mp4") as out:
            vs = out.add_stream("libx264", rate=fps)
            vs.width, vs.height, vs.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            vs.options = {"crf": str(crf)}
            a_s = None
            if audio is not None:
                a_s = out.add_stream("aac", rate=sample_rate)
                a_s.layout = "mono"
            for f in frames:
                for packet in vs.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                    out.mux(packet)
            for packet in vs.encode():
                out.mux(packet)
            if a_s is not None:
                samples = np.clip(np.asarray(audio, np.float32).reshape(-1), -1, 1)
                for i in range(0, len(samples), 1024):
                    fr = av.AudioFrame.from_ndarray(samples[None, i:i + 1024].copy(), format="fltp", layout="mono")
                    fr.sample_rate, fr.pts = sample_rate, i
                    for packet in a_s.encode(fr):
                        out.mux(packet)
                for packet in a_s.encode():
                    out.mux(packet)
    return path
