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
    beam_size: int = 1  # at temperature 0: 1 decodes greedily, N > 1 keeps N beams (openai-whisper's beam search)
    best_of: int = 1  # at a fallback temperature: samples drawn per window, the best one kept
    patience: float = 1.0  # beam search ends once round(beam_size * patience) hypotheses have ended
    length_penalty: float | None = None  # None: rank hypotheses by log-probability / length; else Google NMT's penalty
    without_timestamps: bool | None = False  # text only (<|notimestamps|>, no timestamp rules): a window is one segment; None: auto (engine.pick_text_only)

    def __post_init__(self):
        if self.beam_size < 1 or self.best_of < 1:
            raise ValueError(f"beam_size and best_of must be at least 1, not {self.beam_size} and {self.best_of}")
        if self.beam_size > 1 and self.max_candidates < 1:
            raise ValueError(f"patience {self.patience} with beam size {self.beam_size} keeps no hypothesis")

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
