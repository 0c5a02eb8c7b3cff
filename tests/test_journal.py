"""The resume journal: known by content and options, trusted only when it is the user's own.

Unit tests run on the Journal itself; the end-to-end ones interrupt a run deterministically (a
KeyboardInterrupt right after the first window is journaled, as Ctrl-C would) on clips of one
window, then run wtx again.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import wave
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLE, run_wtx
from wtx.journal import Entry, Journal, JournalBusy, journal_path, source_identity

IDENTITY = {"version": 5, "source": "/x.mp3", "size": 1, "content": "c", "config": "c"}
ENTRY = Entry(0, 0.0, 6.0, "en", [(0.0, 6.0, " Hello there.", ())], [1, 2])
ARGS = ("-f", "txt,srt", "-b", "1")

# wtx with Ctrl-C right after the first window is journaled
INTERRUPT_AFTER_ONE = """
import sys
from wtx import transcribe
from wtx.cli import main

window_done = transcribe._Run.window_done

def then_interrupt(self, key, result):
    window_done(self, key, result)
    raise KeyboardInterrupt

transcribe._Run.window_done = then_interrupt
sys.argv[0] = "wtx"
main()
"""


def write_clip(path: Path, start: float, seconds: float = 6.0) -> Path:
    """`seconds` of the bundled sample from `start`, as 16 kHz 16-bit WAV: clips of the same
    length have the same size."""
    from wtx.audio import SAMPLE_RATE, load_audio

    samples = load_audio(str(SAMPLE))[int(start * SAMPLE_RATE) :][: int(seconds * SAMPLE_RATE)]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def interrupted(source: Path, out: Path) -> list[dict]:
    """Runs wtx on `source` until its first window is journaled; the journal's records."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_AFTER_ONE,
            "transcribe",
            str(source),
            "-o",
            str(out),
            *ARGS,
        ],
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 130, run.stderr.decode()[-2000:]
    assert not (out / f"{source.stem}.txt").exists()
    return [
        json.loads(line)
        for line in journal_path(out / f"{source.stem}.txt").read_text().splitlines()
    ]


def outputs(out: Path, stem: str) -> tuple[bytes, bytes]:
    return (out / f"{stem}.txt").read_bytes(), (out / f"{stem}.srt").read_bytes()


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> dict:
    """A one-window clip, its journal after an interrupted run, and its uninterrupted outputs."""
    d = tmp_path_factory.mktemp("talk")
    source = write_clip(d / "talk.wav", 0.0)
    records = interrupted(source, d / "interrupted")
    fresh = run_wtx("transcribe", str(source), "-o", str(d / "fresh"), *ARGS)
    assert fresh.returncode == 0, fresh.stderr.decode()[-2000:]
    return {"source": source, "records": records, "fresh": outputs(d / "fresh", "talk")}


def plant(out: Path, records: list[dict], mode: int = 0o600) -> Path:
    """Writes `records` as a journal of talk.wav in `out`, as one without the user's key would."""
    out.mkdir(parents=True, exist_ok=True)
    path = journal_path(out / "talk.txt")
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    path.chmod(mode)
    return path


def without_mac(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "mac"}


# 1. a journal of other audio of the same size and time ------------------------------------------


@pytest.mark.slow
def test_audio_swapped_in_under_the_same_size_and_time_starts_over(tmp_path):
    source = write_clip(tmp_path / "a.wav", 20.0)
    other = write_clip(tmp_path / "b.wav", 0.0)
    assert source.stat().st_size == other.stat().st_size
    out = tmp_path / "out"
    assert len(interrupted(source, out)) == 2  # the header and one window of a.wav's speech
    before = source.stat()
    shutil.copyfile(other, source)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r
    run = run_wtx("transcribe", str(source), str(other), "-o", str(out), *ARGS)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert b"resuming" not in run.stderr
    assert b"its journal is not resumed (the audio changed since it was written)" in run.stderr
    assert outputs(out, "a") == outputs(out, "b")  # as a fresh run of the new audio
    assert not journal_path(out / "a.txt").exists()


def test_the_journal_knows_its_input_by_content(tmp_path):
    source, other = tmp_path / "a.wav", tmp_path / "b.wav"
    source.write_bytes(b"RIFF one")
    other.write_bytes(b"RIFF two")
    path = tmp_path / ".a.wtx-journal"
    journal = Journal(path, source_identity(str(source), {"model": "tiny.en"}))
    journal.append(ENTRY)
    journal.close()
    times = source.stat()
    source.write_bytes(other.read_bytes())
    os.utime(source, ns=(times.st_atime_ns, times.st_mtime_ns))
    again = Journal(path, source_identity(str(source), {"model": "tiny.en"}))
    assert again.entries == {} and again.restarted == "the audio changed since it was written"
    again.close()


# 2. a journal that is not the user's own -------------------------------------------------------


