"""Reading and writing media, always atomically.

Videos are written as H.264 mp4 (yuv420p, playable in browsers) with the ffmpeg binary
that ``imageio-ffmpeg`` ships; videos are read with decord where it is installed and PyAV
otherwise. Every writer renders to a temporary file in the destination folder and renames
it into place, so a failed or interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .errors import DiskFullError, InvalidRequestError

# imageio-ffmpeg starts ffmpeg with ``preexec_fn=os.setpgrp`` (so that Ctrl+C does not reach it) unless this is
# set. A ``preexec_fn`` runs Python in the forked child, which can deadlock when other threads hold locks at the
# fork: the web app writes videos from a worker thread beside uvicorn's, and a generation hung there for good
# (imageio-ffmpeg issue #58). Without it the child only execs. An interrupted write still leaves nothing behind:
# every writer here renders to a temporary file. A value the user set is kept.
os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")

VIDEO_EXTENSIONS = (".mp4",)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")


def check_output_path(path: str | os.PathLike, kind: str) -> Path:
    """Validate an output path before any work is done: extension, parent folder, writability."""
    path = Path(path).expanduser()
    allowed = VIDEO_EXTENSIONS if kind == "video" else IMAGE_EXTENSIONS
    if path.suffix.lower() not in allowed:
        raise InvalidRequestError(
            f"Output {path} must end with {' or '.join(allowed)} for a {kind} model.")
    if path.is_dir():
        raise InvalidRequestError(f"Output {path} is a folder; give a file name such as {path / ('out' + allowed[0])}.")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidRequestError(f"The folder {parent} does not exist; create it first or choose another --output.")
    if not os.access(parent, os.W_OK):
        raise InvalidRequestError(f"The folder {parent} is not writable; choose another --output.")
    if path.exists() and not os.access(path, os.W_OK):
        raise InvalidRequestError(f"{path} exists and is not writable; choose another --output.")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); rename it to ``path`` on success only."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".part{path.suffix}", dir=path.parent or ".")
    except OSError as e:
        if is_disk_full(e):
            raise _disk_full_error(path) from e
        raise
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if is_disk_full(e):
            raise _disk_full_error(path) from e
        raise


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk (or the user's quota) is full, as an errno or in a tool's message."""
    return isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e))


def _disk_full_error(path: Path) -> DiskFullError:
    return DiskFullError(f"No space left on the device holding {path.parent.resolve()} while writing {path.name}; "
                         f"nothing was written (an earlier {path.name} there is untouched). Free space or choose "
                         "another --output.")


def swap_in_dir(built: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Put the finished folder ``built`` at ``dest`` by renames: the old ``dest`` (if any) is moved aside
    first and deleted only after the new one is in place, so ``dest`` is never half-written."""
    import shutil

    built, dest = Path(built), Path(dest)
    old = dest.with_name(f".{dest.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        os.replace(dest, old)
    os.replace(built, dest)
    if old.exists():
        shutil.rmtree(old)
    return dest


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] (or uint8) to uint8, clipping."""
    if frames.dtype == np.uint8:
        return frames
    return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _pad_even(frames: np.ndarray) -> np.ndarray:
    f, h, w, c = frames.shape
    if h % 2 == 0 and w % 2 == 0:
        return frames
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: int = 16, quality: int = 18) -> Path:
    """Write ``frames`` ``[F, H, W, 3]`` (float in [0, 1] or uint8) as an H.264 mp4, atomically.

    ``quality`` is x264's CRF (lower is better; 18 is visually lossless). Odd sizes are padded by
    one edge pixel (yuv420p needs even sizes).
    """
    import imageio_ffmpeg

    frames = _pad_even(to_uint8(np.asarray(frames)))
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3], got {frames.shape}")
    _, h, w, _ = frames.shape
    path = Path(path)
    with atomic_path(path) as tmp:
        writer = imageio_ffmpeg.write_frames(
            str(tmp), (w, h), fps=fps, codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
            macro_block_size=1, quality=None, output_params=["-crf", str(quality), "-movflags", "+faststart"],
            ffmpeg_log_level="error",
        )
        try:
            writer.send(None)
            for frame in frames:
                writer.send(np.ascontiguousarray(frame))
        except OSError as e:  # ffmpeg died; its own message (on stderr) is not in `e`
            if _nearly_full(tmp.parent):
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp)) from e
            raise
        finally:
            writer.close()  # ffmpeg finishes (or, after an error, stops) before the temporary file goes
        _check_encoded(tmp, len(frames))
    return path


