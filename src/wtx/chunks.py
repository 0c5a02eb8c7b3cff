"""What travels in a `--ray` run (wtx.cluster): files cut into chunks, and chunks decoded (no torch).

A chunk is the unit a batch row decodes in one go: a recording's consecutive windows whose
indices share `index // span` (wtx.streams). A prompt never crosses a chunk boundary, so a
chunk decodes to the same text wherever and beside whatever it runs. The driver plans each
file (`FilePlan`); the CPU stage decodes its audio with ffmpeg and cuts it (`cut_file`), giving
its `Chunk`s and then a `FileEnd`; a worker decodes each chunk into a `ChunkDone`.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import groupby

from wtx.audio import Window
from wtx.errors import WtxError
from wtx.pipeline import AudioReader
from wtx.segments import WindowResult


@dataclass(frozen=True)
class FilePlan:
    key: str  # the input's path, as the driver names it
    split: str
    span: int  # windows per chunk (wtx.streams.chunk_span)
    language: str | None
    skip: frozenset = frozenset()  # journaled windows: not decoded again
    prompts: dict[int, list[int]] = field(default_factory=dict)  # journaled: index -> prompt after it
    speech_ends: dict[int, float] = field(default_factory=dict)  # journaled: index -> last speech after it


@dataclass(frozen=True)
class Chunk:
    plan: FilePlan  # without the journal's prompts and speech ends outside this chunk
    number: int  # index // span of its windows
    windows: list[Window]
    skipped_before: dict[int, float]  # per window: audio before it that no window covers


@dataclass(frozen=True)
class FileEnd:
    key: str
    numbers: frozenset  # the chunks cut from the file
    seconds: float = 0.0  # audio decoded
    warnings: tuple[str, ...] = ()  # ffmpeg's
    error: Exception | None = None  # the audio failed: its chunks are incomplete


@dataclass(frozen=True)
class ChunkDone:
    key: str
    number: int
    results: list[WindowResult]  # in window order, without their samples
    skipped_before: dict[int, float]
    silent: tuple[tuple[int, float], ...] = ()  # (index, duration) of the windows the detector dropped


def _chunk(plan: FilePlan, number: int, windows: list[Window], skipped: dict[int, float]) -> Chunk:
    """A chunk with the journal's prompts and speech ends of its own windows only (the worker's
    scheduler picks the one it continues from)."""
    mine = {i for i in plan.prompts if i // plan.span == number}
    prompts = {i: plan.prompts[i] for i in mine}
    ends = {i: plan.speech_ends[i] for i in mine if i in plan.speech_ends}
    skipped_before = {w.index: skipped.get(w.index, 0.0) for w in windows}
    return Chunk(replace(plan, prompts=prompts, speech_ends=ends, skip=frozenset()), number, windows, skipped_before)


def cut_file(plan: FilePlan) -> Iterator[Chunk | FileEnd]:
    """The CPU stage: a file's audio decoded and cut into windows, grouped into chunks, then
    its FileEnd. Voice-activity detection is left to the worker, on the device a single process
    would run it on. A file that cannot be decoded ends with its error, never raises."""
    reader = AudioReader(plan.key, plan.split, detector=None, skip=plan.skip)
    numbers: set[int] = set()
    try:
        for number, windows in groupby(reader, key=lambda w: w.index // plan.span):
            numbers.add(number)
            yield _chunk(plan, number, list(windows), reader.skipped_before)
    except (WtxError, OSError) as e:
        yield FileEnd(plan.key, frozenset(numbers), reader.seconds, tuple(reader.warnings), e)
        return
    yield FileEnd(plan.key, frozenset(numbers), reader.seconds, tuple(reader.warnings))


def without_samples(result: WindowResult) -> WindowResult:
    """A window's result as it travels back: its 30 s of samples left behind."""
    return replace(result, window=replace(result.window, samples=None))
