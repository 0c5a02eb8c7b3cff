"""One scheduler for every input: batches across files, and the same bytes however files are run.

The unit tests drive wtx.streams with a scripted decoder; the end-to-end test runs `wtx
transcribe` on three files alone, together, in reverse order, and killed and resumed.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLE, run_wtx
from wtx.audio import N_SAMPLES, Window
from wtx.decode import get_tokenizer
from wtx.errors import AudioError
from wtx.model import ModelDimensions
from wtx.segments import WindowResult, split_segments
from wtx.streams import Recording, RecordingDone, StreamOptions, StreamScheduler, WindowDone

TINY = ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(TINY, "en", "transcribe")


def windows(n: int, start: float = 0.0) -> list[Window]:
    silence = np.zeros(N_SAMPLES, dtype=np.float32)
    return [Window(i, start + 30.0 * i, 30.0, silence) for i in range(n)]


class Decoder:
    """A scripted batch decoder: window (offset) -> " w<offset>"; records every batch."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.batches = []

    def __call__(self, batch, languages, prompts, temperatures):
        self.batches.append([(w.offset, list(p)) for w, p in zip(batch, prompts)])
        ts = self.tokenizer.timestamp_begin
        results = []
        for w, t in zip(batch, temperatures):
            tokens = [ts, *self.tokenizer.encode(f" w{int(w.offset)}"), ts + 1400]
            result = WindowResult(w, tokens, "en", 0.1, -0.1, [], t)
            result.segments = split_segments(tokens, self.tokenizer, w.offset, w.duration)
            results.append(result)
        return results


def run(tokenizer, recordings, batch_size=4):
    decoder = Decoder(tokenizer)
    scheduler = StreamScheduler(decoder, tokenizer, StreamOptions(batch_size=batch_size))
    events = list(scheduler.run(recordings, ordered=True))
    texts = {}
    for event in events:
        if isinstance(event, WindowDone):
            texts.setdefault(event.key, []).append((event.result.window.index, event.result.prompt))
    done = [e for e in events if isinstance(e, RecordingDone)]
    return texts, done, decoder


def test_one_batch_holds_chunks_of_several_files(tokenizer):
    recordings = [Recording(name, windows(n, 1000.0 * k)) for k, (name, n) in enumerate([("a", 1), ("b", 2), ("c", 1)])]
    texts, done, decoder = run(tokenizer, recordings)
    first = {offset // 1000 for offset, _ in decoder.batches[0]}
    assert len(first) == 3  # rows of three files in the first batch
    assert sorted(d.key for d in done) == ["a", "b", "c"] and all(d.error is None for d in done)
    assert {k: [i for i, _ in v] for k, v in texts.items()} == {"a": [0], "b": [0, 1], "c": [0]}


def test_a_file_is_scheduled_the_same_alone_and_among_others(tokenizer):
    def recs():
        return [Recording(name, windows(n, 1000.0 * k)) for k, (name, n) in enumerate([("a", 5), ("b", 9), ("c", 3)])]

    together, _, _ = run(tokenizer, recs())
    reverse, _, _ = run(tokenizer, recs()[::-1])
    for rec in recs():
        alone, _, _ = run(tokenizer, [rec])
        assert alone[rec.key] == together[rec.key] == reverse[rec.key]  # windows and prompts alike


def test_prompts_never_cross_files(tokenizer):
    recordings = [Recording("a", windows(3, 0.0)), Recording("b", windows(3, 5000.0))]
    _, _, decoder = run(tokenizer, recordings, batch_size=1)
    for batch in decoder.batches:
        for offset, prompt in batch:
            text = tokenizer.decode([t for t in prompt if t < tokenizer.eot])
            assert all((int(w[1:]) >= 5000) == (offset >= 5000) for w in text.split()), (offset, text)


def test_a_file_whose_audio_fails_midway_fails_alone(tokenizer):
    def broken():
        yield from windows(2, 2000.0)
        raise AudioError("b.mp3: ffmpeg cannot decode it: truncated")

    recordings = [Recording("a", windows(3)), Recording("b", broken()), Recording("c", windows(2, 9000.0))]
    texts, done, _ = run(tokenizer, recordings)
    errors = {d.key: d.error for d in done}
    assert isinstance(errors["b"], AudioError) and errors["a"] is None and errors["c"] is None
    assert [i for i, _ in texts["a"]] == [0, 1, 2] and [i for i, _ in texts["c"]] == [0, 1]


class Detector:
    """A scripted voice-activity detector: a window holds speech where its first sample is 1."""

    group = 4

    def __init__(self):
        self.calls = []

    def speech(self, windows):
        assert 0 < len(windows) <= self.group
        self.calls.append([w.offset for w in windows])
        return [bool(w.samples[0]) for w in windows]


def marked(n: int, start: float, speech: set[int]) -> list[Window]:
    return [Window(w.index, w.offset, w.duration, np.full(N_SAMPLES, float(w.index in speech), dtype=np.float32))
            for w in windows(n, start)]  # fmt: skip


def test_speech_is_scored_in_groups_that_run_across_recordings(tokenizer):
    """Short files fill the detector's groups together (one padded group per file would score
    each clip as a whole group); windows without speech are never decoded but handed to their
    recording's `silent` (the CLI's progress counts their audio), a recording whose windows are
    all dropped is still done, and a failing one fails alone."""

    def broken():
        yield from marked(2, 4000.0, {0, 1})
        raise AudioError("e.mp3: ffmpeg cannot decode it: truncated")

    silent = []
    keep = lambda key: (lambda index, duration: silent.append((key, index)))  # noqa: E731
    recordings = [Recording("a", marked(1, 0.0, {0})), Recording("b", marked(2, 1000.0, {1}), silent=keep("b")),
                  Recording("c", marked(3, 2000.0, {0, 2}), silent=keep("c")), Recording("d", marked(1, 3000.0, set()), silent=keep("d")),
                  Recording("e", broken()), Recording("f", marked(1, 5000.0, {0}))]  # fmt: skip
    detector = Detector()
    decoder = Decoder(tokenizer)
    scheduler = StreamScheduler(decoder, tokenizer, StreamOptions(batch_size=2))
    events = list(scheduler.run(recordings, ordered=True, detector=detector))
    assert detector.calls == [[0.0, 1000.0, 1030.0, 2000.0], [2030.0, 2060.0, 3000.0, 4000.0], [4030.0, 5000.0]]
    assert silent == [("b", 0), ("c", 1), ("d", 0)]
    decoded = {}
    for event in events:
        if isinstance(event, WindowDone):
            decoded.setdefault(event.key, []).append(event.result.window.index)
    assert decoded == {"a": [0], "b": [1], "c": [0, 2], "e": [0, 1], "f": [0]}
    errors = {e.key: e.error for e in events if isinstance(e, RecordingDone)}
    assert sorted(errors) == ["a", "b", "c", "d", "e", "f"]
    assert isinstance(errors.pop("e"), AudioError) and set(errors.values()) == {None}


def test_a_served_recording_without_windows_is_done_without_waiting_for_more(tokenizer):
    """A worker's chunk whose windows were all dropped as silence: its RecordingDone comes while
    the feed stays open (the call waiting on it is the last one), and a later chunk still runs."""
    import queue
    import threading

    feed: queue.Queue = queue.Queue()
    scheduler = StreamScheduler(Decoder(tokenizer), tokenizer, StreamOptions(batch_size=2))
    events: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [events.put(e) for e in scheduler.serve(feed)], daemon=True).start()
    feed.put(Recording("silent", [], span=1))
    assert events.get(timeout=10) == RecordingDone("silent")
    feed.put(Recording("speech", windows(1), span=1))
    got = [events.get(timeout=10), events.get(timeout=10)]
    assert isinstance(got[0], WindowDone) and got[1] == RecordingDone("speech")
    feed.put(None)


