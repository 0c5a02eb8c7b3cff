"""The engine: batches windows through the rewritten Whisper and yields timed segments.

It never prints. Work is reported by returning results window by window; callers time and
display them. A decode loop syncs with the device only every `check_every` steps, to see
whether every row has reached end-of-text.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import torch

from wtx.audio import Window
from wtx.decode import (
    DecodeState,
    DecodingOptions,
    Segment,
    TimestampRules,
    get_tokenizer,
    greedy_select,
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

    # -- one batch -----------------------------------------------------------------------

    def encode(self, windows: list[Window]) -> torch.Tensor:
        samples = torch.from_numpy(np.stack([w.samples for w in windows])).to(self.device)
        mel = log_mel_spectrogram(samples, self.dims.n_mels).to(self.dtype)
        return self.model.encoder(mel)

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

    @torch.inference_mode()
    def decode_batch(self, windows: list[Window], language: str | None = None) -> list[WindowResult]:
        """Greedy timestamped decoding of up to batch_size windows at once."""
        decoder = self.model.decoder
        n = len(windows)
        self.model.setup_caches(n)
        decoder.set_audio_features(self.encode(windows))

        language = language or self.options.decoding.language
        language_tokens = None
        if self.dims.is_multilingual and language is None:
            first = decoder(torch.full((n, 1), self.tokenizer.sot, device=self.device),
                            torch.zeros(1, dtype=torch.long, device=self.device))[:, 0]
            detected = self._detect_language(first)
            language_tokens = detected[:1].expand(n)  # one language per file: its first window's
        elif self.dims.is_multilingual:
            language_tokens = torch.full((n,), self.tokenizer.to_language_token(language), device=self.device)
        initial = self._initial_tokens(language_tokens, n)
        n_initial = initial.shape[1]
        logits = decoder(initial, torch.arange(n_initial, device=self.device))
        sot_index = list(self.tokenizer.sot_sequence).index(self.tokenizer.sot)
        no_speech_probs = torch.zeros(n, device=self.device)
        if self.tokenizer.no_speech is not None:
            no_speech_probs = logits[:, sot_index].softmax(dim=-1)[:, self.tokenizer.no_speech]
        logits = logits[:, -1]

        state = DecodeState.start(n, self.device)
        sampled = torch.full((n, self.sample_len), self.tokenizer.eot, device=self.device)
        input_pos = torch.tensor([n_initial], device=self.device)
        for i in range(self.sample_len):
            step = torch.tensor(i, device=self.device)
            next_tokens, state = greedy_select(self.rules, logits, step, state)
            sampled[:, i] = next_tokens
            if (i + 1) % self.options.check_every == 0 and bool(state.finished.all()):
                break
            if i + 1 < self.sample_len:
                logits = decoder(next_tokens[:, None], input_pos + i)[:, -1]

        return self._results(windows, sampled, state, no_speech_probs, language_tokens)

    def _results(self, windows, sampled, state, no_speech_probs, language_tokens) -> list[WindowResult]:
        eot = self.tokenizer.eot
        rows = sampled.cpu().tolist()
        sum_logprobs = state.sum_logprobs.cpu().tolist()
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
