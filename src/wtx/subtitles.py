"""Subtitle cues from a transcript: how many lines, how long on screen, which words (no torch).

Without words, a segment's text is shared among cues of MAX_LINES lines of MAX_LINE characters
in proportion to their characters. With words (--word-timestamps), cues take their times from
the words, in wtx's layout or openai-whisper's (--max-line-width, --max-line-count,
--max-words-per-line), and --highlight-words underlines each word in turn.
"""

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from wtx.segments import Word
from wtx.transcript import TimedText, Transcript, timed_cues

MAX_LINE = 42  # characters per subtitle line
MAX_LINES = 2  # lines per cue
MAX_CUE = 7.0  # seconds a cue may stay on screen
MIN_CUE = 0.7  # seconds a cue should stay, where the next one allows
LONG_PAUSE = 3.0  # seconds between words that end a cue, when cues may span segments


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

    @property
    def whisper_layout(self) -> bool:
        """A line width, line count or words per line was given: openai-whisper's layout."""
        return (self.max_line_width, self.max_line_count, self.max_words_per_line) != (None, None, None)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=MAX_LINE, break_long_words=False, break_on_hyphens=False) or [""]


def subtitle_cues(transcript: Transcript) -> list[TimedText]:
    """Segments split into subtitle cues: at most MAX_LINES lines of MAX_LINE characters and
    MAX_CUE seconds each, at least MIN_CUE seconds where the next cue allows, never overlapping.
    A segment's time is shared among its cues in proportion to their characters."""
    cues: list[TimedText] = []
    for seg in timed_cues(transcript):
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
    segments = [s for s in timed_cues(transcript) if s.words]
    if options.whisper_layout:
        width, count = options.max_line_width or 1000, options.max_line_count
        preserve = options.max_line_count is None or options.max_line_width is None
        layout = _word_lines(segments, width, count, options.max_words_per_line or 1000, preserve)
    else:
        layout = [cue for s in segments for cue in _balanced_cues(s.words)]
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


def subtitles(transcript: Transcript, options: SubtitleOptions) -> list[TimedText]:
    """The cues of a .srt or .vtt: timed by words where the transcript has them."""
    if any(s.words for s in transcript.segments):
        return word_cues(transcript, options)
    return subtitle_cues(transcript)
