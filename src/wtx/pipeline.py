"""From an input to the windows the scheduler decodes: audio -> windows -> speech windows.

The same path for the CLI, the Python API and the scripts: ffmpeg decodes the input streamed,
`split` cuts windows that end in pauses (silence skipped), and a voice-activity detector, where
given, drops windows without speech, in groups of this input's windows (`Model.transcribe`). The
CLI gives none: its scheduler scores the windows of all inputs in shared groups
(wtx.streams._speech_only), after the journaled ones were left out here; a window's score does
not depend on the windows beside it, so the decisions are the same either way.
"""

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from wtx.audio import N_SAMPLES, SAMPLE_RATE, Window, is_ready, stream_samples
from wtx.split import make_windows


class AudioReader:
    """One input's audio as windows; counts the seconds decoded and collects ffmpeg's warnings."""

    def __init__(self, source: str | np.ndarray, split: str = "silence", detector=None, skip: Iterable[int] = (),
                 read: Callable[..., Iterator[np.ndarray]] = stream_samples,
                 journaled: dict[int, tuple[float, float]] | None = None,
                 stale: Callable[[int], None] | None = None):  # fmt: skip
        """read(source, warnings=...): its decoded blocks (audio.stream_samples, or what
        wtx.readahead read while the model loaded). journaled: the skipped windows' (offset,
        duration) as a journal recorded them; from the first that is not the window read at its
        index (or that no window has), no window is skipped and stale(index) is called, before
        that window is yielded (or, for those past the end, once the audio ends)."""
        self.source = source
        self.read = read
        self.split = split
        self.detector = detector
        self.skip = set(skip)
        self.journaled = journaled
        self.stale = stale
        self.seconds = 0.0
        self.warnings: list[str] = []
        self.skipped_before: dict[int, float] = {}  # per window: audio before it that no window covers
        self.end = 0.0  # where the last window read ends

    def ready(self) -> bool:
        """Whether its audio can be read without waiting (a FIFO's writer may not have come yet)."""
        return isinstance(self.source, np.ndarray) or is_ready(self.source)

    def _blocks(self) -> Iterator[np.ndarray]:
        if isinstance(self.source, np.ndarray):
            samples = np.ascontiguousarray(self.source, dtype=np.float32)
            blocks: Iterable[np.ndarray] = (samples[i : i + N_SAMPLES] for i in range(0, len(samples), N_SAMPLES))
        else:
            blocks = self.read(self.source, warnings=self.warnings)
        for block in blocks:
            self.seconds += len(block) / SAMPLE_RATE
            yield block

    def __iter__(self) -> Iterator[Window]:
        windows = make_windows(self._blocks(), self.split)
        if self.detector is not None:
            from wtx.vad import speech_windows

            windows = speech_windows(windows, self.detector)
        pending = iter(sorted(self.journaled or ()))  # journaled indices not passed yet
        due = next(pending, None)
        for w in windows:
            self.skipped_before[w.index] = max(0.0, w.offset - self.end)
            self.end = max(self.end, w.offset + w.duration)
            if due is not None and due <= w.index:
                if due < w.index or self.journaled[due] != (w.offset, w.duration):
                    self._stale(due)  # a window the audio does not have, or not this one
                    due = pending = None
                else:
                    due = next(pending, None)
            if w.index not in self.skip:
                yield w
        if due is not None:  # journaled windows past the end of the audio
            self._stale(due)

    def _stale(self, index: int) -> None:
        """Journaled windows from `index` on do not match the audio: none of them is skipped."""
        self.skip = {i for i in self.skip if i < index}
        if self.stale is not None:
            self.stale(index)
