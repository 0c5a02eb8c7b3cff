"""Options: frozen dataclasses, validated once at the boundary (CLI or API)."""

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class EngineOptions:
    model: str = "tiny.en"
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str | None = None  # None: fp16 on cuda, fp32 on cpu
    batch_size: int | None = None  # None: automatic (wtx.autobatch)
    check_every: int = 8  # decode steps between all-rows-finished checks
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    compile: bool = False  # torch.compile the encoder and the decode step (Inductor)
    strict: bool = False  # a failed compile is an error instead of a warning and eager fallback
    cuda_graph: bool = True  # on CUDA, replay the compiled decode steps as one CUDA graph
    step_backend: str = "inductor"  # "inductor", or "eager": CUDA-graph the eager kernels only
    seek_tails: bool = True  # re-decode audio a window left undecoded, as transcribe() seeks
    condition_on_previous_text: bool = True  # prompt each window with its stream's previous text
    stream_windows: int = 8  # at most this many consecutive windows per batch row
