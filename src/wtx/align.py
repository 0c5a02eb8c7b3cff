"""The aligning pass for word timestamps: after a batch is decoded, one teacher-forced decoder
pass over every window's [sot_sequence, no_timestamps, text, eot] (openai-whisper's
find_alignment) collects the alignment heads' attention logits, on the cross-attention K/V the
model still holds from that batch. The rest is per window (wtx.timing).

On an eager CPU each window takes that pass alone, over its own tokens only, so its words are
the same bits whatever windows share its batch: in one batched pass, padded to the longest
text, attention summed over more (masked) keys and a window's word probabilities moved in the
fourth decimal with its neighbours, so a file re-batched after a Ray worker died wrote other
bytes. Elsewhere the batch takes one pass at a fixed width, every row padded to the decoder's
slots, so its shapes, and with them the kernels and a row's bits, never depend on the texts
beside it."""

import torch

from wtx.audio import Window
from wtx.batch import BatchDecoder
from wtx.model import LiveWindows
from wtx.timing import find_alignments, window_frames
from wtx.words import WordTiming

__all__ = ["BatchAligner"]


class BatchAligner:
    """Word alignments for the batch a BatchDecoder just decoded. Eager on every backend: the
    compiled functions are not touched, so nothing recompiles."""

    def __init__(self, batch: BatchDecoder):
        self.batch = batch
        layers: dict[int, list[int]] = {}
        for layer, head in batch.model.alignment_heads:
            layers.setdefault(layer, []).append(head)
        # layer -> its alignment heads
        self.heads = {layer: torch.tensor(h, device=batch.device) for layer, h in layers.items()}
        self.alone = batch.device.type == "cpu"  # each window's pass alone (see the module's doc)

    @torch.no_grad()
    def __call__(self, texts_in: list[list[int] | None], windows: list[Window], languages: list[str],
                 probabilities: bool = True) -> list[list[WordTiming]]:  # fmt: skip
        """texts_in[i] is window i's text tokens (None: no words wanted); the windows and their
        languages are the batch's, in its order. Without `probabilities` the words' probabilities
        are NaN: their tokens' probabilities take a projection onto the whole vocabulary per
        token, a measurable part of a CPU's greedy run, that only .json shows."""
        batch = self.batch
        tokenizer, device = batch.tokenizer, batch.device
        start = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        rows = [start + text + [tokenizer.eot] if text and len(text) + len(start) < batch.n_slots else None
                for text in texts_in]  # fmt: skip
        if not any(rows):
            return [[] for _ in texts_in]
        wanted = [i for i, row in enumerate(rows) if row]
        if self.alone:
            qk, hidden = self._forced_alone(rows, wanted, languages)
        else:
            qk, hidden = self._forced_batch(rows, wanted, start, languages)
        texts = [rows[i][len(start) : -1] for i in wanted]
        probs = [self._text_probs(h, text) if probabilities else [float("nan")] * len(text) for h, text in zip(hidden, texts)]
        frames = [window_frames(windows[i]) for i in wanted]
        aligned = dict(zip(wanted, find_alignments(qk, texts, probs, frames, tokenizer)))
        return [aligned.get(i, []) for i in range(len(texts_in))]

    def _forced_batch(self, rows: list[list[int] | None], wanted: list[int], start: list[int],
                      languages: list[str]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """The forced pass over the whole batch, every row padded to the decoder's slots (a fixed
        shape: see the module's doc): the wanted windows' alignment-head logits
        [W, heads, T, n_audio_ctx] and final hidden states [1, T, D] each."""
        batch = self.batch
        tokenizer, device = batch.tokenizer, batch.device
        width = batch.n_slots
        padded = [(row or start) + [tokenizer.eot] * (width - len(row or start)) for row in rows]
        padded += [padded[0]] * (batch.batch_size - len(padded))
        tokens = torch.tensor(padded, device=device)
        if batch.dims.is_multilingual:
            codes = languages + [languages[0]] * (batch.batch_size - len(languages))
            language = torch.tensor([tokenizer.to_language_token(c) for c in codes], device=device)
            tokens[:, batch.sot_index + 1] = language
        weights: list[torch.Tensor] = []
        pad = torch.zeros(batch.batch_size, dtype=torch.long, device=device)
        hidden = batch.model.decoder.hidden(tokens, batch.slots[:width], pad, self.heads, weights)
        qk = torch.cat(weights, dim=1)  # [B, alignment heads, T, n_audio_ctx]
        return qk[wanted], [hidden[i : i + 1] for i in wanted]

    def _forced_alone(self, rows: list[list[int] | None], wanted: list[int],
                      languages: list[str]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
        """The forced pass for each wanted window alone, over its own tokens (an eager CPU; see
        the module's doc), on its rows of the caches and its audio's keys and values: its
        alignment-head logits [heads, T, n_audio_ctx] and final hidden states [1, T, D]."""
        batch = self.batch
        tokenizer, device = batch.tokenizer, batch.device
        qk, hidden = [], []
        for i in wanted:
            tokens = torch.tensor([rows[i]], device=device)
            if batch.dims.is_multilingual:
                tokens[0, batch.sot_index + 1] = tokenizer.to_language_token(languages[i])
            weights: list[torch.Tensor] = []
            pad = torch.zeros(1, dtype=torch.long, device=device)
            live = LiveWindows([i], 1, compact=True)
            hidden.append(batch.model.decoder.hidden(tokens, batch.slots[: len(rows[i])], pad, self.heads, weights, live))
            qk.append(torch.cat(weights, dim=1)[0])
        return qk, hidden

    def _text_probs(self, hidden: torch.Tensor, text: list[int]) -> list[float]:
        """The probability of each text token in the forced pass; hidden: one window's [1, T, D]."""
        tokenizer, device = self.batch.tokenizer, self.batch.device
        n_sot = len(tokenizer.sot_sequence)
        logits = self.batch.model.decoder.logits(hidden[:, n_sot : n_sot + len(text)])[0, :, : tokenizer.eot]
        at = torch.arange(len(text), device=device)
        return logits.softmax(dim=-1)[at, torch.tensor(text, device=device)].tolist()
