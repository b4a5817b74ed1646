"""Faults: a corrupt model file, a disk that fills, a cancelled run, running out of memory.

Each is reported in one clear line (the CLI exits 2), leaves no partial file and keeps earlier outputs, and leaves
the web service free to serve the next request (no lock held, nothing broken cached, history.jsonl intact).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import weakref

import numpy as np
import pytest
import torch

from kinegen import loading
from kinegen.apps.service import AppConfig, Service
from kinegen.cli import main
from kinegen.errors import CorruptModelFileError, DiskFullError, OutOfMemory, RunCancelled
from kinegen.generation import GenerationRequest
from kinegen.loading import check_weight_files, load_pipeline
from kinegen.media import read_video, write_output, write_video
from kinegen.memory import is_out_of_memory

SMALL = dict(height=16, width=16, frames=1, steps=1)  # the cheapest tiny-wan run
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def saved_wan(tmp_path_factory, wan):
    folder = tmp_path_factory.mktemp("models") / "my-wan"
    wan.save_pretrained(folder, safe_serialization=True)
    return folder


def _damage(src, dst, how: str, rel: str = WEIGHTS):
    if not dst.exists():
        shutil.copytree(src, dst)
    path = dst / rel
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage header": b"\xff" * 16 + data[16:],
                      "empty": b""}[how])
    return dst


def _lock_free(svc: Service) -> bool:
    return not svc._load_lock.locked() and not any(lock.locked() for lock in svc._locks.values())


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------------------- a corrupt model file


@pytest.mark.parametrize("how, why", [
    ("truncated", r"truncated: 52164 bytes where its header lists 104328"),
    ("garbage header", r"its header length field says 18446744073709551615 bytes, the file has 104328"),
    ("empty", r"0 bytes: shorter than a safetensors header"),
])
def test_a_truncated_or_corrupt_weights_file_is_named_with_what_to_do(saved_wan, tmp_path, how, why):
    folder = _damage(saved_wan, tmp_path / "broken-wan", how)
    if how == "truncated":  # the sizes in `why` are those of tiny-wan's transformer
        assert (saved_wan / WEIGHTS).stat().st_size == 104328
    with pytest.raises(CorruptModelFileError, match=why) as err:
        load_pipeline(str(folder), device="cpu")
    msg = str(err.value)
    assert msg.startswith(f"The weights file {folder / WEIGHTS} is truncated or corrupt (")
    assert msg.endswith(f"Re-download the model (`hf download <owner/name> --local-dir {folder} --force-download`) "
                        "or re-export it (`pipe.save_pretrained(folder)`, or run `kinegen train` again).")
    assert "\n" not in msg
    assert not any(key[0] == str(folder.resolve()) for key in loading._PIPELINE_CACHE)  # nothing cached


def test_every_damaged_file_is_listed_and_a_bundled_model_is_restored_from_git(saved_wan, tmp_path, monkeypatch):
    folder = _damage(saved_wan, tmp_path / "models" / "shapes", "truncated")
    _damage(saved_wan, folder, "empty", "vae/diffusion_pytorch_model.safetensors")
    assert check_weight_files(folder) == [
        f"{WEIGHTS} (truncated: 52164 bytes where its header lists 104328)",
        "vae/diffusion_pytorch_model.safetensors (0 bytes: shorter than a safetensors header)"]
    monkeypatch.setattr(loading, "ASSETS_DIR", tmp_path)  # as if it were the bundled model
    with pytest.raises(CorruptModelFileError) as err:
        load_pipeline(str(folder), device="cpu")
    assert str(err.value) == (
        f"2 weights files in {folder.resolve()} are truncated or corrupt: {WEIGHTS} (truncated: 52164 bytes where its "
        "header lists 104328); vae/diffusion_pytorch_model.safetensors (0 bytes: shorter than a safetensors header). "
        "The bundled models ship with the repository: `git checkout -- assets/` restores them.")
    assert check_weight_files(saved_wan) == []


def test_cli_reports_a_corrupt_model_in_one_line(saved_wan, tmp_path, capsys):
    folder = _damage(saved_wan, tmp_path / "broken-wan", "truncated")
    out = tmp_path / "o.mp4"
    assert main(["generate", "a red circle", "--model", str(folder), "--steps", "1", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: The weights file {folder / WEIGHTS} is truncated or corrupt (truncated: "
                                "52164 bytes where its header lists 104328). Re-download the model (`hf download "
                                f"<owner/name> --local-dir {folder} --force-download`) or re-export it "
                                "(`pipe.save_pretrained(folder)`, or run `kinegen train` again)."]
    assert not out.exists()


def test_a_failed_load_does_not_poison_the_service(saved_wan, tmp_path):
    folder = _damage(saved_wan, tmp_path / "broken-wan", "truncated")
    svc = Service(AppConfig(models=[str(folder), "tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    for _ in range(2):  # the same error each time: the failure is not cached as something else
        with pytest.raises(CorruptModelFileError, match="is truncated or corrupt"):
            svc.generate(str(folder), GenerationRequest(prompt="a red circle", **SMALL))
        assert _lock_free(svc)
    out = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", **SMALL))  # another model still serves
    assert read_video(out["output"]).shape == (1, 16, 16, 3)
    shutil.copy(saved_wan / WEIGHTS, folder / WEIGHTS)  # repaired: now it loads (nothing negative was cached)
    assert svc.pipeline(str(folder)).kinegen_spec.name == "broken-wan"
    assert _lock_free(svc)


# ---------------------------------------------------------------------------- a disk that fills


def _fill_disk_while_encoding(monkeypatch, after_frames: int = 0):
    """ffmpeg's writer puts some bytes on disk, then the disk is full (at frame ``after_frames``)."""
    import imageio_ffmpeg

    def write_frames(path, size, **kw):
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)
            yield  # primed: ffmpeg runs
            for _ in range(after_frames):  # frames that fit
                yield
            raise OSError(errno.ENOSPC, "No space left on device")  # on receiving the next one

    monkeypatch.setattr(imageio_ffmpeg, "write_frames", write_frames)


