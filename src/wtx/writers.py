"""Transcript files from segments: txt, srt, vtt, json, tsv. Plain text in, text out.

Writers take a file handle and a Transcript; `write_outputs` places the files atomically.
"""

import io
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from wtx.atomic import atomic_paths, public_mode, sweep
from wtx.names import display
from wtx.outputs import SET_ATTR, SOURCE_ATTR, origin
from wtx.subtitles import SubtitleOptions, subtitles
from wtx.transcript import Transcript, timed_cues

FORMATS = ("txt", "srt", "vtt", "json", "tsv")
DEFAULT_FORMATS = ("txt", "srt")
PARAGRAPH_GAP = 1.5  # seconds of pause that start a new paragraph in .txt


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """openai-whisper's format: [HH:]MM:SS.mmm, rounded to the millisecond."""
    assert seconds >= 0, "non-negative timestamp expected"
    milliseconds = round(seconds * 1000.0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def write_txt(transcript: Transcript, f: TextIO) -> None:
    """Running text; a pause of PARAGRAPH_GAP seconds or more starts a new paragraph."""
    paragraphs: list[list[str]] = []
    previous_end = None
    for cue in timed_cues(transcript):
        if previous_end is None or cue.start - previous_end >= PARAGRAPH_GAP:
            paragraphs.append([])
        paragraphs[-1].append(cue.text)
        previous_end = cue.end
    f.write("\n\n".join(" ".join(p) for p in paragraphs) + ("\n" if paragraphs else ""))


def write_srt(transcript: Transcript, f: TextIO, options: SubtitleOptions = SubtitleOptions()) -> None:
    for i, cue in enumerate(subtitles(transcript, options), start=1):
        start = format_timestamp(cue.start, always_include_hours=True, decimal_marker=",")
        end = format_timestamp(cue.end, always_include_hours=True, decimal_marker=",")
        f.write(f"{i}\n{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_vtt(transcript: Transcript, f: TextIO, options: SubtitleOptions = SubtitleOptions()) -> None:
    f.write("WEBVTT\n\n")
    for cue in subtitles(transcript, options):
        start = format_timestamp(cue.start, always_include_hours=True)
        end = format_timestamp(cue.end, always_include_hours=True)
        f.write(f"{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_tsv(transcript: Transcript, f: TextIO) -> None:
    """openai-whisper's tsv: start and end in integer milliseconds, then the text; with word
    timestamps, a row per word."""
    f.write("start\tend\ttext\n")
    for cue in timed_cues(transcript):
        rows = [(w.start, w.end, w.word.strip()) for w in cue.words] or [(cue.start, cue.end, cue.text)]
        for start, end, text in rows:
            f.write(f"{round(1000 * start)}\t{round(1000 * end)}\t{text.replace(chr(9), ' ')}\n")


def write_json(transcript: Transcript, f: TextIO) -> None:
    payload = {
        "source": display(transcript.source),
        "duration": round(transcript.duration, 3),
        "language": transcript.language,
        "text": transcript.text,
        "segments": [
            {"id": i, "start": s.start, "end": s.end, "text": s.text.strip()}
            | ({"words": [{"word": w.word, "start": w.start, "end": w.end, "probability": round(w.probability, 4)}
                          for w in s.words]} if s.words else {})  # fmt: skip
            for i, s in enumerate(timed_cues(transcript))
        ],
    }
    json.dump(payload, f, ensure_ascii=False, indent=2)
    f.write("\n")


WRITERS: dict[str, Callable[[Transcript, TextIO], None]] = {
    "txt": write_txt,
    "srt": write_srt,
    "vtt": write_vtt,
    "json": write_json,
    "tsv": write_tsv,
}


def render(transcript: Transcript, fmt: str, subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """One format's text, as it would be written to its file."""
    buffer = io.StringIO(newline="")
    if fmt in ("srt", "vtt"):
        WRITERS[fmt](transcript, buffer, subtitles)
    else:
        WRITERS[fmt](transcript, buffer)
    return buffer.getvalue()


def _record(path: Path, source: str, token: str) -> None:
    """Marks a written file as `source`'s output, of the set `token` (wtx.outputs' rule); where
    the file system keeps no extended attributes, nothing is recorded."""
    try:
        os.setxattr(path, SOURCE_ATTR, os.fsencode(source), follow_symlinks=False)
        os.setxattr(path, SET_ATTR, token.encode(), follow_symlinks=False)
    except (AttributeError, OSError):
        pass


def write_outputs(transcript: Transcript, paths: dict[str, Path], subtitles: SubtitleOptions = SubtitleOptions()) -> list[Path]:
    """Writes every format as one set: all files appear (atomically, with the permissions the
    umask gives new files) or, when any of them fails (a full disk, a folder at one of the
    names), none does. Each file records its input and set (wtx.outputs); the temporaries an
    earlier write of these files left when it was killed are removed first."""
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    targets = list(paths.values())
    sweep(targets)
    source, token = origin(transcript.source), secrets.token_hex(8)
    with atomic_paths(targets, mode=public_mode()) as temporaries:
        for fmt, tmp in zip(paths, temporaries):
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(render(transcript, fmt, subtitles))
            _record(tmp, source, token)
    return targets
