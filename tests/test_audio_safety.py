"""Untrusted audio: inputs that would read other files, samples out of range, many short inputs,
FIFOs without a writer, many channels, several audio tracks. Both readers (the ffmpeg binary and
PyAV) get every case."""

import os
import subprocess

import numpy as np
import pytest

from tests.conftest import SAMPLE, make_wav, run_wtx, shared_file
from wtx import audio
from wtx.audio import SAMPLE_RATE, probe_duration, stream_samples
from wtx.errors import AudioError

READERS = ["ffmpeg", "pyav"]
FFMPEG = audio.ffmpeg_binary()  # for making test files, whichever reader is tested


@pytest.fixture(params=READERS)
def reader(request, monkeypatch):
    """Which decoder reads: the ffmpeg binary, or PyAV (as on a machine without the binary)."""
    if request.param == "pyav":
        pytest.importorskip("av")
        monkeypatch.setattr(audio, "ffmpeg_binary", lambda: None)
    elif FFMPEG is None:
        pytest.skip("no ffmpeg binary")
    return request.param


def _ffmpeg(*args: str) -> None:
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def _tone(path, seconds: float = 3.0, freq: int = 440):
    _ffmpeg(
        "-f", "lavfi", "-i", f"sine=frequency={freq}:duration={seconds}", "-ar", "16000", str(path)
    )
    return path


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    """A recording in another folder that no input names."""
    folder = tmp_path_factory.mktemp("secret")
    return _tone(folder / "lj.flac")


PLAYLISTS = {
    # the red team's playlist under a media name, as an absolute and a relative path, and a real .m3u8
    "abs.mp3": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{abs}\n#EXT-X-ENDLIST\n",
    "plain.mp3": "#EXTM3U\n#EXTINF:200.0,\n{abs}\n#EXT-X-ENDLIST\n",
    "rel.mp3": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{rel}\n#EXT-X-ENDLIST\n",
    "list.m3u8": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{rel}\n#EXT-X-ENDLIST\n",
    "concat.wav": "ffconcat version 1.0\nfile '{abs}'\n",
}


@pytest.mark.parametrize("name", list(PLAYLISTS))
def test_a_playlist_never_reads_other_files(tmp_path, secret, reader, name):
    """A playlist (whatever its name says) fails alone, naming itself; the file it lists is never
    decoded, nor probed for its duration."""
    folder = tmp_path / "in"
    folder.mkdir()
    playlist = folder / name
    rel = "../../" + secret.parent.name + "/" + secret.name
    playlist.write_text(PLAYLISTS[name].format(abs=secret, rel=rel))
    assert (folder / rel).resolve() == secret.resolve()
    with pytest.raises(AudioError) as error:
        list(stream_samples(str(playlist)))
    message = str(error.value)
    assert message.startswith(f"{playlist}: ") and "\n" not in message
    if name.endswith(".m3u8") or name == "concat.wav":
        assert "a playlist" in message and "would read other files" in message
    assert probe_duration(str(playlist)) is None


def test_a_playlist_on_stdin_never_reads_other_files(secret, reader):
    """Through a pipe as well: the playlist is refused, nothing of the listed file comes out."""
    text = PLAYLISTS["list.m3u8"].format(rel=secret, abs=secret).encode()
    read, write = os.pipe()
    os.write(write, text)
    os.close(write)
    fifo = f"/dev/fd/{read}"
    try:
        with pytest.raises(AudioError, match="other files|cannot decode"):
            list(stream_samples(fifo))
    finally:
        os.close(read)


