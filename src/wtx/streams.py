"""The stream scheduler: every recording of a job through one set of batch rows (no torch).

Each batch row is a *stream*: it takes a chunk (consecutive windows of one recording) and
decodes its windows in turn, prompting each with the text of the one before (openai-whisper's
condition_on_previous_text). When a row's chunk is done it takes the next chunk of any
recording, so one batch holds chunks of several files and the rows stay full across a folder of
short clips. A recording is cut into chunks of the same number of windows whatever its length
and the batch size, and a row's result depends only on its own windows and prompt (the batch
decoder pads every batch to the same shape), so a file's text is the same alone or among
others, in any order.

Within a stream, as transcribe() does:
- a window whose tokens stop before its end with a closed timestamp pair leaves a *tail*, the
  audio after the seek point, which is the stream's next window (its segments join its parent's);
- a window that fails the compression-ratio or log-probability test is decoded again at the next
  fallback temperature;
- a prompted window that comes out silent is decoded again without its prompt;
- the prompt starts over after repetitive text or a window decoded above temperature 0.5.

Recordings are read ahead in a background thread (audio decoding overlaps the device's work).
A recording whose audio fails midway is reported once, and its other windows are dropped; the
other recordings go on.
"""

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from queue import Empty, Queue

from wtx.audio import SAMPLE_RATE, Window, pad_window
from wtx.options import DecodingOptions
from wtx.prefetch import prefetch
from wtx.segments import WindowResult, compression_ratio, consumed_tokens, seek_point
from wtx.words import WordTiming, add_word_timestamps, last_word_end

MAX_TAIL_DEPTH = 2  # a tail may leave a tail of its own, once
MIN_TAIL_SECONDS = 1.0  # shorter remainders are not decoded again
# recordings due their RecordingDone before more are read: each may hold resources its caller
# opened for it (the CLI's journal), so a run of inputs without speech must not pile them up
MAX_DUE = 16
WAITING_POLL = 0.05  # seconds between looks at recordings not ready to be read


@dataclass(frozen=True)
class StreamOptions:
    batch_size: int = 8
    max_prompt: int = 223  # previous-text tokens a prompt keeps; 0: every window decoded alone
    stream_windows: int = 8  # consecutive windows per chunk, where windows are prompted
    seek_tails: bool = True
    decoding: DecodingOptions = field(default_factory=DecodingOptions)


@dataclass(frozen=True)
class Recording:
    """One input as the scheduler sees it."""

    key: Hashable  # the caller's handle, returned with every event
    windows: Iterable[Window]  # in index order; iterating may raise (a decode error); ready(): _read
    prompts: dict[int, list[int]] = field(default_factory=dict)  # journaled: index -> prompt after it
    language: str | None = None  # None: detected on its first window (multilingual models)
    speech_ends: dict[int, float] = field(default_factory=dict)  # journaled: index -> last speech after it
    span: int | None = None  # windows per chunk, where the caller cut the chunks (None: chunk_span)
    silent: Callable[[int, float], None] | None = None  # (index, duration) of each window the detector drops


@dataclass(frozen=True)
class WindowDone:
    key: Hashable
    result: WindowResult


@dataclass(frozen=True)
class RecordingDone:
    key: Hashable
    error: Exception | None = None  # the audio failed: its windows are incomplete


@dataclass(frozen=True)
class _Item:
    """A window waiting in a stream: a recording's window, or a tail or retry of one."""

    window: Window
    entry: dict  # the parent window's result, complete when nothing of it is open
    depth: int = 0  # tails of tails
    temperature: float = 0.0
    prompted: bool = True  # False: decoded without its stream's prompt (a retry)


@dataclass
class _Stream:
    """One batch row's consecutive windows still to decode, and the text to prompt them with."""

    state: "_State"
    queue: deque  # of _Item
    prompt: list[int] = field(default_factory=list)
    last_speech: float = 0.0  # where its last word ended (word timestamps), or where it started


@dataclass
class _State:
    recording: Recording
    span: int
    language: str | None
    entries: deque = field(default_factory=deque)  # parents in window order
    ended: bool = False  # every window was read
    failed: bool = False
    error: Exception | None = None


Decode = Callable[[list[Window], list[str | None], list[list[int]], list[float]], list[WindowResult]]
Align = Callable[[list[list[int] | None], list[Window], list[str]], list[list[WordTiming]]]


