"""The Python API: load a model once, then transcribe files or arrays.

    import wtx

    model = wtx.load_model("tiny.en", device="cpu", compile=False)
    segments, info = model.transcribe("book.mp3")
    for segment in segments:  # decoded lazily, batch by batch
        print(f"[{segment.start:.2f} -> {segment.end:.2f}] {segment.text}")
    print(info.duration, info.language, info.options)

The CLI is built on it: `Model.run()` takes many recordings at once and schedules their windows
through one set of batch rows (see wtx.streams).
"""

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from wtx.audio import SAMPLE_RATE, probe_duration
from wtx.errors import WtxError
from wtx.options import DecodingOptions
from wtx.segments import Segment
from wtx.streams import Recording, RecordingDone, WindowDone


@dataclass(frozen=True)
class TranscriptionInfo:
    duration: float | None  # seconds of audio (from the header; an array's length)
    language: str  # the language decoded: given, English for .en models, or detected
    options: dict = field(default_factory=dict)  # the options actually used


class Model:
    """A loaded (and with compile=True, compiled) engine; see load_model()."""

    def __init__(self, engine, detector=None, text_only_asked: bool | None = None):
        self.engine = engine
        self.detector = detector
        self.text_only_asked = text_only_asked  # load_model's without_timestamps (None: auto)
        self._lock = threading.Lock()  # the engine's buffers serve one call at a time (_turn)
        self._holder: int | None = None  # the thread whose call holds the lock

    @contextmanager
    def _turn(self):
        """The engine for one call at a time: a call from another thread waits for its turn;
        one from the thread holding it (an earlier call's segments not read to their end) raises
        WtxError, where waiting would never end."""
        if self._holder == threading.get_ident():
            raise WtxError("this thread is still reading an earlier call's segments from this "
                           "model: read them to the end, or close() them, first")  # fmt: skip
        with self._lock:
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._holder = None

    @property
    def options(self) -> dict:
        o = self.engine.options
        return {"model": o.model, "device": str(self.engine.device), "dtype": str(self.engine.dtype).removeprefix("torch."),
                "encoder_dtype": str(self.engine.encoder_dtype).removeprefix("torch."),
                "quantized": self.engine.quantized, "batch_size": o.batch_size, "compile": o.compile, "condition_on_previous_text": o.condition_on_previous_text,
                "task": o.decoding.task, "language": o.decoding.language, "vad": self.detector is not None,
                "decoding": asdict(o.decoding)}  # fmt: skip

    def run(self, recordings: Iterable[Recording], ordered: bool = False, word_timestamps: bool = False,
            vad: bool = False, word_probabilities: bool = True) -> Iterator[WindowDone | RecordingDone]:  # fmt: skip
        """Every recording's windows through one scheduler: WindowDone events (per recording in
        window order with `ordered`, else as each completes), then each RecordingDone. With
        `vad`, the model's voice-activity detector drops the windows without speech as they are
        read, scoring them in groups that run across recordings (windows from an AudioReader
        without a detector); without it, the windows are decoded as given. With
        `word_probabilities=False` timed words carry NaN probabilities (faster).
        Calls take turns (threads may share a model): the events of one call are all decoded
        before another's start, from its first event to its last (or to its close())."""
        detector = self.detector if vad else None
        with self._turn():
            scheduler = self.engine.scheduler(word_timestamps, word_probabilities)
            yield from scheduler.run(recordings, ordered, detector)

    def transcribe(self, audio: str | np.ndarray, split: str = "silence",
                   word_timestamps: bool = False) -> tuple[Iterator[Segment], TranscriptionInfo]:  # fmt: skip
        """Transcribes a file (anything ffmpeg reads) or a 16 kHz mono array: float samples in
        [-1, 1], or integer PCM, scaled as ffmpeg reads it (as_samples).

        Returns (segments, info): segments are yielded lazily in time order; info holds the
        duration, the language and the options used. With word_timestamps, each segment's
        `words` holds its words (`word`, `start`, `end`, `probability`), aligned as
        openai-whisper's word_timestamps=True does, and the segment's times come from them.
        A file that cannot be decoded raises
        wtx.errors.AudioError when the segments are iterated (for a multilingual model without
        a language, when its first window is read for language detection: here)."""
        from wtx.engine import pick_text_only
        from wtx.pipeline import AudioReader

        if split not in ("silence", "fixed"):
            raise ValueError(f"unknown split {split!r}: choose silence or fixed")
        automatic = self.text_only_asked is None  # load_model resolved it for windows that end in pauses
        if automatic and self.engine.options.decoding.without_timestamps and not pick_text_only(None, split):
            raise ValueError("split='fixed' cuts windows in the middle of speech, where text only often ends them "
                             "early (docs/accuracy.md): load the model with without_timestamps=False, or with "
                             "without_timestamps=True to keep text only")  # fmt: skip
        audio = as_samples(audio) if isinstance(audio, np.ndarray) else audio
        reader = AudioReader(audio, split, self.detector)
        duration = len(audio) / SAMPLE_RATE if isinstance(audio, np.ndarray) else probe_duration(audio)
        windows = iter(reader)
        language = self.engine.options.decoding.language
        if language is None and self.engine.dims.is_multilingual:  # detected before returning
            first = next(windows, None)
            with self._turn():
                language = self.engine.detect_language(first) if first is not None else "en"
            windows = _chain(first, windows)
        language = language or "en"
        recording = Recording("audio", windows, {}, language)
        options = {**self.options, "split": split, "language": language, "word_timestamps": word_timestamps}
        return self._segments(recording, word_timestamps), TranscriptionInfo(duration, language, options)

    def _segments(self, recording: Recording, word_timestamps: bool) -> Iterator[Segment]:
        for event in self.run([recording], ordered=True, word_timestamps=word_timestamps):
            if isinstance(event, WindowDone):
                yield from event.result.segments
            elif event.error is not None:
                raise event.error


