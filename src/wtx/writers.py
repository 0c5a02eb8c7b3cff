"""Transcript files from segments: txt, srt, vtt, json, tsv. Plain text in, text out.

Writers take a file handle and a Transcript; `write_outputs` places the files atomically.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from wtx.atomic import atomic_write

FORMATS = ("txt", "srt", "vtt", "json", "tsv")
DEFAULT_FORMATS = ("txt", "srt")


@dataclass(frozen=True)
class TimedText:
    start: float
    end: float
    text: str


@dataclass
class Transcript:
    source: str
    duration: float
    language: str
    segments: Sequence[TimedText] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(s.text.strip() for s in self.segments if s.text.strip())


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """openai-whisper's format: [HH:]MM:SS.mmm, rounded to the millisecond."""
    assert seconds >= 0, "non-negative timestamp expected"
    milliseconds = round(seconds * 1000.0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _cues(transcript: Transcript) -> list[TimedText]:
    """Segments with text, times made monotonic and non-overlapping."""
    cues: list[TimedText] = []
    previous_end = 0.0
    for s in transcript.segments:
        text = s.text.strip()
        if not text:
            continue
        start = max(s.start, previous_end)
        end = max(s.end, start)
        cues.append(TimedText(start, end, text))
        previous_end = end
    return cues


def write_txt(transcript: Transcript, f: TextIO) -> None:
    for s in transcript.segments:
        if s.text.strip():
            f.write(s.text.strip() + "\n")


def write_srt(transcript: Transcript, f: TextIO) -> None:
    for i, cue in enumerate(_cues(transcript), start=1):
        start = format_timestamp(cue.start, always_include_hours=True, decimal_marker=",")
        end = format_timestamp(cue.end, always_include_hours=True, decimal_marker=",")
        f.write(f"{i}\n{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_vtt(transcript: Transcript, f: TextIO) -> None:
    f.write("WEBVTT\n\n")
    for cue in _cues(transcript):
        start = format_timestamp(cue.start, always_include_hours=True)
        end = format_timestamp(cue.end, always_include_hours=True)
        f.write(f"{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_tsv(transcript: Transcript, f: TextIO) -> None:
    """openai-whisper's tsv: start and end in integer milliseconds, then the text."""
    f.write("start\tend\ttext\n")
    for cue in _cues(transcript):
        text = cue.text.replace("\t", " ")
        f.write(f"{round(1000 * cue.start)}\t{round(1000 * cue.end)}\t{text}\n")


def write_json(transcript: Transcript, f: TextIO) -> None:
    payload = {
        "source": transcript.source,
        "duration": round(transcript.duration, 3),
        "language": transcript.language,
        "text": transcript.text,
        "segments": [
            {"id": i, "start": s.start, "end": s.end, "text": s.text.strip()}
            for i, s in enumerate(_cues(transcript))
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


def output_paths(source: str, formats: Sequence[str], output_dir: Path | None) -> dict[str, Path]:
    """Where each format goes: next to the input, or into output_dir (stdin: 'stdin.<fmt>')."""
    src = Path(source)
    stem = "stdin" if source == "-" else src.stem
    folder = output_dir if output_dir is not None else (Path.cwd() if source == "-" else src.parent)
    return {fmt: folder / f"{stem}.{fmt}" for fmt in formats}


def write_outputs(transcript: Transcript, paths: dict[str, Path]) -> list[Path]:
    """Writes every format atomically: a file appears only when complete."""
    written = []
    for fmt, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            WRITERS[fmt](transcript, f)
        written.append(path)
    return written
