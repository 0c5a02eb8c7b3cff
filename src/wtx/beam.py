"""Beam search and best-of-N sampling for a whole batch: G decoder rows per window, fixed shapes.

openai-whisper's BeamSearchDecoder (at temperature 0) and its best-of sampling (at a fallback
temperature), rewritten as tensor ops over B windows x G rows:
- every step ranks each window's N beams x (N + 1) best tokens by summed log-probability and
  keeps the N best that do not end the text; the ones that end it, ranked above the last kept,
  go into a fixed buffer of `max_candidates` ended hypotheses per window, as whisper keeps them;
- beams follow the hypotheses they extend by a gather on the sampled tokens, the timestamp state
  and the self-attention cache; the cross-attention keys and values are shared, never copied;
- a window whose buffer is full (or whose text reached the context's end) is frozen;
- windows at a temperature above 0 sample G rows independently, as DecodeLoop samples one.
Nothing branches on tensor values, so the step compiles into one graph like the greedy step.
The host then ranks each window's hypotheses with whisper's length normalisation (`best_hypothesis`).
"""

import torch
from torch import Tensor

from wtx.decode import DecodeLoop, DecodeState, LogitFilters, pick_tokens
from wtx.model import eager_cpu_slot
from wtx.options import DecodingOptions


def first_positions(mask: Tensor, n: int) -> Tensor:
    """The positions of the first n True entries of each row of mask [B, K], ascending: [B, n].
    Every row must hold at least n."""
    positions = torch.arange(mask.shape[1], device=mask.device, dtype=torch.float32)
    return torch.where(mask, -positions, float("-inf")).topk(n, dim=-1).indices


