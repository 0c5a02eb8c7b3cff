"""The hardening issue's reproduced bugs, one test (or more) each; docs/robustness.md lists them.

Unit tests run in milliseconds; the end-to-end ones run wtx as a process on short clips.
"""

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import SAMPLE, make_wav, run_wtx
from wtx.audio import ffmpeg_binary
from wtx.errors import UntrustedCache, WtxError
from wtx.inputs import Input, expand
from wtx.journal import Entry, Journal, journal_path
from wtx.names import fits
from wtx.outputs import plan_outputs


def ffmpeg(*args: str) -> None:
    subprocess.run([ffmpeg_binary(), "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def clip(path: Path, start: float, seconds: float = 6.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ffmpeg("-ss", str(start), "-t", str(seconds), "-i", str(SAMPLE), "-c:a", "libmp3lame", "-b:a", "48k", str(path))
    return path


IDENTITY = {"version": 3, "source": "/x.mp3", "size": 1, "mtime_ns": 1, "config": "c"}


# 1. the journal follows symlinks -------------------------------------------------------------


def test_journal_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "bashrc"
    target.write_text("precious\n")
    link = tmp_path / ".talk.wtx-journal"
    link.symlink_to(target)
    with pytest.raises(WtxError, match="symbolic link"):
        Journal(link, IDENTITY)
    assert target.read_text() == "precious\n"
    assert link.is_symlink()


def test_journal_is_created_private(tmp_path):
    old = os.umask(0)
    try:
        journal = Journal(tmp_path / ".j.wtx-journal", IDENTITY)
    finally:
        os.umask(old)
    journal.close()
    assert stat.S_IMODE((tmp_path / ".j.wtx-journal").stat().st_mode) == 0o600


# 2. inputs with the same name share outputs ---------------------------------------------------


def test_same_named_inputs_get_distinct_outputs_in_the_order_given(tmp_path):
    items = [Input(str(tmp_path / d / "talk.mp3"), Path("talk")) for d in ("a", "b", "c")]
    plan = plan_outputs(items, ["txt"], tmp_path / "out")
    names = [plan.paths[i.path]["txt"].name for i in items]
    assert names == ["talk.txt", "talk-2.txt", "talk-3.txt"]
    assert len(plan.notes) == 2 and "b/talk.mp3" in plan.notes[0]


def test_folder_inputs_mirror_their_layout_under_the_output_folder(tmp_path):
    for rel in ("author1/book.mp3", "author2/book.mp3", "book.mp3"):
        (tmp_path / "lib" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / rel).write_bytes(b"")
    expanded = expand([str(tmp_path / "lib")])
    plan = plan_outputs(expanded.inputs, ["txt"], tmp_path / "out")
    got = sorted(str(p["txt"].relative_to(tmp_path / "out")) for p in plan.paths.values())
    assert got == ["author1/book.txt", "author2/book.txt", "book.txt"]
    assert plan.notes == []


def test_same_stem_beside_each_other_without_output_folder(tmp_path):
    items = [Input(str(tmp_path / f"talk.{ext}"), Path("talk")) for ext in ("mp3", "wav")]
    plan = plan_outputs(items, ["txt"], None)
    assert [plan.paths[i.path]["txt"].name for i in items] == ["talk.txt", "talk-2.txt"]


@pytest.mark.slow
def test_two_talks_from_two_folders_both_survive(tmp_path):
    a = clip(tmp_path / "a" / "talk.mp3", 0)
    b = clip(tmp_path / "b" / "talk.mp3", 13)
    out = run_wtx("transcribe", str(a), str(b), "-o", str(tmp_path / "out"), "-f", "txt")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    first = (tmp_path / "out" / "talk.txt").read_text()
    second = (tmp_path / "out" / "talk-2.txt").read_text()
    assert first.strip() and second.strip() and first != second
    assert b"talk-2" in out.stderr  # said on stderr, never silently


# 3. two processes converting the bundled model ------------------------------------------------


def test_conversion_is_deterministic_and_published_as_one_folder(tmp_path, monkeypatch):
    from wtx import weights

    paths = []
    for name in ("one", "two"):
        monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path / name))
        paths.append(weights.resolve("tiny.en"))
    assert weights.sha256_of([paths[0]]) == weights.sha256_of([paths[1]])  # temp names never leak in
    assert sorted(p.name for p in paths[0].parent.iterdir()) == ["checkpoint.pt", "checkpoint.pt.sha256"]


