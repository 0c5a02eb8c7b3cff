"""The Python API: load_model() and Model.transcribe(), as the README shows them."""

import subprocess
import sys

import numpy as np
import pytest

import wtx
import wtx.errors
from tests.conftest import SAMPLE
from wtx.audio import load_audio

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    return wtx.load_model("tiny.en", device="cpu", batch_size=4)


def test_transcribe_a_file_lazily_with_info(model):
    segments, info = model.transcribe(str(SAMPLE))
    assert info.language == "en" and 61 < info.duration < 62
    assert info.options["model"] == "tiny.en" and info.options["batch_size"] == 4 and info.options["vad"]
    assert not isinstance(segments, list)  # a generator: decoded as it is iterated
    segments = list(segments)
    text = " ".join(s.text for s in segments)
    assert "installation works" in text
    assert all(a.start <= b.start for a, b in zip(segments, segments[1:]))
    assert isinstance(segments[0], wtx.Segment)


def test_an_array_gives_the_same_text_as_its_file(model):
    from_file = [s.text for s in model.transcribe(str(SAMPLE))[0]]
    from_array = [s.text for s in model.transcribe(load_audio(str(SAMPLE)))[0]]
    assert from_array == from_file


def test_noise_gives_no_segments(model):
    noise = (0.3 * np.random.default_rng(0).standard_normal(16000 * 40)).astype(np.float32)
    assert list(model.transcribe(noise)[0]) == []


def test_fixed_windows_refuse_an_automatic_text_only_mode(model):
    """Windows cut every 30 s end early in text only (engine.pick_text_only): asked for with the
    default mode, a clear error; with timestamps, or text only asked for, they decode."""
    with pytest.raises(ValueError, match="without_timestamps=False"):
        model.transcribe(str(SAMPLE), split="fixed")
    for without_timestamps in (False, True):
        asked = wtx.load_model("tiny.en", device="cpu", batch_size=4, vad=False, without_timestamps=without_timestamps)
        segments, info = asked.transcribe(str(SAMPLE), split="fixed")
        assert "Thank you for listening" in " ".join(s.text for s in segments)
        assert info.options["decoding"]["without_timestamps"] is without_timestamps


def test_a_bad_file_raises_when_its_segments_are_read(model, tmp_path):
    bad = tmp_path / "bad.mp3"
    bad.write_text("not audio")
    segments, _ = model.transcribe(str(bad))
    with pytest.raises(wtx.errors.AudioError, match="bad.mp3"):
        list(segments)


def test_import_wtx_does_not_import_torch():
    code = "import sys, wtx; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"