class GroupLoop(DecodeLoop):
    """DecodeLoop for G rows per window: beam search where a window's temperature is 0, else
    best-of sampling. Rows are window-major (row = window * G + g), and so are its buffers."""

    def __init__(self, decoder, filters: LogitFilters, n_windows: int, sample_len: int, decoding: DecodingOptions,
                 prefix_len: int, device):  # fmt: skip
        self.group, self.beams, self.best_of = decoding.group, decoding.beam_size, decoding.best_of
        self.candidates = max(decoding.max_candidates, 1)  # at least 1 (a buffer) where beam_size is 1
        super().__init__(decoder, filters, n_windows * self.group, sample_len, device)
        self.n_windows = n_windows
        self.prefix_len = prefix_len  # cache slots a prefix fills: the same in all of a window's rows

        def buffer(name, *shape, dtype=torch.long):
            self.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device), persistent=False)

        buffer("ended_tokens", n_windows, self.candidates, sample_len)  # each ends at its length with eot
        buffer("ended_scores", n_windows, self.candidates, dtype=torch.float32)
        buffer("ended_lengths", n_windows, self.candidates)
        buffer("ended_count", n_windows)
        buffer("frozen", n_windows, dtype=torch.bool)  # a beam window that has stopped
        n_rows = n_windows * self.group
        buffer("beam_rows", n_rows, dtype=torch.bool)  # rows of windows decoded by beam search
        self.register_buffer("rows", torch.arange(n_rows, device=device), persistent=False)

    def reset(self, logits: Tensor, n_initial: int, pad: Tensor, temperature: Tensor, seed: Tensor) -> None:
        """Starts a batch from the prefill's last logits and pad, one row per window [B, ...];
        temperature and seed are per decoder row [B * G]. A window at temperature 0 is decoded
        by beam search when beam_size > 1, else greedily by its first row; at a temperature
        above 0, by `best_of` sampled rows. The group's other rows start ended."""
        g = self.group
        super().reset(logits.repeat_interleave(g, dim=0), n_initial, pad.repeat_interleave(g, dim=0), temperature, seed)
        member = self.rows % g
        beam = (temperature == 0) & (self.beams > 1)
        in_use = torch.where(beam, member < self.beams, member < torch.where(temperature > 0, self.best_of, 1))
        self.beam_rows.copy_(beam)
        self.finished.copy_(~in_use)
        self.sum_logprobs.masked_fill_(~in_use, float("-inf"))
        self.ended_tokens.fill_(self.filters.eot)
        self.ended_scores.fill_(float("-inf"))
        for t in (self.ended_lengths, self.ended_count, self.frozen):
            t.zero_()

    def forward(self) -> None:
        b, g, n, eot = self.n_windows, self.group, self.beams, self.filters.eot
        state = DecodeState(self._sampled_at(1), self._sampled_at(2), self.max_ts, self.finished, self.sum_logprobs)
        rows = self.live_rows()  # the vocabulary-wide work for the windows still decoding only
        live = self._live_state(state, rows)
        (live_logits,) = self._of_rows(rows, self.logits)
        logits, logprobs = self.filters.filtered(live_logits, self.i, live.last, live.penult, live.max_ts)
        if self.sample or n == 1:
            temperature, seed = self._of_rows(rows, self.temperature, self.seed)
            picked = pick_tokens(self.filters, logits, self.i, live, temperature, seed, self.sample, logprobs)
            sampled, after_sampling = self._every_row(state, rows, *picked)
            sampled_sums, sampling_done = after_sampling.sum_logprobs, after_sampling.finished
        else:  # every window is at temperature 0, decoded by beam search: no row picks a token of its own
            sampled, sampled_sums, sampling_done = self.rows, self.sum_logprobs, self.finished
        beam_window = self.beam_rows.view(b, g)[:, 0]
        if n > 1:
            top_logprobs, top_tokens = logprobs.view(-1, g, logprobs.shape[-1])[:, :n].topk(n + 1, dim=-1)  # [B, N, N + 1]
            if rows is not None:  # an ended window's candidates: never taken (it is frozen), any token but eot
                windows = rows.view(-1, g)[:, 0] // g
                top_logprobs = top_logprobs.new_full((b, n, n + 1), float("-inf")).index_copy_(0, windows, top_logprobs)
                top_tokens = top_tokens.new_zeros((b, n, n + 1)).index_copy_(0, windows, top_tokens)
            token, source, score = self._beam_step(top_logprobs, top_tokens, beam_window & ~self.frozen)
        else:  # no window is decoded by beam search
            token, source, score = sampled, self.rows, sampled_sums
        moving = self.beam_rows & ~self.frozen.repeat_interleave(g)  # beam rows that take a step
        still = self.beam_rows & ~moving
        token = torch.where(moving, token, torch.where(still, eot, sampled))
        source = torch.where(moving, source, self.rows)
        sum_logprobs = torch.where(moving, score, torch.where(still, self.sum_logprobs, sampled_sums))

        history = self.sampled.index_select(0, source).index_copy(1, self.i.view(1), token[:, None])
        self.sampled.copy_(history)
        max_ts = self.max_ts.index_select(0, source)
        self.max_ts.copy_(torch.where(token >= self.filters.timestamp_begin, token, max_ts))
        self.sum_logprobs.copy_(sum_logprobs)
        n_ctx = self.decoder.positional_embedding.shape[0]
        at_end = self.input_pos - self.pad >= n_ctx
        frozen = self.frozen | (self.ended_count >= self.candidates) | at_end.view(b, g)[:, 0]
        self.frozen.copy_(frozen & beam_window)
        sampling_done = sampling_done | at_end
        self.finished.copy_(torch.where(self.beam_rows, self.frozen.repeat_interleave(g), sampling_done))
        if n > 1:
            # run eagerly on a CPU, only the slots written so far (up to this step's)
            self.decoder.reorder_cache(source, self.prefix_len, eager_cpu_slot(self.input_pos))
        self._next_logits(token)
        self.input_pos.add_(1)
        self.i.add_(1)

    def retire(self, n: int) -> None:
        super().retire(n)
        self.frozen[n:] = True

    def _beam_step(self, top_logprobs: Tensor, top_tokens: Tensor, stepping: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step of beam search for every window, from each beam's N + 1 likeliest tokens
        [B, N, N + 1]: (token, source row, summed log-probability), each [B * G]; rows past a
        window's N beams keep themselves. Hypotheses that end here go into the ended buffers of
        the `stepping` windows [B]."""
        b, g, n, eot = self.n_windows, self.group, self.beams, self.filters.eot
        k = n * (n + 1)
        scores = self.sum_logprobs.view(b, g)[:, :n, None] + top_logprobs
        # at the first step a window's beams are one hypothesis: only the first one's tokens count
        copies = (self.i == 0) & (torch.arange(n, device=top_logprobs.device) > 0)[None, :, None]
        scores, order = scores.masked_fill(copies, float("-inf")).view(b, k).sort(dim=-1, descending=True, stable=True)
        tokens = top_tokens.view(b, k).gather(1, order)
        ends = tokens == eot
        kept = first_positions(~ends, n)  # [B, N]: the beams that go on
        self._keep_ended(scores, order // (n + 1), ends & stepping[:, None] & (torch.arange(k, device=top_logprobs.device) < kept[:, -1:]))

        base = (self.rows.view(b, g)[:, :1]).expand(b, n)
        beam_source = base + (order.gather(1, kept) // (n + 1))
        pad_rows = self.rows.view(b, g)[:, n:]  # a group's rows past its beams
        source = torch.cat([beam_source, pad_rows], dim=1).view(-1)
        token = torch.cat([tokens.gather(1, kept), torch.full_like(pad_rows, eot)], dim=1).view(-1)
        score = torch.cat([scores.gather(1, kept), self.sum_logprobs.view(b, g)[:, n:]], dim=1).view(-1)
        return token, source, score

    def _keep_ended(self, scores: Tensor, beam: Tensor, ended: Tensor) -> None:
        """Adds the hypotheses that end at this step (the `ended` entries of the sorted candidates
        [B, K], best first, from beam `beam` [B, K]) to each window's buffer while it has room."""
        b, g, c = self.n_windows, self.group, self.candidates
        slot = self.ended_count[:, None] + ended.long().cumsum(dim=1) - 1
        taken = ended & (slot < c)
        match = taken[:, :, None] & (slot[:, :, None] == torch.arange(c, device=scores.device))  # [B, K, C]
        filled = match.any(dim=1)  # [B, C]
        which = match.long().argmax(dim=1)  # the candidate that fills each slot
        source = beam.gather(1, which)  # [B, C] beams within the window
        history = self.sampled.view(b, g, -1).gather(1, source[:, :, None].expand(-1, -1, self.sampled.shape[1]))
        self.ended_tokens.copy_(torch.where(filled[:, :, None], history, self.ended_tokens))
        self.ended_scores.copy_(torch.where(filled, scores.gather(1, which), self.ended_scores))
        self.ended_lengths.copy_(torch.where(filled, self.i, self.ended_lengths))
        self.ended_count.add_(taken.sum(dim=1))


def best_hypothesis(hypotheses: list[tuple[list[int], float]], length_penalty: float | None) -> tuple[list[int], float]:
    """openai-whisper's MaximumLikelihoodRanker: the (tokens, sum_logprob) of highest
    sum_logprob / penalty, the penalty being the length, or ((5 + length) / 6) ** length_penalty."""

    def score(hypothesis):
        tokens, logprob = hypothesis
        penalty = len(tokens) if length_penalty is None else ((5 + len(tokens)) / 6) ** length_penalty
        return logprob / penalty

    best = max(range(len(hypotheses)), key=lambda j: score(hypotheses[j]))  # the first of equal scores
    return hypotheses[best]


def until_eot(row: list[int], eot: int) -> list[int]:
    return row[: row.index(eot)] if eot in row else row


def window_hypotheses(loop: GroupLoop, n: int) -> list[list[tuple[list[int], float]]]:
    """The first n windows' hypotheses after the steps, as openai-whisper's finalize() gives them:
    a beam window's ended ones, topped up from its live beams (best first) to beam_size; a
    sampled window's rows in use."""
    g, eot = loop.group, loop.filters.eot
    sampled = loop.sampled[: n * g].cpu().tolist()
    sums = loop.sum_logprobs[: n * g].cpu().tolist()
    beam = loop.beam_rows[: n * g : g].cpu().tolist()
    counts = loop.ended_count[:n].cpu().tolist()
    ended_tokens = loop.ended_tokens[:n].cpu().tolist()
    ended_scores = loop.ended_scores[:n].cpu().tolist()
    ended_lengths = loop.ended_lengths[:n].cpu().tolist()
    result = []
    for w in range(n):
        rows = range(w * g, (w + 1) * g)
        if beam[w]:
            hypotheses = [(ended_tokens[w][c][: ended_lengths[w][c]], ended_scores[w][c]) for c in range(counts[w])]
            live = sorted(rows[: loop.beams], key=lambda r: sums[r], reverse=True)
            for r in live:
                if len(hypotheses) >= loop.beams:
                    break
                hypotheses.append((until_eot(sampled[r], eot), sums[r]))
        else:
            hypotheses = [(until_eot(sampled[r], eot), sums[r]) for r in rows if sums[r] != float("-inf")]
        result.append(hypotheses)
    return result
