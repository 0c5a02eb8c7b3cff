"""The rewritten Whisper: openai-whisper's architecture and parameter names, static shapes.

Differences from openai/whisper's model.py, all in service of torch.compile and CUDA graphs:
- the decoder's self-attention keys/values live in a preallocated `KVCache` of cache slots,
  written in place at a slot tensor (no hooks, no torch.cat);
- rows are left-padded to one prefix length (a previous-text prompt differs per row): a [B]
  `pad` tensor gives each row's first real slot, positions are slot minus pad, and the
  attention mask (causal, padding hidden) is computed from the slot and pad tensors, so one
  graph serves every step;
- cross-attention keys/values are computed once per batch into preallocated buffers;
- forward has no Python branching on tensor values.

State dicts from openai-whisper checkpoints load unchanged.
"""

import base64
import gzip
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelDimensions:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual)


class LayerNorm(nn.LayerNorm):
    """Always normalizes in float32, like openai-whisper, whatever the model dtype."""

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight.float()
        bias = self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type(x.dtype)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """Sinusoidal position table, as openai-whisper builds it for the encoder.

    Always computed on the CPU: under a `torch.device("meta")` context, meta kernels for these
    ops would import TorchDynamo (seconds) even when nothing is compiled."""
    log_timescale_increment = torch.log(torch.tensor(max_timescale, device="cpu")) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2, device="cpu"))
    scaled_time = torch.arange(length, device="cpu")[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


def eager_cpu_slot(input_pos: Tensor) -> int | None:
    """The last of the cache slots `input_pos` as an int, where reading it costs nothing: on a CPU,
    run eagerly. None elsewhere (a host sync on CUDA, a graph break under torch.compile)."""
    if input_pos.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return int(input_pos[-1])


def decoder_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                      input_pos: Tensor | None = None, by_row: bool = False) -> Tensor:  # fmt: skip
    """The decoder's attention: few queries (a step's, or a prompt's) over the cache or the audio.

    SDPA, except on a CPU in bf16 or fp16, or `by_row` (a step of live windows): there two
    matmuls with a float32 softmax, which compute every row on its own, to the same bits
    whichever rows are computed beside it (torch's CPU flash kernel splits its work by the
    batch's size: a row's bits changed with it). So a step computes only the windows still
    decoding, in runs of neighbours (LiveWindows). For a step's cross-attention in float32 the
    matmuls measured close to SDPA in one call and slower row by row; a prompt's many queries
    stay with SDPA (the prefill measured slower with matmuls). In bf16 torch's flash kernel
    measured several times slower than the matmuls for that cross-attention. Run eagerly on a
    CPU, self-attention (input_pos given) reads the cache only up to the last slot written,
    which every row of every batch has at the same step: measured faster than the whole cache
    (docs/benchmarks.md)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    last = eager_cpu_slot(input_pos) if input_pos is not None else None
    if last is not None:
        k, v, mask = k[:, :, : last + 1], v[:, :, : last + 1], mask[..., : last + 1]
    if q.dtype == torch.float32 and not by_row:
        if k.stride(-1) != 1:  # a CPU's cross-attention keys (CrossKV): SDPA's fast kernel wants rows
            k = k.contiguous()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    w = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if mask is not None:
        w = w.masked_fill(~mask, float("-inf"))
    return w.softmax(-1).to(v.dtype) @ v


def split_heads(x: Tensor, n_head: int) -> Tensor:
    # x: [B, T, D] -> [B, H, T, D/H]
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    # x: [B, H, T, Dh] -> [B, T, H*Dh]
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)


def group_attention(q: Tensor, k: Tensor, v: Tensor, by_row: bool = False) -> Tensor:
    """Cross-attention of q [B * G, H, T, Dh], G rows per window, over the windows' keys and
    values [B, H, S, Dh]: a window's rows are queries of one attention call, its audio read once.
    by_row: see decoder_attention."""
    group = q.shape[0] // k.shape[0]
    if group == 1:
        return decoder_attention(q, k, v, by_row=by_row)
    b, h, t, dh = k.shape[0], q.shape[1], q.shape[2], q.shape[3]
    q = q.view(b, group, h, t, dh).transpose(1, 2).reshape(b, h, group * t, dh)  # a window's rows as queries
    a = decoder_attention(q, k, v, by_row=by_row)
    return a.view(b, h, group, t, dh).transpose(1, 2).reshape(b * group, h, t, dh)


@dataclass(frozen=True)
class LiveWindows:
    """The windows of a batch still decoding, each `group` decoder rows (an eager CPU).

    Only their rows' attention and logits are computed; the other rows' are zeros, never read.
    Attention runs over each run of neighbouring live windows as matmuls, which compute every
    row on its own (decoder_attention); beam search's float32 logits are a product per window,
    packed fp16 or int8 logits one call for all live rows (a row's bits its own), greedy float32
    logits the whole batch. So a window's tokens are the same whichever windows are still
    decoding beside it. At beam 5 on a CPU this measured faster than computing every row,
    writing the same bytes. Where the decoder's linear layers and logits give a row the same
    bits in any set of rows (fp16 weights, TextDecoder.rows_apart), a step takes the live rows
    only (`compact`): the linear layers and the vocabulary-wide work skip the ended windows too,
    measured faster still (docs/benchmarks.md)."""

    windows: list[int]
    group: int
    compact: bool = False  # the decoder's input holds the live windows' rows only (see compact_runs)

    def rows(self) -> list[slice]:
        return [slice(w * self.group, (w + 1) * self.group) for w in self.windows]

    def runs(self) -> list[slice]:
        """The live windows as runs of neighbours: slices of windows, in order."""
        runs: list[slice] = []
        for w in self.windows:
            if runs and runs[-1].stop == w:
                runs[-1] = slice(runs[-1].start, w + 1)
            else:
                runs.append(slice(w, w + 1))
        return runs

    def run_rows(self) -> list[tuple[slice, slice]]:
        """(windows, their decoder rows) for every run of neighbouring live windows."""
        return [(run, slice(run.start * self.group, run.stop * self.group)) for run in self.runs()]

    def compact_runs(self) -> list[tuple[slice, slice, slice]]:
        """(windows, their decoder rows, those rows' place in an input of live rows only) for every
        run of neighbouring live windows."""
        runs, at = [], 0
        for windows, rows in self.run_rows():
            n = rows.stop - rows.start
            runs.append((windows, rows, slice(at, at + n)))
            at += n
        return runs

    def row_index(self) -> list[int]:
        return [w * self.group + g for w in self.windows for g in range(self.group)]

    def every_row(self, n_rows: int) -> bool:
        """Whether every one of a batch's n_rows decoder rows is live."""
        return len(self.windows) * self.group == n_rows

    def ended_rows(self, n_rows: int) -> list[int]:
        live = set(self.windows)
        return [r for r in range(n_rows) if r // self.group not in live]


class KVCache(nn.Module):
    """Self-attention keys and values for every decoder cache slot, preallocated."""

    def __init__(self, batch_size: int, n_head: int, max_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch_size, n_head, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor, rows: slice | None = None) -> tuple[Tensor, Tensor]:
        # input_pos: [T] cache slots; k, v: [B, H, T, Dh]. B may be fewer rows than the cache
        # holds: a group's prefill writes one row per window (see repeat_rows); `rows`, where
        # given, are the cache rows k and v belong to (a run of live windows).
        cache_k, cache_v = self.k, self.v
        if rows is not None:
            cache_k, cache_v = cache_k[rows], cache_v[rows]
        elif k.shape[0] != cache_k.shape[0]:
            cache_k, cache_v = cache_k[: k.shape[0]], cache_v[: k.shape[0]]
        cache_k.index_copy_(2, input_pos, k)
        cache_v.index_copy_(2, input_pos, v)
        return cache_k, cache_v

    def repeat_rows(self, group: int) -> None:
        """Rows 0..B-1 repeated `group` times each, in place: B windows' prefill for B * group beams."""
        n = self.k.shape[0] // group
        self.k.copy_(self.k[:n].repeat_interleave(group, dim=0))
        self.v.copy_(self.v[:n].repeat_interleave(group, dim=0))

    def reorder(self, source: Tensor, start: int = 0, end: int | None = None, rows: Tensor | None = None) -> None:
        """Row r takes row source[r]'s keys and values in slots start..end-1 (end: all): beams
        follow the hypotheses they extend. (Slots before `start`, a window's prefix, are the same
        in all its rows; slots from the next one to be written on are rewritten before they are read.)
        rows: where given, the only rows whose source is another row; the others are left as they are."""
        for cache in (self.k[:, :, start:end], self.v[:, :, start:end]):
            if rows is None:
                cache.copy_(cache.index_select(0, source))
            else:
                cache.index_copy_(0, rows, cache.index_select(0, source[rows]))


class CrossKV(nn.Module):
    """Cross-attention keys and values over the audio features, computed once per batch.

    k and v are [B, H, n_audio_ctx, Dh]. On a CPU the keys are laid out [B, H, Dh, n_audio_ctx]
    in memory (k is a transposed view), so a decode step's q @ k^T multiplies by a contiguous
    matrix: measured faster than keys stored [B, H, n_audio_ctx, Dh], to the same bits."""

    def __init__(self, batch_size: int, n_head: int, n_audio_ctx: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch_size, n_head, n_audio_ctx, head_dim)
        if torch.device(device).type == "cpu":
            k = torch.zeros(batch_size, n_head, head_dim, n_audio_ctx, dtype=dtype, device=device).transpose(-1, -2)
        else:
            k = torch.zeros(shape, dtype=dtype, device=device)
        self.register_buffer("k", k, persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


class SelfAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, input_pos: Tensor | None = None, mask: Tensor | None = None,
                live: LiveWindows | None = None) -> Tensor:  # fmt: skip
        # x: [B, T, D]; without a cache (the encoder) attention is over x itself.
        q = split_heads(self.query(x), self.n_head)
        k = split_heads(self.key(x), self.n_head)
        v = split_heads(self.value(x), self.n_head)
        if self.kv_cache is None:
            return self.out(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
        if live is not None and live.compact:  # x holds the live rows only: their caches, run by run
            a = torch.empty_like(q)
            for _, rows, at in live.compact_runs():
                cache_k, cache_v = self.kv_cache.update(input_pos, k[at], v[at], rows)
                a[at] = decoder_attention(q[at], cache_k, cache_v, mask[at], input_pos, by_row=True)
            return self.out(merge_heads(a))
        k, v = self.kv_cache.update(input_pos, k, v)
        if live is None:
            return self.out(merge_heads(decoder_attention(q, k, v, mask, input_pos)))
        a = q.new_zeros(q.shape)
        for _, rows in live.run_rows():
            a[rows] = decoder_attention(q[rows], k[rows], v[rows], mask[rows], input_pos, by_row=True)
        return self.out(merge_heads(a))


class CrossAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)
        self.cross_kv: CrossKV | None = None

    def set_audio_features(self, xa: Tensor, row: int | None = None) -> None:
        # xa: [B, n_audio_ctx, D], or [1, ...] for batch row `row`; written into the preallocated buffers in place
        k, v = (self.cross_kv.k, self.cross_kv.v) if row is None else (self.cross_kv.k[row : row + 1], self.cross_kv.v[row : row + 1])
        k.copy_(split_heads(self.key(xa), self.n_head))
        v.copy_(split_heads(self.value(xa), self.n_head))

    def forward(self, x: Tensor, live: LiveWindows | None = None) -> Tensor:
        # x: [B * G, T, D], G rows (beams or samples) per window sharing its audio's keys and values
        # queries in the keys' dtype (bf16 K/V on some CPUs: engine.pick_cross_dtype), the result in x's
        q = split_heads(self.query(x), self.n_head).to(self.cross_kv.k.dtype)
        k, v = self.cross_kv.k, self.cross_kv.v
        if live is None:
            return self.out(merge_heads(group_attention(q, k, v).to(x.dtype)))
        if live.compact:  # x holds the live rows only
            a = torch.empty_like(q)
            for windows, _, at in live.compact_runs():
                a[at] = group_attention(q[at], k[windows], v[windows], by_row=True)
            return self.out(merge_heads(a.to(x.dtype)))
        a = q.new_zeros(q.shape)
        for windows, rows in live.run_rows():
            a[rows] = group_attention(q[rows], k[windows], v[windows], by_row=True)
        return self.out(merge_heads(a.to(x.dtype)))

    def qk(self, x: Tensor, heads: Tensor, live: LiveWindows | None = None) -> Tensor:
        """The attention logits of `heads` [h] over the audio, [B, h, T, n_audio_ctx] in float32,
        scaled as openai-whisper computes them (one row per window: word alignment); with a
        compact `live`, x holds its windows' rows only."""
        k = self.cross_kv.k if live is None or not live.compact else self.cross_kv.k[live.windows]
        k = k[:, heads]
        q = split_heads(self.query(x), self.n_head)[:, heads].to(k.dtype)
        scale = q.shape[-1] ** -0.25
        return ((q * scale) @ (k * scale).transpose(-1, -2)).float()


def mlp(n_state: int) -> nn.Sequential:
    n_mlp = n_state * 4
    return nn.Sequential(nn.Linear(n_state, n_mlp), nn.GELU(), nn.Linear(n_mlp, n_state))


class EncoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = SelfAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)
        self.mlp = mlp(n_state)
        self.mlp_ln = LayerNorm(n_state)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class DecoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = SelfAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)
        self.cross_attn = CrossAttention(n_state, n_head)
        self.cross_attn_ln = LayerNorm(n_state)
        self.mlp = mlp(n_state)
        self.mlp_ln = LayerNorm(n_state)

    def forward(self, x: Tensor, input_pos: Tensor, mask: Tensor, heads: Tensor | None = None,
                weights: list[Tensor] | None = None, live: LiveWindows | None = None) -> Tensor:  # fmt: skip
        # heads: cross-attention heads whose logits go into `weights` (word alignment only)
        x = x + self.attn(self.attn_ln(x), input_pos, mask, live)
        h = self.cross_attn_ln(x)
        if heads is not None:
            weights.append(self.cross_attn.qk(h, heads, live))
        x = x + self.cross_attn(h, live)
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList(EncoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln_post = LayerNorm(n_state)

    def forward(self, mel: Tensor) -> Tensor:
        # mel: [B, n_mels, 3000] -> [B, n_audio_ctx, D]
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1) + self.positional_embedding.to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        self.blocks = nn.ModuleList(DecoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln = LayerNorm(n_state)
        self.projection: nn.Module | None = None  # packed fp16 or int8 weights (wtx.quantize); else the embedding's transpose
        # whether a step may take the live rows only (LiveWindows.compact): where every linear
        # layer and the projection give a row the same bits in any set of rows (fp16 weights)
        self.rows_apart = False

    def set_audio_features(self, xa: Tensor, row: int | None = None) -> None:
        """The cross-attention keys and values of the audio features xa [B, n_audio_ctx, D], or of
        one window's [1, ...] into batch row `row`."""
        for block in self.blocks:
            block.cross_attn.set_audio_features(xa, row)

    def audio_kv(self, row: int) -> list[tuple[Tensor, Tensor]]:
        """A copy of batch row `row`'s cross-attention keys and values, per layer (set_audio_kv)."""
        return [(b.cross_attn.cross_kv.k[row].clone(), b.cross_attn.cross_kv.v[row].clone()) for b in self.blocks]

    def set_audio_kv(self, row: int, kv: list[tuple[Tensor, Tensor]]) -> None:
        for block, (k, v) in zip(self.blocks, kv):
            block.cross_attn.cross_kv.k[row].copy_(k)
            block.cross_attn.cross_kv.v[row].copy_(v)

    def hidden(self, tokens: Tensor, input_pos: Tensor, pad: Tensor, heads: dict[int, Tensor] | None = None,
               weights: list[Tensor] | None = None, live: LiveWindows | None = None) -> Tensor:  # fmt: skip
        """tokens [B, T] at cache slots input_pos [T]; row b's real tokens start at slot pad[b].

        Returns the final hidden states [B, T, D]. Padding slots are hidden from every query
        but their own (an all-masked row would turn into NaN). heads: layer -> cross-attention
        heads whose logits are appended to `weights`, in layer order (word alignment)."""
        n_ctx = self.positional_embedding.shape[0]
        positions = (input_pos[None, :] - pad[:, None]).clamp(0, n_ctx - 1)  # [B, T]
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        n_slots = self.blocks[0].attn.kv_cache.k.shape[2]
        key = torch.arange(n_slots, device=tokens.device)[None, None, None, :]
        query = input_pos[None, None, :, None]
        mask = (key <= query) & ((key >= pad[:, None, None, None]) | (key == query))  # [B, 1, T, S]
        for layer, block in enumerate(self.blocks):
            x = block(x, input_pos, mask, heads.get(layer) if heads else None, weights, live)
        return self.ln(x)

    def repeat_cache_rows(self, group: int) -> None:
        """After a prefill of one row per window: every window's rows hold its prefix (see KVCache)."""
        for block in self.blocks:
            block.attn.kv_cache.repeat_rows(group)

    def reorder_cache(self, source: Tensor, start: int = 0, end: int | None = None) -> None:
        """Row r of every self-attention cache takes row source[r] [B * G] in slots start..end-1 (beam search).

        On a CPU, run eagerly, only the rows that take another row's cache are copied: a beam
        that extends its own hypothesis, and every row of an ended window, stays in place."""
        rows = None
        if source.device.type == "cpu" and not torch.compiler.is_compiling():
            rows = (source != torch.arange(source.shape[0])).nonzero()[:, 0]
            if rows.numel() == 0:
                return
        for block in self.blocks:
            block.attn.kv_cache.reorder(source, start, end, rows)

    def logits(self, x: Tensor, live: LiveWindows | None = None) -> Tensor:
        # x: [B, T, D] hidden states -> [B, T, n_vocab] in float32
        if live is not None and self.projection is not None and (live.compact or live.every_row(x.shape[0])):
            return self.projection(x)  # x holds the live rows only, or every row is live
        if live is not None and (self.projection is not None or live.group > 1):
            out = x.new_empty(*x.shape[:-1], self.token_embedding.weight.shape[0], dtype=torch.float32)
            out[live.ended_rows(x.shape[0])] = 0.0
            if self.projection is not None:  # packed (wtx.quantize): a row's bits are its own, whatever rows are beside it
                rows = live.row_index()
                out[rows] = self.projection(x[rows])
            for rows in live.rows() if self.projection is None else []:
                out[rows] = self.logits(x[rows])
            return out
        if self.projection is not None:
            return self.projection(x)
        weight = self.token_embedding.weight
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            # [n_vocab, D] @ [D, rows]: on a CPU measured faster than stock's rows times the
            # weight's transpose, most at a few rows, not always to the same bits
            # (scripts/logits_layout.py, docs/benchmarks.md); the copy back to rows is small
            rows = x.reshape(-1, x.shape[-1])
            return (weight @ rows.T).T.contiguous().view(*x.shape[:-1], -1).float()
        return (x @ weight.T).float()

    def forward(self, tokens: Tensor, input_pos: Tensor, pad: Tensor, live: LiveWindows | None = None) -> Tensor:
        return self.logits(self.hidden(tokens, input_pos, pad, live=live), live)


def default_alignment_heads(dims: ModelDimensions) -> list[tuple[int, int]]:
    """openai-whisper's alignment heads for a model without its own: every head of the upper half."""
    layers = range(dims.n_text_layer // 2, dims.n_text_layer)
    return [(layer, head) for layer in layers for head in range(dims.n_text_head)]


def alignment_heads(checkpoint: dict, dims: ModelDimensions) -> list[tuple[int, int]]:
    """The (layer, head) pairs whose cross-attention follows the speech, in layer order.

    From the checkpoint (bundled models carry their config's heads), else openai-whisper's
    table for its model names, else openai-whisper's default: every head of the upper half."""
    if checkpoint.get("alignment_heads"):
        return sorted((int(layer), int(head)) for layer, head in checkpoint["alignment_heads"])
    from wtx.whisper_parts import alignment_heads_table

    try:
        table = alignment_heads_table()
    except ImportError:
        table = {}
    dump = table.get(Path(str(checkpoint.get("name", ""))).name.removesuffix(".pt"))
    if dump is not None:
        mask = np.frombuffer(gzip.decompress(base64.b85decode(dump)), dtype=bool)
        if mask.size == dims.n_text_layer * dims.n_text_head:
            return [(int(layer), int(head)) for layer, head in np.argwhere(mask.reshape(dims.n_text_layer, -1))]
    return default_alignment_heads(dims)


class Whisper(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(
            dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer
        )
        self.decoder = TextDecoder(
            dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer
        )
        self.batch_size = 0
        self.n_slots = 0
        self.group = 1
        self.cross_dtype: torch.dtype | None = None
        self.alignment_heads = default_alignment_heads(dims)  # load_model sets the checkpoint's

    @property
    def device(self) -> torch.device:
        return self.decoder.token_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.token_embedding.weight.dtype

    def setup_caches(self, batch_size: int, n_slots: int, group: int = 1, cross_dtype: torch.dtype | None = None) -> None:
        """Preallocate self- and cross-attention caches for `batch_size` windows (outside any graph).

        n_slots: self-attention cache length, the longest prefix plus the tokens sampled after it;
        group: decoder rows per window (beams or samples), which share its cross-attention K/V;
        cross_dtype: the cross-attention K/V's dtype (default: the model's)."""
        cross_dtype = cross_dtype or self.dtype
        if (batch_size, n_slots, group, cross_dtype) == (self.batch_size, self.n_slots, self.group, self.cross_dtype):
            return
        d = self.dims
        head_dim = d.n_text_state // d.n_text_head
        for block in self.decoder.blocks:
            block.attn.kv_cache = KVCache(
                batch_size * group, d.n_text_head, n_slots, head_dim, self.dtype, self.device
            )
            block.cross_attn.cross_kv = CrossKV(
                batch_size, d.n_text_head, d.n_audio_ctx, head_dim, cross_dtype, self.device
            )
        self.batch_size = batch_size
        self.cross_dtype = cross_dtype
        self.n_slots = n_slots
        self.group = group


@contextmanager
def _no_init():
    """Module constructors skip their random initialisation: the checkpoint's weights replace it.

    On the meta device the initialisers would run as Python references that import TorchDynamo
    (seconds of start-up), which an eager run never needs."""
    names = ("kaiming_uniform_", "uniform_", "normal_", "ones_", "zeros_")
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def load_model(checkpoint: dict, device: str | torch.device = "cpu", dtype=torch.float32) -> Whisper:
    """Build the rewritten model from an openai-whisper checkpoint dict ({dims, model_state_dict})."""
    dims = ModelDimensions(**checkpoint["dims"])
    with torch.device("meta"), _no_init():
        model = Whisper(dims)
    state = {k: v.to(device=device, dtype=dtype) for k, v in checkpoint["model_state_dict"].items()}
    if "encoder.positional_embedding" not in state:  # some exports omit the fixed sinusoids
        state["encoder.positional_embedding"] = sinusoids(dims.n_audio_ctx, dims.n_audio_state).to(device, dtype)
    model.load_state_dict(state, assign=True, strict=True)
    model.alignment_heads = alignment_heads(checkpoint, dims)
    return model.eval().requires_grad_(False)
