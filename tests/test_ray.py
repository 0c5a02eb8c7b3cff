"""`wtx transcribe --ray local`: the same bytes as a single process, through a worker's death and
a driver's (tiny.en on the CPU, local Ray with two workers)."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import SAMPLE, run_wtx
from tests.test_scheduler import ffmpeg, outputs

FORMATS = ("txt", "srt", "json")


@pytest.fixture(scope="module")
def ray_installed():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'wtx[ray]')")
OPTIONS = ("-f", ",".join(FORMATS), "-b", "2", "--beam-size", "1", "--threads", "1")
RAY = ("--ray", "local", "--workers", "2")
# every window its own chunk, so a file's windows come back over several calls and its journal
# lives long enough to be interrupted
UNPROMPTED = (*OPTIONS, "--no-condition")


@pytest.fixture(scope="module")
def five_files(ray_installed, tmp_path_factory) -> list[Path]:
    """Five inputs of different lengths and formats, cut from the bundled sample (62 s)."""
    d = tmp_path_factory.mktemp("five")
    files = []
    for name, start, seconds in [("a.mp3", 0, 3), ("b.wav", 5, 12), ("c.mp3", 20, 35), ("d.flac", 0, 62)]:
        path = d / name
        ffmpeg("-ss", str(start), "-t", str(seconds), "-i", str(SAMPLE), str(path))
        files.append(path)
    looped = d / "e.mp3"  # two minutes: five windows, one chunk (five without prompts)
    ffmpeg("-stream_loop", "1", "-i", str(SAMPLE), "-c:a", "libmp3lame", "-b:a", "32k", str(looped))
    return files + [looped]


def transcribe(files, out: Path, *extra: str, env: dict | None = None, options=OPTIONS) -> subprocess.CompletedProcess:
    result = run_wtx("transcribe", *map(str, files), "-o", str(out), *options, *extra, env=env)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    return result


@pytest.fixture(scope="module")
def single(five_files, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("single")
    transcribe(five_files, out)
    written = outputs(out)
    assert len(written) == len(five_files) * len(FORMATS)
    return written


@pytest.fixture(scope="module")
def single_unprompted(five_files, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("single-unprompted")
    transcribe(five_files, out, options=UNPROMPTED)
    return outputs(out)


# The driver, with its journal's append sending `sig` to its own process right after the
# `after`-th window is journaled: the interruption lands at the same point of every run, with that
# window's input unfinished, however fast the workers return (a test that polled the journal from
# outside missed windows that came back together, or signalled just as they finished).
SIGNALLED_DRIVER = """
import os, signal, sys
from wtx import journal
from wtx.cli import main
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background shell's child ignores it
append, count = journal.Journal.append, [0]
def append_then_signal(self, entry):
    append(self, entry)
    count[0] += 1
    if count[0] == {after}:
        os.kill(os.getpid(), {sig})
journal.Journal.append = append_then_signal
sys.argv[0] = "wtx"
main()
"""


def interrupted(five_files, out: Path, sig: int, after: int = 3) -> subprocess.CompletedProcess:
    """A --ray run stopped by `sig` once `after` windows are journaled: a journal is left to resume from."""
    code = SIGNALLED_DRIVER.format(after=after, sig=int(sig))
    command = [sys.executable, "-c", code, "transcribe", *map(str, five_files), "-o", str(out), *UNPROMPTED, *RAY]
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy(), timeout=600, check=False)
    assert list(out.glob(".*.wtx-journal")), proc.stderr.decode()[-3000:]
    assert len(outputs(out)) < len(five_files) * len(FORMATS)
    return proc


@pytest.mark.slow
def test_two_workers_write_the_bytes_of_one_process(five_files, single, tmp_path):
    result = transcribe(five_files, tmp_path, *RAY)
    assert outputs(tmp_path) == single
    assert result.stdout == b""  # Ray's messages went to its log, not to wtx's stdout
    err = result.stderr.decode()
    assert "Ray worker(s)" in err and "transcribed 5/5 inputs" in err
    assert "(raylet)" not in err and "INFO" not in err


@pytest.mark.slow
def test_stdout_stays_the_data_alone(five_files, tmp_path):
    alone = run_wtx("transcribe", str(five_files[1]), "-o", "-", *OPTIONS[2:])
    on_ray = run_wtx("transcribe", str(five_files[1]), "-o", "-", *OPTIONS[2:], *RAY)
    assert alone.returncode == on_ray.returncode == 0, on_ray.stderr.decode()[-3000:]
    assert on_ray.stdout == alone.stdout and alone.stdout.strip()


@pytest.mark.slow
def test_a_worker_that_dies_midway_loses_nothing(five_files, single, tmp_path):
    marker = tmp_path / "crash-once"
    marker.touch()
    out = tmp_path / "out"
    transcribe(five_files, out, *RAY, env={"WTX_RAY_CRASH_ONCE": f"{marker}:2"})
    assert not marker.exists(), "no worker reached its second call: nothing was killed"
    assert outputs(out) == single


def test_a_job_that_fails_on_the_cluster_says_why_in_one_line(five_files, tmp_path):
    """A worker's call that raises (here the crash hook given a count that is no number) ends
    the job with exit 1 and one line naming the cause and Ray's log; nothing half written."""
    out = tmp_path / "out"
    env = {"WTX_RAY_CRASH_ONCE": f"{tmp_path / 'marker'}:second"}
    result = run_wtx("transcribe", *map(str, five_files[:2]), "-o", str(out), *OPTIONS, *RAY, env=env)
    err = result.stderr.decode()
    assert result.returncode == 1, err[-2000:]
    assert "--ray: the job failed on the cluster: ValueError: invalid literal for int()" in err
    assert "Ray's log: " in err and "Traceback" not in err
    assert not out.exists() or not outputs(out)


