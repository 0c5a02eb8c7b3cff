"""The compiled runner: a batch decoder's encoder and decode steps compiled with Inductor.

It compiles (or loads from the on-disk cache) the encoder and the decode step's two variants,
checks their guards, captures CUDA graphs of the prefill and of `check_every` steps, and falls
back to eager when anything fails. It is the only module that touches Inductor.
"""

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch

from wtx import startup
from wtx.audio import N_FRAMES, N_SAMPLES
from wtx.batch import BatchDecoder, silent_window
from wtx.decode import DecodeLoop
from wtx.errors import UntrustedCache

FUNCTION_NAMES = ("encoder", "step-greedy", "step-sample")  # what is compiled ahead of time


class CompileError(RuntimeError):
    pass


@dataclass
class CompileReport:
    source: str  # "compiled", "loaded" (from the on-disk cache), "graphs" (CUDA graphs of eager kernels) or "eager" (fallback)
    seconds: float
    warnings: list[str] = field(default_factory=list)
    ahead_of_time: bool = False  # compiled with aot_compile (loaded without tracing), else just in time


def run_encoder(encoder, mel):
    """The function compiled ahead of time for the encoder (its weights are inputs)."""
    return encoder(mel)


def run_step(loop):
    """The function compiled ahead of time for one decode step (see DecodeLoop)."""
    loop()


def _aot_compile(fn, *args):
    return torch.compile(fn, fullgraph=True, dynamic=False).aot_compile((args, {}))


@contextmanager
def step_variant(loop: DecodeLoop, sample: bool):
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


class PrefillGraph:
    """A CUDA graph of `BatchDecoder.prefill` over static input tensors it owns."""

    def __init__(self, batch: BatchDecoder):
        rows, device = batch.batch_size, batch.device
        self.samples = torch.zeros(rows, N_SAMPLES, device=device)
        self.language = torch.full((rows,), batch.tokenizer.sot, device=device)
        prefix, pad = batch.prefix(None, rows)
        self.prefix, self.pad = prefix.to(device), pad.to(device)
        self.temperature = torch.zeros(batch.n_rows, device=device)
        self.seed = torch.zeros(batch.n_rows, dtype=torch.long, device=device)
        language = self.language if batch.dims.is_multilingual else None

        def prefill():
            return batch.prefill(self.samples, language, self.prefix, self.pad, self.temperature, self.seed)

        with torch.no_grad():
            self.graph, self.outputs = capture(prefill, device)

    def __call__(self, samples, language_tokens, prefix, pad, temperature, seed):
        """Copies the batch's inputs (host tensors; language tokens on the device) and replays."""
        self.samples.copy_(samples, non_blocking=True)
        self.prefix.copy_(prefix)
        self.pad.copy_(pad)
        self.temperature.copy_(temperature)
        self.seed.copy_(seed)
        if language_tokens is not None:
            self.language.copy_(language_tokens)
        self.graph.replay()
        return self.outputs


