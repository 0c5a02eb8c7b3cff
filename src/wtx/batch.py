"""One batch of windows on the device: features, encoder, prefix, decode steps and results.

Every batch has the same shape, eager or compiled: padded with silent rows to the batch size,
every prefix left-padded to the longest possible prompt. So a row's arithmetic, and its text,
never depend on the other rows or on how many there are. A batch syncs with the device only
every `check_every` steps, to see whether every row has reached end-of-text.

The decoder runs its encoder and steps through plain attributes (`encoder`, `step`,
`prefill_graph`); the compiled runner (wtx.compiled) replaces them with compiled functions and
CUDA graphs. Nothing here touches Inductor.
"""

import numpy as np
import torch

from wtx.audio import N_SAMPLES, Window
from wtx.beam import GroupLoop, best_hypothesis, until_eot, window_hypotheses
from wtx.decode import DecodeLoop, LogitFilters
from wtx.features import log_mel_spectrogram
from wtx.model import Whisper
from wtx.options import DecodingOptions
from wtx.quantize import Fp16Linear, Int8Linear, install_linears
from wtx.segments import WindowResult, split_segments


def silent_window() -> Window:
    """Padding for a batch's unused rows; their results are discarded."""
    return Window(index=-1, offset=0.0, duration=0.0, samples=np.zeros(N_SAMPLES, dtype=np.float32))


def window_seed(window: Window, temperature: float) -> int:
    """A row's sampling-noise seed: from its window's offset and temperature, not its batch."""
    return round(window.offset * 50) * 16 + round(temperature * 10)


