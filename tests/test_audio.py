import numpy as np
import pytest
import torch

from tests.conftest import SAMPLE, make_wav
from wtx.audio import N_SAMPLES, SAMPLE_RATE, fixed_windows, load_audio, stream_samples
from wtx.errors import AudioError
from wtx.features import log_mel_spectrogram


def test_windows_carry_offsets_and_the_last_is_padded(tmp_path):
    wav = make_wav(tmp_path / "tone.wav", seconds=65.5)
    windows = list(fixed_windows(stream_samples(str(wav))))
    assert [w.offset for w in windows] == [0, 30, 60]
    assert [w.duration for w in windows] == pytest.approx([30.0, 30.0, 5.5])
    assert all(w.samples.shape == (N_SAMPLES,) and w.samples.dtype == np.float32 for w in windows)
    last = windows[-1].samples
    assert np.abs(last[: 5 * SAMPLE_RATE]).max() > 0.2
    assert np.all(last[int(5.5 * SAMPLE_RATE) + 1 :] == 0)


def test_resampled_and_downmixed(tmp_path):
    wav = make_wav(tmp_path / "stereo.wav", seconds=2.0, rate=44100, channels=2)
    audio = load_audio(str(wav))
    assert abs(len(audio) - 2 * SAMPLE_RATE) <= 1


def test_undecodable_file_names_the_file(tmp_path):
    bogus = tmp_path / "notes.mp3"
    bogus.write_text("this is not audio")
    with pytest.raises(AudioError, match="notes.mp3"):
        load_audio(str(bogus))


def test_missing_file(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        load_audio(str(tmp_path / "absent.wav"))


def test_features_match_openai_whisper_per_window():
    import whisper.audio

    windows = list(fixed_windows(stream_samples(str(SAMPLE))))
    batch = torch.from_numpy(np.stack([w.samples for w in windows]))
    ours = log_mel_spectrogram(batch)
    for row, w in zip(ours, windows):
        theirs = whisper.audio.log_mel_spectrogram(torch.from_numpy(w.samples))
        torch.testing.assert_close(row, theirs, rtol=1e-5, atol=1e-5)


def _speechlike_mp3(path, seconds: float, rate: int, channels: int):
    """An MP3 of noise shaped like syllables (not silence: seams are checked on its samples)."""
    import subprocess

    from wtx.audio import ffmpeg_binary

    rng = np.random.default_rng(5)
    n = int(seconds * rate)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * np.arange(n) / rate)
    pcm = (0.2 * envelope[:, None] * rng.standard_normal((n, channels))).astype(np.float32)
    subprocess.run(
        [ffmpeg_binary(), "-loglevel", "error", "-y", "-f", "f32le", "-ar", str(rate), "-ac", str(channels),
         "-i", "pipe:0", "-b:a", "96k", str(path)], input=pcm.tobytes(), check=True,
    )  # fmt: skip
    return path


@pytest.mark.parametrize("rate,channels", [(16000, 1), (44100, 2)])
def test_pieces_decode_sample_for_sample_as_one_pass(tmp_path, monkeypatch, rate, channels):
    pytest.importorskip("av")
    import wtx.audio as audio
    from wtx import audio_pieces

    mp3 = _speechlike_mp3(tmp_path / "long.mp3", 95.0, rate, channels)
    monkeypatch.setattr(audio_pieces, "MIN_PIECE_SECONDS", 30)
    monkeypatch.setenv("WTX_AUDIO_WORKERS", "3")
    plan = audio_pieces.plan(str(mp3))
    assert plan is not None and len(audio_pieces.piece_bounds(plan.duration, plan.workers)) == 3
    pieces = audio_pieces.decode_in_pieces(str(mp3), plan)
    one_pass = np.concatenate(list(audio._one_pass(str(mp3), N_SAMPLES)))
    assert pieces is not None  # every seam matched
    assert np.array_equal(pieces, one_pass)
    blocks = list(stream_samples(str(mp3)))  # the pieces, cut into blocks like the one pass
    assert [len(b) for b in blocks] == [N_SAMPLES] * (len(one_pass) // N_SAMPLES) + [len(one_pass) % N_SAMPLES]


def test_a_seam_that_differs_is_not_joined():
    from wtx.audio_pieces import CHECK_SECONDS, join

    second = SAMPLE_RATE * CHECK_SECONDS
    bounds = [(0, 2), (2, None)]
    first = np.arange(3 * SAMPLE_RATE, dtype=np.float32)  # seconds 0-2, then the check second
    following = first[2 * SAMPLE_RATE :].copy()
    assert np.array_equal(join([first, following], bounds), first)
    following[second // 2] += 0.5  # one sample off
    assert join([first, following], bounds) is None


def test_pieces_off_for_short_files_and_one_worker(tmp_path, monkeypatch):
    pytest.importorskip("av")
    from wtx import audio_pieces

    wav = make_wav(tmp_path / "tone.wav", seconds=65.5)
    monkeypatch.setenv("WTX_AUDIO_WORKERS", "4")
    assert audio_pieces.plan(str(wav)) is None  # under two pieces' worth
    mp3 = _speechlike_mp3(tmp_path / "long.mp3", 250.0, 16000, 1)
    assert audio_pieces.plan(str(mp3)) is not None
    monkeypatch.setenv("WTX_AUDIO_WORKERS", "1")
    assert audio_pieces.plan(str(mp3)) is None
