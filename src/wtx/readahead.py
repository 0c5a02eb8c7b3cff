"""Audio decoded while the model loads: ffmpeg starts on the first inputs before torch does (no torch).

A run spends its first seconds importing torch, starting CUDA and loading the model, and its
first batch then needs a window of every row's chunk, spread over whole files. So the CLI
hands its inputs to `ReadAhead` before anything else. It starts ffmpeg at once on the first
few, each read by a thread that keeps the decoded blocks, up to a shared budget of memory.
When the scheduler reaches an input, `stream_samples` hands over what its thread has read,
and the thread goes on a few blocks ahead of the reader, as long as the file lasts.

Only where an ffmpeg binary decodes: the threads then wait on pipes, while PyAV's per-frame
loop would hold the interpreter lock that the imports need. Pipes and stdin are read by the
scheduler alone, once, as before.
"""

import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from wtx import audio
from wtx.errors import AudioError
from wtx.names import display

BUDGET_BYTES = 256 << 20  # decoded samples held for inputs not reached yet: 70 min of audio
AHEAD_BLOCKS = 4  # blocks read ahead of an input's reader once it is reached
_END = object()


class _Feed:
    """One input's blocks, read by its own thread."""

    def __init__(self, source: str):
        self.source = source
        self.blocks: deque = deque()  # arrays, then _END or the exception that ended the read
        self.warnings: list[str] = []
        self.taken = False  # the scheduler reads it: the shared budget no longer applies
        self.stop = False


class ReadAhead:
    """Decodes the first `max_inputs` of `sources` in background threads from now on."""

    def __init__(self, sources: Iterable[str], budget: int = BUDGET_BYTES, max_inputs: int | None = None):
        self.budget = budget
        self.held = 0  # bytes of blocks of inputs not reached yet
        self.changed = threading.Condition()
        self.feeds: dict[str, _Feed] = {}  # every input read ahead, reached (taken) or not
        if audio.ffmpeg_binary() is None:
            return
        limit = max_inputs if max_inputs is not None else min(8, os.cpu_count() or 1)
        for source in sources:
            if len(self.feeds) >= limit:
                break
            if source in self.feeds or audio.is_pipe(source) or not audio.is_readable_input(source):
                continue
            feed = self.feeds[source] = _Feed(source)
            threading.Thread(target=self._read, args=(feed,), name="wtx-readahead", daemon=True).start()

    def stream_samples(self, source: str, warnings: list[str] | None = None) -> Iterator[np.ndarray]:
        """audio.stream_samples(source), from what was read ahead where there is any."""
        with self.changed:
            feed = self.feeds.get(source)
            if feed is None or feed.taken or feed.stop:  # asked for again, or after close()
                return audio.stream_samples(source, warnings=warnings)
            feed.taken = True  # what it read no longer counts against the budget
            self.held -= sum(b.nbytes for b in feed.blocks if isinstance(b, np.ndarray))
            self.changed.notify_all()
        return self._take(feed, [] if warnings is None else warnings)

    def close(self) -> None:
        """Stops every thread still reading, reached or not (their ffmpeg processes end)."""
        with self.changed:
            for feed in self.feeds.values():
                feed.stop = True
            self.changed.notify_all()

    def _full(self, feed: _Feed) -> bool:
        if feed.taken:
            return len(feed.blocks) >= AHEAD_BLOCKS
        return self.held >= self.budget

    def _read(self, feed: _Feed) -> None:
        blocks, end = None, _END
        try:
            blocks = audio.stream_samples(feed.source, warnings=feed.warnings)
            for block in blocks:
                with self.changed:
                    while self._full(feed) and not feed.stop:
                        self.changed.wait()
                    if feed.stop:  # a reader still waiting learns that the rest is missing
                        end = AudioError(f"{display(feed.source)}: reading stopped before its end")
                        break
                    feed.blocks.append(block)
                    if not feed.taken:
                        self.held += block.nbytes
                    self.changed.notify_all()
        except Exception as e:  # the reader raises it, as audio.stream_samples would
            end = e
        finally:
            if blocks is not None:
                blocks.close()  # kills ffmpeg if the read stopped early
        with self.changed:
            feed.blocks.append(end)
            self.changed.notify_all()

    def _take(self, feed: _Feed, warnings: list[str]) -> Iterator[np.ndarray]:
        try:
            while True:
                with self.changed:
                    while not feed.blocks:
                        self.changed.wait()
                    item = feed.blocks.popleft()
                    self.changed.notify_all()
                if item is _END:
                    warnings.extend(feed.warnings)
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            with self.changed:
                feed.stop = True
                self.changed.notify_all()