@pytest.mark.slow
def test_a_journal_planted_by_another_user_is_set_aside(talk, tmp_path):
    header, entry = (without_mac(r) for r in talk["records"])
    entry["segments"] = [[0.0, 6.0, " Attacker text planted in your transcript.", []]]
    out = tmp_path / "shared"
    path = plant(out, [header, entry], 0o666)
    run = run_wtx("transcribe", str(talk["source"]), "-o", str(out), *ARGS)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert b"resuming" not in run.stderr
    assert (
        b"its journal was not used (others can read or write it (mode 0666, not 0600))"
        in run.stderr
    )
    assert b"Attacker" not in (out / "talk.txt").read_bytes()
    assert outputs(out, "talk") == talk["fresh"]
    aside = [p for p in out.iterdir() if p.name.endswith(".corrupt")]
    assert len(aside) == 1 and b"Attacker" in aside[0].read_bytes()  # kept for inspection
    assert not path.exists()


def written(path: Path, identity: dict = IDENTITY, key: bytes | None = None) -> Path:
    journal = Journal(path, identity, **({"key": key} if key else {}))
    journal.append(ENTRY)
    journal.close()
    return path


def test_a_journal_others_can_write_is_set_aside(tmp_path):
    path = written(tmp_path / ".talk.wtx-journal")
    path.chmod(0o666)
    journal = Journal(path, IDENTITY)
    assert journal.entries == {} and "mode 0666" in journal.reason
    assert journal.set_aside.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    journal.close()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_journal_another_user_owns_is_set_aside(tmp_path):
    path = written(tmp_path / ".talk.wtx-journal")
    os.chown(path, 65534, 65534)
    journal = Journal(path, IDENTITY)
    assert journal.entries == {} and "owned by user id 65534" in journal.reason
    assert path.stat().st_uid == os.getuid()
    journal.close()


@pytest.mark.parametrize("forgery", ["no MAC", "a bad MAC", "another key", "an edited entry"])
def test_records_without_the_users_mac_are_set_aside(tmp_path, forgery):
    path = written(tmp_path / ".talk.wtx-journal")
    lines = path.read_text().splitlines()
    forged = json.loads(lines[1])
    forged["segments"] = [[0.0, 6.0, " Attacker text.", []]]
    if forgery == "no MAC":
        lines.append(json.dumps(without_mac(forged)))
    elif forgery == "a bad MAC":
        lines.append(json.dumps({**forged, "mac": "0" * 64}))
    elif forgery == "an edited entry":
        lines[1] = json.dumps(forged)  # its MAC kept
    else:
        lines = written(tmp_path / "other", key=b"k" * 32).read_text().splitlines()
    path.write_text("\n".join(lines) + "\n")
    journal = Journal(path, IDENTITY)
    assert journal.entries == {} and "authentication" in journal.reason
    journal.close()


def test_the_journal_key_is_private(tmp_path, monkeypatch):
    from wtx.paths import journal_key

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path / "cache"))
    key = journal_key()
    path = tmp_path / "cache" / "journal.key"
    assert len(key) == 32 and journal_key() == key
    assert (
        stat.S_IMODE(path.stat().st_mode) == 0o600
        and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    )


# 22. entries that are not the input's windows ---------------------------------------------------


@pytest.mark.slow
def test_an_entry_past_the_end_of_the_audio_is_not_used(talk, tmp_path):
    out = tmp_path / "out"
    path = plant(out, [])
    header = without_mac(talk["records"][0])
    journal = Journal(path, header)  # the user's own key: only its windows can tell
    assert list(journal.entries) == []
    for record in talk["records"][1:]:
        record = without_mac(record)
        journal.append(
            Entry(
                record["index"],
                record["offset"],
                record["duration"],
                record["language"],
                record["segments"],
                record["prompt"],
                record["last_speech"],
            )
        )
    journal.append(Entry(7, 210.0, 30.0, "en", [(210.0, 215.0, " Text from nowhere.", ())]))
    journal.close()
    run = run_wtx("transcribe", str(talk["source"]), "-o", str(out), *ARGS)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert b"resuming" in run.stderr  # its first window was the input's
    assert b"its journal does not match its audio from window 7 on" in run.stderr
    assert outputs(out, "talk") == talk["fresh"]


