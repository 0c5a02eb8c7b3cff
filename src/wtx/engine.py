"""The engine: batches windows through the rewritten Whisper and yields timed segments.

It never prints. Work is reported by returning results window by window; callers time and
display them. A decode loop syncs with the device only every `check_every` steps, to see
whether every row has reached end-of-text.

Like openai-whisper's transcribe(), each window is conditioned on the text before it (a
<|startofprev|> prompt). Batch rows are streams of consecutive windows: row r decodes its
windows one after another, each prompted with the text its previous one produced, while the
other rows do the same for other stretches of the recording.
"""

import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import groupby

import numpy as np
import torch

from wtx.audio import CHUNK_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, Window, pad_window
from wtx.decode import (
    DecodingOptions,
    GreedyLoop,
    Segment,
    TimestampRules,
    compression_ratio,
    consumed_tokens,
    get_tokenizer,
    seek_point,
    split_segments,
    stretches_timestamps,
)
from wtx.errors import UntrustedCache
from wtx.features import log_mel_spectrogram
from wtx.prefetch import prefetch
from wtx.model import Whisper, load_model
from wtx.weights import load_checkpoint

MAX_TAIL_DEPTH = 2  # a tail may leave a tail of its own, once
MIN_TAIL_SECONDS = 1.0  # shorter remainders are not decoded again

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
    seek_tails: bool = True  # re-decode audio a window left undecoded, as transcribe() seeks
    condition_on_previous_text: bool = True  # prompt each window with its stream's previous text
    stream_windows: int = 8  # at most this many consecutive windows per batch row


FUNCTION_NAMES = ("encoder", "step-greedy", "step-sample")  # what is compiled ahead of time


class CompileError(RuntimeError):
    pass


@dataclass
class CompileReport:
    source: str  # "compiled", "loaded" (from the on-disk cache) or "eager" (fallback)
    seconds: float
    warnings: list[str] = field(default_factory=list)
    ahead_of_time: bool = False  # compiled with aot_compile (loaded without tracing), else just in time


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

    queue: deque  # of _Item
    prompt: list[int] = field(default_factory=list)


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


def run_encoder(encoder, mel):
    """The function compiled ahead of time for the encoder (its weights are inputs)."""
    return encoder(mel)


def run_step(loop):
    """The function compiled ahead of time for one decode step (see GreedyLoop)."""
    loop()


def _aot_compile(fn, *args):
    return torch.compile(fn, fullgraph=True, dynamic=False).aot_compile((args, {}))


@contextmanager
def step_variant(loop: GreedyLoop, sample: bool):
    """`loop` set to its greedy or sampling step variant for a block, then set back."""
    before = loop.sample
    loop.sample = sample
    try:
        yield loop
    finally:
        loop.sample = before


