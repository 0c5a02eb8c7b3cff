"""The engine: batches windows through the rewritten Whisper and yields timed segments.

It never prints. Work is reported by returning results window by window; callers time and
display them. A decode loop syncs with the device only every `check_every` steps, to see
whether every row has reached end-of-text.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
import time
from itertools import islice

import numpy as np
import torch

from wtx.audio import N_SAMPLES, Window
from wtx.decode import (
    DecodingOptions,
    GreedyLoop,
    Segment,
    TimestampRules,
    get_tokenizer,
    split_segments,
)
from wtx.features import log_mel_spectrogram
from wtx.model import Whisper, load_model
from wtx.weights import load_checkpoint

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class EngineOptions:
    model: str = "tiny.en"
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str | None = None  # None: fp16 on cuda, fp32 on cpu
    batch_size: int = 8
    check_every: int = 8  # decode steps between all-rows-finished checks
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    compile: bool = False  # torch.compile the encoder and the decode step (Inductor)
    strict: bool = False  # a failed compile is an error instead of a warning and eager fallback
    cuda_graph: bool = True  # on CUDA, replay the compiled decode steps as one CUDA graph
    step_backend: str = "inductor"  # "inductor", or "eager": CUDA-graph the eager kernels only


class CompileError(RuntimeError):
    pass


@dataclass
class CompileReport:
    source: str  # "compiled", "loaded" (from the on-disk bundle) or "eager" (fallback)
    seconds: float
    warnings: list[str] = field(default_factory=list)


@dataclass
class WindowResult:
    window: Window
    tokens: list[int]  # sampled tokens up to (not including) end-of-text
    language: str
    no_speech_prob: float
    avg_logprob: float
    segments: list[Segment]

    @property
    def is_silent(self) -> bool:
        return not self.segments


def pick_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def silent_window() -> Window:
    """Padding for a compiled engine's fixed batch; its results are discarded."""
    return Window(index=-1, offset=0.0, duration=0.0, samples=np.zeros(N_SAMPLES, dtype=np.float32))


def batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch


