"""Where outputs go: never over an input or a file wtx did not write for that input; a set of
formats is published whole; the leftovers of a killed write are swept; usage errors for empty
-f and -o. docs/robustness.md lists the cases.

Unit tests run in milliseconds; the end-to-end ones run wtx as a process on tone clips.
"""

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import make_wav, run_wtx
from wtx import atomic, outputs
from wtx.atomic import atomic_paths
from wtx.errors import WtxError
from wtx.inputs import Input
from wtx.outputs import output_paths, plan_outputs
from wtx.transcript import TimedText, Transcript
from wtx.writers import write_outputs

AUDIO = b"fLaC\x00\x00\x00\x22\x10\x00\x10\x00\xff\xfe" * 64  # what a FLAC file begins with


def item(path: Path) -> Input:
    return Input(str(path), Path(path.stem))


def transcript(source: Path, text: str = "hello") -> Transcript:
    return Transcript(
        source=str(source), duration=2.0, language="en", segments=[TimedText(0.0, 1.0, text)]
    )


def xattrs_work(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.wtx.probe", b"1")
        return True
    except (AttributeError, OSError):
        return False
    finally:
        probe.unlink()


# 3. an output over an input ------------------------------------------------------------------


def test_an_input_named_like_an_output_is_never_written_over(tmp_path):
    flac, txt = tmp_path / "a.flac", tmp_path / "a.txt"
    flac.write_bytes(AUDIO)
    txt.write_bytes(AUDIO)  # audio, named .txt, given as an input
    plan = plan_outputs([item(flac), item(txt)], ["txt", "srt"], None)
    written = [p for paths in plan.paths.values() for p in paths.values()]
    assert txt not in written and len(set(written)) == len(written)
    assert plan.paths[str(flac)]["txt"].name == "a-2.txt"
    assert any("a.txt" in note and "input" in note for note in plan.notes)


def test_an_input_is_never_its_own_output(tmp_path):
    rec = tmp_path / "rec.srt"
    rec.write_bytes(AUDIO)
    plan = plan_outputs([item(rec)], ["txt", "srt"], None)
    assert [p.name for p in plan.paths[str(rec)].values()] == ["rec-2.txt", "rec-2.srt"]
    assert len(plan.notes) == 1 and "rec-2" in plan.notes[0]


NOT_OURS = {
    "txt": b"ID3\x04\x00\x00\x00\x00\x00\x00\xff\xfb",  # an MP3 named .txt
    "srt": b"Subtitles I typed myself\n",
    "vtt": b"NOTE from the editor\n",
    "json": b'{"settings": {"theme": "dark"}}\n',
    "tsv": b"name\tphone\nAda\t555\n",
}


@pytest.mark.parametrize("fmt", sorted(NOT_OURS))
def test_a_file_wtx_did_not_write_is_never_written_over(tmp_path, fmt):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / f"talk.{fmt}").write_bytes(NOT_OURS[fmt])
    talk = tmp_path / "talk.flac"
    plan = plan_outputs([item(talk)], ["txt", "srt", "vtt", "json", "tsv"], tmp_path / "out")
    assert plan.paths[str(talk)][fmt].name == f"talk-2.{fmt}"
    assert len(plan.notes) == 1 and f"talk.{fmt}" in plan.notes[0]


def test_a_rerun_writes_over_its_own_outputs_under_the_same_names(tmp_path):
    talk = tmp_path / "talk.flac"
    formats = ["txt", "srt", "vtt", "json", "tsv"]
    first = plan_outputs([item(talk)], formats, tmp_path / "out").paths[str(talk)]
    write_outputs(transcript(talk), first)
    for empty in (first["txt"], first["srt"]):  # what an older wtx leaves for silence: no record
        empty.write_bytes(b"")
    again = plan_outputs([item(talk)], formats, tmp_path / "out")
    assert again.paths[str(talk)] == first and again.notes == []


# 5. --skip-existing and another input's outputs ----------------------------------------------


def test_an_input_never_takes_another_inputs_outputs_for_its_own(tmp_path):
    if not xattrs_work(tmp_path):
        pytest.skip("this file system keeps no extended attributes")
    a, b = tmp_path / "a" / "talk.flac", tmp_path / "b" / "talk.flac"
    out = tmp_path / "out"
    write_outputs(transcript(b), output_paths(item(b), ["txt", "srt"], out))  # b ran alone first
    plan = plan_outputs([item(a), item(b)], ["txt", "srt"], out)
    assert plan.paths[str(a)]["txt"].name == "talk-2.txt"
    assert plan.paths[str(b)]["txt"].name == "talk.txt"  # b keeps its names
    assert outputs.complete(plan.paths[str(b)]) and not outputs.complete(plan.paths[str(a)])
    reversed_order = plan_outputs([item(b), item(a)], ["txt", "srt"], out)
    assert reversed_order.paths == plan.paths  # the same names whatever the order