def test_ordinary_formats_still_decode(tmp_path, reader):
    """The formats people transcribe pass the list of formats wtx reads."""
    source = _tone(tmp_path / "tone.wav", seconds=1.0)
    for suffix in ["mp3", "flac", "ogg", "m4a", "mkv", "mp4", "webm", "aiff", "opus"]:
        out = tmp_path / f"tone.{suffix}"
        _ffmpeg("-i", str(source), *(["-c:a", "libopus"] if suffix == "webm" else []), str(out))
        samples = np.concatenate(list(stream_samples(str(out))))
        assert abs(len(samples) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE, suffix
        assert probe_duration(str(out)) == pytest.approx(1.0, abs=0.1), suffix


def _float_wav(path, samples: np.ndarray):
    """A 16 kHz mono WAV of 32-bit float samples, written as they are (NaN and all)."""
    subprocess.run(
        [FFMPEG, "-nostdin", "-loglevel", "error", "-y", "-f", "f32le", "-ar", "16000", "-ac", "1",
         "-i", "pipe:0", "-c:a", "pcm_f32le", str(path)],
        input=samples.astype("<f4").tobytes(), check=True,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def speech():
    """The first 12 s of the bundled sample, as float32 samples."""
    if FFMPEG is None:
        pytest.skip("no ffmpeg binary to make the test files")
    return audio.load_audio(str(SAMPLE))[: 12 * SAMPLE_RATE].copy()


def _broken(speech: np.ndarray) -> np.ndarray:
    """The speech with 0.3% of its samples NaN and a few infinite."""
    bad = speech.copy()
    rng = np.random.default_rng(0)
    bad[rng.choice(len(bad), len(bad) * 3 // 1000, replace=False)] = np.nan
    bad[rng.choice(len(bad), 20, replace=False)] = np.inf
    bad[rng.choice(len(bad), 20, replace=False)] = -np.inf
    return bad


def test_samples_that_are_not_numbers_read_as_silence(tmp_path, speech, reader):
    """NaN and infinite samples (a float file can hold them) become silence, with a warning naming
    the file; the other samples keep their values."""
    bad = _broken(speech)
    path = _float_wav(tmp_path / "nan.wav", bad)
    warnings: list[str] = []
    samples = np.concatenate(list(stream_samples(str(path), warnings=warnings)))
    finite = np.isfinite(bad)
    assert np.isfinite(samples).all()
    assert np.array_equal(samples[finite], bad[finite]) and not samples[~finite].any()
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}: ")
    assert f"{(~finite).sum()} samples" in warnings[0] and "NaN" in warnings[0]


def test_samples_far_beyond_full_scale_are_scaled_down(tmp_path, speech, reader):
    """Speech scaled by 1e30 (a float file's) is read at full scale, with a warning naming the file."""
    path = _float_wav(tmp_path / "loud.wav", speech * np.float32(1e30))
    warnings: list[str] = []
    samples = np.concatenate(list(stream_samples(str(path), warnings=warnings)))
    peak = np.abs(speech).max()
    np.testing.assert_allclose(samples, speech / peak, atol=1e-6)
    assert (
        len(warnings) == 1
        and warnings[0].startswith(f"{path}: ")
        and "scaled them down" in warnings[0]
    )


def test_ordinary_samples_keep_their_values(reader):
    """A recording at ordinary levels (peaks a little past full scale after resampling, as the
    JFK clip's) comes out as ffmpeg decodes it, bit for bit, with no warning."""
    path = shared_file("audio/jfk.flac")
    raw = subprocess.run(
        [FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(path), "-f", "f32le", "-ac", "1",
         "-ar", "16000", "-"], capture_output=True, check=True,
    ).stdout  # fmt: skip
    expected = np.frombuffer(raw, dtype=np.float32)
    assert np.abs(expected).max() > 1.0
    warnings: list[str] = []
    samples = np.concatenate(list(stream_samples(str(path), warnings=warnings)))
    if reader == "ffmpeg":
        assert np.array_equal(samples, expected)
    assert np.abs(samples).max() == pytest.approx(np.abs(expected).max(), rel=1e-3)
    assert warnings == []


@pytest.mark.slow
def test_nan_and_huge_samples_are_transcribed(tmp_path, speech):
    """The red team's files: 0.3% NaN samples, or speech scaled by 1e30, are transcribed (they
    came out empty, or as "!!!!!!" without the detector)."""
    nan = _float_wav(tmp_path / "nan.wav", _broken(speech))
    loud = _float_wav(tmp_path / "loud.wav", speech * np.float32(1e30))
    out = run_wtx("transcribe", str(nan), str(loud), "-o", str(tmp_path / "out"), "-f", "txt")
    assert out.returncode == 0, out.stderr.decode()
    for name in ["nan", "loud"]:
        text = (tmp_path / "out" / f"{name}.txt").read_text()
        assert "welcome" in text.lower() and "lighthouse" not in text.lower(), (name, text)
    stderr = out.stderr.decode()
    assert f"{nan}: " in stderr and f"{loud}: " in stderr


class _Silent:
    """A speech detector that finds no speech in any window."""

    group = 8

    def speech(self, windows):
        return [False] * len(windows)


def test_a_run_raises_its_soft_limit_on_open_files(tmp_path):
    """Inputs in flight each hold a journal and a pipe: the run raises the soft limit on open
    files to the hard one before reading, as on Ray (checked where the model would load)."""
    import resource
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 64:
        pytest.skip(f"the hard limit on open files is {hard}")
    clip = make_wav(tmp_path / "tone.wav", 1.0)
    code = (
        "import resource, sys\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "import wtx.transcribe as t\n"
        "def loaded(*args, **kwargs):\n"
        "    print('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0], file=sys.stderr)\n"
        "    return 0\n"
        "t._run_loaded = loaded\n"
        "from wtx.cli import main\n"
        f"sys.argv = ['wtx', 'transcribe', {str(clip)!r}, '-o', {str(tmp_path / 'out')!r}]\n"
        "main()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    said = [line for line in run.stderr.splitlines() if line.startswith("soft ")]
    assert said, run.stderr[-2000:]
    assert int(said[0].split()[1]) > 64, said


def test_inputs_without_speech_are_done_as_they_are_read():
    """Inputs whose every window the detector drops are reported done as the reading goes on, not
    all at once after the last: each holds its journal open until then (1,099 tone clips ran out
    of open files)."""
    from wtx.audio import N_SAMPLES, Window
    from wtx.streams import Recording, RecordingDone, StreamOptions, StreamScheduler

    unreported: set[int] = set()  # inputs read (their journals open), not yet reported done
    most = 0

    def recordings():
        for key in range(300):
            unreported.add(key)
            yield Recording(key, [Window(0, 0.0, 2.0, np.zeros(N_SAMPLES, dtype=np.float32))])

    scheduler = StreamScheduler(None, None, StreamOptions(batch_size=4))
    done = []
    for event in scheduler.run(recordings(), detector=_Silent()):
        most = max(most, len(unreported))
        assert isinstance(event, RecordingDone) and event.error is None
        unreported.discard(event.key)
        done.append(event.key)
    assert done == list(range(300))
    assert most <= 64, f"{most} inputs were open at once"


def test_a_fifo_without_a_writer_holds_up_no_other_input(tmp_path, reader):
    """A FIFO whose writer has not come is read after the inputs that are ready; once its writer
    writes, it is read as well (both readers use the same wait)."""
    import threading

    from wtx.pipeline import AudioReader
    from wtx.streams import Recording, RecordingDone, StreamOptions, StreamScheduler

    fifo = tmp_path / "late.wav"
    os.mkfifo(fifo)
    tone = _tone(tmp_path / "tone.wav", seconds=1.0)
    recordings = [Recording(str(p), AudioReader(str(p))) for p in [fifo, tone]]
    scheduler = StreamScheduler(None, None, StreamOptions(batch_size=2))
    events = scheduler.run(iter(recordings), detector=_Silent())
    got: list = []
    reading = threading.Thread(target=lambda: got.extend(events), daemon=True)
    reading.start()
    deadline = 30.0
    while not got and deadline > 0:
        reading.join(0.1)
        deadline -= 0.1
    assert [e.key for e in got] == [str(tone)]  # the tone is done while the FIFO waits
    with open(fifo, "wb") as writer:
        writer.write(tone.read_bytes())
    reading.join(30)
    assert [e.key for e in got] == [str(tone), str(fifo)]
    assert all(isinstance(e, RecordingDone) and e.error is None for e in got)
    assert recordings[0].windows.seconds == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
def test_sigterm_stops_a_run_waiting_on_a_fifo(tmp_path):
    """A FIFO that never gets a writer holds up no other input, and SIGTERM ends the run at once
    (it was ignored for more than 25 s)."""
    import signal
    import sys
    import time

    fifo = tmp_path / "never.wav"
    os.mkfifo(fifo)
    tone = _tone(tmp_path / "tone.wav", seconds=2.0)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "wtx", "transcribe", str(fifo), str(tone), "-o", str(out), "-f", "txt"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(600):  # the tone's output, written while the FIFO waits
            if (out / "tone.txt").exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert (out / "tone.txt").exists(), proc.communicate(timeout=5)[1].decode()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=10)
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr.decode()
    assert "terminated" in stderr.decode()


def _wav(path, channels: np.ndarray):
    """A 16 kHz 16-bit WAV of `channels` (channels x samples), with no channel layout."""
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(len(channels))
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((channels.T * 32767).astype("<i2").tobytes())
    return path


@pytest.mark.parametrize("count", [10, 32])
def test_many_channels_are_mixed_to_mono(tmp_path, reader, count):
    """Channels past those ffmpeg knows a layout for are averaged (they failed with "Error while
    processing the decoded data")."""
    t = np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    channels = np.stack(
        [tone * (2 * k / (count - 1)) for k in range(count)]
    )  # their mean: the tone
    path = _wav(tmp_path / f"c{count}.wav", channels)
    warnings: list[str] = []
    samples = np.concatenate(list(stream_samples(str(path), warnings=warnings)))
    np.testing.assert_allclose(samples, tone, atol=2e-4)
    assert warnings == []


def test_many_channels_from_a_pipe_fail_naming_the_fix(tmp_path):
    """From a pipe, which cannot be read twice, the ffmpeg binary's reader says what to do."""
    if FFMPEG is None:
        pytest.skip("no ffmpeg binary")
    path = _wav(tmp_path / "c32.wav", np.zeros((32, SAMPLE_RATE)))
    read, write = os.pipe()
    writer = subprocess.Popen(["cat", str(path)], stdout=write, stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        with pytest.raises(
            AudioError, match=r"^/dev/fd/\d+: 32 channels .* save it to a file first$"
        ):
            list(stream_samples(f"/dev/fd/{read}"))
    finally:
        os.close(read)  # the rest of the file is not read: the writer stops
        writer.wait(timeout=10)


@pytest.fixture(scope="module")
def tracks(tmp_path_factory):
    """An mp4 of three audio tracks: the default one silent, the other two tones."""
    path = tmp_path_factory.mktemp("tracks") / "three tracks.mp4"
    if FFMPEG is None:
        pytest.skip("no ffmpeg binary")
    _ffmpeg(
        "-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-f", "lavfi", "-i", "sine=frequency=300:duration=2",
        "-f", "lavfi", "-i", "sine=frequency=600:duration=2", "-map", "0:a", "-map", "1:a", "-map", "2:a",
        "-t", "2", "-c:a", "aac", "-disposition:a:0", "default", "-disposition:a:1", "0",
        "-disposition:a:2", "0", str(path),
    )  # fmt: skip
    return path


def test_several_audio_tracks_say_which_one_is_read(tracks, reader):
    """Of several audio tracks the default one is read, by both readers, and a note names the
    file, the track and how to read another."""
    warnings: list[str] = []
    samples = np.concatenate(list(stream_samples(str(tracks), warnings=warnings)))
    assert not samples.any()  # the silent default track
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"{tracks}: has 3 audio tracks, transcribed track 1 (the default) alone"
    )
    assert f"ffmpeg -i '{tracks}' -map 0:a:N-1" in warnings[0]


def test_notes_keep_colon_words_as_written():
    """':a:' (an ffmpeg stream specifier, or part of a file name) is printed as written, not as
    an emoji."""
    from wtx.progress import stderr

    with stderr.capture() as captured:
        stderr.print("ffmpeg -i 'talk :fire:.mp4' -map 0:a:N-1", highlight=False)
    assert captured.get().strip() == "ffmpeg -i 'talk :fire:.mp4' -map 0:a:N-1"
