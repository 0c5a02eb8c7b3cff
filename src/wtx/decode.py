"""Decoding with timestamps for a whole batch, greedy or sampled, as tensor masks.

The rules are openai-whisper's `decode()` rules (SuppressBlank, SuppressTokens,
ApplyTimestampRules with the initial-timestamp limit), rewritten without per-row Python:
each step reads a few [B] state tensors and masks the logits from [B] and [V] tensors. Nothing here
branches on tensor values, so a step compiles into a single graph.
"""

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from wtx.model import LiveWindows
from wtx.options import DecodingOptions
from wtx.segments import TIME_PRECISION


def get_tokenizer(dims, language: str | None, task: str):
    from wtx.whisper_parts import tokenizer_module

    return tokenizer_module().get_tokenizer(
        dims.is_multilingual, num_languages=dims.num_languages, language=language, task=task
    )


def suppress_tokens(tokenizer) -> list[int]:
    """openai-whisper's suppress_tokens="-1" set plus the task and special tokens."""
    from wtx.whisper_parts import non_speech_tokens

    tokens = set(non_speech_tokens(tokenizer))
    tokens.update([tokenizer.transcribe, tokenizer.translate, tokenizer.sot])
    tokens.update([tokenizer.sot_prev, tokenizer.sot_lm])
    if tokenizer.no_speech is not None:
        tokens.add(tokenizer.no_speech)
    return sorted(tokens)


class LogitFilters(torch.nn.Module):
    """Every logit filter of timestamped decoding (suppressed tokens, blanks, timestamp rules),
    held as [n_vocab] tensors. Without timestamps (options.without_timestamps), the first two
    only, as openai-whisper's decode(without_timestamps=True)."""

    def __init__(self, tokenizer, n_vocab: int, options: DecodingOptions, device=None):
        super().__init__()
        self.eot = tokenizer.eot
        self.timestamp_begin = tokenizer.timestamp_begin
        self.max_initial_timestamp_index = round(options.max_initial_timestamp / TIME_PRECISION)
        self.timestamp_rules = not options.without_timestamps
        vocab = torch.arange(n_vocab, device=device)
        suppress = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        suppress[suppress_tokens(tokenizer)] = True
        if tokenizer.no_timestamps is not None and self.timestamp_rules:
            suppress[tokenizer.no_timestamps] = True
        if options.suppress_eot:
            suppress[tokenizer.eot] = True
        blank = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        if options.suppress_blank:
            blank[tokenizer.encoding.encode_ordinary(" ") + [tokenizer.eot]] = True
        last_initial = self.timestamp_begin + self.max_initial_timestamp_index
        initial = ((vocab < self.timestamp_begin) | (vocab > last_initial)) & self.timestamp_rules  # a timestamp first
        self.register_buffer("vocab", vocab, persistent=False)
        self.register_buffer("suppress", suppress, persistent=False)
        self.register_buffer("first_step", suppress | blank | initial, persistent=False)
        # a copy, not a view of `vocab`: torch.export refuses state tensors that alias one another
        self.register_buffer("timestamps", vocab[self.timestamp_begin :].clone(), persistent=False)

    def forward(self, logits: Tensor, i: Tensor, last: Tensor, penult: Tensor, max_ts: Tensor) -> Tensor:
        """Masks logits [B, V] for sampled step `i` (a 0-d tensor); see filtered()."""
        return self.filtered(logits, i, last, penult, max_ts)[0]

    def filtered(self, logits: Tensor, i: Tensor, last: Tensor, penult: Tensor, max_ts: Tensor) -> tuple[Tensor, Tensor]:
        """The masked logits [B, V] for sampled step `i` (a 0-d tensor), and their log_softmax.

        last, penult: the previous two sampled tokens [B] (any value where i < 1, i < 2);
        max_ts: the last sampled timestamp token [B], 0 where none was sampled yet.

        The vocabulary is three ranges: text (below eot), special tokens, timestamps. Each rule
        masks one range, for some rows, so the masks are built per range from [B] and [V]
        tensors; no [B, V] mask is made (such masks measured costly in a CPU's step)."""
        ts_begin, eot = self.timestamp_begin, self.eot
        logits = logits.masked_fill(torch.where(i == 0, self.first_step, self.suppress), float("-inf"))
        if not self.timestamp_rules:
            return logits, torch.log_softmax(logits, dim=-1)
        last_ts = (i >= 1) & (last >= ts_begin)  # [B]
        penult_ts = (i < 2) | (penult >= ts_begin)
        pair_open = last_ts & ~penult_ts
        # after a segment's opening timestamp comes text; after a closed pair, no timestamp
        logits[:, :eot].masked_fill_(pair_open[:, None], float("-inf"))
        # timestamps never decrease, and a segment has nonzero length
        ts_last = torch.where(pair_open, max_ts, max_ts + 1)[:, None]
        logits[:, ts_begin:].masked_fill_((last_ts & penult_ts)[:, None] | (self.timestamps < ts_last), float("-inf"))
        # where timestamps are jointly likelier than any single text token, sample a timestamp
        logprobs = torch.log_softmax(logits, dim=-1)
        timestamp_logprob = logprobs[:, ts_begin:].logsumexp(dim=-1)
        max_text_logprob = logprobs[:, :ts_begin].amax(dim=-1)
        to_timestamps = timestamp_logprob > max_text_logprob
        logits[:, :ts_begin].masked_fill_(to_timestamps[:, None], float("-inf"))
        return logits, log_softmax_again(logits, logprobs, to_timestamps)