def _nearly_full(folder: Path) -> bool:
    import shutil

    return shutil.disk_usage(folder).free < 16 * 2**20


def _check_encoded(path: Path, expected: int) -> None:
    """Raise unless ``path`` is a whole mp4 of ``expected`` frames. imageio-ffmpeg does not check ffmpeg's exit
    status, so a disk that fills while ffmpeg writes the file would otherwise leave a truncated mp4 that looks
    finished (and replaces the earlier output). Reads the boxes' headers and the frame count, not the frames."""
    import av

    problem = _mp4_boxes_problem(path)
    if problem is None:
        try:
            with av.open(str(path)) as container:
                found = container.streams.video[0].frames
        except Exception:  # no video stream
            found = 0
        if found != expected:
            problem = f"{found} of {expected} frames"
    if problem is None:
        return
    if _nearly_full(path.parent):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    raise OSError(errno.EIO, f"ffmpeg wrote an incomplete video to {path} ({problem}; its message is above)")


def _mp4_boxes_problem(path: Path) -> str | None:
    """Why the top-level boxes of an mp4 do not tile the file exactly with a moov and an mdat (truncated), or None."""
    size, pos, names = path.stat().st_size, 0, set()
    with open(path, "rb") as f:
        while pos < size:
            f.seek(pos)
            head = f.read(16)
            n = int.from_bytes(head[:4], "big")
            if n == 1 and len(head) == 16:  # a 64-bit size follows the name
                n = int.from_bytes(head[8:16], "big")
            elif n == 0:  # to the end of the file
                n = size - pos
            if len(head) < 8 or n < 8:
                return f"a broken box header at byte {pos}"
            names.add(head[4:8])
            pos += n
    if pos != size:
        return f"truncated: {size} bytes where its boxes need {pos}"
    missing = [b.decode() for b in (b"moov", b"mdat") if b not in names]
    return f"no {' or '.join(missing)} box" if missing else None


def read_video(path: str | os.PathLike) -> np.ndarray:
    """All frames of a video as uint8 ``[F, H, W, 3]``.

    decord is tried first where it is installed; PyAV reads otherwise, and also when decord
    fails (decord 0.6.0 rejects some widths that are not multiples of 32, e.g. 48).
    """
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    try:
        import decord

        vr = decord.VideoReader(path, ctx=decord.cpu(0))
        return vr.get_batch(list(range(len(vr)))).asnumpy()
    except Exception:  # ImportError, or a decord decoding error: fall back to PyAV
        pass
    import av

    with av.open(path) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def write_image(path: str | os.PathLike, image: np.ndarray) -> Path:
    """Write one ``[H, W, 3]`` frame (float in [0, 1] or uint8) as png/jpg/webp, atomically."""
    from PIL import Image

    path = Path(path)
    with atomic_path(path) as tmp:
        fmt = Image.registered_extensions()[path.suffix.lower()]
        Image.fromarray(to_uint8(np.asarray(image))).save(tmp, format=fmt)
    return path


def image_grid(images: np.ndarray, columns: int | None = None, upscale: int = 1, pad: int = 2,
               background: float = 1.0) -> np.ndarray:
    """Tile ``[N, H, W, 3]`` images (float in [0, 1]) into one ``[rows*(H+pad)+pad, ..., 3]`` image.

    ``columns`` defaults to ``ceil(sqrt(N))``; ``upscale`` enlarges each image by nearest neighbour first
    (small GAN samples stay crisp); the padding between cells has the ``background`` value.
    """
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 4 or images.shape[-1] != 3 or len(images) == 0:
        raise ValueError(f"image_grid takes [N, H, W, 3] images with N >= 1, got shape {images.shape}.")
    if upscale > 1:
        images = images.repeat(upscale, axis=1).repeat(upscale, axis=2)
    n, h, w, _ = images.shape
    cols = columns or int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / cols))
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), background, dtype=np.float32)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + c * (w + pad)
        grid[y:y + h, x:x + w] = img
    return grid


def write_output(path: str | os.PathLike, frames: np.ndarray, kind: str, fps: int = 16) -> Path:
    """Write a generation's frames: an mp4 for video, the first frame as an image otherwise."""
    if kind == "video":
        return write_video(path, frames, fps=fps)
    return write_image(path, frames[0])
