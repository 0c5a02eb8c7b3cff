"""The engine: wires a model, a batch decoder, the compiled runner and the stream scheduler.

It never prints. Work is reported by returning results window by window; callers time and
display them.

By default windows are decoded as text only, each window alone, as faster-whisper's batched
pipeline (resolve_modes): every row of a batch takes any window. With Whisper's timestamp tokens
(--timestamps, and windows cut every 30 s), each window is conditioned on the text before it, as
openai-whisper's transcribe() does (a <|startofprev|> prompt): batch rows are streams of consecutive windows,
row r decoding its windows one after another, each prompted with the text its previous one
produced, while the other rows do the same for other stretches of the recording, or for other
recordings (wtx.streams).
"""

from collections.abc import Iterable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from wtx import batch as batch_module, beam, compiled, decode, features, model as model_module, startup
from wtx.audio import Window
from wtx.align import BatchAligner
from wtx.autobatch import pick_batch_size
from wtx.batch import BatchDecoder
from wtx.compiled import CompileError, CompileReport, CompiledRunner
from wtx.decode import get_tokenizer
from wtx.model import Whisper, load_model
from wtx.options import EngineOptions
from wtx.quantize import fp16_linears, fp16_projection, has_vnni, int8_projection
from wtx.segments import WindowResult
from wtx.streams import Recording, StreamOptions, StreamScheduler, WindowDone
from wtx.weights import load_checkpoint

__all__ = ["CompileError", "CompileReport", "Engine", "EngineOptions", "native_bf16", "pick_device", "pick_dtype",
           "pick_condition", "pick_cross_dtype", "pick_encoder_dtype", "pick_quantize", "pick_text_only", "resolve_modes"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TRACED_SOURCES = [m.__file__ for m in (batch_module, beam, compiled, decode, features, model_module)]  # the cache key


def pick_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """"auto" (or None): fp16 on CUDA, fp32 on a CPU (whose encoder may run in bf16: pick_encoder_dtype).

    bf16 is not the CPU's default, even where the CPU runs it natively: with AVX-512 BF16 it
    measured faster than float32 but less accurate, at beam 5 and greedy (scripts/bench_cpu.py,
    docs/benchmarks.md)."""
    if dtype in (None, "auto"):
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX; Linux's CPU flags). Other
    CPUs convert bf16 to float32 and back around every operation."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_encoder_dtype(dtype: str | None, device: torch.device, model_dtype: torch.dtype, compile: bool = False,
                       native: bool | None = None) -> torch.dtype:  # fmt: skip
    """The encoder's dtype: the model's, except for "auto" (or None) on a CPU in float32, eager,
    that computes bf16 natively: there the encoder runs in bf16 and the decoder in float32.

    With AVX-512 BF16 a window's encoder measured faster in bf16 than in float32, at the same
    WER over the five long files of scripts/eval_wer.py, at beam 5 and greedy
    (docs/benchmarks.md). The whole model in bf16 was less accurate at beam 5, mostly through
    the logits' rounding. native: whether the CPU that runs it computes bf16
    natively (default: this one's)."""
    auto = dtype in (None, "auto") and device.type == "cpu" and model_dtype == torch.float32 and not compile
    return torch.bfloat16 if auto and (native_bf16() if native is None else native) else model_dtype