class StreamScheduler:
    def __init__(self, decode: Decode, tokenizer, options: StreamOptions, detect_language=None, align: Align | None = None):
        """decode(windows, languages, prompts, temperatures) -> one result per window: the batch
        decoder. detect_language(window) -> a language code, for recordings without one (None:
        English-only model). align(texts, windows, languages) -> each window's words, for the
        batch just decoded (None: no word timestamps)."""
        self.decode = decode
        self.tokenizer = tokenizer
        self.options = options
        self.detect_language = detect_language
        self.align = align
        self.batches = 0  # batches decoded, and the rows they used: how full the rows were kept
        self.rows_used = 0

    def stream_length(self) -> int:
        """Windows per chunk (chunk_span)."""
        return chunk_span(self.options.max_prompt, self.options.stream_windows)

    def run(self, recordings: Iterable[Recording], ordered: bool = True, detector=None) -> Iterator[WindowDone | RecordingDone]:
        """Decodes every recording's windows; yields each window's result (per recording in window
        order, or with `ordered=False` as soon as it is complete) and then its RecordingDone.
        With a `detector` (wtx.vad.SpeechDetector), windows without speech are dropped as they
        are read (`_speech_only`)."""
        items = _read(recordings)
        if detector is not None:
            items = _speech_only(items, detector)
        items = prefetch(items, depth=2 * self.options.batch_size)
        return self._loop(_Chunks(lambda block: next(items, None), self), ordered)

    def serve(self, feed: Queue) -> Iterator[WindowDone | RecordingDone]:
        """Decodes recordings as they arrive on `feed` (their windows in memory; None ends it),
        as a long-lived worker does (wtx.cluster): rows left free wait for nothing while others
        decode, and are filled from whatever has arrived by the next batch."""
        return self._loop(_Chunks(_feed_items(feed), self), ordered=False)

    def _loop(self, chunks: "_Chunks", ordered: bool) -> Iterator[WindowDone | RecordingDone]:
        rows: list[_Stream | None] = [None] * self.options.batch_size
        states: list[_State] = []
        while True:
            for r, stream in enumerate(rows):
                while stream is None or not stream.queue or stream.state.failed:
                    busy = any(s is not None and s.queue and not s.state.failed for s in rows)
                    stream = chunks.next_stream(states, block=not busy)
                    if stream is None:
                        break
                rows[r] = stream
            active = [s for s in rows if s is not None and s.queue]
            if active:
                batch = [s.queue.popleft() for s in active]
                self.batches += 1
                self.rows_used += len(batch)
                results = self.decode(
                    [item.window for item in batch], [s.state.language for s in active],
                    [s.prompt if item.prompted else [] for s, item in zip(active, batch)],
                    [item.temperature for item in batch],
                )  # fmt: skip
                kept = [self._judge(stream, item, result) for stream, item, result in zip(active, batch, results)]
                if self.align is not None:
                    self._add_words(active, results, kept)
                for stream, item, result, keep in zip(active, batch, results, kept):
                    if keep:
                        self._take(stream, item, result)
            yield from _completed(states, ordered)
            states[:] = [s for s in states if not _finished(s)]
            if not active and chunks.exhausted:
                return

    def _judge(self, stream: _Stream, item: _Item, result: WindowResult) -> bool:
        """Whether a decoded window is kept: False when it goes back to its stream's queue (at the
        next fallback temperature, or without its prompt). A kept window that stopped early leaves
        its tail at the front of the queue and keeps only the segments before the seek point."""
        options = self.options.decoding
        if item.prompted and stream.prompt and result.is_silent(options):
            # a prompt can talk the model out of a window's speech: decode it again on its own
            stream.queue.appendleft(replace(item, prompted=False))
            return False
        fallback = options.fallback_temperatures
        attempt = fallback.index(item.temperature) + 1 if item.temperature in fallback else 0
        if attempt < len(fallback) and result.needs_fallback(options, self.tokenizer):
            stream.queue.appendleft(replace(item, temperature=fallback[attempt]))
            return False
        tail = self._tail(result) if self.options.seek_tails and item.depth < MAX_TAIL_DEPTH else None
        if tail is not None:
            tail_window, start = tail
            # the text after the last closed pair starts at the seek time: the tail decodes it
            # again (segment times are rounded to 1 ms, timestamps are 20 ms apart)
            result.segments = [seg for seg in result.segments if seg.start < start - 0.01]
            stream.queue.appendleft(_Item(tail_window, item.entry, item.depth + 1))
            item.entry["open"] += 1
        return True

    def _add_words(self, streams: list[_Stream], results: list[WindowResult], kept: list[bool]) -> None:
        """Word timestamps for the kept windows of the batch just decoded, in one aligning pass;
        each stream carries where its speech last ended into its next window, as transcribe() does."""
        texts = [[t for seg in r.segments for t in seg.tokens] if keep and r.segments else None
                 for r, keep in zip(results, kept)]  # fmt: skip
        alignments = self.align(texts, [r.window for r in results], [r.language for r in results])
        for stream, result, text, alignment in zip(streams, results, texts, alignments):
            if text is None:
                continue
            result.segments = add_word_timestamps(result.segments, alignment, result.window.offset, stream.last_speech)
            stream.last_speech = last_word_end(result.segments)

    def _take(self, stream: _Stream, item: _Item, result: WindowResult) -> None:
        """Takes a kept window into its stream's prompt and its parent's result."""
        entry = item.entry
        self._condition(stream, result)
        if entry["result"] is None:
            entry["result"] = result
        else:
            entry["result"].segments.extend(result.segments)
        entry["open"] -= 1
        if entry["open"] == 0:
            entry["result"].prompt = list(stream.prompt)
            entry["result"].last_speech = stream.last_speech

    def _condition(self, stream: _Stream, result: WindowResult) -> None:
        """Carries a window's text into its stream's prompt, as transcribe() does.

        Silent windows add nothing. After repetitive text (openai-whisper's compression-ratio
        test, failed at every temperature) or a window decoded above temperature 0.5, the
        prompt starts over, so a bad window does not lead the next one astray."""
        max_prompt = self.options.max_prompt
        if not max_prompt or not result.segments:
            return
        text = " ".join(s.text for s in result.segments)
        if result.temperature > 0.5 or compression_ratio(text) > self.options.decoding.compression_ratio_threshold:
            stream.prompt = []
            return
        stream.prompt = (stream.prompt + consumed_tokens(result.tokens, self.tokenizer))[-max_prompt:]

    def _tail(self, result: WindowResult) -> tuple[Window, float] | None:
        """The audio after the seek point, as a window, with the seek time; None when none is left."""
        w = result.window
        seek = seek_point(result.tokens, self.tokenizer) if result.segments else None
        if seek is None or seek <= 0 or w.duration - seek < MIN_TAIL_SECONDS:
            return None
        start = int(round(seek * SAMPLE_RATE))
        end = int(round(w.duration * SAMPLE_RATE))
        samples = pad_window(w.samples[start:end].copy())
        return Window(w.index, w.offset + seek, w.duration - seek, samples), w.offset + seek


