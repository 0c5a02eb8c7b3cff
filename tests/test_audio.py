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


@pytest.mark.parametrize("rate,channels", [(16000, 1), (44100, 2)])
def test_pyav_decodes_as_the_ffmpeg_binary_does(tmp_path, monkeypatch, rate, channels):
    """Without an ffmpeg binary wtx decodes through PyAV: the same samples, in the same blocks."""
    pytest.importorskip("av")
    import subprocess

    import wtx.audio as audio

    rng = np.random.default_rng(3)
    pcm = (0.2 * rng.standard_normal((int(41.5 * rate), channels))).astype(np.float32)
    mp3 = tmp_path / f"noise_{rate}.mp3"
    subprocess.run(
        [audio.ffmpeg_binary(), "-loglevel", "error", "-y", "-f", "f32le", "-ar", str(rate), "-ac", str(channels),
         "-i", "pipe:0", str(mp3)], input=pcm.tobytes(), check=True,
    )  # fmt: skip
    by_binary = list(stream_samples(str(mp3)))
    monkeypatch.setattr(audio, "ffmpeg_binary", lambda: None)
    by_pyav = list(stream_samples(str(mp3)))
    assert [len(b) for b in by_pyav] == [len(b) for b in by_binary] == [N_SAMPLES, len(by_binary[-1])]
    assert all(np.array_equal(a, b) for a, b in zip(by_pyav, by_binary))
    assert all(b.dtype == np.float32 and b.flags.writeable for b in by_pyav)