def _fill_disk_while_saving_image(monkeypatch):
    from PIL import Image

    def save(self, fp, format=None, **kw):
        with open(fp, "wb") as f:
            f.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", save)


def _full_message(folder, name: str) -> str:
    return (f"No space left on the device holding {folder.resolve()} while writing {name}; nothing was written (an "
            f"earlier {name} there is untouched). Free space or choose another --output.")


@pytest.mark.parametrize("kind, name", [("video", "out.mp4"), ("image", "out.png")])
def test_a_full_disk_leaves_the_earlier_output_and_no_partial_file(tmp_path, monkeypatch, kind, name):
    earlier = write_output(tmp_path / name, np.full((3, 16, 16, 3), 0.5, np.float32), kind)
    before = earlier.read_bytes()
    if kind == "video":
        _fill_disk_while_encoding(monkeypatch)
    else:
        _fill_disk_while_saving_image(monkeypatch)
    with pytest.raises(DiskFullError) as err:
        write_output(tmp_path / name, np.zeros((3, 16, 16, 3), np.float32), kind)
    assert str(err.value) == _full_message(tmp_path, name)
    assert os.listdir(tmp_path) == [name] and earlier.read_bytes() == before


def test_a_video_that_ffmpeg_could_not_finish_is_not_put_in_place(tmp_path, monkeypatch):
    """imageio-ffmpeg ignores ffmpeg's exit status: a disk that fills while ffmpeg writes the end of the mp4 used to
    leave a truncated file in place of the earlier output. The frame count is read back before the rename."""
    import collections

    import imageio_ffmpeg

    earlier = write_video(tmp_path / "out.mp4", np.full((3, 16, 16, 3), 0.5, np.float32))
    before = earlier.read_bytes()

    def write_frames(path, size, **kw):  # ffmpeg failed at the trailer; imageio-ffmpeg says nothing
        with open(path, "wb") as f:
            f.write(before[: len(before) // 2])
            while True:
                yield

    monkeypatch.setattr(imageio_ffmpeg, "write_frames", write_frames)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**30, 2**30, 0))
    with pytest.raises(DiskFullError, match="No space left on the device holding"):
        write_video(tmp_path / "out.mp4", np.zeros((3, 16, 16, 3), np.float32))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**30, 0, 2**30))  # not full: ffmpeg failed otherwise
    with pytest.raises(OSError, match=r"ffmpeg wrote an incomplete video to \S*/\.out\.\w+\.part\.mp4 \(truncated: "
                       rf"{len(before) // 2} bytes where its boxes need \d+; its message is above\)"):
        write_video(tmp_path / "out.mp4", np.zeros((3, 16, 16, 3), np.float32))
    assert os.listdir(tmp_path) == ["out.mp4"] and earlier.read_bytes() == before