def test_a_conversion_that_loses_the_race_keeps_the_winners_pair(tmp_path, monkeypatch):
    from wtx import weights

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    winner = weights.resolve("tiny.en")
    before = winner.stat().st_ino
    model = weights.BUNDLED["tiny.en"]
    weights._write_converted(model, *weights._bundled_sources(model), winner)  # a late second process
    assert winner.stat().st_ino == before
    assert weights.resolve("tiny.en") == winner  # verified: checkpoint and stamp from one process
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny.en"]  # no staging left


@pytest.mark.slow
def test_racing_processes_never_leave_a_tampered_cache(tmp_path):
    env = {**os.environ, "WTX_CACHE_DIR": str(tmp_path)}
    code = "from wtx import weights; weights.resolve('tiny.en')"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE) for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    check = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()[-2000:]


# 4. names that are not UTF-8 ------------------------------------------------------------------


@pytest.mark.slow
def test_a_name_that_is_not_utf8_works_and_the_rest_run(tmp_path):
    folder = tmp_path / "in"
    good = clip(folder / "good.mp3", 0)
    odd = os.fsdecode(bytes(folder) + b"/caf\xe9.mp3")
    os.link(good, odd)
    clip(folder / "later.mp3", 13)
    out = run_wtx("transcribe", str(folder), "-o", str(tmp_path / "out"), "-f", "all", "--no-resume")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    names = os.listdir(os.fsencode(tmp_path / "out"))
    for fmt in ("txt", "srt", "vtt", "json", "tsv"):
        assert b"caf\xe9." + fmt.encode() in names
    assert b"later.txt" in names
    payload = json.loads((tmp_path / "out" / "later.json").read_text())
    assert payload["text"]
    odd_json = json.loads(Path(os.fsdecode(bytes(tmp_path / "out") + b"/caf\xe9.json")).read_text())
    assert odd_json["source"].endswith("caf\ufffd.mp3")  # valid UTF-8 JSON, the odd byte shown as U+FFFD
    assert not [n for n in names if n.endswith(b"-journal")]


# 5. loading planted compiled artifacts ---------------------------------------------------------


def test_a_cache_others_can_write_is_refused(tmp_path, monkeypatch):
    from wtx import compile_cache

    root = tmp_path / "cache"
    (root / "compiled").mkdir(parents=True)
    planted = root / "compiled" / "key.encoder.fn"
    planted.write_bytes(b"not to be unpickled")
    monkeypatch.setenv("WTX_CACHE_DIR", str(root))
    root.chmod(0o777)
    with pytest.raises(UntrustedCache, match="writable by others"):
        compile_cache.load_function("key", "encoder")
    root.chmod(0o700)
    planted.chmod(0o666)
    with pytest.raises(UntrustedCache, match="chmod go-w"):
        compile_cache.load_function("key", "encoder")
    planted.chmod(0o600)
    os.chown(planted, 65534, 65534) if os.getuid() == 0 else None
    if os.getuid() == 0:
        with pytest.raises(UntrustedCache, match="owned by user id 65534"):
            compile_cache.load_function("key", "encoder")


def test_converted_weights_get_the_same_check(tmp_path, monkeypatch):
    from wtx import weights

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    path = weights.resolve("tiny.en")
    path.parent.chmod(0o777)
    with pytest.raises(UntrustedCache):
        weights.resolve("tiny.en")


