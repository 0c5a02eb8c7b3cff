"""Word timestamps: openai-whisper's method, from the cross-attention of the alignment heads.

After a batch is decoded, one teacher-forced decoder pass (wtx.batch) over each window's
[<|startoftranscript|>..., <|notimestamps|>, text..., <|endoftext|>] yields the alignment heads'
attention logits. Per window, as whisper's timing.py does: softmax over the window's frames,
normalised per frame over the tokens, median-filtered along time (width 7) and averaged over
the heads; dynamic time warping then maps tokens to frames (20 ms each), and tokens are grouped
into words. The segment rules that follow are in wtx.words.

The attention pass (wtx.batch), the per-window normalisation and one dynamic time warping over
the whole batch run on the model's device; the paths are read back on the host.
"""

import numpy as np
import torch
import torch.nn.functional as F

from wtx.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, Window
from wtx.words import WordTiming

TOKENS_PER_SECOND = 50  # one audio-encoder frame per 20 ms
MEDFILT_WIDTH = 7


def window_frames(window: Window) -> int:
    """A window's mel frames with audio (100 a second), as transcribe() counts a segment's."""
    return min(N_FRAMES, round(window.duration * SAMPLE_RATE) // HOP_LENGTH)


# Knuth's 16-comparator sorting network for 7 wires (TAOCP vol. 3, 5.3.4)
SORTING_NETWORKS = {7: [(0, 6), (2, 3), (4, 5), (0, 2), (1, 4), (3, 6), (0, 1), (2, 5), (3, 4), (1, 2), (4, 6),
                        (2, 3), (4, 5), (1, 2), (3, 4), (5, 6)]}  # fmt: skip


def sorting_network(width: int) -> list[tuple[int, int]]:
    """Comparators (i, j), i < j, that sort `width` wires: min to i, max to j."""
    if width in SORTING_NETWORKS:
        return SORTING_NETWORKS[width]
    return [(i, i + 1) for round_ in range(width) for i in range(round_ % 2, width - 1, 2)]  # odd-even transposition


def median_network(width: int) -> list[tuple[int, int, bool, bool]]:
    """The comparators of sorting_network(width) that the middle wire depends on, each with
    whether its min and its max are used further on: (i, j, min used, max used)."""
    needed, kept = {width // 2}, []
    for i, j in reversed(sorting_network(width)):
        low, high = i in needed, j in needed
        if low or high:
            kept.append((i, j, low, high))
            needed |= {i, j}
    return kept[::-1]


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of `width` (odd) along the last dimension, edges reflected.

    A sorting network over the `width` shifted copies, only the comparisons the middle wire
    depends on (width 7: 22 minima and maxima): exact, like sorting each window, and many times
    faster than torch.sort over so short a dimension."""
    pad = width // 2
    if x.shape[-1] <= pad:  # too short to reflect
        return x
    padded = F.pad(x, (pad, pad, 0, 0), mode="reflect")  # x: [heads, tokens, frames]
    n = x.shape[-1]
    copies = [padded[..., i : i + n] for i in range(width)]
    for i, j, low, high in median_network(width):
        a, b = copies[i], copies[j]
        if low:
            copies[i] = torch.minimum(a, b)
        if high:
            copies[j] = torch.maximum(a, b)
    return copies[pad]


def dtw(cost: torch.Tensor) -> torch.Tensor:
    """Cheapest monotonic paths through a batch of cost matrices [B, N, M] (float64), as whisper's dtw.

    Steps go diagonally, down (next token) or right (next frame); ties prefer right, then down.
    Costs add up in float64 (as whisper's numba dtw does on the CPU, the reference), one
    anti-diagonal of the (N + 1) x (M + 1) table at a time: every cell of a diagonal depends
    only on the two before it. On a GPU with Triton one kernel walks the diagonals
    (`wtx.dtw_kernel`); elsewhere a step is a few tensor operations over the whole batch. A
    matrix smaller than [N, M] is padded anywhere below or right of it: its cells never depend
    on the padding. Returns the steps taken [N + M + 1, B, N + 1] (int8, indexed by diagonal and
    row), for `backtrace`."""
    b, n, m = cost.shape
    skewed = skew(cost)
    if cost.device.type == "cuda":
        from wtx import dtw_kernel

        if dtw_kernel.usable(cost.device) and n < dtw_kernel.BLOCK:
            try:
                return dtw_kernel.dtw_steps(skewed)
            except torch.cuda.OutOfMemoryError:  # the loop needs more memory, not a kernel failure
                raise
            except Exception as e:  # a kernel that cannot compile here: the loop below is the fallback
                dtw_kernel.failed(e)
    return _dtw_loop(skewed, b, n, m)


def skew(cost: torch.Tensor) -> torch.Tensor:
    """The costs [B, N, M] by anti-diagonal and row [N + M + 1, B, N]: cell (i, k - i) of the
    table at [k, :, i - 1], inf outside each matrix."""
    b, n, m = cost.shape
    rows = torch.arange(1, n + 1, device=cost.device)
    diagonals = torch.arange(n + m + 1, device=cost.device)
    columns = diagonals[:, None] - rows[None, :]  # [K, N]: the column of row i on diagonal k
    inside = (columns >= 1) & (columns <= m)
    skewed = cost[:, rows[None, :] - 1, (columns - 1).clamp(0, m - 1)]  # [B, K, N]
    return skewed.masked_fill(~inside, float("inf")).transpose(0, 1).contiguous()


def _dtw_loop(skewed: torch.Tensor, b: int, n: int, m: int) -> torch.Tensor:
    """`dtw` as tensor operations, one anti-diagonal a step: three diagonals in turn in three
    buffers, the steps' choices written in place."""
    device = skewed.device
    # diagonal k's costs, cell (i, k - i) at [:, i], in buffers[k % 3]; diagonal 0 is cell (0, 0)
    buffers = [torch.full((b, n + 1), float("inf"), dtype=torch.float64, device=device) for _ in range(3)]
    buffers[0][:, 0] = 0
    diagonal = torch.zeros((n + m + 1, b, n), dtype=torch.bool, device=device)
    down = torch.zeros((n + m + 1, b, n), dtype=torch.bool, device=device)
    for k in range(2, n + m + 1):
        before_last, last, new = buffers[(k - 2) % 3], buffers[(k - 1) % 3], buffers[k % 3]
        if k == 3:
            new[:, 0] = float("inf")  # it held cell (0, 0)
        c0, c1, c2 = before_last[:, :-1], last[:, :-1], last[:, 1:]  # from (i-1, j-1), (i-1, j), (i, j-1)
        took_diagonal = torch.lt(c0, c1, out=diagonal[k])
        took_diagonal &= c0 < c2
        took_down = torch.lt(c1, c0, out=down[k])  # c1 < c0 rules out the diagonal
        took_down &= c1 < c2
        torch.add(skewed[k], torch.where(took_diagonal, c0, torch.where(took_down, c1, c2)), out=new[:, 1:])
    trace = torch.full((n + m + 1, b, n + 1), 2, dtype=torch.int8, device=device)  # 2: right
    trace[:, :, 1:] -= 2 * diagonal.to(torch.int8) + down.to(torch.int8)  # 0: diagonal, 1: down
    return trace


def backtrace(trace: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """One matrix's path from its trace [N + M + 1, N + 1] back from cell (n, m): (rows, columns)."""
    i, j = n, m
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = 1 if j == 0 else 2 if i == 0 else trace[i + j, i]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1])
    return path[:, 0], path[:, 1]


def alignment_matrix(qk: torch.Tensor, n_text: int, n_frames: int, n_sot: int) -> torch.Tensor:
    """One window's token-to-frame weights [n_text + 1, n_frames // 2] from its alignment heads'
    logits [heads, T, n_audio_ctx] over [sot_sequence, no_timestamps, text, eot]: softmax over
    the frames with audio, normalised over the tokens, median-filtered, averaged over heads."""
    weights = qk[:, : n_sot + n_text + 2, : n_frames // 2].float().softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std, MEDFILT_WIDTH)
    return weights.mean(dim=0)[n_sot:-1]  # rows: no_timestamps and the text tokens, each predicting the next


def find_alignments(qk: torch.Tensor | list[torch.Tensor], texts: list[list[int]], token_probs: list[list[float]],
                    frames: list[int], tokenizer) -> list[list[WordTiming]]:  # fmt: skip
    """Each window's words aligned to its frames: whisper's find_alignment, batched.

    qk: the alignment heads' attention logits [B, heads, T, n_audio_ctx] over each window's
    forced sequence (or one [heads, T_i, n_audio_ctx] per window); texts: its text tokens;
    token_probs: their probabilities in that pass; frames: its mel frames with audio (100 a second)."""
    n_sot = len(tokenizer.sot_sequence)
    matrices = [alignment_matrix(qk[i], len(text), f, n_sot) for i, (text, f) in enumerate(zip(texts, frames))]
    cost = torch.zeros(len(texts), max(len(t) for t in texts) + 1, max(f // 2 for f in frames),
                       dtype=torch.float64, device=matrices[0].device)  # fmt: skip
    for i, matrix in enumerate(matrices):
        cost[i, : matrix.shape[0], : matrix.shape[1]] = -matrix.double()
    trace = dtw(cost).cpu().numpy()
    alignments = []
    for i, (text, probs, matrix) in enumerate(zip(texts, token_probs, matrices)):
        text_indices, time_indices = backtrace(trace[:, i], *matrix.shape)
        alignments.append(_words(text, probs, text_indices, time_indices, tokenizer))
    return alignments


def _words(text_tokens: list[int], token_probs: list[float], text_indices: np.ndarray, time_indices: np.ndarray,
           tokenizer) -> list[WordTiming]:  # fmt: skip
    """Words from a path: a word starts at the frame where the path reaches its first token."""
    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    probabilities = [float(np.mean(token_probs[i:j])) for i, j in zip(boundaries[:-1], boundaries[1:])]
    return [WordTiming(w, t, float(s), float(e), p) for w, t, s, e, p in zip(words, word_tokens, starts, ends, probabilities)]