def test_a_reader_passes_on_journaled_windows_that_are_not_the_inputs():
    from wtx.audio import SAMPLE_RATE
    from wtx.pipeline import AudioReader

    samples = np.tile(
        np.float32([0.5, -0.5]), 75 * SAMPLE_RATE // 2
    )  # a loud 75 s: 3 fixed windows
    windows = [(w.index, w.offset, w.duration) for w in AudioReader(samples, "fixed")]
    assert windows == [(0, 0, 30.0), (1, 30, 30.0), (2, 60, 15.0)]
    cases = {  # journaled windows -> (windows read again, where they stop matching)
        "all match": ({0: (0.0, 30.0), 1: (30.0, 30.0)}, [2], None),
        "another duration": ({0: (0.0, 30.0), 1: (30.0, 29.0)}, [1, 2], 1),
        "past the end": ({0: (0.0, 30.0), 5: (150.0, 30.0)}, [1, 2], 5),
        "one window too many": (
            {0: (0.0, 30.0), 1: (30.0, 30.0), 2: (60.0, 15.0), 3: (90.0, 1.0)},
            [],
            3,
        ),
    }
    for name, (journaled, again, stale_from) in cases.items():
        stale = []
        reader = AudioReader(
            samples, "fixed", skip=journaled, journaled=journaled, stale=stale.append
        )
        assert [w.index for w in reader] == again, name
        assert stale == ([] if stale_from is None else [stale_from]), name


# 13. a journal left beside finished outputs -----------------------------------------------------


def test_skip_existing_removes_a_journal_left_beside_finished_outputs(tmp_path):
    (tmp_path / "sample.txt").write_text("done\n")
    (tmp_path / "sample.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\ndone\n")
    journal = written(journal_path(tmp_path / "sample.txt"))
    run = run_wtx(
        "transcribe", str(SAMPLE), "-o", str(tmp_path), "--skip-existing", "-f", "txt,srt"
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert b"skipped" in run.stderr and not journal.exists()


# options: a journal written under other options is started over -----------------------------------


def test_every_option_that_changes_the_text_is_in_the_journals_identity():
    from wtx.subtitles import SubtitleOptions
    from wtx.transcribe import Job, _Backend, journal_config

    job = Job(formats=("txt", "json"))
    backend = _Backend(
        "cpu",
        "torch.float32",
        8,
        False,
        True,
        2,
        events=None,
        quantized="int8",
        encoder_dtype="torch.bfloat16",
        word_timestamps=True,
    )
    base = journal_config(job, backend)
    assert sorted(base) == sorted(
        [
            "model",
            "task",
            "language",
            "split",
            "condition",
            "dtype",
            "quantized",
            "device",
            "compiled",
            "vad",
            "beam_size",
            "best_of",
            "patience",
            "length_penalty",
            "word_timestamps",
            "word_probabilities",
            "threads",
            "batch_size",
            "encoder_dtype",
            "without_timestamps",
        ]
    )
    changes = {
        "job": {
            "model": "base.en",
            "task": "translate",
            "language": "de",
            "split": "fixed",
            "beam_size": 2,
            "best_of": 3,
            "patience": 2.0,
            "length_penalty": 0.5,
            "formats": ("txt",),
        },
        "backend": {
            "device": "cuda",
            "dtype": "torch.float16",
            "batch_size": 4,
            "compiled": True,
            "vad": False,
            "threads": 1,
            "quantized": "fp16",
            "encoder_dtype": "torch.float32",
            "without_timestamps": True,
            "condition": False,
            "word_timestamps": False,
            "vnni": True,
        },
    }
    for name, value in changes["job"].items():
        assert journal_config(replace(job, **{name: value}), backend) != base, name
    for name, value in changes["backend"].items():
        assert journal_config(job, replace(backend, **{name: value})) != base, name
    # the Job's fields that never change a window's text, or do only as the backend resolves them
    inert_or_resolved = {
        "out",
        "to_stdout",
        "quiet",
        "strict",
        "compare_eager",
        "skip_existing",
        "resume",
        "subtitles",
        "ray",
        "cuda_graphs",
        "profile_startup",
        "batch_size",
        "device",
        "dtype",
        "quantize",
        "threads",
        "compile",
        "condition",
        "vad",
        "word_timestamps",
        "without_timestamps",
    }
    assert {f.name for f in fields(Job)} == inert_or_resolved | set(changes["job"]), (
        "a new Job field: is it in the identity?"
    )
    assert (
        journal_config(replace(job, subtitles=SubtitleOptions(max_line_width=10)), backend) == base
    )


@pytest.mark.slow
def test_a_journal_written_under_other_options_is_started_over(talk, tmp_path):
    out = tmp_path / "out"
    path = journal_path(out / "talk.txt")
    out.mkdir()
    header = without_mac(talk["records"][0])
    written(path, header)
    run = run_wtx("transcribe", str(talk["source"]), "-o", str(out), *ARGS, "--beam-size", "2")
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert b"resuming" not in run.stderr
    assert b"its journal is not resumed (it was written with other options)" in run.stderr


# the lock -----------------------------------------------------------------------------------------


def test_a_second_journal_on_the_same_path_is_busy(tmp_path):
    first = Journal(tmp_path / ".talk.wtx-journal", IDENTITY)
    with pytest.raises(JournalBusy, match="another wtx process"):
        Journal(tmp_path / ".talk.wtx-journal", IDENTITY)
    first.close()
    Journal(tmp_path / ".talk.wtx-journal", IDENTITY).close()  # free once the first lets go