def test_new_cache_folders_are_private(tmp_path, monkeypatch):
    from wtx.paths import private_dir

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path / "c"))
    old = os.umask(0)
    try:
        private_dir(tmp_path / "c" / "compiled")
    finally:
        os.umask(old)
    for folder in (tmp_path / "c", tmp_path / "c" / "compiled"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_tritons_kernels_go_to_a_private_folder_unless_the_user_chose_one(tmp_path, monkeypatch):
    from wtx.compile_cache import use_triton_cache

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    use_triton_cache()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine") and not (tmp_path / "c").exists()
    monkeypatch.delenv("TRITON_CACHE_DIR")
    use_triton_cache()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "c" / "triton")
    assert stat.S_IMODE((tmp_path / "c" / "triton").stat().st_mode) == 0o700


# 6. a corrupt journal -------------------------------------------------------------------------


@pytest.mark.parametrize("junk", [b"\xff\xfe\x00binary junk\n", b'{"version": 3}\n{"index": 1}\n{"x": 2}\n', b"[]\n"])
def test_a_corrupt_journal_is_set_aside_and_the_input_starts_afresh(tmp_path, junk):
    path = tmp_path / ".talk.wtx-journal"
    path.write_bytes(junk)
    journal = Journal(path, IDENTITY)
    assert journal.entries == {} and journal.set_aside is not None
    assert journal.set_aside.read_bytes() == junk  # kept for inspection
    journal.append(Entry(0, 0.0, 1.0, "en", [(0.0, 1.0, "hi")]))
    journal.close()
    again = Journal(path, IDENTITY)
    assert list(again.entries) == [0] and again.set_aside is None
    again.close()


def test_a_last_line_cut_short_by_a_crash_is_dropped_quietly(tmp_path):
    path = tmp_path / ".talk.wtx-journal"
    journal = Journal(path, IDENTITY)
    journal.append(Entry(0, 0.0, 1.0, "en", [(0.0, 1.0, "hi")]))
    journal.close()
    with open(path, "ab") as f:
        f.write(b'{"index": 1, "offs')
    again = Journal(path, IDENTITY)
    assert list(again.entries) == [0] and again.set_aside is None
    again.close()


# 7. long names --------------------------------------------------------------------------------


def test_hidden_names_fit_name_max_for_the_longest_legal_stems(tmp_path):
    from wtx.atomic import atomic_paths

    stem = "x" * 250  # stem.txt is 254 bytes: legal
    output = tmp_path / f"{stem}.txt"
    assert fits(output.name, tmp_path)
    journal = Journal(journal_path(output), IDENTITY)
    journal.close()
    assert len(journal.path.name) <= 255
    assert journal_path(output) == journal.path  # the same name each run, so resume finds it
    with atomic_paths([output]) as (tmp,):
        tmp.write_text("ok")
    assert output.read_text() == "ok"


def test_an_output_name_too_long_fails_before_decoding(tmp_path):
    item = Input(str(tmp_path / ("y" * 252 + ".mp3")), Path("y" * 252))
    plan = plan_outputs([item], ["txt", "json"], tmp_path)
    assert "longer than the file system allows" in plan.problems[item.path]


# 9. an unwritable cache -----------------------------------------------------------------------


@pytest.mark.slow
def test_an_unwritable_cache_is_one_error_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = run_wtx("transcribe", str(SAMPLE), "-o", str(tmp_path / "o"), env={"WTX_CACHE_DIR": str(blocker / "c")})
    assert out.returncode == 1
    lines = [line for line in out.stderr.decode().splitlines() if line.startswith("error")]
    assert lines and "WTX_CACHE_DIR" in lines[0] and "Traceback" not in out.stderr.decode()