@pytest.mark.slow
def test_skip_existing_skips_only_the_input_whose_outputs_exist(tmp_path):
    if not xattrs_work(tmp_path):
        pytest.skip("this file system keeps no extended attributes")
    a, b = tmp_path / "a" / "talk.wav", tmp_path / "b" / "talk.wav"
    for path in (a, b):
        path.parent.mkdir()
        make_wav(path, 2.0)
    out = tmp_path / "out"
    run = ("transcribe", "-o", str(out), "-f", "json", "-b", "1", "--no-vad")
    first = run_wtx(*run, str(b))  # b alone first: its outputs are out/talk.*
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    before = (out / "talk.json").stat().st_mtime_ns
    second = run_wtx(*run, str(a), str(b), "--skip-existing")
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert json.loads((out / "talk-2.json").read_text())["source"] == str(a)  # a transcribed
    assert (out / "talk.json").stat().st_mtime_ns == before  # b skipped, its outputs untouched
    assert f"skipped {b}" in second.stderr.decode()  # said on one line
    third = run_wtx(*run, str(a), str(b), "--skip-existing")
    assert third.returncode == 0 and third.stderr.decode().count("skipped") == 2


# 14. an output name held by a folder ---------------------------------------------------------


def test_a_folder_at_an_output_name_fails_the_whole_set(tmp_path):
    paths = output_paths(item(tmp_path / "jfk.flac"), ["txt", "srt"], tmp_path / "out")
    paths["srt"].mkdir(parents=True)
    with pytest.raises(WtxError, match="jfk.srt"):
        write_outputs(transcript(tmp_path / "jfk.flac"), paths)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["jfk.srt"]  # no .txt alone


def test_a_folder_at_an_output_name_is_planned_around(tmp_path):
    (tmp_path / "out" / "jfk.srt").mkdir(parents=True)
    jfk = tmp_path / "jfk.flac"
    plan = plan_outputs([item(jfk)], ["txt", "srt"], tmp_path / "out")
    assert [p.name for p in plan.paths[str(jfk)].values()] == ["jfk-2.txt", "jfk-2.srt"]


# 13. kill -9 while a set is renamed ----------------------------------------------------------


def leftover(path: Path, seconds_ago: float = 3600) -> Path:
    tmp = path.parent / f".{path.name}.k3x_9qa2.tmp"
    tmp.write_text("cut short")
    os.utime(tmp, (time.time() - seconds_ago,) * 2)
    return tmp


def test_the_next_run_sweeps_a_killed_writes_temporaries(tmp_path):
    paths = output_paths(item(tmp_path / "talk.flac"), ["txt", "srt"], None)
    stale = [leftover(p) for p in paths.values()]
    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / ".talk.srt.linkxxxx.tmp"
    link.symlink_to(target)
    other = tmp_path / ".talk.mp3.abcdefgh.tmp"  # not one of this input's outputs
    other.write_text("x")
    write_outputs(transcript(tmp_path / "talk.flac"), paths)
    assert not any(p.exists() for p in stale)
    assert link.is_symlink() and target.read_text() == "keep" and other.exists()


def test_a_live_writers_temporaries_are_left_alone(tmp_path):
    path = tmp_path / "talk.txt"
    with atomic_paths([path]) as (tmp,):
        os.utime(tmp, (time.time() - 3600,) * 2)
        assert atomic.sweep([path]) == []  # its writer holds it
        assert tmp.exists()
    assert path.exists()


def test_a_set_cut_mid_publish_is_not_complete(tmp_path):
    if not xattrs_work(tmp_path):
        pytest.skip("this file system keeps no extended attributes")
    talk = tmp_path / "talk.flac"
    paths = output_paths(item(talk), ["txt", "srt"], None)
    write_outputs(transcript(talk, "old"), paths)
    assert outputs.complete(paths)
    kept = paths["srt"].read_bytes()
    write_outputs(transcript(talk, "new"), paths)
    paths["srt"].unlink()  # the new .srt never got renamed: put the old one back
    paths["srt"].write_bytes(kept)
    assert not outputs.complete(paths)


# usage errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-f", "-o"])
def test_an_empty_format_or_output_folder_is_a_usage_error(tmp_path, monkeypatch, flag):
    from typer.testing import CliRunner

    from wtx.cli import app

    monkeypatch.chdir(tmp_path)  # where `-o ''` used to write
    wav = make_wav(tmp_path / "tone.wav", 1.0)
    result = CliRunner().invoke(app, ["transcribe", str(wav), flag, ""])
    assert result.exit_code == 2
    assert flag in result.stderr and "give" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tone.wav"]