class BatchDecoder:
    """Decodes up to `batch_size` windows at a time with one model, tokenizer and options."""

    def __init__(self, model: Whisper, tokenizer, decoding: DecodingOptions, batch_size: int,
                 max_prompt: int, check_every: int, dtype: torch.dtype):  # fmt: skip
        self.model = model
        self.dims = model.dims
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.batch_size = batch_size
        self.group = decoding.group  # decoder rows per window: beams or samples
        self.n_rows = batch_size * self.group
        self.max_prompt = max_prompt  # previous-text tokens a prompt may hold; 0: no prompts
        self.check_every = check_every
        self.dtype = dtype
        self.device = next(model.parameters()).device
        # every prefix ends with these; text only, with <|notimestamps|>
        self.sot_tokens = (tokenizer.sot_sequence_including_notimestamps if decoding.without_timestamps
                           else tokenizer.sot_sequence)  # fmt: skip
        self.filters = LogitFilters(tokenizer, self.dims.n_vocab, decoding, self.device)
        self.sample_len = min(decoding.sample_len, self.dims.n_text_ctx // 2)
        self.sot_sequence = torch.tensor(self.sot_tokens, device=self.device)
        self.sot_index = list(self.sot_tokens).index(tokenizer.sot)
        n_sot = len(self.sot_tokens)
        self.prefix_len = n_sot + (1 + max_prompt if max_prompt else 0)  # the longest prefix
        self.n_slots = self.prefix_len + self.sample_len
        self.slots = torch.arange(self.n_slots, device=self.device)
        self.loop: DecodeLoop | GroupLoop | None = None
        self.encoder = model.encoder  # set by the compiled runner
        self.encoder_dtype = model.encoder.conv1.weight.dtype  # bf16 on some CPUs (engine.pick_encoder_dtype)
        self.cross_dtype = dtype  # the cross-attention K/V's: bf16 on some CPUs (engine.pick_cross_dtype)
        self._silence: list | None = None  # the cross-attention K/V of an all-zero window (eager CPU)
        self.projection: torch.nn.Module | None = None  # the logits' (fp16 or int8: wtx.quantize); None: the embedding's
        self.linears: dict | None = None  # the decoder blocks' linear layers in fp16 (wtx.quantize); None: the checkpoint's
        self.step = None  # runs `steps_per_call` decode steps: eager, compiled or a CUDA graph
        self.steps_per_call = 1
        self.prefill_graph = None  # a CUDA graph of `prefill` with its static tensors (wtx.compiled)
        self.owns_caches = False  # True once compiled functions hold this decoder's cache tensors

    def stack(self, windows: list[Window]) -> torch.Tensor:
        """The windows' samples as one [B, N_SAMPLES] CPU tensor, pinned when the model is on CUDA."""
        samples = torch.from_numpy(np.stack([w.samples for w in windows]))
        return samples.pin_memory() if self.device.type == "cuda" else samples

    def language_tokens(self, languages: list[str | None], batch: int) -> torch.Tensor | None:
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

    @torch.no_grad()
    def detect_language(self, window: Window) -> str:
        """The language spoken in `window` (multilingual models): the encoder on the batch's fixed
        shape, then one decoder step at <|startoftranscript|>, as the prefill detects it."""
        self.ensure_loop()
        rows = [window] + [silent_window()] * (self.batch_size - 1)
        self._encode(self.stack(rows).to(self.device, non_blocking=True))
        token = self._language_at_sot(self.batch_size)[0]
        return self.tokenizer.decode([int(token)]).strip("<|>")

    def _encode(self, samples: torch.Tensor) -> None:
        """Features and encoder for samples [B, N_SAMPLES], into the cross-attention K/V."""
        if self.device.type == "cpu" and self.encoder is self.model.encoder:
            for row, window in enumerate(samples):
                self._encode_window(window, row)
            return
        # the batch's fixed shape, as compiled and captured
        features = self.encoder(log_mel_spectrogram(samples, self.dims.n_mels).to(self.encoder_dtype))
        self.model.decoder.set_audio_features(features.to(self.dtype))  # a bf16 encoder's (a CPU's) to the decoder's

    def _encode_window(self, samples: torch.Tensor, row: int) -> None:
        """The encoder and the cross-attention K/V of one window [N_SAMPLES] into batch row `row`
        (an eager CPU): one window's shape, whatever the batch, so its keys and values never
        depend on the batch. An all-zero window (the padding rows, or digital silence) reuses the
        keys and values computed for the first one: a padding row cost a whole projection of
        1,500 rows per layer. On a CPU the encoder measured faster on windows one by one than on
        them as one batch, bit for bit equal (docs/benchmarks.md)."""
        decoder = self.model.decoder
        if samples.any() or self._silence is None:
            features = self.encoder(log_mel_spectrogram(samples[None], self.dims.n_mels).to(self.encoder_dtype))
            decoder.set_audio_features(features.to(self.dtype), row)
            if not samples.any():
                self._silence = decoder.audio_kv(row)
        else:
            decoder.set_audio_kv(row, self._silence)

    def _language_at_sot(self, n: int) -> torch.Tensor:
        """One decoder step at <|startoftranscript|> (slot 0): the first row's language token, for all n rows."""
        sot = self.sot_sequence[:1].expand(n, 1)
        pad = torch.zeros(n, dtype=torch.long, device=self.device)
        return self._detect_language(self.model.decoder(sot, self.slots[:1], pad)[:, 0])

    def ensure_loop(self) -> DecodeLoop | GroupLoop:
        """The decode loop and the model's caches, allocated for this decoder's batch size, and its logit projection."""
        # another decoder may share the model and have reallocated its caches for other shapes
        shape = (self.batch_size, self.n_slots, self.group, self.cross_dtype)
        caches_fit = (self.model.batch_size, self.model.n_slots, self.model.group, self.model.cross_dtype) == shape
        if self.owns_caches and not caches_fit:
            raise RuntimeError("another engine reallocated this compiled engine's caches: give each engine its own model")
        self.model.decoder.projection = self.projection
        install_linears(self.model.decoder, self.linears)
        self.model.decoder.rows_apart = self.linears is not None and isinstance(self.projection, (Fp16Linear, Int8Linear))
        if self.loop is None or not caches_fit:
            self.model.setup_caches(*shape)
            if self.group > 1:
                self.loop = GroupLoop(self.model.decoder, self.filters, self.batch_size, self.sample_len, self.decoding,
                                      self.prefix_len, self.device)  # fmt: skip
            else:
                self.loop = DecodeLoop(self.model.decoder, self.filters, self.batch_size, self.sample_len, self.device)
            self.step = self.loop
            self.steps_per_call = 1
        return self.loop

    def prefix(self, prompts: list[list[int]] | None, n_rows: int, fixed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's initial tokens per row, left-padded to one length: ([B, P], pad [B]).

        A row is [<|startofprev|>, *prompt, *sot_sequence], or the sot sequence alone without a
        prompt. P is the decoder's longest possible prefix, or the longest row unless `fixed`."""
        sot_sequence = list(self.sot_tokens)
        rows = []
        for i in range(n_rows):
            prompt = prompts[i][-self.max_prompt :] if prompts and i < len(prompts) and self.max_prompt else []
            rows.append(([self.tokenizer.sot_prev, *prompt] if prompt else []) + sot_sequence)
        width = self.prefix_len if fixed else max(len(r) for r in rows)
        pad = [width - len(r) for r in rows]
        tokens = [[self.tokenizer.eot] * p + r for p, r in zip(pad, rows)]
        return torch.tensor(tokens), torch.tensor(pad)

    def prefill(self, samples, language_tokens, prefix, pad, temperature, seed):
        """Features, encoder, cross-attention K/V and the prefix tokens, then resets the loop.

        samples: [B, N_SAMPLES], prefix: [B, P], pad: [B]; temperature and seed: per decoder row
        [B * group]; all on the device. Pure tensor work (no host transfers), so it can be captured as a CUDA graph.
        Returns (no_speech_probs [B], language_tokens [B] or None)."""
        decoder = self.model.decoder
        n, width = prefix.shape
        self._encode(samples)
        if self.dims.is_multilingual and language_tokens is None:
            language_tokens = self._language_at_sot(n)  # the first row decides
        sot_at = width - len(self.sot_tokens)  # the sot sequence ends every row
        if language_tokens is not None:
            prefix = torch.cat([prefix[:, : sot_at + 1], language_tokens[:, None], prefix[:, sot_at + 2 :]], dim=1)
        hidden = decoder.hidden(prefix, self.slots[:width], pad)
        if self.group > 1:
            decoder.repeat_cache_rows(self.group)
        sot = sot_at + self.sot_index
        logits = decoder.logits(torch.cat([hidden[:, sot : sot + 1], hidden[:, -1:]], dim=1))
        if self.tokenizer.no_speech is not None:
            no_speech = logits[:, 0].softmax(dim=-1)[:, self.tokenizer.no_speech]
        else:
            no_speech = torch.zeros(n, device=self.device)
        self.loop.reset(logits[:, 1], width, pad, temperature, seed)
        return no_speech, language_tokens

    def run_steps(self) -> None:
        """Runs decode steps until every row has ended or sample_len tokens were sampled."""
        every = max(self.check_every, self.steps_per_call)
        done = 0
        while done < self.sample_len:
            self.step()
            done += self.steps_per_call
            if done % every == 0 and bool(self.loop.finished.all()):  # the only host sync
                break

    @torch.no_grad()  # not inference_mode: functions compiled ahead of time guard on it
    def decode(
        self,
        windows: list[Window],
        prompts: list[list[int]] | None = None,
        temperatures: list[float] | None = None,
        languages: list[str | None] | None = None,
    ) -> list[WindowResult]:
        """Timestamped decoding of up to batch_size windows at once.

        prompts: per window, the previous text's tokens to condition on (may be empty);
        temperatures: per window, 0 for greedy (the default) or a sampling temperature, its
        noise seeded by `window_seed`; languages: per window (default: the decoding options'
        language); None rows of a multilingual model are detected from the first row."""
        n = len(windows)
        if n > self.batch_size:
            raise ValueError(f"batch of {n} windows exceeds the batch size {self.batch_size}")
        temperatures = list(temperatures or []) + [0.0] * (n - len(temperatures or []))
        rows = windows + [silent_window()] * (self.batch_size - n)
        loop = self.ensure_loop()
        language_tokens = self.language_tokens(languages or [self.decoding.language] * n, self.batch_size)
        prefix, pad = self.prefix(prompts, self.batch_size)
        temperature = temperatures + [0.0] * (self.batch_size - n)
        g = self.group
        seed = torch.tensor([window_seed(w, t) * g + member for w, t in zip(rows, temperature) for member in range(g)])
        temperature = [t for t in temperature for _ in range(g)]
        inputs = (self.stack(rows), language_tokens, prefix, pad, torch.tensor(temperature), seed)
        loop.sample = any(t > 0 for t in temperatures)  # greedy batches skip the sampling noise
        needs_detection = self.dims.is_multilingual and language_tokens is None
        if self.prefill_graph is not None and not needs_detection:
            no_speech, language_tokens = self.prefill_graph(*inputs)
        else:
            samples, _, *rest = inputs
            samples = samples.to(self.device, non_blocking=True)
            no_speech, language_tokens = self.prefill(samples, language_tokens, *(t.to(self.device) for t in rest))
        loop.retire(n)
        self.run_steps()
        return self.results(windows, self.hypotheses(n), no_speech[:n], language_tokens, temperatures)

    def hypotheses(self, n: int) -> list[tuple[list[int], float]]:
        """The first n windows' chosen (tokens up to end-of-text, summed log-probability) after the steps."""
        loop, eot = self.loop, self.tokenizer.eot
        if self.group > 1:
            penalty = self.decoding.length_penalty
            return [best_hypothesis(h, penalty) for h in window_hypotheses(loop, n)]
        rows = loop.sampled[:n].cpu().tolist()
        return [(until_eot(row, eot), lp) for row, lp in zip(rows, loop.sum_logprobs[:n].cpu().tolist())]

    def results(self, windows, hypotheses, no_speech_probs, language_tokens, temperatures) -> list[WindowResult]:
        no_speech = no_speech_probs.float().cpu().tolist()
        if language_tokens is None:
            languages = [self.decoding.language or "en"] * len(windows)
        else:
            languages = [self.tokenizer.decode([t]).strip("<|>") for t in language_tokens.tolist()]
        results = []
        for w, (tokens, lp), ns, lang, t in zip(windows, hypotheses, no_speech, languages, temperatures):
            result = WindowResult(w, tokens, lang, ns, lp / (len(tokens) + 1), [], t)
            if not result.is_silent(self.decoding):
                result.segments = split_segments(tokens, self.tokenizer, w.offset, w.duration)
            results.append(result)
        return results
