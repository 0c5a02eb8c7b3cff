import io
import json
import re

import pytest

from pathlib import Path

from wtx.inputs import Input
from wtx.outputs import output_paths
from wtx.transcript import TimedText, Transcript
from wtx.writers import (
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

    def broken(transcript, f, *options):
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


def worded_transcript(seed: int = 0) -> Transcript:
    """Segments with word times: pauses, long words and punctuation, as --word-timestamps gives them."""
    import random

    from wtx.segments import Word

    rng = random.Random(seed)
    vocabulary = ["the", "lighthouse", "keeper,", "climbed", "stairs.", "Every", "night", "a", "lamp", "burned", "--> on", "rocks!"]
    segments, t = [], 0.0
    for _ in range(12):
        words = []
        for _ in range(rng.randint(1, 14)):
            t += rng.choice([0.0, 0.1, 0.4, 3.5])
            end = t + rng.choice([0.1, 0.3, 0.6])
            words.append(Word(" " + rng.choice(vocabulary), round(t, 2), round(end, 2), rng.random()))
            t = end
        text = "".join(w.word for w in words).strip()
        segments.append(TimedText(words[0].start, words[-1].end, text, tuple(words)))
    return Transcript("book.mp3", t + 1, "en", segments)


@pytest.mark.parametrize("options", [
    dict(max_line_width=20, max_line_count=2), dict(max_line_width=30), dict(max_line_count=3, max_line_width=42),
    dict(max_words_per_line=3), dict(max_line_width=25, max_line_count=1, max_words_per_line=4),
    dict(max_line_width=20, max_line_count=2, highlight_words=True), dict(max_words_per_line=2, highlight_words=True),
])  # fmt: skip
def test_word_subtitles_are_whispers(options):
    """--max-line-width, --max-line-count, --max-words-per-line and --highlight-words lay out
    cues as openai-whisper's subtitle writer does, on the same words (.vtt has the same cues)."""
    from whisper.utils import WriteSRT

    from wtx.subtitles import SubtitleOptions
    from wtx.writers import render as render_format

    transcript = worded_transcript()
    result = {"segments": [{"start": s.start, "end": s.end, "text": s.text,
                            "words": [{"word": w.word, "start": w.start, "end": w.end} for w in s.words]}
                           for s in transcript.segments]}  # fmt: skip
    stock = io.StringIO()
    WriteSRT(".").write_result(result, stock, **options)
    ours = render_format(transcript, "srt", SubtitleOptions(**options))
    assert ours.replace("->", "-->").replace("--->", "-->") == stock.getvalue()  # wtx never writes "-->" in a cue
    vtt = render_format(transcript, "vtt", SubtitleOptions(**options)).split("\n\n")[1:]
    assert [c.split("\n", 1)[1] for c in vtt if c] == [text for *_, text in parse_srt(ours)]


def test_word_outputs():
    """With words: the JSON lists each segment's words, the TSV has a row per word, and the
    default cues (two lines of 42 characters) take their times from the words."""
    from wtx.subtitles import SubtitleOptions
    from wtx.writers import render as render_format

    transcript = worded_transcript(1)
    words = [w for s in transcript.segments for w in s.words]
    payload = json.loads(render_format(transcript, "json"))
    listed = [w for s in payload["segments"] for w in s["words"]]
    assert [(w["word"], w["start"], w["end"]) for w in listed] == [(w.word, w.start, w.end) for w in words]
    assert all(0 <= w["probability"] <= 1 for w in listed)
    rows = render_format(transcript, "tsv").splitlines()
    assert rows[0] == "start\tend\ttext" and len(rows) == len(words) + 1
    assert rows[1] == f"{round(words[0].start * 1000)}\t{round(words[0].end * 1000)}\t{words[0].word.strip()}"
    cues = parse_srt(render_format(transcript, "srt"))
    starts = {round(w.start, 3) for w in words}
    ends = {round(w.end, 3) for w in words}
    assert all(start in starts and end in ends for _, start, end, _ in cues)
    assert all(len(line) <= 42 and text.count("\n") < 2 for _, _, _, text in cues for line in text.split("\n"))
    assert " ".join(t.replace("\n", " ") for *_, t in cues).replace("->", "-->") == " ".join(s.text for s in transcript.segments)
    highlighted = parse_srt(render_format(transcript, "srt", SubtitleOptions(highlight_words=True)))
    assert sum("<u>" in text for *_, text in highlighted) == len(words)