# 10. devices that are not there ---------------------------------------------------------------


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:7"])
def test_an_unavailable_device_is_a_usage_error(tmp_path, device):
    import torch

    if device != "gpu" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the device")
    out = run_wtx("transcribe", str(SAMPLE), "--device", device, "-o", str(tmp_path))
    assert out.returncode == 2
    err = out.stderr.decode()
    assert "cpu" in err and "Traceback" not in err


# 11. names that look like URLs ----------------------------------------------------------------


@pytest.mark.slow
def test_names_with_a_protocol_prefix_are_read_as_local_files(tmp_path, monkeypatch):
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        monkeypatch.chdir(tmp_path)
        clip(tmp_path / "http:" / f"127.0.0.1:{port}" / "x.mp3", 0)
        clip(tmp_path / "file:a.mp3", 13)  # a file of that name; a.mp3 beside it holds no speech
        make_wav(tmp_path / "a.wav", 3.0)
        ffmpeg("-i", str(tmp_path / "a.wav"), str(tmp_path / "a.mp3"))
        out = run_wtx("transcribe", f"http://127.0.0.1:{port}/x.mp3", "file:a.mp3", "-o", "out", "-f", "txt")
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert requests == []  # ffmpeg never went to the network
    assert (tmp_path / "out" / "x.txt").read_text().strip()
    assert (tmp_path / "out" / "file:a.txt").read_text().strip()  # the file named, not a.mp3


# 12. the tampered-model message --------------------------------------------------------------


def test_the_tampered_model_message_names_a_command_that_fixes_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wtx import weights
    from wtx.cli import app
    from wtx.errors import WeightsMismatch

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    path = weights.resolve("tiny.en")
    with open(path, "r+b") as f:
        f.seek(1_000_000)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(WeightsMismatch, match="sha256") as caught:  # a tampered conversion is refused
        weights.resolve("tiny.en")
    command = str(caught.value).split("'")[1]  # the message quotes the command
    assert command.startswith("wtx cache clear")
    result = CliRunner().invoke(app, command.split()[1:])
    assert result.exit_code == 0
    assert weights.resolve("tiny.en") == path  # reconverted, verified


# 8. --split fixed and silence -----------------------------------------------------------------


def test_fixed_windows_without_a_sound_are_never_decoded():
    import numpy as np

    from wtx.split import make_windows

    rng = np.random.default_rng(0)
    silence = np.zeros(16000 * 65, dtype=np.float32)
    speechy = silence.copy()
    speechy[16000 * 40 : 16000 * 42] = 0.1 * rng.standard_normal(32000)
    def blocks(x):
        return iter([x[i : i + 480000] for i in range(0, len(x), 480000)])

    assert list(make_windows(blocks(silence), "fixed")) == []
    kept = list(make_windows(blocks(speechy), "fixed"))
    assert [(w.index, w.offset) for w in kept] == [(1, 30)]  # index and offset kept


# what users expect -----------------------------------------------------------------------------


def test_the_same_file_named_twice_is_one_input(tmp_path, monkeypatch):
    (tmp_path / "a.mp3").write_bytes(b"")
    (tmp_path / "link.mp3").symlink_to(tmp_path / "a.mp3")
    monkeypatch.chdir(tmp_path)
    expanded = expand(["a.mp3", "./a.mp3", str(tmp_path / "a.mp3"), "link.mp3"])
    assert [i.path for i in expanded.inputs] == ["a.mp3"]