class CompiledRunner:
    """Installs compiled functions and CUDA graphs on a batch decoder, or leaves it eager.

    cache_key(sources) names the on-disk cache entry; `sources` are the files whose code is
    traced, named by the caller, so the key changes with any of them."""

    def __init__(self, batch: BatchDecoder, step_backend: str = "inductor", cuda_graph: bool = True,
                 strict: bool = False):  # fmt: skip
        if step_backend not in ("inductor", "eager"):
            raise ValueError(f"unknown step backend {step_backend!r}")
        self.batch = batch
        self.step_backend = step_backend
        self.cuda_graph = cuda_graph and batch.device.type == "cuda"
        self.strict = strict

    def variant(self) -> str:
        """What, besides shapes and sources, makes compiled artifacts differ."""
        d = self.batch.decoding
        groups = f"-group{d.group}-beams{d.beam_size}-best{d.best_of}-candidates{d.max_candidates}"
        text_only = "-notimestamps" if d.without_timestamps else ""  # the step has no timestamp rules
        return f"{self.step_backend}-graph{int(self.cuda_graph)}-prefix{self.batch.prefix_len}{groups}{text_only}"

    def compile(self, sources: list[str], on_status: Callable[[str], None] | None = None) -> CompileReport:
        """Compiles the encoder and the decode step for the decoder's fixed batch.

        Saved artifacts for this exact configuration are loaded first: the functions compiled
        ahead of time (no tracing at all) and the bundle of Inductor's caches; after a fresh
        compile both are saved. Failures fall back to eager with a warning, or raise
        CompileError when `strict`. on_status(line) hears what is about to happen."""
        from wtx import compile_cache

        batch = self.batch
        started = time.perf_counter()
        warnings: list[str] = []
        if self.step_backend == "eager":  # CUDA graphs of the eager kernels: nothing for Dynamo or Inductor
            if on_status is not None:
                on_status(f"capturing CUDA graphs of the decode step (batch {batch.batch_size}) ...")
            failed = self._fall_back(lambda: self._build("", warnings), started, warnings)
            return failed or CompileReport("graphs", time.perf_counter() - started, warnings)
        compile_cache.configure()
        startup.mark("Dynamo and Inductor imported")
        key = compile_cache.bundle_key(batch.dims, batch.device, batch.dtype, batch.batch_size, self.variant(), sources)
        loaded = False
        try:
            loaded = compile_cache.load_bundle(key)
        except compile_cache.CorruptBundle as e:
            warnings.append(f"{e}; compiling from scratch")
        startup.mark("Inductor's cache bundle loaded")
        saved = all(compile_cache.function_path(key, name).is_file() for name in FUNCTION_NAMES)
        if on_status is not None:
            on_status(f"loading the compiled encoder and decode step (batch {batch.batch_size}) ..." if loaded and saved
                      else f"compiling the encoder and decode step for batch {batch.batch_size} "
                           "(first run only: later runs load it) ...")  # fmt: skip
        built = []

        def build():
            with compile_cache.in_process(loaded and saved):  # only loading: no compile workers
                built.append(self._build(key, warnings))

        failed = self._fall_back(build, started, warnings)
        if failed:
            return failed
        precompiled = built[0]
        if not loaded:
            try:
                compile_cache.save_bundle(key)
            except Exception as e:  # the cache is an optimisation: never fail the job for it
                warnings.append(f"could not save compiled artifacts: {e}")
        source = "loaded" if precompiled == "loaded" or (loaded and precompiled is None) else "compiled"
        return CompileReport(source, time.perf_counter() - started, warnings, ahead_of_time=precompiled is not None)

    def _fall_back(self, build: Callable[[], object], started: float, warnings: list[str]) -> CompileReport | None:
        """Runs build(); where it fails, the decoder is left eager and the report says so
        (CompileError when strict; an untrusted cache is always an error)."""
        try:
            build()
        except UntrustedCache:
            raise
        except Exception as e:
            what = "torch.compile" if self.step_backend == "inductor" else "CUDA graph capture"
            if self.strict:
                raise CompileError(f"{what} failed: {type(e).__name__}: {e}") from e
            self._reset_eager()
            warnings.append(f"{what} failed ({type(e).__name__}: {e}); continuing eager")
            return CompileReport("eager", time.perf_counter() - started, warnings)
        return None

    def _build(self, key: str, warnings: list[str]) -> str | None:
        """Compiles (or loads) the encoder and both step variants, then captures CUDA graphs.
        Returns "loaded" or "compiled" for functions compiled ahead of time, None
        when they were compiled just in time (ahead of time is not possible here)."""
        batch = self.batch
        loop = batch.ensure_loop()
        batch.owns_caches = True
        precompiled = None
        step = loop
        if self.step_backend == "inductor":
            try:
                precompiled, step = self._ahead_of_time(key, loop, warnings)
            except UntrustedCache:
                raise
            except Exception as e:  # an older torch, or one that cannot serialize this graph
                warnings.append(f"no ahead-of-time compile ({type(e).__name__}: {e}); compiling just in time")
                batch.encoder = torch.compile(batch.model.encoder, fullgraph=True, dynamic=False)
                step = torch.compile(loop, fullgraph=True, dynamic=False)
        batch.step = step
        batch.steps_per_call = 1
        if precompiled is None:  # eager step (its first decode allocates the caches the graphs hold), or compiled just in time
            self._warm_up()
            startup.mark("warmed up" if step is loop else "warmed up (compiling just in time)")
        if self.cuda_graph:  # capture() warms each graph's code up
            self._capture_cuda_graphs(step)
            startup.mark("CUDA graphs captured")
            self._warm_up()  # one replay of each graph before real work
            startup.mark("CUDA graphs replayed once")
        return precompiled

    def _ahead_of_time(self, key: str, loop: DecodeLoop, warnings: list[str]):
        """The encoder and the step's two variants compiled with `torch.compile().aot_compile()`:
        loaded from the cache when saved there, else compiled and saved.

        A loaded function skips Dynamo's tracing, most of what a warm start used to cost. Each
        call checks the function's guards (shapes, dtypes, grad mode, the step variant) and
        raises rather than recompile. Returns ("loaded" or "compiled", the step function)."""
        from wtx import compile_cache

        batch, names = self.batch, FUNCTION_NAMES
        try:
            functions = [compile_cache.load_function(key, name) for name in names]
        except compile_cache.CorruptBundle as e:
            warnings.append(f"{e}; compiling from scratch")
            compile_cache.remove_functions(key, names)
            functions = [None]
        startup.mark("compiled functions read")
        source = "loaded"
        mel = torch.zeros(batch.batch_size, batch.dims.n_mels, N_FRAMES, dtype=batch.dtype, device=batch.device)
        if not all(functions):
            source = "compiled"
            with torch.no_grad():
                functions = [_aot_compile(run_encoder, batch.model.encoder, mel)]
                for sample in (False, True):
                    with step_variant(loop, sample):
                        functions.append(_aot_compile(run_step, loop))
        encoder_fn, greedy, sampling = functions
        batch.encoder = partial(encoder_fn, batch.model.encoder)
        steps = {False: greedy, True: sampling}

        def step() -> None:
            steps[loop.sample](loop)

        # no warm-up needed: nothing compiles on a first call; check each function's guards
        # here, so a mismatch falls back to compiling just in time rather than failing later
        with torch.no_grad():
            fits = encoder_fn.guard_check(batch.model.encoder, mel)
            for sample, fn in steps.items():
                with step_variant(loop, sample):
                    fits = fits and fn.guard_check(loop)
        startup.mark("compiled (first run)" if source == "compiled" else "guards checked")
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
        """Decodes silence greedily and by sampling: the step's two variants (see DecodeLoop)."""
        self.batch.decode([silent_window()])
        self.batch.decode([silent_window()], temperatures=[1.0])

    def _capture_cuda_graphs(self, step) -> None:
        """Captures the prefill, and `check_every` consecutive decode steps, as CUDA graphs."""
        batch = self.batch
        chunk = batch.check_every if batch.sample_len % batch.check_every == 0 else 1

        def steps():
            for _ in range(chunk):
                step()

        loop = batch.loop
        graphs = {}
        batch.prefill_graph = PrefillGraph(batch)
        with torch.no_grad():
            for sample in (False, True):  # the step's greedy and sampling variants
                with step_variant(loop, sample):
                    graphs[sample], _ = capture(steps, batch.device)
        batch.step = lambda: graphs[loop.sample].replay()
        batch.steps_per_call = chunk

    def _reset_eager(self) -> None:
        batch = self.batch
        batch.owns_caches = False
        batch.prefill_graph = None
        batch.encoder = batch.model.encoder
        batch.loop = None
        batch.model.batch_size = 0
        batch.model.n_slots = 0
