"""The engine: batches windows through the rewritten Whisper and yields timed segments.

It never prints. Work is reported by returning results window by window; callers time and
display them. A decode loop syncs with the device only every `check_every` steps, to see
whether every row has reached end-of-text.

Like openai-whisper's transcribe(), each window is conditioned on the text before it (a
<|startofprev|> prompt). Batch rows are streams of consecutive windows: row r decodes its
windows one after another, each prompted with the text its previous one produced, while the
other rows do the same for other stretches of the recording.
"""

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from wtx.audio import N_FRAMES, N_SAMPLES, Window
from wtx.decode import GreedyLoop, TimestampRules, get_tokenizer
from wtx.options import DecodingOptions
from wtx.segments import WindowResult, split_segments
from wtx.streams import Recording, StreamOptions, StreamScheduler, WindowDone
from wtx.errors import UntrustedCache
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


def pick_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def repeatable_attention() -> None:
    """Turns PyTorch's cuDNN attention off, for this process (eager and compiled code alike).

    On the H200 (torch 2.11, fp16) SDPA picks cuDNN attention for unmasked attention, and for a
    decode step's cross-attention (one query over 1500 keys, batch 8) it gave different bits on
    repeated calls with the same inputs: the same command wrote different text from run to run.
    Flash attention, chosen instead, is bitwise repeatable there (scripts/fp16_probe.py)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


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
        if self.device.type == "cuda":
            repeatable_attention()
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

    def _language_tokens(self, languages: list[str | None], batch: int) -> torch.Tensor | None:
        """The language token per row (padding rows take the first row's), or None: an
        English-only model, or a row whose language is to be detected."""
        if not self.dims.is_multilingual or any(language is None for language in languages):
            return None
        tokens = [self.tokenizer.to_language_token(language) for language in languages]
        return torch.tensor(tokens + [tokens[0]] * (batch - len(tokens)), device=self.device)

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
        languages: list[str | None] | None = None,
    ) -> list[WindowResult]:
        """Timestamped decoding of up to batch_size windows at once.

        Every batch has the same shape, eager or compiled: padded with silent rows to
        batch_size, every prefix left-padded to the longest possible prompt. So a row's
        arithmetic, and its text, never depend on the other rows or on how many there are.

        prompts: per window, the previous text's tokens to condition on (may be empty);
        temperatures: per window, 0 for greedy (the default) or a sampling temperature. The
        sampling noise is seeded from the window's offset and temperature, so it does not
        depend on the rest of the batch. languages: per window (default `language` for all, or
        the engine's); None rows of a multilingual model are detected from the first row."""
        n = len(windows)
        temperatures = list(temperatures or [])
        temperatures += [0.0] * (n - len(temperatures))
        rows = self.fixed_batch or self.options.batch_size
        if n > rows:
            raise ValueError(f"batch of {n} windows exceeds the batch size {rows}")
        windows = windows + [silent_window()] * (rows - n)
        samples = self.stack(windows)
        loop = self._loop(len(windows))
        languages = languages or [language or self.options.decoding.language] * n
        language_tokens = self._language_tokens(languages, len(windows))
        needs_detection = self.dims.is_multilingual and language_tokens is None
        use_graph = self.prefill_graph is not None and not needs_detection
        prefix, pad = self._prefix(prompts, len(windows), fixed=True)
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
        from wtx import decode, features, model

        sources = [decode.__file__, __file__, features.__file__, model.__file__]  # what is traced
        key = compile_cache.bundle_key(self.dims, self.device, self.dtype, options.batch_size,
                                       f"{options.step_backend}-graph{int(options.cuda_graph)}-prefix{self.prefix_len}",
                                       sources)
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

    def scheduler(self) -> StreamScheduler:
        """The stream scheduler over this engine's batches (see wtx.streams)."""
        options = StreamOptions(
            batch_size=self.options.batch_size, max_prompt=self.max_prompt,
            stream_windows=self.options.stream_windows, seek_tails=self.options.seek_tails,
            decoding=self.options.decoding,
        )  # fmt: skip

        def decode(windows, languages, prompts, temperatures):
            return self.decode_batch(windows, prompts=prompts, temperatures=temperatures, languages=languages)

        detect = self.detect_language if self.dims.is_multilingual else None
        return StreamScheduler(decode, self.tokenizer, options, detect)

    def detect_language(self, window: Window) -> str:
        """The language spoken in `window` (multilingual models): a step of its own, once per file."""
        return self.decode_batch([window], languages=[None])[0].language

    def stream_length(self, duration: float | None) -> int:
        return self.scheduler().stream_length(duration)

    def transcribe_windows(
        self, windows: Iterable[Window], duration: float | None = None, prompts: dict[int, list[int]] | None = None,
        ordered: bool = True,
    ) -> Iterator[WindowResult]:
        """One recording's windows through the stream scheduler; a result per window, in window
        order (or with `ordered=False` as soon as each is complete). Raises the audio's error."""
        recording = Recording("", windows, duration, prompts or {}, self.options.decoding.language)
        for event in self.scheduler().run([recording], ordered):
            if isinstance(event, WindowDone):
                yield event.result
            elif event.error is not None:
                raise event.error