def chunk_span(max_prompt: int, stream_windows: int) -> int:
    """Windows per chunk: `stream_windows` when windows are prompted, whatever the recording's
    length and the batch size, so a file's prompts (and text) depend on neither; 1 without
    prompts, every window a chunk of its own that any row may take."""
    return stream_windows if max_prompt else 1


_END = object()
_NOT_READY = object()
_WAIT = object()  # (None, _WAIT): the reading waits for an input (_read); what was read goes first


def _read(recordings: Iterable[Recording]) -> Iterator[tuple]:
    """(recording, window), then (recording, _END) or (recording, error), for each recording in
    turn: runs ahead in a thread. A recording whose windows can't be read yet (their `ready()`
    says False: a FIFO without a writer) waits while the others are read, so it holds up none."""
    waiting: list[Recording] = []
    for recording in recordings:
        waiting.append(recording)
        while (ready := next((r for r in waiting if _ready(r)), None)) is not None:
            waiting.remove(ready)
            yield from _windows(ready)
    waited = False
    while waiting:
        ready = next((r for r in waiting if _ready(r)), None)
        if ready is None and not waited:
            yield None, _WAIT
            waited = True
        if ready is None and len(waiting) > 1:
            time.sleep(WAITING_POLL)
            continue
        ready = ready or waiting[0]  # the last one waits in its reading
        waiting.remove(ready)
        waited = False
        yield from _windows(ready)


def _ready(recording: Recording) -> bool:
    ready = getattr(recording.windows, "ready", None)
    return ready is None or ready()


def _windows(recording: Recording) -> Iterator[tuple]:
    try:
        for window in recording.windows:
            yield recording, window
    except Exception as e:  # this recording's audio failed; the others go on
        yield recording, e
        return
    yield recording, _END


def _speech_only(items: Iterator[tuple], detector) -> Iterator[tuple]:
    """The read-ahead items without the windows that hold no speech. The detector scores its
    groups of windows across recordings, so a folder of short clips fills every group instead of
    padding one group per clip: a window's score depends on the group's fixed shape, not on the
    windows beside it, so a file's decisions are the same alone or among others, resumed or not.
    A recording's end (or error) waits with its last windows until their group is scored, or until
    the reading waits for an input (_WAIT)."""
    held: list[tuple] = []
    windows = 0
    for item in items:
        if item[1] is _WAIT:  # scored now, not when an input that may never come fills the group
            yield from _scored(held, detector)
            held, windows = [], 0
            yield item
            continue
        held.append(item)
        windows += isinstance(item[1], Window)
        if windows == detector.group:
            yield from _scored(held, detector)
            held, windows = [], 0
    yield from _scored(held, detector)