# end to end ------------------------------------------------------------------------------------


def ffmpeg(*args: str) -> None:
    from wtx.audio import ffmpeg_binary

    subprocess.run([ffmpeg_binary(), "-nostdin", "-loglevel", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def three_files(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("three")
    long = d / "long.mp3"
    ffmpeg("-stream_loop", "1", "-i", str(SAMPLE), "-t", "95", "-c:a", "libmp3lame", "-b:a", "32k", str(long))  # 95 s: 2 rows
    mid = d / "mid.mp3"
    ffmpeg("-i", str(SAMPLE), "-c:a", "libmp3lame", "-b:a", "32k", str(mid))
    short = d / "short.mp3"
    ffmpeg("-ss", "20", "-t", "25", "-i", str(SAMPLE), "-c:a", "libmp3lame", "-b:a", "32k", str(short))
    return [long, mid, short]


FORMATS = ("txt", "srt", "json")
COMPILE_ON_CPU = {"WTX_CPU_COMPILE": "1"}  # --compile is not used on a CPU otherwise


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def _mode_flags(mode: str) -> list[str]:
    """compile: greedy, to keep the CPU's compiles short (compiled beam search is tested in test_compile)."""
    return ["--compile", "--beam-size", "1"] if mode == "compile" else []


def transcribe(files, out: Path, mode: str) -> None:
    extra = _mode_flags(mode)
    result = run_wtx("transcribe", *map(str, files), "-o", str(out), "-f", ",".join(FORMATS), "-b", "2", *extra,
                     env=COMPILE_ON_CPU)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_the_same_bytes_alone_together_reversed_and_resumed(three_files, tmp_path, mode):
    alone = {}
    for f in three_files:
        transcribe([f], tmp_path / f"alone-{f.stem}", mode)
        alone.update(outputs(tmp_path / f"alone-{f.stem}"))
    assert len(alone) == 3 * len(FORMATS)
    transcribe(three_files, tmp_path / "together", mode)
    assert outputs(tmp_path / "together") == alone
    transcribe(three_files[::-1], tmp_path / "reversed", mode)
    assert outputs(tmp_path / "reversed") == alone

    killed = tmp_path / "killed"
    extra = _mode_flags(mode)
    command = [sys.executable, "-m", "wtx", "transcribe", *map(str, three_files), "-o", str(killed),
               "-f", ",".join(FORMATS), "-b", "2", *extra]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **COMPILE_ON_CPU})
    journals = [killed / f".{f.stem}.wtx-journal" for f in three_files]
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if any(j.exists() and len(j.read_bytes().splitlines()) > 1 for j in journals):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert any(j.exists() for j in journals)
    transcribe(three_files, killed, mode)
    assert outputs(killed) == alone
