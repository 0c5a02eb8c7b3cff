"""Voice-activity detection: windows that hold no speech are never decoded.

Whisper turns noise, tones and music into invented sentences. Before decoding, every window
goes through Silero VAD (the `silero-vad` package's TorchScript model, MIT licensed, verified
by its pinned sha256 and never imported as a package): a window with less than MIN_SPEECH
seconds of 32 ms frames above THRESHOLD speech probability is dropped, as silence is. Windows
keep their index and offset, so times and resumes are unchanged.

Windows are scored in groups of GROUP, padded with silence to a fixed batch, so a window's
score does not depend on where a group boundary falls or on how many windows are left; a row's
score depends only on that shape, not on the windows beside it, so the CLI's scheduler and Ray's
workers fill groups with the windows of several inputs (wtx.streams._speech_only). Where
the package is not installed, the energy rules of `split` (silence is skipped) are all there
is, and the caller says so.
"""

import hashlib
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from wtx.audio import SAMPLE_RATE, Window
from wtx.errors import WeightsMismatch
from wtx.weights import package_file

PACKAGE = "silero_vad"
MODEL_FILE = "data/silero_vad.jit"
SHA256 = "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720"  # silero-vad 6.2.3
INSTALL = "pip install silero-vad==6.2.3"
CHUNK = 512  # samples the model scores at a time (32 ms at 16 kHz)
THRESHOLD = 0.5  # Silero's default speech probability
MIN_SPEECH = 0.25  # seconds of speech frames a window needs (Silero's min_speech_duration_ms)
GROUP = 16  # windows scored together on a CPU
PARTS = 8  # stretches per window scored side by side on a CPU (3.75 s each)
CUDA_GROUP = 64  # on a GPU, where each of the model's sequential steps costs kernel launches
CUDA_PARTS = 4  # (7.5 s each)


def model_file() -> Path | None:
    """The installed package's model, found without importing (running) the package."""
    return package_file(PACKAGE, MODEL_FILE)


class SpeechDetector:
    """Silero VAD on a device; `speech(windows)` tells which windows hold speech."""

    def __init__(self, path: Path, device="cpu"):
        import torch

        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != SHA256:
            raise WeightsMismatch(f"{path}: sha256 is {digest}, expected {SHA256}; reinstall with: "
                                  f"pip install --force-reinstall silero-vad==6.2.3")  # fmt: skip
        import io

        import warnings

        self.device = torch.device(device)
        self.group = CUDA_GROUP if self.device.type == "cuda" else GROUP
        self.parts = CUDA_PARTS if self.device.type == "cuda" else PARTS
        with warnings.catch_warnings():  # "torch.jit.load is deprecated": nothing a user can act on
            warnings.simplefilter("ignore", DeprecationWarning)
            self.model = torch.jit.load(io.BytesIO(data), map_location=self.device).eval()
        self.graph = None
        if self.device.type == "cuda":
            self._capture()

    def _frames(self, x):
        """The model over x [rows, N] in CHUNK steps from a fresh state: [rows, N // CHUNK]."""
        import torch

        self.model.reset_states()
        with torch.no_grad():
            return self._steps(x)

    def _steps(self, x):
        """The model over x in CHUNK steps from the state it holds (`_frames`; the graph)."""
        import torch

        frames = [self.model(x[:, i : i + CHUNK], SAMPLE_RATE) for i in range(0, x.shape[1] - CHUNK + 1, CHUNK)]
        return torch.cat(frames, dim=1)

    def _capture(self) -> None:
        """On CUDA a group's scoring is hundreds of sequential steps of small kernels, bound by
        their launches: it is recorded once as a CUDA graph over a static input of the group's
        fixed shape, and replayed for every group (`_replay`). TorchScript runs it unoptimised,
        so that the kernels recorded are the ones every call would run (its profiling executor
        would fuse them after a few calls). The model makes its fresh state on the CPU, which a
        capture cannot copy: the state is made by two calls before it and zeroed before each
        replay, as a reset makes it. Capture errors are confined to this thread: the reader
        calls the detector while the decoder runs on the main thread. Where the capture fails,
        the detector runs call by call."""
        import torch

        from wtx.audio import N_SAMPLES

        rows = self.group * self.parts
        try:
            with torch.jit.optimized_execution(False), torch.no_grad():
                self.static = torch.zeros(rows, N_SAMPLES // self.parts, device=self.device)
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # the libraries' first-use set-up, outside the graph
                    self._frames(torch.zeros(rows, 2 * CHUNK, device=self.device))
                    self.state = (self.model._state, self.model._context)  # what the first step reads
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self.scores = self._steps(self.static)
            self.graph = graph
        except RuntimeError:
            self.graph = None
            torch.cuda.synchronize(self.device)

    def _replay(self, x):
        for t in self.state:
            t.zero_()
        self.static.copy_(x)
        self.graph.replay()
        return self.scores.clone()  # the graph's output is overwritten by the next replay

    def probabilities(self, samples: np.ndarray):
        """Speech probability per 32 ms frame: samples [B, N] -> [B, N // CHUNK] (a tensor)."""
        import torch

        x = torch.from_numpy(samples)
        if self.graph is not None and x.shape == self.static.shape:
            return self._replay(x)
        with torch.jit.optimized_execution(self.device.type != "cuda"):  # on CUDA as the graph runs it
            return self._frames(x.to(self.device))

    def speech(self, windows: list[Window]) -> list[bool]:
        """Whether each of up to `group` windows holds speech. A window is scored as `parts`
        independent stretches side by side, fewer sequential steps, with the same decisions.
        Against groups of 8 windows in 4 stretches, a CPU's 16 windows in 8 stretches measured
        faster on a long book and as fast on the bundled sample, and over the 171 windows of
        ../shared's recordings and tests/test_hardening's noise, tones, music and room tone, no
        decision changed (speech frames per window moved a little). On a GPU
        a group of 64 windows in 4 stretches is one CUDA graph."""
        rows = np.zeros((self.group, windows[0].samples.shape[0]), dtype=np.float32)
        for i, w in enumerate(windows):
            rows[i] = w.samples
        probs = self.probabilities(rows.reshape(self.group * self.parts, -1))
        speech_frames = (probs > THRESHOLD).reshape(self.group, -1).sum(dim=1).tolist()
        needed = MIN_SPEECH * SAMPLE_RATE / CHUNK
        return [frames >= needed for frames in speech_frames[: len(windows)]]


def load_detector(device="cpu") -> SpeechDetector | None:
    """The detector, or None where silero-vad is not installed."""
    path = model_file()
    return SpeechDetector(path, device) if path is not None else None


def speech_windows(windows: Iterable[Window], detector: SpeechDetector) -> Iterator[Window]:
    """The windows that hold speech, in order; the others are dropped as silence is."""
    it = iter(windows)
    while group := list(islice(it, detector.group)):
        for window, speech in zip(group, detector.speech(group)):
            if speech:
                yield window
