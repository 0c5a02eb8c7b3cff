import threading
import time

import numpy as np
import pytest

from tests.conftest import SAMPLE, make_wav
from wtx import audio, readahead
from wtx.errors import AudioError
from wtx.readahead import ReadAhead

pytestmark = pytest.mark.skipif(audio.ffmpeg_binary() is None, reason="reads ahead only through an ffmpeg binary")


def _joined(blocks) -> np.ndarray:
    return np.concatenate(list(blocks))


def _threads_end(timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(t.name == "wtx-readahead" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_blocks_equal_a_direct_read_under_any_budget(tmp_path):
    wav = make_wav(tmp_path / "tone.wav", seconds=95.5)
    direct = {p: list(audio.stream_samples(str(p))) for p in (SAMPLE, wav)}
    for budget in (0, audio.N_SAMPLES * 4, readahead.BUDGET_BYTES):
        ahead = ReadAhead([str(SAMPLE), str(wav)], budget=budget)
        assert set(ahead.feeds) == {str(SAMPLE), str(wav)}
        time.sleep(0.2)  # let the threads run into the budget
        # the second input first: a reached input never waits on the budget the other fills
        for path in (wav, SAMPLE):
            warnings: list[str] = []
            blocks = list(ahead.stream_samples(str(path), warnings=warnings))
            assert [len(b) for b in blocks] == [len(b) for b in direct[path]]
            assert np.array_equal(_joined(blocks), _joined(direct[path]))
            assert warnings == []
        assert ahead.held == 0
        ahead.close()
    assert _threads_end()


def test_inputs_not_read_ahead_are_read_directly(tmp_path):
    wav = make_wav(tmp_path / "tone.wav", seconds=3.0)
    ahead = ReadAhead([str(SAMPLE), str(wav)], max_inputs=1)
    assert list(ahead.feeds) == [str(SAMPLE)]
    assert np.array_equal(_joined(ahead.stream_samples(str(wav))), _joined(audio.stream_samples(str(wav))))
    # asked for twice (the same path given twice): the second read is a direct one
    assert np.array_equal(_joined(ahead.stream_samples(str(SAMPLE))), _joined(ahead.stream_samples(str(SAMPLE))))
    ahead.close()
    assert _threads_end()


def test_errors_reach_the_reader_naming_the_file(tmp_path):
    bogus = tmp_path / "notes.mp3"
    bogus.write_text("this is not audio")
    ahead = ReadAhead([str(bogus), str(tmp_path / "absent.wav")])
    assert list(ahead.feeds) == [str(bogus)]  # a missing file fails where it is read, as before
    with pytest.raises(AudioError, match="notes.mp3: ffmpeg cannot decode it"):
        list(ahead.stream_samples(str(bogus)))
    with pytest.raises(AudioError, match="absent.wav: no such file"):
        list(ahead.stream_samples(str(tmp_path / "absent.wav")))
    ahead.close()
    assert _threads_end()


def test_ffmpeg_reports_come_with_the_blocks(tmp_path):
    damaged = tmp_path / "damaged.mp3"
    data = bytearray(SAMPLE.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 4000] = bytes(4000)  # frames overwritten midway
    damaged.write_bytes(bytes(data))
    expected: list[str] = []
    direct = _joined(audio.stream_samples(str(damaged), warnings=expected))
    assert expected, "ffmpeg reported nothing about the damaged frames"
    ahead = ReadAhead([str(damaged)])
    warnings: list[str] = []
    assert np.array_equal(_joined(ahead.stream_samples(str(damaged), warnings=warnings)), direct)
    assert warnings == expected
    ahead.close()


def test_close_and_an_abandoned_reader_stop_the_threads(tmp_path):
    long = make_wav(tmp_path / "long.wav", seconds=600.0)
    other = make_wav(tmp_path / "other.wav", seconds=600.0)
    ahead = ReadAhead([str(long), str(other)], budget=audio.N_SAMPLES * 4)
    blocks = ahead.stream_samples(str(long))
    assert len(next(blocks)) == audio.N_SAMPLES
    blocks.close()  # the scheduler gave up on this input: its thread and ffmpeg stop
    ahead.close()  # the run ended before the other input was reached
    assert _threads_end()


def test_close_stops_a_reached_input_whose_reader_stopped_midway(tmp_path):
    long = make_wav(tmp_path / "long.wav", seconds=600.0)
    ahead = ReadAhead([str(long)])
    blocks = ahead.stream_samples(str(long))
    assert len(next(blocks)) == audio.N_SAMPLES  # its thread now waits, a few blocks ahead
    ahead.close()  # an interrupted run: the reader was neither finished nor closed
    assert _threads_end()
    with pytest.raises(AudioError, match="long.wav: reading stopped before its end"):
        list(blocks)  # what was read ahead, then an error: never a short read taken for the whole


def test_nothing_is_read_ahead_without_an_ffmpeg_binary(monkeypatch):
    monkeypatch.setattr(audio, "ffmpeg_binary", lambda: None)
    ahead = ReadAhead([str(SAMPLE)])
    assert ahead.feeds == {}
    ahead.close()