def log_softmax_again(logits: Tensor, logprobs: Tensor, changed: Tensor) -> Tensor:
    """log_softmax(logits) [B, V], where `logprobs` is the log_softmax of the same logits before
    the rows `changed` [B] were masked further. Run eagerly on a CPU, only those rows are
    computed again (a row's bits are its own, in any set of rows): a full log_softmax is a
    measurable part of a beam step, and the timestamp rule changes a few rows a step. Elsewhere
    every row, in place of `logprobs` (fixed shapes, no host sync)."""
    if logits.device.type != "cpu" or torch.compiler.is_compiling():
        return torch.log_softmax(logits, dim=-1)
    rows = changed.nonzero()[:, 0]
    if len(rows) == 0:
        return logprobs
    return logprobs.index_copy_(0, rows, torch.log_softmax(logits[rows], dim=-1))


@dataclass
class DecodeState:
    """Per-row decoding state; every field is a [B] tensor."""

    last: Tensor
    penult: Tensor
    max_ts: Tensor
    finished: Tensor
    sum_logprobs: Tensor

    @classmethod
    def start(cls, batch_size: int, device) -> "DecodeState":
        zeros = torch.zeros(batch_size, dtype=torch.long, device=device)
        return cls(
            last=zeros,
            penult=zeros.clone(),
            max_ts=zeros.clone(),
            finished=torch.zeros(batch_size, dtype=torch.bool, device=device),
            sum_logprobs=torch.zeros(batch_size, dtype=torch.float32, device=device),
        )


HASH_MODULUS = 2**31 - 1  # a Park-Miller generator's prime: every product below stays exact in int64


def uniform_noise(seed: Tensor, i: Tensor, vocab: Tensor) -> Tensor:
    """Counter-based uniform noise in (0, 1), [B, V]: a pure function of (row seed, step, token).

    A row's noise depends on nothing else in its batch, so a window samples the same tokens in
    any batch and after a resume. Integer rounds of multiply-mod and xor-shift, no overflow."""
    x = (seed[:, None] * 7919 + i * 104729 + vocab[None, :] * 1299709) % HASH_MODULUS
    for _ in range(3):
        x = (x * 48271 + 11) % HASH_MODULUS
        x = x ^ (x >> 13)
    x = (x * 48271 + 11) % HASH_MODULUS  # back below the modulus
    return (x.double() + 0.5) / HASH_MODULUS


def select_tokens(
    filters: LogitFilters, logits: Tensor, i: Tensor, state: DecodeState, temperature: Tensor, seed: Tensor,
    sample: bool = True,
):
    """Applies the filters and picks a token per row: the argmax where temperature is 0, else a
    sample from softmax(logits / temperature) by the Gumbel-max trick. Returns (tokens [B], new state).

    sample=False skips the noise (every row greedy): the same tokens, without its cost."""
    logits, logprobs = filters.filtered(logits, i, state.last, state.penult, state.max_ts)
    return pick_tokens(filters, logits, i, state, temperature, seed, sample, logprobs)