def test_a_fifo_is_an_input(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert [i.path for i in expand([str(fifo)]).inputs] == [str(fifo)]


@pytest.mark.slow
def test_stdout_takes_the_format_and_separates_files(tmp_path):
    a, b = clip(tmp_path / "a.mp3", 0), clip(tmp_path / "b.mp3", 13)
    files = run_wtx("transcribe", str(a), str(b), "-o", str(tmp_path / "out"), "-f", "srt", "--no-resume")
    piped = run_wtx("transcribe", str(a), str(b), "-o", "-", "-f", "srt")
    assert files.returncode == piped.returncode == 0, piped.stderr.decode()[-2000:]
    expected = (tmp_path / "out" / "a.srt").read_bytes() + b"\n" + (tmp_path / "out" / "b.srt").read_bytes()
    assert piped.stdout == expected
    both = run_wtx("transcribe", str(a), "-o", "-", "-f", "srt,txt")
    assert both.returncode == 2 and b"one format" in both.stderr


@pytest.mark.slow
def test_a_closed_pipe_stops_quietly(tmp_path):
    # one window a batch, and a second input three windows long: its transcript is written seconds
    # after the first one, once the reader has gone, so the write meets the closed pipe
    a = clip(tmp_path / "a.mp3", 0)
    proc = subprocess.Popen([sys.executable, "-m", "wtx", "transcribe", str(a), str(SAMPLE), "-o", "-", "-q", "-b", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.readline()  # the first transcript arrived: the reader goes away, as `| head -1` does
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err and b"BrokenPipe" not in err


@pytest.mark.slow
def test_process_substitution_reads_like_stdin(tmp_path):
    a = clip(tmp_path / "a.mp3", 0)
    command = f"{sys.executable} -m wtx transcribe <(cat '{a}') -o -"
    out = subprocess.run(["bash", "-c", command], capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.strip()


@pytest.mark.slow
def test_a_missing_path_in_a_list_fails_alone(tmp_path):
    a = clip(tmp_path / "a.mp3", 0)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path / 'gone.mp3'}\n{a}\n")
    out = run_wtx("transcribe", "--from-list", str(listing), "-o", str(tmp_path / "out"), "-f", "txt")
    assert out.returncode == 1
    assert b"gone.mp3: no such file" in out.stderr
    assert (tmp_path / "out" / "a.txt").read_text().strip()


def test_an_output_folder_that_is_a_file_says_so(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    out = run_wtx("transcribe", str(SAMPLE), "-o", str(blocker))
    assert out.returncode == 1
    assert b"is a file, not a folder" in out.stderr and b"File exists" not in out.stderr


@pytest.mark.slow
def test_a_truncated_file_is_transcribed_with_a_warning(tmp_path):
    full = tmp_path / "full.flac"
    ffmpeg("-i", str(SAMPLE), "-t", "20", str(full))
    data = full.read_bytes()
    cut = tmp_path / "cut.flac"
    cut.write_bytes(data[: len(data) // 2])
    out = run_wtx("transcribe", str(cut), "-o", str(tmp_path / "out"), "-f", "txt")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    err = out.stderr.decode()
    assert "warning" in err and "header says 0:20" in err and "cut.flac" in err
    assert (tmp_path / "out" / "cut.txt").read_text().strip()


# non-speech ------------------------------------------------------------------------------------


def write_wav(path: Path, samples) -> Path:
    import wave

    import numpy as np

    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return path


def non_speech(folder: Path) -> list[Path]:
    """White noise, tones, a music-like signal and room tone: none of it is speech."""
    import numpy as np

    rng = np.random.default_rng(7)
    rate = 16000
    t = np.arange(90 * rate) / rate
    tones = 0.3 * np.sin(2 * np.pi * np.where(t < 30, 440, np.where(t < 60, 880, 660)) * t)
    music = np.zeros(60 * rate)
    for bar in range(60 * 2):  # two chords a second, with harmonics and a plucked envelope
        start = bar * rate // 2
        n = np.arange(rate // 2)
        root = 220 * 2 ** (((bar * 5) % 12) / 12)
        chord = sum(np.sin(2 * np.pi * root * ratio * k * n / rate) / k for ratio in (1, 1.25, 1.5) for k in (1, 2, 3))
        music[start : start + rate // 2] = 0.08 * chord * np.exp(-n / (0.15 * rate))
        music[start : start + 400] += 0.2 * rng.standard_normal(400)  # a drum hit
    room = 0.01 * np.cumsum(rng.standard_normal(300 * rate)) / 60  # brown-ish, around -40 dBFS
    room -= np.convolve(room, np.ones(800) / 800, mode="same")  # no DC drift
    return [
        write_wav(folder / "white_noise.wav", 0.3 * rng.standard_normal(120 * rate)),
        write_wav(folder / "tones.wav", tones),
        write_wav(folder / "music.wav", music),
        write_wav(folder / "room_tone.wav", room),
    ]


@pytest.mark.slow
def test_non_speech_gives_empty_transcripts(tmp_path):
    inputs = non_speech(tmp_path)
    out = run_wtx("transcribe", *map(str, inputs), "-o", str(tmp_path / "out"), "-f", "txt,srt")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    for path in inputs:
        assert (tmp_path / "out" / f"{path.stem}.txt").read_text() == "", path.stem
        assert (tmp_path / "out" / f"{path.stem}.srt").read_text() == "", path.stem


def test_the_detector_keeps_speech_and_drops_noise():
    import numpy as np

    from tests.conftest import shared_file
    from wtx.audio import N_SAMPLES, Window, load_audio, pad_window
    from wtx.vad import load_detector, speech_windows

    detector = load_detector()
    assert detector is not None, "silero-vad is a dependency"
    speech = load_audio(str(shared_file("audio/jfk.flac")))
    rng = np.random.default_rng(0)
    windows = [Window(0, 0.0, len(speech) / 16000, pad_window(speech)),
               Window(1, 30.0, 30.0, (0.3 * rng.standard_normal(N_SAMPLES)).astype(np.float32))]  # fmt: skip
    assert [w.index for w in speech_windows(windows, detector)] == [0]


def test_a_windows_speech_scores_do_not_depend_on_the_windows_beside_it():
    """What lets the scheduler (and Ray's workers) fill the detector's groups with windows of
    several files: a window's frame scores are the same bits alone in a padded group, at another
    row among other windows, and with another file's windows beside it."""
    import numpy as np
    import torch

    from tests.conftest import shared_file
    from wtx.audio import N_SAMPLES, load_audio, pad_window
    from wtx.vad import load_detector

    detector = load_detector()
    speech = pad_window(load_audio(str(shared_file("audio/jfk.flac"))))
    rng = np.random.default_rng(1)
    others = (0.2 * rng.standard_normal((detector.group, N_SAMPLES))).astype(np.float32)

    def scores(rows: np.ndarray, row: int):
        frames = detector.probabilities(rows.reshape(detector.group * detector.parts, -1))
        return frames.reshape(detector.group, -1)[row]

    alone = np.zeros((detector.group, N_SAMPLES), dtype=np.float32)
    alone[0] = speech
    among = others.copy()
    among[detector.group // 2 + 1] = speech
    assert (scores(alone, 0) > 0.5).sum() > 100  # it holds speech
    assert torch.equal(scores(alone, 0), scores(among, detector.group // 2 + 1))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_waits_until_outputs_and_journal_agree(sig):
    """Ctrl-C or SIGTERM while an input's outputs are written and its journal removed takes effect
    once both are done, never between them, through the handler it would have met."""
    import signal

    from wtx import transcribe

    # SIGINT as in a terminal, SIGTERM as the CLI handles it while a job runs
    with transcribe._handlers({signal.SIGINT: signal.default_int_handler}), transcribe._sigterm_as_interrupt():
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        done = []
        raised = transcribe.Terminated if sig == "SIGTERM" else KeyboardInterrupt
        with pytest.raises(raised), transcribe._signals_held():
            os.kill(os.getpid(), getattr(signal, sig))
            done.append("outputs")
            done.append("journal removed")
        assert done == ["outputs", "journal removed"]
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handed back


def test_an_ignored_signal_stays_ignored_while_outputs_are_written():
    import signal

    from wtx import transcribe

    with transcribe._handlers({signal.SIGINT: signal.SIG_IGN}):  # nohup, or a background job
        with transcribe._signals_held():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
