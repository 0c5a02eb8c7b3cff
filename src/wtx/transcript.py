"""A transcript as the writers see it: timed text with its words, plain data (no torch)."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from wtx.segments import Word


@dataclass(frozen=True)
class TimedText:
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()  # with word timestamps


@dataclass
class Transcript:
    source: str
    duration: float
    language: str
    segments: Sequence[TimedText] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(s.text.strip() for s in self.segments if s.text.strip())


def timed_cues(transcript: Transcript) -> list[TimedText]:
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