def _scored(held: list[tuple], detector) -> Iterator[tuple]:
    windows = [payload for _, payload in held if isinstance(payload, Window)]
    speech = iter(detector.speech(windows) if windows else ())
    for recording, payload in held:
        if not isinstance(payload, Window) or next(speech):
            yield recording, payload
        elif recording.silent is not None:
            recording.silent(payload.index, payload.duration)  # in the reading thread


def _feed_items(feed: Queue) -> Callable[[bool], object]:
    """next_item(block) over the recordings put on `feed`: (recording, window) pairs, then
    (recording, _END); _NOT_READY when nothing has arrived and block is False; None at the end."""
    current: deque = deque()

    def next_item(block: bool):
        if not current:
            try:
                recording = feed.get(block=block)
            except Empty:
                return _NOT_READY
            if recording is None:
                return None
            current.extend((recording, window) for window in recording.windows)
            current.append((recording, _END))
        return current.popleft()

    return next_item


class _Chunks:
    """Turns the read-ahead windows into row streams, one chunk at a time, in input order."""

    def __init__(self, next_item: Callable[[bool], object], scheduler: StreamScheduler):
        """next_item(block) -> the next (recording, window or _END or error), None at the end,
        or _NOT_READY when block is False and nothing has been read yet."""
        self.next_item = next_item
        self.scheduler = scheduler
        self.pending: tuple | None = None
        self.state: _State | None = None  # the recording being read
        self.exhausted = False

    def _peek(self, block: bool = True) -> tuple | None:
        if self.pending is None and not self.exhausted:
            item = self.next_item(block)
            if item is _NOT_READY:
                return None
            self.pending = item
            self.exhausted = self.pending is None
        return self.pending

    def _take(self) -> tuple:
        item, self.pending = self.pending, None
        return item

    def next_stream(self, states: list[_State], block: bool = True) -> _Stream | None:
        """The stream over the next chunk of any recording; None when every window was read
        (or, unless `block`, when the next has not been read yet). A recording with nothing
        left to decode is due its RecordingDone, so while one is, nothing is waited for (a
        worker's call may be waiting on it). Past MAX_DUE such recordings, None: they are
        reported before more is read. Where the reading waits for an input (_WAIT), None too
        until nothing else is left to do."""
        while sum(map(_finished, states)) < MAX_DUE:
            item = self._peek(wait := block and not any(map(_finished, states)))
            if item is None:
                return None
            if item[1] is _WAIT:  # the reading waits for an input: what was read goes first
                if not wait:
                    return None
                self._take()
                continue
            recording, payload = item
            if self.state is None or self.state.recording is not recording:
                self.state = self._open(recording)
                states.append(self.state)
            if payload is _END or isinstance(payload, Exception):
                self._take()
                self.state.ended = True
                if isinstance(payload, Exception):
                    self.state.failed = True
                    self.state.error = payload
                continue
            return self._chunk(self.state)
        return None

    def _open(self, recording: Recording) -> _State:
        language = recording.language
        if language is None and self.scheduler.detect_language is not None:
            _, first = self._peek()
            if isinstance(first, Window):
                language = self.scheduler.detect_language(first)
        return _State(recording, recording.span or self.scheduler.stream_length(), language)

    def _chunk(self, state: _State) -> _Stream:
        """Reads one chunk's windows (those with the same index // span) into a new stream."""
        windows = []
        while (item := self._peek()) is not None and item[0] is state.recording and isinstance(item[1], Window):
            if windows and item[1].index // state.span != windows[0].index // state.span:
                break
            windows.append(self._take()[1])
        # a chunk a resumed run picks up midway continues from its last journaled window's prompt
        # and speech end (windows dropped as silence in between were never in its stream)
        first, span, recording = windows[0].index, state.span, state.recording
        done = [i for i in recording.prompts if i < first and i // span == first // span]
        last = max(done) if done else None
        prompt = list(recording.prompts[last]) if last is not None and self.scheduler.options.max_prompt else []
        last_speech = recording.speech_ends.get(last, windows[0].offset) if last is not None else windows[0].offset
        stream = _Stream(state, deque(), prompt, last_speech)
        for window in windows:
            entry = {"result": None, "open": 1, "yielded": False}
            state.entries.append(entry)
            stream.queue.append(_Item(window, entry))
        return stream


def _finished(state: _State) -> bool:
    return state.ended and (state.failed or not state.entries)


def _completed(states: list[_State], ordered: bool) -> Iterator[WindowDone | RecordingDone]:
    for state in states:
        key = state.recording.key
        if not state.failed:
            while state.entries and state.entries[0]["open"] == 0:
                entry = state.entries.popleft()
                if not entry["yielded"]:
                    yield WindowDone(key, entry["result"])
            if not ordered:
                for entry in state.entries:
                    if entry["open"] == 0 and not entry["yielded"]:
                        entry["yielded"] = True
                        yield WindowDone(key, entry["result"])
        if _finished(state):
            yield RecordingDone(key, state.error)
