"""Words into segments: openai-whisper's rules after alignment (plain Python and numpy, no torch).

wtx.timing aligns a window's tokens to its audio and groups them into words (`WordTiming`,
times from the window's start). Here punctuation joins its neighbours, words that run long over
a pause or a sentence end are cut to twice the median word duration, and each segment takes its
words and, from them, its start and end, as openai-whisper's add_word_timestamps does.
"""

from dataclasses import dataclass, replace

import numpy as np

from wtx.segments import Segment, Word

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MAX_MEDIAN_DURATION = 0.7  # seconds: words longer than twice the median (capped so) are suspect


@dataclass
class WordTiming:
    """A word aligned inside its window: times in seconds from the window's start."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def merge_punctuations(alignment: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:  # fmt: skip
    """Opening punctuation joins the word after it, closing punctuation the word before it; the
    emptied entries stay (with no word and no tokens) so token counts still line up."""
    following = len(alignment) - 1
    for i in range(len(alignment) - 2, -1, -1):
        before, after = alignment[i], alignment[following]
        if before.word.startswith(" ") and before.word.strip() in prepended:
            after.word, after.tokens = before.word + after.word, before.tokens + after.tokens
            before.word, before.tokens = "", []
        else:
            following = i
    previous = 0
    for j in range(1, len(alignment)):
        before, after = alignment[previous], alignment[j]
        if not before.word.endswith(" ") and after.word in appended:
            before.word, before.tokens = before.word + after.word, before.tokens + after.tokens
            after.word, after.tokens = "", []
        else:
            previous = j


def add_word_timestamps(segments: list[Segment], alignment: list[WordTiming], offset: float,
                        last_speech: float) -> list[Segment]:  # fmt: skip
    """A window's segments with their words, by openai-whisper's rules.

    alignment: the window's words (find_alignment) over the concatenated text tokens of
    `segments`; offset: the window's start; last_speech: where speech last ended before it (the
    previous window's last word). Words longer than twice the median word duration are cut at
    sentence ends and after pauses; a segment takes its start and end from its words unless a
    word runs half a second past them."""
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(MAX_MEDIAN_DURATION, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)

    timed: list[Segment] = []
    index = 0
    for segment in segments:
        n_tokens = len(segment.tokens)
        taken = 0
        words: list[dict] = []
        while index < len(alignment) and taken < n_tokens:
            t = alignment[index]
            if t.word:
                words.append({"word": t.word, "start": round(offset + t.start, 2), "end": round(offset + t.end, 2),
                              "probability": t.probability})  # fmt: skip
            taken += len(t.tokens)
            index += 1
        start, end = segment.start, segment.end
        if words:
            first, last = words[0], words[-1]
            # the first word after a pause: at most twice the median duration
            if first["end"] - last_speech > median * 4 and (
                first["end"] - first["start"] > longest
                or (len(words) > 1 and words[1]["end"] - first["start"] > longest * 2)
            ):
                if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
                    boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
                    first["end"] = words[1]["start"] = boundary
                first["start"] = max(0, first["end"] - longest)
            if start < first["end"] and start - 0.5 > first["start"]:
                first["start"] = max(0, min(first["end"] - median, start))
            else:
                start = first["start"]
            if end > last["start"] and end + 0.5 < last["end"]:
                last["end"] = max(last["start"] + median, end)
            else:
                end = last["end"]
            last_speech = end
        timed.append(replace(segment, start=start, end=end, words=tuple(Word(**w) for w in words)))
    return timed


def last_word_end(segments: list[Segment]) -> float | None:
    """The end of the last word of `segments`, else of the last segment, else None."""
    for segment in reversed(segments):
        if segment.words:
            return segment.words[-1].end
    return segments[-1].end if segments else None