@pytest.mark.slow
def test_a_killed_driver_resumes_from_its_journals(five_files, single_unprompted, tmp_path):
    interrupted(five_files, tmp_path, signal.SIGKILL)
    resumed = transcribe(five_files, tmp_path, *RAY, options=UNPROMPTED)
    assert "resuming" in resumed.stderr.decode()
    assert outputs(tmp_path) == single_unprompted


@pytest.mark.slow
def test_a_ray_run_resumes_without_ray(five_files, single_unprompted, tmp_path):
    """Journals written on Ray are finished by a single process, to the same bytes."""
    assert interrupted(five_files, tmp_path, signal.SIGINT).returncode == 130
    resumed = transcribe(five_files, tmp_path, options=UNPROMPTED)
    assert "resuming" in resumed.stderr.decode()
    assert outputs(tmp_path) == single_unprompted


@pytest.mark.parametrize("args, hint", [
    (("--workers", "2"), "--ray"),
    (("--ray", "local", "-"), "stdin"),
    (("--ray", "nowhere"), "HOST:PORT"),
    (("--ray", "local", "--compare-eager"), "single process"),
])  # fmt: skip
def test_ray_usage_errors(args, hint):
    result = run_wtx("transcribe", str(SAMPLE), *args)
    assert result.returncode == 2
    assert hint in result.stderr.decode()


LOCKED_BUILD = """
import sys
from wtx.cluster import compile_lock
print("started", flush=True)
with compile_lock(True):
    print("holds the lock", flush=True)
    sys.stdin.readline()  # until the test lets go
"""


class _Worker:
    """A process running LOCKED_BUILD, its lines read as they come."""

    def __init__(self, env: dict):
        self.process = subprocess.Popen([sys.executable, "-c", LOCKED_BUILD], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line.strip()) for line in self.process.stdout], daemon=True).start()

    def line(self, timeout: float = 60.0) -> str | None:
        """The next line it prints, or None if none comes within `timeout` seconds."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None


def test_the_first_worker_builds_alone_and_the_others_side_by_side(tmp_path):
    """compile_lock: while the first worker on a node builds (compiles) its engine, the others
    wait; once it is done they build theirs at the same time (they only load what it saved)."""
    env = {**os.environ, "WTX_CACHE_DIR": str(tmp_path / "cache")}
    workers: list[_Worker] = []

    def start() -> _Worker:
        workers.append(_Worker(env))
        assert workers[-1].line() == "started"
        return workers[-1]

    try:
        first = start()
        assert first.line() == "holds the lock"
        others = [start(), start()]
        time.sleep(1.0)  # both are in compile_lock now
        assert [o.line(timeout=0.5) for o in others] == [None, None], "they did not wait for the first"
        first.process.stdin.write("\n")
        first.process.stdin.close()
        # both hold it at once (neither has been let go): the lock is shared after the first
        assert [o.line() for o in others] == ["holds the lock"] * 2
    finally:
        for worker in workers:
            worker.process.kill()
            worker.process.wait()