class Engine:
    def __init__(self, options: EngineOptions = EngineOptions(), model: Whisper | None = None):
        self.options = options
        self.device = pick_device(options.device)
        self.dtype = pick_dtype(options.dtype, self.device)
        if model is None:
            checkpoint = load_checkpoint(options.model)
            model = load_model(checkpoint, self.device, self.dtype)
        self.model = model
        self.dims = model.dims
        decoding = options.decoding
        if not self.dims.is_multilingual and decoding.language not in (None, "en"):
            raise ValueError(f"{options.model} is English-only; it cannot use --language {decoding.language}")
        self.tokenizer = get_tokenizer(self.dims, decoding.language or "en", decoding.task)
        self.rules = TimestampRules(self.tokenizer, self.dims.n_vocab, decoding, self.device)
        self.sample_len = min(decoding.sample_len, self.dims.n_text_ctx // 2)
        self.loop: GreedyLoop | None = None
        self.step = None  # runs `steps_per_call` decode steps: eager, compiled or a CUDA graph
        self.steps_per_call = 1
        self.encoder = self.model.encoder
        self.fixed_batch: int | None = None  # compiled engines pad every batch to this size
        self.compile_report: CompileReport | None = None
        if options.compile:
            self.compile_report = self._compile()

    # -- one batch -----------------------------------------------------------------------

    def encode(self, windows: list[Window]) -> torch.Tensor:
        samples = torch.from_numpy(np.stack([w.samples for w in windows])).to(self.device)
        mel = log_mel_spectrogram(samples, self.dims.n_mels).to(self.dtype)
        return self.encoder(mel)

    def _initial_tokens(self, language_tokens: torch.Tensor | None, batch: int) -> torch.Tensor:
        sot_sequence = list(self.tokenizer.sot_sequence)
        tokens = torch.tensor([sot_sequence] * batch, device=self.device)
        if language_tokens is not None and len(sot_sequence) > 1:
            tokens[:, 1] = language_tokens
        return tokens

    def _detect_language(self, logits_at_sot: torch.Tensor) -> torch.Tensor:
        # logits_at_sot: [B, V] -> the most likely language token per row [B]
        lang_ids = torch.tensor(self.tokenizer.all_language_tokens, device=self.device)
        return lang_ids[logits_at_sot[:, lang_ids].argmax(dim=-1)]

    def _loop(self, batch_size: int) -> GreedyLoop:
        if self.loop is None or self.loop.sampled.shape[0] != batch_size:
            self.model.setup_caches(batch_size)
            self.loop = GreedyLoop(self.model.decoder, self.rules, batch_size, self.sample_len, self.device)
            self.step = self.loop
            self.steps_per_call = 1
        return self.loop

    def _prefill(self, windows: list[Window], language: str | None):
        """Encoder, cross-attention K/V and the initial tokens; returns (logits [B, V], no_speech, languages)."""
        decoder = self.model.decoder
        n = len(windows)
        decoder.set_audio_features(self.encode(windows))
        language_tokens = None
        if self.dims.is_multilingual and language is None:
            sot = torch.full((n, 1), self.tokenizer.sot, device=self.device)
            first = decoder(sot, torch.zeros(1, dtype=torch.long, device=self.device))[:, 0]
            language_tokens = self._detect_language(first)[:1].expand(n)  # the file's first window
        elif self.dims.is_multilingual:
            token = self.tokenizer.to_language_token(language)
            language_tokens = torch.full((n,), token, device=self.device)
        initial = self._initial_tokens(language_tokens, n)
        logits = decoder(initial, torch.arange(initial.shape[1], device=self.device))
        sot_index = list(self.tokenizer.sot_sequence).index(self.tokenizer.sot)
        if self.tokenizer.no_speech is not None:
            no_speech = logits[:, sot_index].softmax(dim=-1)[:, self.tokenizer.no_speech]
        else:
            no_speech = torch.zeros(n, device=self.device)
        return logits[:, -1], initial.shape[1], no_speech, language_tokens

    def _run_steps(self, loop: GreedyLoop) -> None:
        """Runs decode steps until every row has ended or sample_len tokens were sampled."""
        every = max(self.options.check_every, self.steps_per_call)
        done = 0
        while done < self.sample_len:
            self.step()
            done += self.steps_per_call
            if done % every == 0 and bool(loop.finished.all()):  # the only host sync
                break

    @torch.inference_mode()
    def decode_batch(self, windows: list[Window], language: str | None = None) -> list[WindowResult]:
        """Greedy timestamped decoding of up to batch_size windows at once."""
        n = len(windows)
        if self.fixed_batch is not None:
            if n > self.fixed_batch:
                raise ValueError(f"batch of {n} windows exceeds the compiled batch size {self.fixed_batch}")
            windows = windows + [silent_window()] * (self.fixed_batch - n)
        loop = self._loop(len(windows))
        logits, n_initial, no_speech, language_tokens = self._prefill(
            windows, language or self.options.decoding.language
        )
        loop.reset(logits, n_initial)
        self._run_steps(loop)
        return self._results(windows[:n], loop.sampled[:n], loop.sum_logprobs[:n], no_speech[:n], language_tokens)

    # -- compilation ---------------------------------------------------------------------

    def _compile(self) -> CompileReport:
        """Compiles the encoder and the decode step for a fixed batch, warming up on silence.

        A saved bundle of compiled artifacts is loaded first when one exists for this exact
        configuration; after a fresh compile, one is saved. Failures fall back to eager with a
        warning, or raise CompileError when `strict`."""
        from wtx import compile_cache

        options = self.options
        started = time.perf_counter()
        warnings: list[str] = []
        compile_cache.configure()
        key = compile_cache.bundle_key(self.dims, self.device, self.dtype, options.batch_size,
                                       f"{options.step_backend}-graph{int(options.cuda_graph)}")
        loaded = False
        try:
            loaded = compile_cache.load_bundle(key)
        except compile_cache.CorruptBundle as e:
            warnings.append(f"{e}; compiling from scratch")
        try:
            self._build_compiled(options.batch_size)
        except Exception as e:
            if options.strict:
                raise CompileError(f"torch.compile failed: {type(e).__name__}: {e}") from e
            self._reset_eager()
            warnings.append(f"torch.compile failed ({type(e).__name__}: {e}); continuing eager")
            return CompileReport("eager", time.perf_counter() - started, warnings)
        if not loaded:
            try:
                compile_cache.save_bundle(key)
            except Exception as e:  # the cache is an optimisation: never fail the job for it
                warnings.append(f"could not save compiled artifacts: {e}")
        return CompileReport("loaded" if loaded else "compiled", time.perf_counter() - started, warnings)

    def _build_compiled(self, batch_size: int) -> None:
        self.fixed_batch = batch_size
        loop = self._loop(batch_size)
        if self.options.step_backend == "inductor":
            self.encoder = torch.compile(self.model.encoder, fullgraph=True, dynamic=False)
            compiled_step = torch.compile(loop, fullgraph=True, dynamic=False)
        elif self.options.step_backend == "eager":
            compiled_step = loop
        else:
            raise ValueError(f"unknown step backend {self.options.step_backend!r}")
        self.step = compiled_step
        self.steps_per_call = 1
        self.decode_batch([silent_window()])  # compiles (or loads) both graphs
        if self.device.type == "cuda" and self.options.cuda_graph:
            self._capture_cuda_graph(compiled_step)
            self.decode_batch([silent_window()])  # one replay before real work

    def _capture_cuda_graph(self, step) -> None:
        """Captures `check_every` consecutive decode steps as one CUDA graph."""
        chunk = self.options.check_every if self.sample_len % self.options.check_every == 0 else 1
        self.loop.reset(torch.zeros_like(self.loop.logits), len(self.tokenizer.sot_sequence))
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream, as CUDA graph capture requires
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            for _ in range(chunk):
                step()
        self.cuda_graph = graph
        self.step = graph.replay
        self.steps_per_call = chunk

    def _reset_eager(self) -> None:
        self.fixed_batch = None
        self.encoder = self.model.encoder
        self.loop = None
        self.model.batch_size = 0

    def _results(self, windows, sampled, sum_logprobs, no_speech_probs, language_tokens) -> list[WindowResult]:
        eot = self.tokenizer.eot
        rows = sampled.cpu().tolist()
        sum_logprobs = sum_logprobs.cpu().tolist()
        no_speech = no_speech_probs.float().cpu().tolist()
        if language_tokens is None:
            languages = [self.options.decoding.language or "en"] * len(windows)
        else:
            languages = [self.tokenizer.decode([t]).strip("<|>") for t in language_tokens.tolist()]
        results = []
        for w, row, lp, ns, lang in zip(windows, rows, sum_logprobs, no_speech, languages):
            tokens = row[: row.index(eot)] if eot in row else row
            avg_logprob = lp / (len(tokens) + 1)
            opts = self.options.decoding
            silent = ns > opts.no_speech_threshold and avg_logprob < opts.logprob_threshold
            segments = [] if silent else split_segments(tokens, self.tokenizer, w.offset, w.duration)
            results.append(WindowResult(w, tokens, lang, ns, avg_logprob, segments))
        return results

    # -- a whole recording ---------------------------------------------------------------

    def transcribe_windows(self, windows: Iterable[Window]) -> Iterator[WindowResult]:
        """Decodes a recording's windows in batches; yields results in window order."""
        language = self.options.decoding.language
        for batch in batched(windows, self.options.batch_size):
            results = self.decode_batch(batch, language)
            if language is None and self.dims.is_multilingual:
                language = results[0].language  # detected once per file, on its first window
            yield from results