def pick_cross_dtype(quantized: str | None, encoder_dtype: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The cross-attention keys and values' dtype: bf16 with int8 logits where the encoder runs
    in bf16 (--dtype auto on a CPU that computes bf16 natively), else the model's.

    A decode step reads every window's keys and values over its 1,500 audio frames in each layer:
    bf16 halves those bytes, and on a CPU the steps measured faster, more so with int8 logits
    (docs/benchmarks.md). They are rounded to bf16, so the text moves (alone, with timestamp
    tokens, enough to decode more windows again), so it comes with int8 logits only
    (--quantize int8, the default on a CPU with VNNI); with timestamps and prompts, a run
    measured faster than fp16's at about its WER."""
    native = quantized == "int8" and encoder_dtype == torch.bfloat16 and dtype == torch.float32
    return torch.bfloat16 if native else dtype


def pick_text_only(without_timestamps: bool | None, split: str = "silence") -> bool:
    """Whether windows are decoded as text only (openai-whisper's without_timestamps). None
    (auto): text only where windows end in pauses (`split` "silence"), on every device;
    Whisper's timestamp tokens where they are cut every 30 s ("fixed").

    Text only, each window is one segment: no window tail is decoded again and a batch takes
    fewer steps. Against timestamps and prompts, whole processes measured faster and the WER
    lower on the long files measured, on a CPU and on a GPU, at beam 5 and greedy
    (docs/benchmarks.md).

    A window cut in the middle of speech often ends early in text only: with windows cut every
    30 s (--split fixed), text only measured far less accurate than timestamps, which carry such
    a window's tail into the next (docs/accuracy.md)."""
    return split == "silence" if without_timestamps is None else without_timestamps


def pick_condition(condition: bool | None, text_only: bool) -> bool:
    """Whether a window is prompted with the previous window's text. None (auto): with
    timestamp tokens, as openai-whisper's transcribe(); text only, each window alone, as
    faster-whisper's batched pipeline: greedy and text only, prompts measured a higher WER
    (docs/benchmarks.md), and every row of a batch can take any window."""
    return not text_only if condition is None else condition


def resolve_modes(options: EngineOptions) -> EngineOptions:
    """The options with text only and prompts decided (pick_text_only, pick_condition), for
    windows that end in pauses; the caller decides for fixed windows."""
    text_only = pick_text_only(options.decoding.without_timestamps)
    return replace(options, decoding=replace(options.decoding, without_timestamps=text_only),
                   condition_on_previous_text=pick_condition(options.condition_on_previous_text, text_only))  # fmt: skip


def pick_quantize(quantize: str | None, device: torch.device, dtype: torch.dtype, compile: bool = False,
                  vnni: bool | None = None) -> str | None:  # fmt: skip
    """How the decoder's weights run (wtx.quantize): "fp16" (the linear layers and the logit
    projection with fp16 weights, float32 sums), "int8" (the logit projection in int8, the
    linear layers in fp16) or None (the model's dtype). "auto" (or None) on a CPU in float32,
    eager: "int8" where the CPU has VNNI (`vnni`, None: this CPU's), else "fp16"; elsewhere None.
    "fp16" or "int8": asked for, and an error where it cannot run; "none": never.

    Whisper's weights are fp16 in its checkpoints, so fp16 rounds nothing: it comes within
    float32's error of float64. int8 is off by up to 1.2 in a logit, but each row's 16 largest
    are computed again from the fp16 weights (wtx.quantize); on a CPU with VNNI its
    logits take 8-bit rows, measured faster than fp16's (docs/benchmarks.md, with the text it
    gives). A row's bits are its own in both, so one call takes all of a step's live rows."""
    runs = device.type == "cpu" and dtype == torch.float32 and not compile
    if quantize in (None, "auto"):
        if not runs:
            return None
        return "int8" if (has_vnni() if vnni is None else vnni) else "fp16"
    if quantize in ("fp16", "int8") and not runs:
        where = f"{device.type} in {str(dtype).removeprefix('torch.')}{', compiled' if compile else ''}"
        raise ValueError(f"--quantize {quantize} runs on a CPU in fp32, eager; not on {where}")
    return quantize if quantize in ("fp16", "int8") else None


def repeatable_attention() -> None:
    """Turns PyTorch's cuDNN attention off, for this process (eager and compiled code alike).

    On the H200 (torch 2.11, fp16) SDPA picks cuDNN attention for unmasked attention, and for a
    decode step's cross-attention (one query over 1500 keys, batch 8) it gave different bits on
    repeated calls with the same inputs: the same command wrote different text from run to run.
    Flash attention, chosen instead, is bitwise repeatable there (scripts/fp16_probe.py)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


class Engine:
    def __init__(self, options: EngineOptions = EngineOptions(), model: Whisper | None = None, on_status=None):
        """on_status(line), if given, hears what compilation is about to do (wtx.compiled)."""
        self.device = pick_device(options.device)
        options = self.options = resolve_modes(options)
        # a given model runs in its own dtype unless one is asked for
        self.dtype = model.dtype if model is not None and options.dtype in (None, "auto") else pick_dtype(options.dtype, self.device)
        if self.device.type == "cuda":
            repeatable_attention()
        if model is None:
            checkpoint = load_checkpoint(options.model)
            startup.mark("weights read")
            model = load_model(checkpoint, self.device, self.dtype)
            # only a model of its own: a given model runs as it is
            model.encoder.to(pick_encoder_dtype(options.dtype, self.device, self.dtype, options.compile))
            startup.mark("model on the device (CUDA initialised)" if self.device.type == "cuda" else "model built")
        self.quantized = pick_quantize(options.quantize, self.device, self.dtype, options.compile)
        self.model = model
        self.dims = model.dims
        if options.batch_size is None:  # resolved once: the options say what ran
            windows = pick_batch_size(self.dims, self.device, self.dtype, options.decoding.group, options.windows_alone)
            options = self.options = replace(options, batch_size=windows)
        decoding = options.decoding
        if not self.dims.is_multilingual and decoding.language not in (None, "en"):
            raise ValueError(f"{options.model} is English-only; it cannot use --language {decoding.language}")
        check_model_language(options.model, self.dims.num_languages, decoding.language)
        self.tokenizer = get_tokenizer(self.dims, decoding.language or "en", decoding.task)
        # a prompt is <|startofprev|> and up to n_text_ctx // 2 - 1 previous tokens, as in openai-whisper
        self.max_prompt = self.dims.n_text_ctx // 2 - 1 if options.condition_on_previous_text else 0
        self.batch = BatchDecoder(model, self.tokenizer, decoding, options.batch_size, self.max_prompt,
                                  options.check_every, self.dtype)  # fmt: skip
        # this engine's own: a model shared with other engines is left as it was
        projection = {"fp16": fp16_projection, "int8": int8_projection}.get(self.quantized)
        self.batch.projection = projection(model) if projection else None
        self.batch.linears = fp16_linears(model) if self.quantized in ("fp16", "int8") else None
        self.batch.cross_dtype = pick_cross_dtype(self.quantized, self.batch.encoder_dtype, self.dtype)
        self.align = BatchAligner(self.batch)  # word timestamps for the batch just decoded
        self.sample_len = self.batch.sample_len
        self.compile_report: CompileReport | None = None
        graphs_only = not options.compile and options.cuda_graph and self.device.type == "cuda"
        if options.compile or graphs_only:  # graphs_only: the eager kernels, replayed as CUDA graphs
            backend = options.step_backend if options.compile else "eager"
            runner = CompiledRunner(self.batch, backend, options.cuda_graph, options.strict)
            self.compile_report = runner.compile(TRACED_SOURCES, on_status)

    @property
    def encoder_dtype(self) -> torch.dtype:
        """bf16 on a CPU that computes it natively under --dtype auto (pick_encoder_dtype), else dtype."""
        return self.batch.encoder_dtype

    def decode_batch(self, windows: list[Window], prompts=None, temperatures=None, languages=None) -> list[WindowResult]:
        """Up to batch_size windows decoded at once (see BatchDecoder.decode)."""
        return self.batch.decode(windows, prompts, temperatures, languages)

    def scheduler(self, word_timestamps: bool = False, word_probabilities: bool = True) -> StreamScheduler:
        """The stream scheduler over this engine's batches (see wtx.streams); with
        word_timestamps, every kept window's segments get their words (wtx.timing), with their
        probabilities unless `word_probabilities` is False (then NaN)."""
        options = StreamOptions(
            batch_size=self.options.batch_size, max_prompt=self.max_prompt,
            stream_windows=self.options.stream_windows, seek_tails=self.options.seek_tails,
            decoding=self.options.decoding,
        )  # fmt: skip

        def decode(windows, languages, prompts, temperatures):
            return self.decode_batch(windows, prompts=prompts, temperatures=temperatures, languages=languages)

        detect = self.detect_language if self.dims.is_multilingual else None
        align = partial(self.align, probabilities=word_probabilities) if word_timestamps else None
        return StreamScheduler(decode, self.tokenizer, options, detect, align)

    def detect_language(self, window: Window) -> str:
        """The language spoken in `window` (multilingual models): a step of its own, once per file."""
        return self.batch.detect_language(window)

    def transcribe_windows(
        self, windows: Iterable[Window], prompts: dict[int, list[int]] | None = None, ordered: bool = True, word_timestamps: bool = False, speech_ends: dict[int, float] | None = None,
    ) -> Iterator[WindowResult]:
        """One recording's windows through the stream scheduler; a result per window, in window
        order (or with `ordered=False` as soon as each is complete). Raises the audio's error.
        prompts and speech_ends: journaled, per window index, for a resumed recording."""
        recording = Recording("", windows, prompts or {}, self.options.decoding.language, speech_ends or {})
        for event in self.scheduler(word_timestamps).run([recording], ordered):
            if isinstance(event, WindowDone):
                yield event.result
            elif event.error is not None:
                raise event.error


def check_model_language(model: str, num_languages: int, language: str | None) -> None:
    """Raises ValueError, naming the models that know it, for a language code Whisper knows but
    `model` was not trained on (Cantonese, "yue", came with large-v3: the 100th language)."""
    from wtx.whisper_parts import tokenizer_module

    codes = tuple(tokenizer_module().LANGUAGES)
    if language is None or language in codes[:num_languages]:
        return
    raise ValueError(f"{model} knows {num_languages} languages, not {language!r}; large-v3 and "
                     f"large-v3-turbo know all {len(codes)}")  # fmt: skip
