"""Transcript files from segments: txt, srt, vtt, json, tsv. Plain text in, text out.

Writers take a file handle and a Transcript; `write_outputs` places the files atomically.
"""

import io
import json
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from wtx.atomic import atomic_paths, public_mode
from wtx.names import display
from wtx.segments import Word

FORMATS = ("txt", "srt", "vtt", "json", "tsv")
DEFAULT_FORMATS = ("txt", "srt")
MAX_LINE = 42  # characters per subtitle line
MAX_LINES = 2  # lines per cue
MAX_CUE = 7.0  # seconds a cue may stay on screen
MIN_CUE = 0.7  # seconds a cue should stay, where the next one allows
PARAGRAPH_GAP = 1.5  # seconds of pause that start a new paragraph in .txt


@dataclass(frozen=True)
class TimedText:
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()  # with word timestamps


@dataclass(frozen=True)
class SubtitleOptions:
    """openai-whisper's subtitle options; they need word timestamps (segments without words ignore them)."""

    max_line_width: int | None = None  # characters per line
    max_line_count: int | None = None  # lines per cue; with max_line_width, cues may span segments
    max_words_per_line: int | None = None
    highlight_words: bool = False  # one cue per word, the word underlined

    @property
    def any(self) -> bool:
        return self != SubtitleOptions()


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
        cues.append(TimedText(start, end, text, s.words))
        previous_end = end
    return cues


def write_txt(transcript: Transcript, f: TextIO) -> None:
    """Running text; a pause of PARAGRAPH_GAP seconds or more starts a new paragraph."""
    paragraphs: list[list[str]] = []
    previous_end = None
    for cue in _cues(transcript):
        if previous_end is None or cue.start - previous_end >= PARAGRAPH_GAP:
            paragraphs.append([])
        paragraphs[-1].append(cue.text)
        previous_end = cue.end
    f.write("\n\n".join(" ".join(p) for p in paragraphs) + ("\n" if paragraphs else ""))


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=MAX_LINE, break_long_words=False, break_on_hyphens=False) or [""]


def subtitle_cues(transcript: Transcript) -> list[TimedText]:
    """Segments split into subtitle cues: at most MAX_LINES lines of MAX_LINE characters and
    MAX_CUE seconds each, at least MIN_CUE seconds where the next cue allows, never overlapping.
    A segment's time is shared among its cues in proportion to their characters."""
    cues: list[TimedText] = []
    for seg in _cues(transcript):
        pieces: list[str] = []
        for word in seg.text.split():
            candidate = f"{pieces[-1]} {word}" if pieces else word
            if pieces and len(_wrap(candidate)) <= MAX_LINES:
                pieces[-1] = candidate
            else:
                pieces.append(word)
        total = sum(len(p) for p in pieces)
        start = seg.start
        for piece in pieces:
            end = start + (seg.end - seg.start) * len(piece) / total
            cues.append(TimedText(start, min(end, start + MAX_CUE), "\n".join(_wrap(piece))))
            start = end
    fixed: list[TimedText] = []
    for i, cue in enumerate(cues):
        start = max(cue.start, fixed[-1].end if fixed else 0.0)
        next_start = cues[i + 1].start if i + 1 < len(cues) else float("inf")
        end = max(cue.end, min(start + MIN_CUE, next_start))
        fixed.append(TimedText(round(start, 3), round(min(max(end, start), start + MAX_CUE), 3), cue.text))
    return fixed


LONG_PAUSE = 3.0  # seconds between words that end a cue, when cues may span segments


def _word_lines(segments: Sequence[TimedText], width: int, count: int | None, per_line: int,
                preserve: bool) -> list[list[tuple[str, Word]]]:  # fmt: skip
    """openai-whisper's subtitle rule over words: each cue a list of (text, word), the text
    starting with a newline where a line breaks. A line holds up to `width` characters and
    `per_line` words; a cue holds up to `count` lines (None: any). With `preserve`, each
    segment (and each run of `per_line` words) starts a cue; otherwise a pause of LONG_PAUSE
    seconds does."""
    cues: list[list[tuple[str, Word]]] = []
    cue: list[tuple[str, Word]] = []
    line_len, line_count = 0, 1
    last = next((s.start for s in segments if s.words), 0.0)
    for segment in segments:
        for run_start in range(0, len(segment.words), per_line):
            for i, word in enumerate(segment.words[run_start : run_start + per_line]):
                text = word.word
                long_pause = not preserve and word.start - last > LONG_PAUSE
                has_room = line_len + len(text) <= width
                segment_break = i == 0 and bool(cue) and preserve
                if line_len > 0 and has_room and not long_pause and not segment_break:
                    line_len += len(text)
                else:
                    text = text.strip()
                    if (cue and count is not None and (long_pause or line_count >= count)) or segment_break:
                        cues.append(cue)
                        cue, line_count = [], 1
                    elif line_len > 0:
                        line_count += 1
                        text = "\n" + text
                    line_len = len(text.strip())
                cue.append((text, word))
                last = word.start
    if cue:
        cues.append(cue)
    return cues


def _fill(texts: list[str], width: int) -> list[bool]:
    """Greedy lines of at most `width` characters over words: which word starts a line."""
    starts, length = [], 0
    for text in texts:
        new_line = length > 0 and length + 1 + len(text) > width
        length = len(text) if new_line or length == 0 else length + 1 + len(text)
        starts.append(new_line or not starts)
    return starts


