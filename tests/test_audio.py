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