def capture(fn, device):
    """Warms `fn` up on a side stream, then records it as a CUDA graph: (graph, fn's outputs)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


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
        self.sot_sequence = torch.tensor(self.tokenizer.sot_sequence, device=self.device)
        self.sot_index = list(self.tokenizer.sot_sequence).index(self.tokenizer.sot)
        # a prompt is <|startofprev|> and up to n_text_ctx // 2 - 1 previous tokens, as in openai-whisper
        self.max_prompt = self.dims.n_text_ctx // 2 - 1 if options.condition_on_previous_text else 0
        n_sot = len(self.tokenizer.sot_sequence)
        self.prefix_len = n_sot + (1 + self.max_prompt if self.max_prompt else 0)  # longest prefix
        self.n_slots = self.prefix_len + self.sample_len
        self.slots = torch.arange(self.n_slots, device=self.device)
        self.prefill_graph = None  # CUDA graph of _prefill for fixed-batch CUDA engines
        self.loop: GreedyLoop | None = None
        self.step = None  # runs `steps_per_call` decode steps: eager, compiled or a CUDA graph
        self.steps_per_call = 1
        self.encoder = self.model.encoder
        self.fixed_batch: int | None = None  # compiled engines pad every batch to this size
        self.compile_report: CompileReport | None = None
        if options.compile:
            self.compile_report = self._compile()

    # -- one batch -----------------------------------------------------------------------

    def stack(self, windows: list[Window]) -> torch.Tensor:
        """The windows' samples as one [B, N_SAMPLES] CPU tensor, pinned when the model is on CUDA."""
        samples = torch.from_numpy(np.stack([w.samples for w in windows]))
        return samples.pin_memory() if self.device.type == "cuda" else samples

    def _language_tokens(self, language: str | None, batch: int) -> torch.Tensor | None:
        """The language token per row, or None (English-only model, or to be detected)."""
        if not self.dims.is_multilingual or language is None:
            return None
        return torch.full((batch,), self.tokenizer.to_language_token(language), device=self.device)

    def _detect_language(self, logits_at_sot: torch.Tensor) -> torch.Tensor:
        # logits_at_sot: [B, V] -> the most likely language token of the first row, for all rows
        lang_ids = torch.tensor(self.tokenizer.all_language_tokens, device=self.device)
        best = lang_ids[logits_at_sot[:1, lang_ids].argmax(dim=-1)]
        return best.expand(logits_at_sot.shape[0])

    def _loop(self, batch_size: int) -> GreedyLoop:
        # another engine may share the model and have reallocated its caches for other shapes
        caches_fit = (self.model.batch_size, self.model.n_slots) == (batch_size, self.n_slots)
        if self.loop is not None and self.step is not self.loop and not caches_fit:
            raise RuntimeError("another engine reallocated this compiled engine's caches: give each engine its own model")
        if self.loop is None or self.loop.sampled.shape[0] != batch_size or not caches_fit:
            self.model.setup_caches(batch_size, self.n_slots)
            self.loop = GreedyLoop(self.model.decoder, self.rules, batch_size, self.sample_len, self.device)
            self.step = self.loop
            self.steps_per_call = 1
        return self.loop

    def _prefix(self, prompts: list[list[int]] | None, n_rows: int, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's initial tokens per row, left-padded to one length: ([B, P], pad [B]).

        A row is [<|startofprev|>, *prompt, *sot_sequence], or the sot sequence alone without a
        prompt. P is the longest row, or the engine's longest possible prefix when `fixed`."""
        sot_sequence = list(self.tokenizer.sot_sequence)
        rows = []
        for i in range(n_rows):
            prompt = prompts[i][-self.max_prompt :] if prompts and i < len(prompts) and self.max_prompt else []
            rows.append(([self.tokenizer.sot_prev, *prompt] if prompt else []) + sot_sequence)
        width = self.prefix_len if fixed else max(len(r) for r in rows)
        pad = [width - len(r) for r in rows]
        tokens = [[self.tokenizer.eot] * p + r for p, r in zip(pad, rows)]
        return torch.tensor(tokens), torch.tensor(pad)

    def _prefill(self, samples, language_tokens, prefix, pad, temperature, seed):
        """Features, encoder, cross-attention K/V and the prefix tokens, then resets the loop.

        samples: [B, N_SAMPLES], prefix: [B, P], pad, temperature and seed: [B], all on the
        device. Pure tensor work (no host transfers), so it can be captured as a CUDA graph.
        Returns (no_speech_probs [B], language_tokens [B] or None)."""
        decoder = self.model.decoder
        n, width = prefix.shape
        mel = log_mel_spectrogram(samples, self.dims.n_mels).to(self.dtype)
        decoder.set_audio_features(self.encoder(mel))
        if self.dims.is_multilingual and language_tokens is None:
            sot = self.sot_sequence[:1].expand(n, 1)
            first = decoder(sot, self.slots[:1], torch.zeros_like(pad))[:, 0]
            language_tokens = self._detect_language(first)  # the file's first window decides
        sot_at = width - len(self.tokenizer.sot_sequence)  # the sot sequence ends every row
        if language_tokens is not None:
            prefix = torch.cat([prefix[:, : sot_at + 1], language_tokens[:, None], prefix[:, sot_at + 2 :]], dim=1)
        hidden = decoder.hidden(prefix, self.slots[:width], pad)
        sot = sot_at + self.sot_index
        logits = decoder.logits(torch.cat([hidden[:, sot : sot + 1], hidden[:, -1:]], dim=1))
        if self.tokenizer.no_speech is not None:
            no_speech = logits[:, 0].softmax(dim=-1)[:, self.tokenizer.no_speech]
        else:
            no_speech = torch.zeros(n, device=self.device)
        self.loop.reset(logits[:, 1], width, pad, temperature, seed)
        return no_speech, language_tokens

    def _run_steps(self, loop: GreedyLoop) -> None:
        """Runs decode steps until every row has ended or sample_len tokens were sampled."""
        every = max(self.options.check_every, self.steps_per_call)
        done = 0
        while done < self.sample_len:
            self.step()
            done += self.steps_per_call
            if done % every == 0 and bool(loop.finished.all()):  # the only host sync
                break

    @torch.no_grad()  # not inference_mode: functions compiled ahead of time guard on it
    def decode_batch(
        self,
        windows: list[Window],
        language: str | None = None,
        prompts: list[list[int]] | None = None,
        temperatures: list[float] | None = None,
    ) -> list[WindowResult]:
        """Timestamped decoding of up to batch_size windows at once.

        prompts: per window, the previous text's tokens to condition on (may be empty);
        temperatures: per window, 0 for greedy (the default) or a sampling temperature. The
        sampling noise is seeded from the window's offset and temperature, so it does not
        depend on the rest of the batch."""
        n = len(windows)
        temperatures = list(temperatures or [])
        temperatures += [0.0] * (n - len(temperatures))
        if self.fixed_batch is not None:
            if n > self.fixed_batch:
                raise ValueError(f"batch of {n} windows exceeds the compiled batch size {self.fixed_batch}")
            windows = windows + [silent_window()] * (self.fixed_batch - n)
        samples = self.stack(windows)
        loop = self._loop(len(windows))
        language_tokens = self._language_tokens(language or self.options.decoding.language, len(windows))
        needs_detection = self.dims.is_multilingual and language_tokens is None
        use_graph = self.prefill_graph is not None and not needs_detection
        prefix, pad = self._prefix(prompts, len(windows), fixed=use_graph)
        temperature = torch.tensor(temperatures + [0.0] * (len(windows) - n))
        loop.sample = any(t > 0 for t in temperatures)  # greedy batches skip the sampling noise
        seed = torch.tensor([round(w.offset * 50) * 16 + round(t * 10) for w, t in zip(windows, temperature.tolist())])
        if use_graph:
            self.static_samples.copy_(samples, non_blocking=True)
            self.static_prefix.copy_(prefix)
            self.static_pad.copy_(pad)
            self.static_temperature.copy_(temperature)
            self.static_seed.copy_(seed)
            if language_tokens is not None:
                self.static_language.copy_(language_tokens)
            self.prefill_graph.replay()
            no_speech, language_tokens = self.static_prefill_out
        else:
            device = self.device
            samples = samples.to(device, non_blocking=True)
            no_speech, language_tokens = self._prefill(
                samples, language_tokens, prefix.to(device), pad.to(device), temperature.to(device), seed.to(device)
            )
        self._run_steps(loop)
        return self._results(windows[:n], loop.sampled[:n], loop.sum_logprobs[:n], no_speech[:n], language_tokens, temperatures)

    # -- compilation ---------------------------------------------------------------------

    def _compile(self) -> CompileReport:
        """Compiles the encoder and the decode step for a fixed batch.

        Saved artifacts for this exact configuration are loaded first: the functions compiled
        ahead of time (no tracing at all) and the bundle of Inductor's caches; after a fresh
        compile both are saved. Failures fall back to eager with a warning, or raise
        CompileError when `strict`."""
        from wtx import compile_cache

        options = self.options
        started = time.perf_counter()
        warnings: list[str] = []
        compile_cache.configure()
        key = compile_cache.bundle_key(self.dims, self.device, self.dtype, options.batch_size,
                                       f"{options.step_backend}-graph{int(options.cuda_graph)}-prefix{self.prefix_len}")
        loaded = False
        try:
            loaded = compile_cache.load_bundle(key)
        except compile_cache.CorruptBundle as e:
            warnings.append(f"{e}; compiling from scratch")
        saved = all(compile_cache.function_path(key, name).is_file() for name in FUNCTION_NAMES)
        try:
            with compile_cache.in_process(loaded and saved):  # only loading: no compile workers
                precompiled = self._build_compiled(options.batch_size, key, warnings)
        except UntrustedCache:
            raise
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
        source = "loaded" if precompiled == "loaded" or (loaded and precompiled is None) else "compiled"
        return CompileReport(source, time.perf_counter() - started, warnings, ahead_of_time=precompiled is not None)

    def _build_compiled(self, batch_size: int, key: str, warnings: list[str]) -> str | None:
        """Compiles (or loads) the encoder and both step variants, then captures CUDA graphs.
        Returns "loaded" or "compiled" for functions compiled ahead of time, None
        when they were compiled just in time (ahead of time is not possible here)."""
        self.fixed_batch = batch_size
        loop = self._loop(batch_size)
        if self.options.step_backend not in ("inductor", "eager"):
            raise ValueError(f"unknown step backend {self.options.step_backend!r}")
        precompiled = None
        compiled_step = loop
        if self.options.step_backend == "inductor":
            try:
                precompiled, compiled_step = self._ahead_of_time(key, loop, warnings)
            except UntrustedCache:
                raise
            except Exception as e:  # an older torch, or one that cannot serialize this graph
                warnings.append(f"no ahead-of-time compile ({type(e).__name__}: {e}); compiling just in time")
                self.encoder = torch.compile(self.model.encoder, fullgraph=True, dynamic=False)
                compiled_step = torch.compile(loop, fullgraph=True, dynamic=False)
        self.step = compiled_step
        self.steps_per_call = 1
        if precompiled is None:  # eager step, or compiled just in time: first calls compile (or load) the graphs
            self._warm_up()
        if self.device.type == "cuda" and self.options.cuda_graph:  # capture() warms each graph's code up
            self._capture_cuda_graph(compiled_step)
            self._warm_up()  # one replay of each graph before real work
        return precompiled

    def _ahead_of_time(self, key: str, loop: GreedyLoop, warnings: list[str]):
        """The encoder and the step's two variants compiled with `torch.compile().aot_compile()`:
        loaded from the cache when saved there, else compiled and saved.

        A loaded function skips Dynamo's tracing, most of what a warm start used to cost. Each
        call checks the function's guards (shapes, dtypes, grad mode, the step variant) and
        raises rather than recompile. Returns ("loaded" or "compiled", the step function)."""
        from wtx import compile_cache

        names = FUNCTION_NAMES
        try:
            functions = [compile_cache.load_function(key, name) for name in names]
        except compile_cache.CorruptBundle as e:
            warnings.append(f"{e}; compiling from scratch")
            compile_cache.remove_functions(key, names)
            functions = [None]
        source = "loaded"
        mel = torch.zeros(self.fixed_batch, self.dims.n_mels, N_FRAMES, dtype=self.dtype, device=self.device)
        if not all(functions):
            source = "compiled"
            with torch.no_grad():
                functions = [_aot_compile(run_encoder, self.model.encoder, mel)]
                for sample in (False, True):
                    with step_variant(loop, sample):
                        functions.append(_aot_compile(run_step, loop))
        encoder_fn, greedy, sampling = functions
        self.encoder = partial(encoder_fn, self.model.encoder)
        steps = {False: greedy, True: sampling}

        def step() -> None:
            steps[loop.sample](loop)

        # no warm-up needed: nothing compiles on a first call; check each function's guards
        # here, so a mismatch falls back to compiling just in time rather than failing later
        with torch.no_grad():
            fits = encoder_fn.guard_check(self.model.encoder, mel)
            for sample, fn in steps.items():
                with step_variant(loop, sample):
                    fits = fits and fn.guard_check(loop)
        if not fits:
            if source == "loaded":  # saved by another build of torch or wtx: not to be tried again
                compile_cache.remove_functions(key, names)
            raise RuntimeError("the compiled functions' guards do not accept this engine's inputs")
        if source == "compiled":
            try:
                for name, fn in zip(names, functions):
                    compile_cache.save_function(key, name, fn)
            except Exception as e:  # the cache is an optimisation: never fail the job for it
                compile_cache.remove_functions(key, names)
                warnings.append(f"could not save compiled functions: {e}")
        return source, step

    def _warm_up(self) -> None:
        """Decodes silence greedily and by sampling: the step's two variants (see GreedyLoop)."""
        self.decode_batch([silent_window()])
        self.decode_batch([silent_window()], temperatures=[1.0])

    def _capture_cuda_graph(self, step) -> None:
        """Captures the prefill, and `check_every` consecutive decode steps, as CUDA graphs."""
        chunk = self.options.check_every if self.sample_len % self.options.check_every == 0 else 1
        batch = self.fixed_batch
        self.static_samples = torch.zeros(batch, N_SAMPLES, device=self.device)
        self.static_language = torch.full((batch,), self.tokenizer.sot, device=self.device)
        prefix, pad = self._prefix(None, batch, fixed=True)
        self.static_prefix = prefix.to(self.device)
        self.static_pad = pad.to(self.device)
        self.static_temperature = torch.zeros(batch, device=self.device)
        self.static_seed = torch.zeros(batch, dtype=torch.long, device=self.device)
        language = self.static_language if self.dims.is_multilingual else None

        def prefill():
            return self._prefill(self.static_samples, language, self.static_prefix, self.static_pad,
                                 self.static_temperature, self.static_seed)  # fmt: skip

        def steps():
            for _ in range(chunk):
                step()

        loop = self.loop
        graphs = {}
        with torch.no_grad():
            self.prefill_graph, self.static_prefill_out = capture(prefill, self.device)
            for sample in (False, True):  # the step's greedy and sampling variants
                with step_variant(loop, sample):
                    graphs[sample], _ = capture(steps, self.device)
        self.step = lambda: graphs[loop.sample].replay()
        self.steps_per_call = chunk

    def _reset_eager(self) -> None:
        self.fixed_batch = None
        self.prefill_graph = None
        self.encoder = self.model.encoder
        self.loop = None
        self.model.batch_size = 0
        self.model.n_slots = 0

    def _results(self, windows, sampled, sum_logprobs, no_speech_probs, language_tokens, temperatures) -> list[WindowResult]:
        eot = self.tokenizer.eot
        rows = sampled.cpu().tolist()
        sum_logprobs = sum_logprobs.cpu().tolist()
        no_speech = no_speech_probs.float().cpu().tolist()
        if language_tokens is None:
            languages = [self.options.decoding.language or "en"] * len(windows)
        else:
            languages = [self.tokenizer.decode([t]).strip("<|>") for t in language_tokens.tolist()]
        results = []
        for w, row, lp, ns, lang, t in zip(windows, rows, sum_logprobs, no_speech, languages, temperatures):
            tokens = row[: row.index(eot)] if eot in row else row
            avg_logprob = lp / (len(tokens) + 1)
            opts = self.options.decoding
            result = WindowResult(w, tokens, lang, ns, avg_logprob, [], t)
            if not result.is_silent(opts):
                result.segments = split_segments(tokens, self.tokenizer, w.offset, w.duration)
            results.append(result)
        return results

    # -- a whole recording ---------------------------------------------------------------

    def stream_length(self, duration: float | None) -> int:
        """Windows per batch row: enough to spread a recording of `duration` over every row."""
        if not self.options.condition_on_previous_text:
            return 1
        if duration is None:
            return self.options.stream_windows
        windows = math.ceil(duration / CHUNK_LENGTH)
        return max(1, min(self.options.stream_windows, math.ceil(windows / self.options.batch_size)))

    def transcribe_windows(
        self, windows: Iterable[Window], duration: float | None = None, prompts: dict[int, list[int]] | None = None,
        ordered: bool = True,
    ) -> Iterator[WindowResult]:
        """Decodes a recording's windows in batches; yields one result per window, in window
        order, or with `ordered=False` as soon as each is complete (so a caller can journal it
        at once: rows work on different stretches of the recording).

        Each batch row is a stream: it takes the windows of one chunk (`stream_length(duration)`
        consecutive window indices) and decodes them in turn, prompting each with the text of the
        one before (openai-whisper's condition_on_previous_text). When a window's tokens stop
        before its end with a closed timestamp pair, transcribe() would seek there and decode
        again; here that tail is the stream's next window (seek_tails), and its segments join its
        parent's result. A window that fails openai-whisper's compression-ratio or log-probability
        test is decoded again at the next fallback temperature. A background thread decodes audio
        ahead while the device works.

        prompts: a resumed run's finished windows, index -> the prompt after that window
        (WindowResult.prompt), so a chunk picked up midway continues as it would have."""
        language = self.options.decoding.language
        span = self.stream_length(duration)
        fresh = prefetch(windows, depth=2 * self.options.batch_size)
        chunks = (list(chunk) for _, chunk in groupby(fresh, key=lambda w: w.index // span))
        streams: list[_Stream | None] = [None] * self.options.batch_size
        entries: deque[dict] = deque()  # parents in window order, emitted once complete
        while True:
            for r, stream in enumerate(streams):
                if stream is None or not stream.queue:
                    streams[r] = self._stream(next(chunks, []), span, entries, prompts or {})
            active = [s for s in streams if s is not None]
            if not active:
                break
            batch = [s.queue.popleft() for s in active]
            texts = [s.prompt if item.prompted else [] for s, item in zip(active, batch)]
            results = self.decode_batch([item.window for item in batch], language, texts, [item.temperature for item in batch])
            if language is None and self.dims.is_multilingual:
                language = results[0].language  # detected once per file, on its first window
            for stream, item, result in zip(active, batch, results):
                self._advance(stream, item, result)
            while entries and entries[0]["open"] == 0:
                entry = entries.popleft()
                if not entry.get("yielded"):
                    yield entry["result"]
            if not ordered:
                for entry in entries:
                    if entry["open"] == 0 and not entry.get("yielded"):
                        entry["yielded"] = True
                        yield entry["result"]

    def _stream(self, chunk: list[Window], span: int, entries: deque, prompts: dict[int, list[int]]) -> "_Stream | None":
        """A row's stream over one chunk; a chunk a resumed run picks up midway keeps its prompt."""
        if not chunk:
            return None
        first = chunk[0].index
        midway = first % span != 0 and self.max_prompt
        stream = _Stream(deque(), list(prompts.get(first - 1, [])) if midway else [])
        for window in chunk:
            entry = {"result": None, "open": 1}
            entries.append(entry)
            stream.queue.append(_Item(window, entry))
        return stream

    def _advance(self, stream: "_Stream", item: "_Item", result: WindowResult) -> None:
        """Takes one decoded window into its stream: fallback, tail, prompt, parent result."""
        entry = item.entry
        options = self.options.decoding
        if item.prompted and stream.prompt and result.is_silent(options):
            # a prompt can talk the model out of a window's speech: decode it again on its own
            stream.queue.appendleft(replace(item, prompted=False))
            return
        fallback = options.fallback_temperatures
        attempt = fallback.index(item.temperature) + 1 if item.temperature in fallback else 0
        if attempt < len(fallback) and result.needs_fallback(options, self.tokenizer):
            stream.queue.appendleft(replace(item, temperature=fallback[attempt]))
            return
        tail = self._tail(result) if self.options.seek_tails and item.depth < MAX_TAIL_DEPTH else None
        if tail is not None:
            tail_window, start = tail
            # the text after the last closed pair starts at the seek time: the tail decodes it
            # again (segment times are rounded to 1 ms, timestamps are 20 ms apart)
            result.segments = [seg for seg in result.segments if seg.start < start - 0.01]
            stream.queue.appendleft(_Item(tail_window, entry, item.depth + 1))
            entry["open"] += 1
        self._condition(stream, result)
        if entry["result"] is None:
            entry["result"] = result
        else:
            entry["result"].segments.extend(result.segments)
        entry["open"] -= 1
        if entry["open"] == 0:
            entry["result"].prompt = list(stream.prompt)

    def _condition(self, stream: "_Stream", result: WindowResult) -> None:
        """Carries a window's text into its stream's prompt, as transcribe() does.

        Silent windows add nothing. After repetitive text (openai-whisper's compression-ratio
        test, failed at every temperature) or a window decoded above temperature 0.5, the
        prompt starts over, so a bad window does not lead the next one astray."""
        if not self.max_prompt or not result.segments:
            return
        text = " ".join(s.text for s in result.segments)
        if result.temperature > 0.5 or compression_ratio(text) > self.options.decoding.compression_ratio_threshold:
            stream.prompt = []
            return
        stream.prompt = (stream.prompt + consumed_tokens(result.tokens, self.tokenizer))[-self.max_prompt :]

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
