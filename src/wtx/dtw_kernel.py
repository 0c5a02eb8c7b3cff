"""The DTW of word timestamps on a GPU as one Triton kernel: one program per cost matrix walks
its anti-diagonals in order, so a batch's DTW is one launch instead of a dozen tensor
operations per diagonal (about 1,700 diagonals for a 30 s window: tens of thousands of
launches). It does what `wtx.timing.dtw`'s loop does, the same float64 sums and comparisons,
so the steps are the same bits.

Triton compiles the kernel once per device and keeps it under `<wtx cache>/triton` (private,
like the rest of the cache). Where Triton is missing, `usable()` is False; where it fails to
compile or launch, the caller falls back to the tensor loop (`failed`)."""

import warnings

import torch

from wtx.compile_cache import use_triton_cache
from wtx.errors import WtxError

__all__ = ["BLOCK", "dtw_steps", "failed", "usable"]

BLOCK = 512  # lanes per program, one per token row: above n_text_ctx (448) + 1, so one kernel for every window
_failure: list[Exception] = []
try:
    use_triton_cache()  # before Triton reads it
    import triton
    import triton.language as tl
except ImportError:  # wtx runs without Triton: the tensor loop does the DTW
    triton = None
except (WtxError, OSError) as e:  # a cache folder wtx cannot or will not use (UntrustedCache): the loop does the DTW
    triton = None
    _failure.append(e)
    warnings.warn(f"word timestamps: {e}; using the slower tensor loop", stacklevel=1)

if triton is not None:

    @triton.jit(do_not_specialize=["n_batch", "n_rows", "n_diagonals"])
    def _dtw_kernel(skewed, buffers, trace, n_batch, n_rows, n_diagonals, BLOCK: tl.constexpr):
        # skewed: [K, B, N] costs by diagonal and row; buffers: [B, 3, N + 1], three diagonals'
        # sums in turn, cell (0, 0) = 0 in diagonal 0's and inf elsewhere; trace: [K, B, N + 1] of 2s
        b = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        inside = (i >= 1) & (i <= n_rows)
        width = n_rows + 1
        own = buffers + b * 3 * width
        for k in tl.range(2, n_diagonals, num_stages=1):  # no loads run ahead of the barrier
            before_last = own + ((k - 2) % 3) * width
            last = own + ((k - 1) % 3) * width
            new = own + (k % 3) * width
            c0 = tl.load(before_last + i - 1, mask=inside, other=float("inf"))  # from (i-1, j-1)
            c1 = tl.load(last + i - 1, mask=inside, other=float("inf"))  # from (i-1, j)
            c2 = tl.load(last + i, mask=inside, other=float("inf"))  # from (i, j-1)
            cost = tl.load(skewed + (k * n_batch + b) * n_rows + i - 1, mask=inside, other=0.0)
            took_diagonal = (c0 < c1) & (c0 < c2)
            took_down = (c1 < c0) & (c1 < c2)
            tl.store(new + i, cost + tl.where(took_diagonal, c0, tl.where(took_down, c1, c2)), mask=inside)
            tl.store(new + i, float("inf"), mask=(i == 0) & (k == 3))  # it held cell (0, 0)
            step = 2 - 2 * took_diagonal.to(tl.int8) - took_down.to(tl.int8)  # 0 diagonal, 1 down, 2 right
            tl.store(trace + (k * n_batch + b) * width + i, step.to(tl.int8), mask=inside)
            tl.debug_barrier()  # the diagonal is written before any lane reads it


def usable(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: a GPU, Triton installed, no failure yet."""
    return device.type == "cuda" and triton is not None and not _failure


def failed(error: Exception) -> None:
    """The kernel failed to compile or run: warn once; the tensor loop does the DTW from now on."""
    if not _failure:
        warnings.warn(f"word timestamps: the Triton DTW kernel failed ({error!r}); using the slower tensor loop", stacklevel=2)
    _failure.append(error)


def dtw_steps(skewed: torch.Tensor) -> torch.Tensor:
    """The steps taken [K, B, N + 1] (int8: 0 diagonal, 1 down, 2 right) from the costs by
    anti-diagonal [K, B, N] (float64, inf outside each matrix): `wtx.timing.dtw`'s result."""
    k, b, n = skewed.shape
    if n + 1 > BLOCK:
        raise ValueError(f"{n} token rows; the kernel takes at most {BLOCK - 1}")
    buffers = torch.full((b, 3, n + 1), float("inf"), dtype=torch.float64, device=skewed.device)
    buffers[:, 0, 0] = 0
    trace = torch.full((k, b, n + 1), 2, dtype=torch.int8, device=skewed.device)
    with torch.cuda.device(skewed.device if skewed.is_cuda else -1):  # Triton launches on the current device
        _dtw_kernel[(b,)](skewed, buffers, trace, b, n, k, BLOCK=BLOCK, num_warps=4, num_stages=1)
    return trace

