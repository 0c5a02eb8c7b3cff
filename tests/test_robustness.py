"""Fault injection: bad inputs, kill -9 and Ctrl-C with resume, corrupt caches, concurrency."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SAMPLE, run_wtx
from wtx.audio import ffmpeg_binary
from wtx.journal import VERSION

pytestmark = pytest.mark.slow


def ffmpeg(*args: str) -> None:
    subprocess.run([ffmpeg_binary(), "-nostdin", "-loglevel", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    clip = ["-i", str(SAMPLE), "-t", "6"]
    files = {
        "empty_dir": d / "no audio here",
        "zero_bytes": d / "zero.mp3",
        "text_as_mp3": d / "notes.mp3",
        "png": d / "picture.png",
        "truncated_mp3": d / "truncated.mp3",
        "under_1s": d / "short.wav",
        "silence": d / "silence.wav",
        "8khz": d / "narrow 8k.wav",
        "96khz": d / "wide96k.flac",
        "stereo": d / "stereo.ogg",
        "video_with_audio": d / "talk.mp4",
        "video_no_audio": d / "mute.mp4",
        "unicode_name": d / "Früh – ünïcode ☃.mp3",
    }
    files["empty_dir"].mkdir()
    (files["empty_dir"] / "readme.txt").write_text("nothing to hear")
    files["zero_bytes"].write_bytes(b"")
    files["text_as_mp3"].write_text("this is a text file, not audio\n")
    ffmpeg("-f", "lavfi", "-i", "color=c=red:s=32x32", "-frames:v", "1", str(files["png"]))
    full = d / "full.mp3"
    ffmpeg(*clip, "-c:a", "libmp3lame", "-b:a", "32k", str(full))
    data = full.read_bytes()
    files["truncated_mp3"].write_bytes(data[: len(data) // 2])
    ffmpeg("-i", str(SAMPLE), "-t", "0.6", str(files["under_1s"]))
    ffmpeg("-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-t", "20", str(files["silence"]))
    ffmpeg(*clip, "-ar", "8000", str(files["8khz"]))
    ffmpeg(*clip, "-ar", "96000", str(files["96khz"]))
    ffmpeg(*clip, "-ac", "2", "-c:a", "libvorbis", str(files["stereo"]))
    ffmpeg("-f", "lavfi", "-i", "color=c=blue:s=64x64:d=6", *clip, "-shortest", "-c:v", "mpeg4", "-c:a", "aac", str(files["video_with_audio"]))
    ffmpeg("-f", "lavfi", "-i", "color=c=blue:s=64x64:d=3", "-c:v", "mpeg4", str(files["video_no_audio"]))
    ffmpeg(*clip, "-c:a", "libmp3lame", str(files["unicode_name"]))
    return files


EXPECT_FAIL = {"empty_dir", "zero_bytes", "text_as_mp3", "png", "video_no_audio"}


def test_every_bad_input_fails_alone_and_the_rest_complete(bad_inputs, tmp_path):
    out_dir = tmp_path / "out"
    args = [str(p) for p in bad_inputs.values()]
    out = run_wtx("transcribe", *args, "-o", str(out_dir), "-f", "txt,srt", "-b", "4")
    stderr = out.stderr.decode()
    assert out.returncode == 1, stderr[-3000:]
    written = {p.name for p in out_dir.iterdir()}
    assert not [n for n in written if n.endswith(".tmp") or n.endswith("-journal")]  # no partial files
    for key, path in bad_inputs.items():
        if key in EXPECT_FAIL:
            assert path.name in stderr, f"{key}: no error naming {path.name}"
            assert f"{path.stem}.txt" not in written, f"{key}: output written for a failed input"
        else:
            assert {f"{path.stem}.txt", f"{path.stem}.srt"} <= written, f"{key}: outputs missing\n{stderr[-2000:]}"
    assert (out_dir / "silence.txt").read_text() == ""  # no hallucinated text for silence
    video = (out_dir / "talk.txt").read_text().lower()
    assert "welcome" in video and "tool" in video, video  # the sample's first words, from the video
    for key in ("8khz", "96khz", "stereo", "unicode_name", "truncated_mp3"):
        assert (out_dir / f"{bad_inputs[key].stem}.txt").read_text().strip(), key


def test_unwritable_output_dir_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = run_wtx("transcribe", str(SAMPLE), "-o", str(blocker / "sub"))
    assert out.returncode == 1
    assert b"cannot write outputs" in out.stderr


def test_skip_existing(tmp_path):
    out = run_wtx("transcribe", str(SAMPLE), "-o", str(tmp_path), "-f", "txt")
    assert out.returncode == 0
    before = (tmp_path / "sample.txt").stat().st_mtime_ns
    out = run_wtx("transcribe", str(SAMPLE), "-o", str(tmp_path), "-f", "txt", "--skip-existing")
    assert out.returncode == 0 and b"skipped" in out.stderr
    assert (tmp_path / "sample.txt").stat().st_mtime_ns == before


def test_directory_and_list_inputs(tmp_path, bad_inputs):
    listing = tmp_path / "list.txt"
    listing.write_text(f"# inputs\n{bad_inputs['stereo']}\n\n{bad_inputs['8khz']}\n")
    out = run_wtx("transcribe", "--from-list", str(listing), "-o", str(tmp_path / "o"), "-f", "txt")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert {p.name for p in (tmp_path / "o").iterdir()} == {"stereo.txt", "narrow 8k.txt"}


@pytest.fixture(scope="module")
def long_input(tmp_path_factory) -> Path:
    """The sample four times over: about 4 minutes, so a run takes long enough to interrupt."""
    d = tmp_path_factory.mktemp("long")
    path = d / "long.mp3"
    ffmpeg("-stream_loop", "3", "-i", str(SAMPLE), "-c:a", "libmp3lame", "-b:a", "32k", str(path))
    return path


# greedy: what is interrupted and resumed is the journal's, whatever the decoding, at a fifth of
# beam 5's cost (test_beam holds beam search to stock's)
RUN = ("-f", "txt,srt,json", "-b", "2", "--beam-size", "1")


@pytest.fixture(scope="module")
def uninterrupted(long_input, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("reference")
    out = run_wtx("transcribe", str(long_input), "-o", str(out_dir), *RUN)
    assert out.returncode == 0
    return out_dir


def _default_sigint() -> None:
    # a test run started in the background by a non-interactive shell ignores SIGINT, and a child
    # inherits that: give wtx the disposition a terminal gives it, so Ctrl-C raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(long_input: Path, out_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "wtx", "transcribe", str(long_input), "-o", str(out_dir), *RUN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy(), preexec_fn=_default_sigint,
    )  # fmt: skip


def wait_for_journal(out_dir: Path, entries: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    journal = out_dir / ".long.wtx-journal"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if journal.exists() and len(journal.read_text().splitlines()) > entries:
            return
        assert proc.poll() is None, "finished before it could be interrupted"
        time.sleep(0.05)
    raise AssertionError("journal never grew")


def same_outputs(a: Path, b: Path) -> None:
    for name in ("long.txt", "long.srt", "long.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


SIGNALS = {"kill -9": signal.SIGKILL, "ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM}


@pytest.mark.parametrize("how", list(SIGNALS))
def test_interrupted_run_resumes_to_identical_outputs(how, long_input, uninterrupted, tmp_path):
    out_dir = tmp_path / "out"
    proc = start(long_input, out_dir)
    wait_for_journal(out_dir, entries=1, proc=proc)  # header and one window: most of the work is left
    proc.send_signal(SIGNALS[how])
    _, stderr = proc.communicate(timeout=120)
    if how != "kill -9":
        assert proc.returncode == {"ctrl-c": 130, "sigterm": 143}[how], stderr.decode()[-2000:]
        assert b"run the same command again to resume" in stderr
        assert b"finished windows of" in stderr
    assert not (out_dir / "long.txt").exists()  # no partial outputs
    journal = (out_dir / ".long.wtx-journal").read_text().splitlines()
    assert len(journal) >= 2 and json.loads(journal[0])["version"] == VERSION
    again = run_wtx("transcribe", str(long_input), "-o", str(out_dir), *RUN)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert b"resuming" in again.stderr
    same_outputs(uninterrupted, out_dir)
    assert not (out_dir / ".long.wtx-journal").exists()


def test_two_processes_share_output_and_cache_dirs(long_input, tmp_path):
    env = {"WTX_CACHE_DIR": str(tmp_path / "cache")}  # both convert the weights at the same time
    out_dir = tmp_path / "out"
    procs = [
        subprocess.Popen([sys.executable, "-m", "wtx", "transcribe", str(src), "-o", str(out_dir),
                          "-f", "txt", "--beam-size", "1"],
                         stderr=subprocess.PIPE, env={**os.environ, **env})  # fmt: skip
        for src in (SAMPLE, long_input)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    assert sorted(p.name for p in out_dir.iterdir()) == ["long.txt", "sample.txt"]
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir()] == ["tiny.en"]
    assert sorted(p.name for p in (models / "tiny.en").iterdir()) == ["checkpoint.pt", "checkpoint.pt.sha256"]


def test_same_input_twice_at_once_never_corrupts(tmp_path):
    """A second process on an input whose journal another one holds is refused, writing nothing."""
    from wtx.journal import Journal, journal_path

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # the first process: its journal locked
    first = Journal(journal_path(out_dir / "sample.txt"), {"version": VERSION})
    try:
        second = run_wtx("transcribe", str(SAMPLE), "-o", str(out_dir), "-f", "txt,srt", "-b", "1")
    finally:
        first.close()
    assert second.returncode == 1, second.stderr.decode()[-2000:]
    assert b"another wtx process is transcribing it" in second.stderr
    assert [p.name for p in out_dir.iterdir()] == [".sample.wtx-journal"]  # the first one's