def _line_starts(texts: list[str]) -> list[bool]:
    """As few lines of at most MAX_LINE characters as hold the words, their lengths evened out."""
    starts = _fill(texts, MAX_LINE)
    lines = sum(starts)
    for width in range(-(-len(" ".join(texts)) // lines), MAX_LINE):
        if sum(even := _fill(texts, width)) == lines:
            return even
    return starts


def _balanced_cues(words: Sequence[Word]) -> list[list[tuple[str, Word]]]:
    """wtx's layout of one segment's words: as few cues of MAX_LINES lines of MAX_LINE
    characters as fit them, their lengths evened out (no one-word cue left over at the end)."""
    texts = [w.word.strip() for w in words]

    def pack(limit: int) -> list[list[int]]:
        pieces: list[list[int]] = []
        for i, text in enumerate(texts):
            candidate = [texts[j] for j in pieces[-1]] + [text] if pieces else [text]
            if pieces and (len(" ".join(candidate)) > limit or sum(_line_starts(candidate)) > MAX_LINES):
                pieces.append([i])
            elif pieces:
                pieces[-1].append(i)
            else:
                pieces.append([i])
        return pieces

    pieces = pack(MAX_LINE * MAX_LINES)
    total = len(" ".join(texts))
    for limit in range(-(-total // len(pieces)), MAX_LINE * MAX_LINES):
        if len(even := pack(limit)) == len(pieces):
            pieces = even
            break
    cues = []
    for piece in pieces:
        starts = _line_starts([texts[i] for i in piece])
        cues.append([(("\n" if new_line and k else " " if k else "") + texts[i], words[i])
                     for k, (i, new_line) in enumerate(zip(piece, starts))])  # fmt: skip
    return cues


def word_cues(transcript: Transcript, options: SubtitleOptions) -> list[TimedText]:
    """Subtitle cues timed by words: wtx's default layout (each segment's words in as few cues
    of MAX_LINES lines of MAX_LINE characters as fit, evened out), or openai-whisper's
    --max-line-width, --max-line-count and --max-words-per-line; --highlight-words with either."""
    segments = [s for s in _cues(transcript) if s.words]
    if not options.any or options == SubtitleOptions(highlight_words=True):
        layout = [cue for s in segments for cue in _balanced_cues(s.words)]
    else:
        width, count = options.max_line_width or 1000, options.max_line_count
        preserve = options.max_line_count is None or options.max_line_width is None
        layout = _word_lines(segments, width, count, options.max_words_per_line or 1000, preserve)
    cues: list[TimedText] = []
    for cue in layout:
        start, end = cue[0][1].start, cue[-1][1].end
        text = "".join(t for t, _ in cue)
        if not options.highlight_words:
            cues.append(TimedText(start, end, text))
            continue
        last = start
        for i, (_, word) in enumerate(cue):
            if last != word.start:
                cues.append(TimedText(last, word.start, text))
            marked = [(t[: len(t) - len(t.lstrip())] + f"<u>{t.lstrip()}</u>") if j == i else t for j, (t, _) in enumerate(cue)]
            cues.append(TimedText(word.start, word.end, "".join(marked)))
            last = word.end
    return cues


def _subtitles(transcript: Transcript, options: SubtitleOptions) -> list[TimedText]:
    if any(s.words for s in transcript.segments):
        return word_cues(transcript, options)
    return subtitle_cues(transcript)


def write_srt(transcript: Transcript, f: TextIO, options: SubtitleOptions = SubtitleOptions()) -> None:
    for i, cue in enumerate(_subtitles(transcript, options), start=1):
        start = format_timestamp(cue.start, always_include_hours=True, decimal_marker=",")
        end = format_timestamp(cue.end, always_include_hours=True, decimal_marker=",")
        f.write(f"{i}\n{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_vtt(transcript: Transcript, f: TextIO, options: SubtitleOptions = SubtitleOptions()) -> None:
    f.write("WEBVTT\n\n")
    for cue in _subtitles(transcript, options):
        start = format_timestamp(cue.start, always_include_hours=True)
        end = format_timestamp(cue.end, always_include_hours=True)
        f.write(f"{start} --> {end}\n{cue.text.replace('-->', '->')}\n\n")


def write_tsv(transcript: Transcript, f: TextIO) -> None:
    """openai-whisper's tsv: start and end in integer milliseconds, then the text; with word
    timestamps, a row per word."""
    f.write("start\tend\ttext\n")
    for cue in _cues(transcript):
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


def render(transcript: Transcript, fmt: str, subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """One format's text, as it would be written to its file."""
    buffer = io.StringIO(newline="")
    if fmt in ("srt", "vtt"):
        WRITERS[fmt](transcript, buffer, subtitles)
    else:
        WRITERS[fmt](transcript, buffer)
    return buffer.getvalue()


def write_outputs(transcript: Transcript, paths: dict[str, Path], subtitles: SubtitleOptions = SubtitleOptions()) -> list[Path]:
    """Writes every format as one set: all files appear (atomically, with the permissions the
    umask gives new files) or, when any of them fails (a full disk), none does."""
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    targets = list(paths.values())
    with atomic_paths(targets, mode=public_mode()) as temporaries:
        for fmt, tmp in zip(paths, temporaries):
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(render(transcript, fmt, subtitles))
    return targets