def as_samples(audio: np.ndarray) -> np.ndarray:
    """A 1-D array of 16 kHz samples as the decoder takes them: floats as given (float32 in
    [-1, 1], as openai-whisper's load_audio returns); integer PCM scaled to [-1, 1] as ffmpeg
    reads it (int16 / 32768, int32 / 2**31, uint8 (x - 128) / 128). Raises InvalidOption (a
    ValueError) for more than one channel or samples that are not numbers."""
    from wtx.errors import InvalidOption

    if audio.ndim != 1:
        mono = "must be mono, a 1-D array of samples at 16 kHz"
        raise InvalidOption("audio", f"{mono}; got shape {audio.shape}")
    if audio.dtype.kind == "f":
        return audio
    if audio.dtype.kind not in "iu":
        numbers = "must be float32 samples in [-1, 1] or integer PCM"
        raise InvalidOption("audio", f"{numbers}, not {audio.dtype}")
    half = 2.0 ** (8 * audio.dtype.itemsize - 1)
    centre = half if audio.dtype.kind == "u" else 0.0
    return ((audio.astype(np.float64) - centre) / half).astype(np.float32)


def _chain(first, rest):
    if first is not None:
        yield first
        yield from rest


def load_model(
    name: str = "tiny.en", device: str | None = None, dtype: str | None = None, compile: bool = False,
    quantize: str | None = None, batch_size: int | None = None, language: str | None = None, task: str = "transcribe",
    condition_on_previous_text: bool | None = None, vad: bool = True, strict: bool = False, beam_size: int = 5,
    best_of: int | None = None, patience: float = 1.0, length_penalty: float | None = None,
    without_timestamps: bool | None = None,
) -> Model:
    """Loads a model: "tiny.en" or "base" (bundled), an openai-whisper name found in
    ~/.cache/whisper, or a .pt path. batch_size=None picks the batch that measured fastest for
    the model on the device, within its free memory (on an H200 64 for tiny.en and base greedy,
    32 with beam search; on a CPU 24 in text-only mode with each window alone, else 8);
    info.options says which.
    compile=True compiles (or loads cached artifacts of) the encoder and decode step;
    quantize: "auto" (None), "fp16", "int8" or "none", as the CLI's --quantize (auto, on a CPU
    in float32, eager: int8 logits where the CPU has VNNI, else the decoder's linear layers and
    logit projection with fp16 weights);
    vad=True drops windows without speech (Silero VAD) before decoding.
    beam_size, best_of, patience and length_penalty are openai-whisper's (its CLI's defaults):
    beam search at temperature 0 (beam_size=1: greedy), best-of sampling at fallback temperatures
    (best_of=None: as many samples as beams). Every batch holds max(beam_size, best_of) decoder
    rows per window, so best_of above beam_size costs every window, not only the fallbacks.
    without_timestamps=True decodes text only (openai-whisper's option): a window is one segment;
    False decodes the timestamp tokens; None (auto): text only, and transcribe(split="fixed")
    then raises ValueError: windows cut in the middle of speech end early in text only
    (engine.pick_text_only).
    condition_on_previous_text: prompt each window with the text before it; None (auto): with
    timestamps only (engine.resolve_modes). info.options says what was picked.
    language: a code or an English name, any case ("de", "German"); an English-only model
    given another language (or task="translate") warns and transcribes English, as
    openai-whisper does. A value that cannot run raises wtx.errors.InvalidOption (a
    ValueError) before anything loads: see check_arguments."""
    import warnings

    from wtx.autobatch import engine_batch_warning
    from wtx.engine import Engine, EngineOptions

    language, task = check_arguments(name, device, dtype, quantize, batch_size, language, task,
                                     beam_size, best_of, patience, length_penalty)  # fmt: skip
    options = EngineOptions(
        model=name, device=device, dtype=dtype, quantize=quantize, batch_size=batch_size, compile=compile, strict=strict,
        decoding=replace(DecodingOptions(), task=task, language=language, beam_size=beam_size, best_of=best_of or beam_size,
                         patience=patience, length_penalty=length_penalty, without_timestamps=without_timestamps),
        condition_on_previous_text=condition_on_previous_text,
    )  # fmt: skip
    engine = Engine(options)
    if batch_size is not None and (warning := engine_batch_warning(engine)):
        warnings.warn(warning, stacklevel=2)
    detector = None
    if vad:
        from wtx.vad import load_detector

        detector = load_detector(engine.device)
    return Model(engine, detector, without_timestamps)


def check_arguments(name, device, dtype, quantize, batch_size, language, task, beam_size, best_of,
                    patience, length_penalty) -> tuple[str | None, str]:  # fmt: skip
    """load_model's arguments checked as the CLI checks its flags (wtx.options), raising
    InvalidOption; returns the language (its code) and task to run, English and transcribe for
    an English-only model given others (with a warning)."""
    import warnings

    from wtx import options as o

    if batch_size is not None:
        o.check_count("batch_size", batch_size, 1, o.MAX_BATCH_SIZE)
    o.check_count("beam_size", beam_size, 1, o.MAX_GROUP)
    if best_of is not None:
        o.check_count("best_of", best_of, 1, o.MAX_GROUP)
    o.check_patience(patience, beam_size)
    o.check_length_penalty(length_penalty)
    o.check_choice("dtype", "auto" if dtype is None else dtype, o.DTYPES)
    o.check_choice("quantize", "auto" if quantize is None else quantize, o.QUANTIZE)
    o.check_choice("task", task, o.TASKS)
    language, task, warning = o.fit_english_only(str(name), o.language_code(language), task)
    if warning:
        warnings.warn(warning, stacklevel=3)
    o.check_device(device)
    return language, task
