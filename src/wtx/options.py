"""Options: frozen dataclasses, validated once at the boundary (CLI or API).

The check_* functions below are that validation, shared by the CLI and the API: each raises
wtx.errors.InvalidOption (a ValueError) with one line saying what to give, before anything
loads. Only check_device imports torch, and only for a device other than the CPU.
"""

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from wtx.errors import InvalidOption

DTYPES = ("auto", "fp32", "fp16", "bf16")
QUANTIZE = ("auto", "fp16", "int8", "none")
TASKS = ("transcribe", "translate")
MAX_BATCH_SIZE = 256  # windows per batch
MAX_GROUP = 16  # beams per window, or samples per fallback temperature
# beam search buffers round(beam_size * patience) ended hypotheses per window (wtx.beam)
MAX_PATIENCE = 20.0


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"
    language: str | None = None  # None: English for .en models, detected once per file otherwise
    sample_len: int = 224  # openai-whisper's default: n_text_ctx // 2
    suppress_blank: bool = True
    max_initial_timestamp: float = 1.0
    compression_ratio_threshold: float = 2.4  # above it a window's text is repetitive: decode it again
    fallback_temperatures: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)  # openai-whisper's; () for none
    no_speech_threshold: float = 0.6
    logprob_threshold: float = -1.0
    suppress_eot: bool = False  # benchmarks only: every row decodes exactly sample_len tokens
    beam_size: int = 1  # at temperature 0: 1 decodes greedily, N > 1 keeps N beams (openai-whisper's beam search)
    best_of: int = 1  # at a fallback temperature: samples drawn per window, the best one kept
    patience: float = 1.0  # beam search ends once round(beam_size * patience) hypotheses have ended
    length_penalty: float | None = None  # None: rank hypotheses by log-probability / length; else Google NMT's penalty
    without_timestamps: bool | None = False  # text only (<|notimestamps|>, no timestamp rules): a window is one segment; None: auto (engine.pick_text_only)

    def __post_init__(self):
        if self.beam_size < 1 or self.best_of < 1:
            raise ValueError(f"beam_size and best_of must be at least 1, not {self.beam_size} and {self.best_of}")
        check_patience(self.patience, self.beam_size)  # finite: max_candidates rounds it

    @property
    def group(self) -> int:
        """Decoder rows per window: the beams, or the samples of a fallback temperature."""
        return max(self.beam_size, self.best_of if self.fallback_temperatures else 1)

    @property
    def max_candidates(self) -> int:
        """Ended hypotheses a window's beam search collects before it stops (openai-whisper's rule)."""
        return round(self.beam_size * self.patience)


@dataclass(frozen=True)
class EngineOptions:
    model: str = "tiny.en"
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str | None = None  # None or "auto": fp16 on cuda, fp32 on cpu
    quantize: str | None = None  # None or "auto": on a CPU in fp32, eager, int8 logits with VNNI, else fp16 weights (engine.pick_quantize); "fp16", "int8" or "none"
    batch_size: int | None = None  # None: automatic (wtx.autobatch)
    check_every: int = 8  # decode steps between all-rows-finished checks
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    compile: bool = False  # torch.compile the encoder and the decode step (Inductor)
    strict: bool = False  # a failed compile is an error instead of a warning and eager fallback
    cuda_graph: bool = True  # on CUDA, replay the decode steps as CUDA graphs: Inductor's with compile, else the eager kernels'
    step_backend: str = "inductor"  # "inductor", or "eager": CUDA-graph the eager kernels only
    seek_tails: bool = True  # re-decode audio a window left undecoded, as transcribe() seeks
    condition_on_previous_text: bool | None = True  # prompt each window with its stream's previous text; None: auto (engine.pick_condition)
    stream_windows: int = 8  # at most this many consecutive windows per batch row

    @property
    def windows_alone(self) -> bool:
        """Text only and without prompts: every window is decoded on its own (False while auto)."""
        return self.decoding.without_timestamps is True and self.condition_on_previous_text is False


def _either(choices) -> str:
    return f"{', '.join(choices[:-1])} or {choices[-1]}"


