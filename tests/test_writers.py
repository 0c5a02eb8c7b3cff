import io
import json
import re

import pytest

from pathlib import Path

from wtx.inputs import Input
from wtx.outputs import output_paths
from wtx.writers import (
    Transcript,
    TimedText,
    format_timestamp,
    write_json,
    write_outputs,
    write_srt,
    write_tsv,
    write_txt,
    write_vtt,
)

SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.+?)\n\n", re.S)


def parse_srt(text: str) -> list[tuple[int, float, float, str]]:
    cues = []
    pos = 0
    for m in SRT_CUE.finditer(text):
        assert m.start() == pos, f"unparsable SRT near {text[pos:pos + 40]!r}"
        pos = m.end()
        g = m.groups()
        start = int(g[1]) * 3600 + int(g[2]) * 60 + int(g[3]) + int(g[4]) / 1000
        end = int(g[5]) * 3600 + int(g[6]) * 60 + int(g[7]) + int(g[8]) / 1000
        cues.append((int(g[0]), start, end, g[9]))
    assert pos == len(text), "trailing garbage in SRT"
    return cues


def render(writer, transcript) -> str:
    f = io.StringIO()
    writer(transcript, f)
    return f.getvalue()


def transcript(*segments) -> Transcript:
    return Transcript("a.mp3", 4000.0, "en", [TimedText(*s) for s in segments])


def test_format_timestamp_rolls_over_hours():
    assert format_timestamp(3599.9995) == "01:00:00.000"
    assert format_timestamp(3600 + 61.5, always_include_hours=True, decimal_marker=",") == "01:01:01,500"
    assert format_timestamp(59.999) == "00:59.999"
    assert format_timestamp(0, always_include_hours=True) == "00:00:00.000"


def test_srt_parses_back_with_hour_rollover():
    t = transcript((3598.0, 3601.25, "across the hour"), (3601.25, 3605.0, "second"))
    cues = parse_srt(render(write_srt, t))
    assert cues == [(1, 3598.0, 3601.25, "across the hour"), (2, 3601.25, 3605.0, "second")]


def test_empty_text_segments_are_dropped_everywhere():
    t = transcript((0.0, 1.0, "  "), (1.0, 2.0, "hello"), (2.0, 3.0, ""))
    assert parse_srt(render(write_srt, t)) == [(1, 1.0, 2.0, "hello")]
    assert render(write_txt, t) == "hello\n"
    assert render(write_vtt, t) == "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nhello\n\n"
    assert render(write_tsv, t) == "start\tend\ttext\n1000\t2000\thello\n"
    assert json.loads(render(write_json, t))["segments"] == [{"id": 0, "start": 1.0, "end": 2.0, "text": "hello"}]


def test_empty_transcript_writes_valid_empty_files():
    t = transcript()
    assert render(write_srt, t) == ""
    assert render(write_txt, t) == ""
    assert render(write_vtt, t) == "WEBVTT\n\n"
    assert json.loads(render(write_json, t))["text"] == ""


def test_cues_are_monotonic_and_do_not_overlap():
    t = transcript((0.0, 5.0, "a"), (4.0, 6.0, "b"), (6.0, 5.5, "c"))
    cues = parse_srt(render(write_srt, t))
    for (_, s1, e1, _), (_, s2, e2, _) in zip(cues, cues[1:]):
        assert s1 <= e1 <= s2 <= e2


def test_write_outputs_is_atomic_and_all_or_nothing(tmp_path, monkeypatch):
    import wtx.writers as writers

    def broken(transcript, f):
        f.write("partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(writers.WRITERS, "srt", broken)
    paths = output_paths(Input(str(tmp_path / "x.mp3"), Path("x")), ["txt", "srt", "json"], None)
    with pytest.raises(OSError):
        write_outputs(transcript((0, 1, "hi")), paths)
    assert list(tmp_path.iterdir()) == []  # not x.txt alone: no file of the set, no temp file


def test_outputs_honour_the_umask(tmp_path):
    import os
    import stat

    paths = output_paths(Input(str(tmp_path / "x.mp3"), Path("x")), ["txt"], None)
    old = os.umask(0o027)
    try:
        write_outputs(transcript((0, 1, "hi")), paths)
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths["txt"].stat().st_mode) == 0o640


def test_output_paths():
    paths = output_paths(Input("/data/book one.mp3", Path("book one")), ["txt", "srt"], None)
    assert [str(p) for p in paths.values()] == ["/data/book one.txt", "/data/book one.srt"]