def test_cli_reports_a_full_disk_in_one_line(tmp_path, capsys, monkeypatch, wan):
    out = tmp_path / "o.mp4"
    out.write_bytes(b"an earlier video")
    _fill_disk_while_encoding(monkeypatch)
    args = ["generate", "a red circle", "--model", "tiny-wan", "--height", "16", "--width", "16", "--frames", "1",
            "--steps", "1", "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [f"error: {_full_message(tmp_path, 'o.mp4')}"] and "Traceback" not in err
    assert os.listdir(tmp_path) == ["o.mp4"] and out.read_bytes() == b"an earlier video"


class _DiskFillsMidLine:
    """``os`` for the service module, except that a write puts half its bytes on disk and then finds it full."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def write(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")


def test_the_service_survives_a_full_disk_and_keeps_history_jsonl_whole(tmp_path, monkeypatch, caplog):
    import kinegen.apps.service as service_module

    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    history = tmp_path / "out" / "history.jsonl"
    first = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", seed=1, **SMALL))
    before = history.read_bytes()

    with monkeypatch.context() as m:  # the disk fills while the video is written
        _fill_disk_while_encoding(m)
        with pytest.raises(DiskFullError, match="No space left on the device holding"):
            svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", seed=2, **SMALL))
    assert _lock_free(svc) and history.read_bytes() == before and len(svc.history_rows()) == 1
    assert sorted(os.listdir(tmp_path / "out")) == sorted([os.path.basename(first["output"]), "history.jsonl"])

    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="kinegen.app"):
        m.setattr(service_module, "os", _DiskFillsMidLine())  # ... or while the history line is appended
        second = svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", seed=3, **SMALL))
    assert os.path.isfile(second["output"])  # the run's output is kept, and it is in this server's history
    assert history.read_bytes() == before  # the half line was cut back
    assert [r[4] for r in svc.history_rows()] == [3, 1]
    assert [r.getMessage() for r in caplog.records if r.name == "kinegen.app"] == [
        f"could not record the run in {history} ([Errno 28] No space left on device); the file is as it was"]

    with open(history, "a") as f:  # a line cut by a crash: the next entry must not be glued to it
        f.write('{"time": "cut')
    svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", seed=4, **SMALL))
    again = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    assert [r[4] for r in again.history_rows()] == [4, 1]


# ---------------------------------------------------------------------------- a cancelled run


def test_a_cancelled_run_frees_the_model_and_leaves_nothing(tmp_path):
    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    request = GenerationRequest(prompt="a red circle", seed=5, height=16, width=16, frames=1, steps=2)
    before = svc.generate("tiny-wan", request, ["first-block:threshold=0.05"])
    files, rows = sorted(os.listdir(tmp_path / "out")), svc.history_rows()
    steps = []

    def stop_after_first_step(i, n, latents):  # what the page's worker does once Gradio cancels the event
        steps.append(i)
        raise RunCancelled("The run was cancelled; nothing was written.")

    with pytest.raises(RunCancelled):
        svc.generate("tiny-wan", request, ["first-block:threshold=0.05"], step_callback=stop_after_first_step)
    assert steps == [0] and _lock_free(svc)
    assert sorted(os.listdir(tmp_path / "out")) == files and svc.history_rows() == rows  # no file, no entry
    # The next request runs, and the pipeline carries nothing over (the accelerator's hooks are gone).
    after = svc.generate("tiny-wan", request, ["first-block:threshold=0.05"])
    np.testing.assert_array_equal(read_video(after["output"]), read_video(before["output"]))
    assert len(svc.history_rows()) == 2


def test_a_cancel_event_stops_a_run_at_its_next_step_or_before_it_starts(tmp_path):
    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    request = GenerationRequest(prompt="a red circle", height=16, width=16, frames=1, steps=2)
    cancel, steps = threading.Event(), []

    def page_goes_away(i, n, latents):
        steps.append(i)
        cancel.set()

    with pytest.raises(RunCancelled, match="The run was cancelled; nothing was written."):
        svc.generate("tiny-wan", request, cancel=cancel, step_callback=page_goes_away)
    assert steps == [0] and _lock_free(svc)

    # Cancelled while it waits for the model (another run holds it): it never starts.
    cancel, outcome = threading.Event(), {}

    def waiting():
        try:
            svc.generate("tiny-wan", request, cancel=cancel, step_callback=lambda *a: steps.append("ran"))
        except RunCancelled as e:
            outcome["error"] = e

    with svc._locks["tiny-wan"]:
        worker = threading.Thread(target=waiting)
        worker.start()
        cancel.set()
    worker.join(60)
    assert isinstance(outcome.get("error"), RunCancelled) and steps == [0] and _lock_free(svc)
    assert os.listdir(tmp_path / "out") == [] and svc.history_rows() == []


# ---------------------------------------------------------------------------- out of memory


def _oom_in_pipeline_call(monkeypatch, wan, kept: list, emptied: list | None = None):
    """The pipeline call allocates, then runs out of CUDA memory (on this CPU build, torch.OutOfMemoryError). With
    ``emptied``, CUDA looks initialised from then on, and ``torch.cuda.empty_cache`` calls are counted in it."""

    def call(self, *a, **kw):
        activations = torch.ones(256, 256)
        kept.append(weakref.ref(activations))
        if emptied is not None:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
            monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
            monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                     "of 23.55 GiB of which 1.21 GiB is free.")

    monkeypatch.setattr(type(wan), "__call__", call)


OOM_MESSAGE = ("Out of memory at 32x32x5 (tried to allocate 2.00 GiB): try fewer frames, a smaller size, "
               "--cpu-offload or --vae-tiling.")


def test_out_of_memory_is_a_clear_message_and_the_service_keeps_serving(tmp_path, monkeypatch, wan):
    svc = Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path / "out"))
    svc.pipeline("tiny-wan")
    kept, emptied = [], []
    with monkeypatch.context() as m:
        _oom_in_pipeline_call(m, wan, kept, emptied)  # as on a GPU: the CUDA cache is emptied
        with pytest.raises(OutOfMemory) as err:
            svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", height=32, width=32, frames=5, steps=1))
    assert str(err.value) == OOM_MESSAGE
    assert kept[0]() is None and emptied  # the failed call's tensors are freed, not kept alive by the error
    assert _lock_free(svc) and os.listdir(tmp_path / "out") == [] and svc.history_rows() == []
    assert os.path.isfile(svc.generate("tiny-wan", GenerationRequest(prompt="a red circle", **SMALL))["output"])


def test_cli_reports_out_of_memory_in_one_line(tmp_path, capsys, monkeypatch, wan):
    _oom_in_pipeline_call(monkeypatch, wan, [])
    out = tmp_path / "o.mp4"
    args = ["generate", "a red circle", "--model", "tiny-wan", "--height", "32", "--width", "32", "--frames", "5",
            "--steps", "1", "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert lines == [f"error: {OOM_MESSAGE}"]  # run_job's guard names the size; the CLI's own is a backstop
    assert "Traceback" not in err and not out.exists()


def test_out_of_memory_while_loading_says_to_offload(saved_wan, monkeypatch, wan):
    def to(self, *a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 MiB.")

    monkeypatch.setattr(type(wan), "to", to)
    with pytest.raises(OutOfMemory) as err:
        load_pipeline(str(saved_wan), device="cpu")
    assert str(err.value) == ("Out of memory loading my-wan on cpu (tried to allocate 40.00 MiB): try --cpu-offload "
                              "model (or sequential, least memory), or a smaller --dtype (bf16).")
    assert not any(key[0] == str(saved_wan.resolve()) for key in loading._PIPELINE_CACHE)


@pytest.mark.parametrize("error, oom", [
    (torch.OutOfMemoryError("CUDA out of memory."), True),
    (MemoryError(), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes."), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 9.00 GB)"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (OutOfMemory("Out of memory at 16x16"), False),  # already said: not wrapped twice
    (KeyboardInterrupt(), False),
])
def test_what_counts_as_out_of_memory(error, oom):
    assert is_out_of_memory(error) is oom