def check_choice(option: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidOption(option, f"{value!r}: choose {_either(choices)}")


def check_count(option: str, value, low: int, high: int) -> None:
    """A whole number from low to high (numpy integers too; not a bool or a float)."""
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not whole or not low <= value <= high:
        raise InvalidOption(option, f"{value!r}: give a whole number from {low} to {high}")


def check_patience(patience, beam_size: int) -> None:
    """Finite, above 0 and at most MAX_PATIENCE; with beam search, keeping a hypothesis."""
    real = isinstance(patience, numbers.Real) and not isinstance(patience, bool)
    if not real or not math.isfinite(patience) or not 0 < patience <= MAX_PATIENCE:
        give = f"give a number above 0 and at most {MAX_PATIENCE:g}"
        raise InvalidOption("patience", f"{patience!r}: {give}")
    if beam_size > 1 and round(beam_size * patience) < 1:
        rounded = f"round({beam_size} x {patience}) is 0"
        kept = f"with beam size {beam_size} keeps no hypothesis ({rounded})"
        raise InvalidOption("patience", f"{patience} {kept}")


def check_length_penalty(length_penalty) -> None:
    """None (log-probability / length), or Google NMT's alpha from 0 to 2."""
    if length_penalty is None:
        return
    real = isinstance(length_penalty, numbers.Real) and not isinstance(length_penalty, bool)
    if not real or not 0 <= length_penalty <= 2:
        give = "give None or a number from 0 to 2"
        raise InvalidOption("length_penalty", f"{length_penalty!r}: {give}")


def language_code(language: str | None) -> str | None:
    """openai-whisper's language, as a code ("de") or an English name ("German", "castilian"),
    in any case, as its code; None stays None (English for .en models, else detected)."""
    if language is None:
        return None
    from wtx.whisper_parts import tokenizer_module

    tokenizer = tokenizer_module()  # the standard library and tiktoken only
    key = language.strip().lower() if isinstance(language, str) else language
    if key in tokenizer.LANGUAGES:
        return key
    if key in tokenizer.TO_LANGUAGE_CODE:
        return tokenizer.TO_LANGUAGE_CODE[key]
    codes = ", ".join(sorted(tokenizer.LANGUAGES))
    give = f"give a code or an English name (e.g. de or German), any case: {codes}"
    raise InvalidOption("language", f"{language!r} is not a language Whisper knows; {give}")


def english_only(model: str) -> bool:
    """Whether `model` names an English-only checkpoint, as openai-whisper tells them: tiny.en,
    medium.en, a path to base.en.pt."""
    return Path(model).name.removesuffix(".pt").endswith(".en")


def fit_english_only(model: str, language: str | None, task: str):
    """(language, task, warning or None): what an English-only model runs, as openai-whisper's
    CLI does with one: another language is replaced by English, with a warning; so is
    translating (an English-only model has no task token: it transcribes). Other models keep
    what was given."""
    if not english_only(model) or (language in (None, "en") and task == "transcribe"):
        return language, task, None
    asked = [f"language {language!r}"] if language not in (None, "en") else []
    asked += ["task 'translate'"] if task == "translate" else []
    got = " and ".join(asked)
    warning = f"{model} is an English-only model but got {got}; transcribing English instead"
    return "en", "transcribe", warning


def check_device(device: str | None) -> None:
    """None (CUDA if available, else the CPU), "cpu", "cuda" or "cuda:N" that this torch can
    use; an error says which devices there are."""
    import re

    if device is None:
        return
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise InvalidOption("device", f"{device!r} is not a device; choose cpu, cuda or cuda:N")
    if device == "cpu":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        why = "no CUDA device is visible" if torch.version.cuda else "torch has no CUDA support"
        why += f" (torch {torch.__version__})"
        raise InvalidOption("device", f"{device}: {why}; the available device is cpu")
    if index >= count:
        choices = ", ".join(["cpu", "cuda"] + [f"cuda:{i}" for i in range(count)])
        raise InvalidOption("device", f"{device}: there are {count} CUDA devices; choose {choices}")
