"""Decoding options: a frozen dataclass, validated once at the boundary (CLI or API)."""

from dataclasses import dataclass


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
