"""Videos with sound: the procedural clips of issue 22 and reading uploads (decord, and PyAV without it)."""

import numpy as np
import pytest

from kinegen.data.av_shapes import (
    PITCHES,
    SAMPLE_RATE,
    bounce_times,
    caption,
    questions_for,
    render_audio,
    render_frames,
    sample_av_clip,
)
from kinegen.data.shapes import is_held_out
from kinegen.errors import InvalidRequestError
from kinegen.media_av import _read_pyav, read_av, sample_frame_indices, write_av


def test_clips_are_pure_functions_of_the_seed_and_respect_the_split():
    assert sample_av_clip(7) == sample_av_clip(7)
    for seed in range(60):
        train, held = sample_av_clip(seed, "train"), sample_av_clip(seed, "held_out")
        assert not any(is_held_out(o.shape, o.colour, o.motion) for o in train.objects)
        assert any(is_held_out(o.shape, o.colour, o.motion) for o in held.objects)
        if len(train.objects) == 2:
            a, b = train.objects
            assert a.shape != b.shape and a.colour != b.colour and a.pitch != b.pitch
            assert a.t_off == b.t_on  # one after the other


def test_sound_follows_the_picture():
    clip = next(c for c in (sample_av_clip(s, num_objects=2) for s in range(50))
                if any(bounce_times(o) for o in c.objects))
    audio = render_audio(clip)
    assert audio.shape == (int(clip.seconds * SAMPLE_RATE),) and np.abs(audio).max() <= 1
    for obj in clip.objects:  # the loudest frequency while a shape is on screen is its tone
        a, b = int(obj.t_on * SAMPLE_RATE) + 800, int(obj.t_off * SAMPLE_RATE) - 800
        spectrum = np.abs(np.fft.rfft(audio[a:b]))
        peak = np.fft.rfftfreq(b - a, 1 / SAMPLE_RATE)[spectrum.argmax()]
        assert abs(peak - PITCHES[obj.pitch]) < 5, (obj.pitch, peak)
        for t in bounce_times(obj):  # a click is far louder than the tone around it
            c = int(t * SAMPLE_RATE)
            assert np.abs(audio[c:c + 40]).max() > 0.4
    frames = render_frames(clip, [0.1, clip.seconds - 0.1])
    assert frames.shape == (2, 64, 64, 3) and frames[0].std() > 5


def test_questions_have_the_answers_of_the_clip():
    clip = sample_av_clip(11, num_objects=2)
    qs = {q.template: q for q in questions_for(clip)}
    first, second = clip.objects
    assert qs["first_tone"].answer == first.pitch
    by_text = {q.text: q.answer for q in questions_for(clip)}
    assert by_text[f"which shape makes the {second.pitch} tone?"] == second.shape
    assert by_text[f"what colour is the {first.shape}?"] == first.colour
    assert qs["describe"].answer == caption(clip) and first.colour in caption(clip)
    assert {q.needs for q in questions_for(clip)} >= {"video", "audio", "both", "describe"}


def test_frame_sampling_follows_the_qwen_omni_rule():
    assert len(sample_frame_indices(32, video_fps=8)) == 8  # 4 s at 2 fps
    assert len(sample_frame_indices(5, video_fps=8)) == 4  # at least 4
    assert len(sample_frame_indices(8 * 1000, video_fps=8, max_frames=64)) == 64
    idx = sample_frame_indices(33, video_fps=8)
    assert idx[0] == 0 and idx[-1] == 32 and len(idx) % 2 == 0


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory):
    clip = sample_av_clip(5, num_objects=2)
    path = tmp_path_factory.mktemp("av") / "clip.mp4"
    write_av(path, render_frames(clip, np.arange(32) / 8), 8, render_audio(clip))
    return path, clip


@pytest.mark.parametrize("reader", ["auto", "pyav"])
def test_read_back_frames_and_sound(clip_file, reader):
    path, clip = clip_file
    x = read_av(path) if reader == "auto" else _read_pyav(path, 2.0, 300, 768, SAMPLE_RATE)
    assert x.frames.shape == (8, 64, 64, 3) and x.has_audio
    assert x.duration == pytest.approx(4.0)
    assert len(x.audio) == 4 * SAMPLE_RATE  # AAC's padding cut
    ref = render_audio(clip)
    assert np.corrcoef(x.audio, ref)[0, 1] > 0.95  # aligned, not shifted
    assert np.abs(x.frames.astype(float) - render_frames(clip, x.frame_times)).mean() < 4


def test_silent_files_corrupt_files_and_limits(tmp_path, clip_file):
    silent = write_av(tmp_path / "silent.mp4", np.zeros((8, 32, 32, 3), np.uint8), 8)
    assert read_av(silent).audio is None
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video" * 50)
    with pytest.raises(InvalidRequestError, match="whole, playable video"):
        read_av(bad)
    with pytest.raises(InvalidRequestError, match="the limit is 2 s"):
        read_av(clip_file[0], max_seconds=2)
    with pytest.raises(InvalidRequestError, match="the limit is 0.0 MB"):
        read_av(clip_file[0], max_bytes=1000)
    with pytest.raises(InvalidRequestError, match="No such file"):
        read_av(tmp_path / "missing.mp4")
    wav_only = tmp_path / "sound.mp4"
    import av

    with av.open(str(wav_only), "w", format="mp4") as out:  # audio without video
        s = out.add_stream("aac", rate=SAMPLE_RATE)
        s.layout = "mono"
        fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        fr.sample_rate, fr.pts = SAMPLE_RATE, 0
        for p in s.encode(fr):
            out.mux(p)
        for p in s.encode():
            out.mux(p)
    with pytest.raises(InvalidRequestError, match="no video stream"):
        read_av(wav_only)