def pick_tokens(
    filters: LogitFilters, logits: Tensor, i: Tensor, state: DecodeState, temperature: Tensor, seed: Tensor,
    sample: bool = True, logprobs: Tensor | None = None,
):
    """select_tokens() on logits the filters were already applied to (and their log_softmax, if
    the caller has it)."""
    if sample:
        gumbel = -torch.log(-torch.log(uniform_noise(seed, i, filters.vocab))).float()
        next_tokens = (logits + temperature[:, None] * gumbel).argmax(dim=-1)
    else:
        next_tokens = logits.argmax(dim=-1)
    if logprobs is None:
        logprobs = torch.log_softmax(logits, dim=-1)
    current = logprobs.gather(-1, next_tokens[:, None])[:, 0]
    sum_logprobs = state.sum_logprobs + torch.where(state.finished, 0.0, current)
    next_tokens = torch.where(state.finished, filters.eot, next_tokens)
    is_ts = next_tokens >= filters.timestamp_begin
    return next_tokens, DecodeState(
        last=next_tokens,
        penult=state.last,
        max_ts=torch.where(is_ts, next_tokens, state.max_ts),
        finished=state.finished | (next_tokens == filters.eot),
        sum_logprobs=sum_logprobs,
    )


class DecodeLoop(torch.nn.Module):
    """One decode step for a whole batch, greedy or sampled per row, entirely in place on
    preallocated buffers.

    `forward()` takes no arguments and returns nothing: it picks the next token from the
    logits buffer under the filters, writes it into `sampled` at column `i`, runs the decoder
    on it at cache slot `input_pos` and stores the new logits. Slots are tensors incremented
    in place, so every step is the same graph: compiled once, or captured as a CUDA graph.
    A row whose next position would pass the text context (a long prompt) is finished, as
    openai-whisper stops at n_text_ctx tokens. `sample` is set by the caller before the steps of
    a batch, from the host's own list of temperatures: False (every row greedy) skips the sampling
    noise, whose integer hash over the vocabulary costs as much as a fifth of a step. A compiled
    loop holds one graph for each value.
    """

    def __init__(self, decoder, filters: LogitFilters, batch_size: int, sample_len: int, device):
        super().__init__()
        self.decoder = decoder
        self.filters = filters
        n_vocab = filters.vocab.shape[0]

        def buffer(name, *shape, dtype=torch.long):
            self.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device), persistent=False)

        buffer("logits", batch_size, n_vocab, dtype=torch.float32)
        buffer("sampled", batch_size, sample_len)
        buffer("input_pos", 1)
        buffer("pad", batch_size)  # per row: the slots before it are left padding
        buffer("i")
        buffer("max_ts", batch_size)
        buffer("finished", batch_size, dtype=torch.bool)
        buffer("sum_logprobs", batch_size, dtype=torch.float32)
        buffer("temperature", batch_size, dtype=torch.float32)  # 0: greedy
        buffer("seed", batch_size)  # per row, for sampling at a temperature
        self.sample = False

    def reset(self, logits: Tensor, n_initial: int, pad: Tensor, temperature: Tensor, seed: Tensor) -> None:
        """Starts a batch from the prefill's last logits [B, V] (outside any graph).

        n_initial: the prefix length in slots; pad [B]: each row's left padding; temperature,
        seed [B]: each row's sampling temperature (0: greedy) and noise seed."""
        self.logits.copy_(logits)
        self.sampled.fill_(self.filters.eot)
        self.input_pos.fill_(n_initial)
        self.pad.copy_(pad)
        self.temperature.copy_(temperature)
        self.seed.copy_(seed)
        for t in (self.i, self.max_ts, self.finished, self.sum_logprobs):
            t.zero_()

    group = 1  # decoder rows per window

    def retire(self, n: int) -> None:
        """The rows past the first n windows' (a batch's padding) take no steps: ended from the
        start, so the steps stop once the real windows have ended (outside any graph)."""
        self.finished[n * self.group :] = True

    def live_windows(self) -> LiveWindows | None:
        """Run eagerly on a CPU: the windows with a row still decoding, whose attention and logits
        are the only ones computed (see LiveWindows). None elsewhere: every row, fixed shapes."""
        if self.finished.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        windows = (~self.finished.view(-1, self.group).all(dim=1)).nonzero()[:, 0]
        return LiveWindows(windows.tolist(), self.group)

    def live_rows(self) -> Tensor | None:
        """Run eagerly on a CPU where some window has ended: the rows of the windows still
        decoding, the only ones whose vocabulary-wide work (filters, log-softmax, picks) is done.
        Every such operation computes a row on its own, to the same bits in any set of rows. None
        where every window is live, and elsewhere (fixed shapes)."""
        live = self.live_windows()
        if live is None or live.every_row(self.finished.shape[0]):
            return None
        return torch.tensor(live.row_index(), dtype=torch.long)

    @staticmethod
    def _of_rows(rows: Tensor | None, *tensors: Tensor) -> tuple[Tensor, ...]:
        """Each tensor's `rows` only (all of it where rows is None)."""
        return tensors if rows is None else tuple(t[rows] for t in tensors)

    def _live_state(self, state: DecodeState, rows: Tensor | None) -> DecodeState:
        """The state of `rows` only (all of it where rows is None)."""
        return DecodeState(*self._of_rows(rows, state.last, state.penult, state.max_ts, state.finished, state.sum_logprobs))

    def _every_row(self, state: DecodeState, rows: Tensor | None, tokens: Tensor, new: DecodeState) -> tuple[Tensor, DecodeState]:
        """The tokens and new state picked for `rows` (select_tokens or pick_tokens), spread over
        every row: an ended row picks eot and keeps its state, as the picks leave it."""
        if rows is None:
            return tokens, new
        tokens = torch.full_like(state.last, self.filters.eot).index_copy_(0, rows, tokens)
        return tokens, DecodeState(tokens, state.last, state.max_ts.index_copy(0, rows, new.max_ts),
                                   state.finished.index_copy(0, rows, new.finished),
                                   state.sum_logprobs.index_copy(0, rows, new.sum_logprobs))  # fmt: skip

    def _next_logits(self, tokens: Tensor) -> None:
        """The decoder on the tokens just picked [B], into `logits`. Where the decoder computes a
        row to the same bits in any set of rows (rows_apart) and some window has ended, it takes
        the live windows' rows only; the ended rows' logits are left as they were, never read."""
        live = self.live_windows()
        if live is not None and self.decoder.rows_apart and not live.every_row(tokens.shape[0]):
            rows = torch.tensor(live.row_index(), dtype=torch.long)
            logits = self.decoder(tokens[rows, None], self.input_pos, self.pad[rows], replace(live, compact=True))
            self.logits.index_copy_(0, rows, logits[:, -1])
        else:
            self.logits.copy_(self.decoder(tokens[:, None], self.input_pos, self.pad, live)[:, -1])

    def _sampled_at(self, offset: int) -> Tensor:
        # the token sampled `offset` steps ago [B]; column 0 where there is none (the filters ignore it)
        column = (self.i - offset).clamp(min=0).view(1, 1).expand(self.sampled.shape[0], 1)
        return self.sampled.gather(1, column)[:, 0]

    def forward(self) -> None:
        # last and penult are read back from `sampled` rather than kept in buffers of their own:
        # two in-place copies between buffers (penult <- last <- new) were reordered by Inductor.
        state = DecodeState(
            self._sampled_at(1), self._sampled_at(2), self.max_ts, self.finished, self.sum_logprobs
        )
        rows = self.live_rows()  # the vocabulary-wide work for the windows still decoding only
        logits, temperature, seed = self._of_rows(rows, self.logits, self.temperature, self.seed)
        picked = select_tokens(self.filters, logits, self.i, self._live_state(state, rows), temperature, seed, self.sample)
        tokens, new = self._every_row(state, rows, *picked)
        self.sampled.index_copy_(1, self.i.view(1), tokens[:, None])
        self.max_ts.copy_(new.max_ts)
        n_ctx = self.decoder.positional_embedding.shape[0]
        self.finished.copy_(new.finished | (self.input_pos - self.pad >= n_ctx))
        self.sum_logprobs.copy_(new.sum_logprobs)
        self._next_logits(tokens)
        self.input_pos.add_(1)
        self.i.add_(1)
