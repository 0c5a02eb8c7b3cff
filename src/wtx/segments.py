"""From a window's sampled tokens to timed text, and the tests transcribe() applies to them.

Plain Python over token lists (no torch): openai-whisper's segment splitting, seek point,
compression ratio and no-speech rule, and a window's decoding result.
"""

import zlib
from dataclasses import dataclass

from wtx.audio import CHUNK_LENGTH, Window
from wtx.options import DecodingOptions

TIME_PRECISION = 0.02  # seconds per timestamp token
MIN_CHARS_PER_SECOND = 5.0  # a segment's text slower than this skipped speech (speech runs 12-20)
MIN_STRETCHED_SECONDS = 4.0  # shorter segments are never taken for skips


@dataclass(frozen=True)
class Word:
    """A word with its absolute start and end (seconds) and its tokens' mean probability."""

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()
    words: tuple[Word, ...] = ()  # with word timestamps (wtx.timing); else empty


def split_segments(tokens: list[int], tokenizer, offset: float, duration: float) -> list[Segment]:
    """Turns one window's sampled tokens (up to end-of-text) into timed segments.

    Follows openai-whisper's transcribe(): consecutive timestamp pairs close segments; text
    after the last pair becomes a final segment ending at the last timestamp or the window end.
    Times are absolute (window offset added) and clipped to the window's real audio.
    """
    ts_begin = tokenizer.timestamp_begin
    window_end = offset + min(duration, CHUNK_LENGTH)

    def make(piece: list[int], start: float, end: float) -> Segment | None:
        text_tokens = [t for t in piece if t < tokenizer.eot]
        text = tokenizer.decode(text_tokens).strip()
        if not text:
            return None
        start = min(offset + start, window_end)
        end = min(max(offset + end, start), window_end)
        return Segment(round(start, 3), round(end, 3), text, tuple(text_tokens))

    segments: list[Segment] = []
    rest_start = 0
    for start, end in _closed_pieces(tokens, ts_begin):
        piece = tokens[start:end]
        seg = make(piece, (piece[0] - ts_begin) * TIME_PRECISION, (piece[-1] - ts_begin) * TIME_PRECISION)
        if seg:
            segments.append(seg)
        rest_start = end
    rest = tokens[rest_start:]
    if any(t < tokenizer.eot for t in rest):
        stamps = [t for t in rest if t >= ts_begin]
        start = (stamps[0] - ts_begin) * TIME_PRECISION if rest[0] >= ts_begin else 0.0
        end = (stamps[-1] - ts_begin) * TIME_PRECISION if rest[-1] >= ts_begin else CHUNK_LENGTH
        if end <= start:
            end = CHUNK_LENGTH
        seg = make(rest, start, end)
        if seg:
            segments.append(seg)
    return segments


def _closed_pieces(tokens: list[int], ts_begin: int) -> list[tuple[int, int]]:
    """(start, end) token indices of the pieces closed by a timestamp pair, in order."""
    is_ts = [t >= ts_begin for t in tokens]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    return list(zip([0, *cuts], cuts))


def stretches_timestamps(tokens: list[int], tokenizer) -> bool:
    """True when a closed segment's timestamps stretch far beyond its text.

    Whisper sometimes skips a sentence and stretches a neighbouring segment's timestamps across
    it: 45 characters over 17 s, where speech runs at 12 to 20 characters a second. Such a
    window is decoded again at the next fallback temperature, like a repetitive one. The final
    segment (ended by a single timestamp) is not judged: it may run on over a window's trailing
    pause."""
    ts_begin = tokenizer.timestamp_begin
    for start, end in _closed_pieces(tokens, ts_begin):
        seconds = (tokens[end - 1] - tokens[start]) * TIME_PRECISION
        if seconds < MIN_STRETCHED_SECONDS:
            continue
        text = tokenizer.decode([t for t in tokens[start:end] if t < tokenizer.eot]).strip()
        if len(text) < MIN_CHARS_PER_SECOND * seconds:
            return True
    return False


def _last_pair_end(tokens: list[int], tokenizer) -> int | None:
    """Index just past the last closed timestamp pair when transcribe() would seek there."""
    ts_begin = tokenizer.timestamp_begin
    is_ts = [t >= ts_begin for t in tokens]
    if is_ts[-2:] == [False, True]:  # single timestamp ending: the window was consumed
        return None
    pairs = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    return pairs[-1] if pairs else None


def seek_point(tokens: list[int], tokenizer) -> float | None:
    """Where openai-whisper's transcribe() would continue inside this window, in seconds.

    When the sampled tokens end with a closed timestamp pair (or text after one) instead of a
    single final timestamp, transcribe() drops the text after the last pair and decodes again
    from the pair's time. None: the window was consumed entirely."""
    end = _last_pair_end(tokens, tokenizer)
    if end is None:
        return None
    return (tokens[end - 1] - tokenizer.timestamp_begin) * TIME_PRECISION


def consumed_tokens(tokens: list[int], tokenizer) -> list[int]:
    """The tokens transcribe() keeps from a window (and conditions the next one on)."""
    end = _last_pair_end(tokens, tokenizer)
    return tokens if end is None else tokens[:end]


def compression_ratio(text: str) -> float:
    """openai-whisper's repetition measure: text bytes over their zlib-compressed size."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass
class WindowResult:
    window: Window
    tokens: list[int]  # sampled tokens up to (not including) end-of-text
    language: str
    no_speech_prob: float
    avg_logprob: float
    segments: list[Segment]
    temperature: float = 0.0
    prompt: list[int] | None = None  # the stream's prompt after this window (and its tails)
    last_speech: float | None = None  # with word timestamps: where the stream's speech ended after it

    def is_silent(self, options: DecodingOptions) -> bool:
        """openai-whisper's no-speech rule: likely silence and no likely text."""
        return self.no_speech_prob > options.no_speech_threshold and self.avg_logprob < options.logprob_threshold

    def needs_fallback(self, options: DecodingOptions, tokenizer) -> bool:
        """openai-whisper's test for decoding a window again at the next temperature, plus
        timestamps stretched over skipped speech."""
        if self.is_silent(options):
            return False
        text = " ".join(s.text for s in self.segments)
        repetitive = compression_ratio(text) > options.compression_ratio_threshold
        unlikely = self.avg_logprob < options.logprob_threshold
        # the stretch test decodes segment texts: only when the cheaper tests have not decided
        return repetitive or unlikely or stretches_timestamps(self.tokens, tokenizer)
