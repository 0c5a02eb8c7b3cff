"""Packed weights for a CPU's decode steps, through fbgemm: the logit projection, and with fp16
the decoder's linear layers too (fp16_linears).

A decode step reads the logit projection (the token embedding's transpose, 51,864 x 384 numbers
for tiny.en) whole, for a few rows; in float32 that is the largest part of a step.

- fp16 (`Fp16Linear`): fbgemm's fp16 GEMM keeps the weights in fp16 and converts them as it
  multiplies, the activations and the sums in float32. Whisper's checkpoints (openai-whisper's
  and the bundled ones) store their weights in fp16, so nothing is rounded: on tiny.en's
  projection, the real rows of a transcription, the largest error against float64 is 3.2e-5
  (float32's: 1.8e-5). A row's bits do not depend on the rows beside it.
- int8 (`Int8Linear`): weights in int8 with a scale per output channel, off by up to 1.2 in a
  tiny.en logit. For the logits (int8_projection) each row's 16 largest are then computed again
  from the fp16 weights, so the tokens greedy and beam search pick between are ranked exactly:
  over five long files (tiny.en, CPU, text only) the WER came back to fp16's at beam 5 and
  greedy, where int8 alone measured higher (docs/benchmarks.md). Activations
  are quantised per row (per token), so that a row's result never depends on the other rows of
  its batch. fbgemm's dynamic linear picks one scale for its whole input from the input's range;
  one fixed anchor row [1, -1, 0, ...] pins that range to [-1, 1], and each row, divided by its
  largest magnitude, is written as integers on that range's grid.
  On a CPU with VNNI, where fbgemm sums u8 x s8 products straight into int32, a row takes 8 bits
  (integers within +-127, as CTranslate2's int8 does). Without VNNI, products are summed in pairs
  in int16 first, which 8-bit activations can saturate: fbgemm's reduced range (7 bits) is used,
  and each row is written as two rows of integers within +-63, its value and its rounding error
  (in steps 126 times finer), adding no error of their own at twice the multiplications.

On a CPU with VNNI, tiny.en's projection for a step's rows measured fastest in int8 in 8 bits,
then fp16, then float32; int8 in two 7-bit rows measured about as fast as fp16
(docs/benchmarks.md)."""

import functools
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from wtx.model import Whisper

__all__ = ["Fp16Linear", "Int8Linear", "fp16_linears", "fp16_projection", "install_linears", "int8_kind", "int8_projection"]

GRID = 63.5  # fbgemm's dynamic linear (reduce_range) maps [-1, 1] onto 0..127: a grid of 1 / 63.5
STEPS = 63  # the grid points used on either side of zero, all of them inside [-1, 1]
GRID_8BIT, STEPS_8BIT = 127.5, 127  # the full range, 0..255
RESCORED = 16  # a logit row's largest int8 logits computed again from the fp16 weights


@functools.cache
def has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX512-VNNI or AVX-VNNI), read from /proc/cpuinfo (False
    where there is none to read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def _pack(weight: Tensor, bias: Tensor | None) -> tuple[object, Tensor | None]:
    """fbgemm's prepacked int8 weight [N, K] (symmetric, a scale per output channel). The bias is
    kept apart, added after the rows are scaled back."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    zero = torch.zeros(weight.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # quantised tensors are deprecated; the packed weight is what runs
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qweight, None)
    return packed, None if bias is None else bias.detach().float().clone()


class Fp16Linear(nn.Module):
    """y = x W^T + b with W in fp16 (exact for fp16 checkpoints), x, b, the sums and y in float32."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().float(), None if bias is None else bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.in_features), self.packed)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp16"


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 and x quantised per row; x is float32 [..., K].

    two_rows: each row as two 7-bit rows (None: where the CPU has no VNNI), else one of 8 bits.
    rescored: in each row, this many of the largest results are computed again exactly, from
    the weights in fp16 (exact for fp16 checkpoints) and x in float32 (0: none)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, two_rows: bool | None = None, rescored: int = 0):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.two_rows = not has_vnni() if two_rows is None else two_rows
        self.packed, self.bias = _pack(weight, bias)
        self.rescored = min(rescored, self.out_features)
        self.weight16 = weight.detach().half().contiguous() if self.rescored else None
        anchor = torch.zeros(1, self.in_features)
        anchor[0, 0], anchor[0, -1] = 1.0, -1.0
        self.anchor = anchor

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        scale = rows.abs().amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        # the anchor row pins fbgemm's range to [-1, 1], whose grid holds the integers / GRID
        # exactly (a row holding NaN or inf is zeroed for fbgemm, whose range check refuses it;
        # its scale makes its logits NaN, as in float32)
        if self.two_rows:
            unit = rows * (STEPS / scale)
            coarse = unit.round()  # integers in [-STEPS, STEPS]
            fine = (unit - coarse).mul_(2 * STEPS).round_()  # its rounding error, as integers too
            steps = torch.cat([coarse, fine]).div_(GRID).nan_to_num_(0.0, 0.0, 0.0)  # one call: the weights read once
            products = torch.ops.quantized.linear_dynamic(torch.cat([steps, self.anchor]), self.packed, True)
            y = products[n : 2 * n].mul(1 / (2 * STEPS)).add_(products[:n]).mul_(scale * (GRID / STEPS))
        else:
            steps = rows.mul(STEPS_8BIT / scale).round_().div_(GRID_8BIT).nan_to_num_(0.0, 0.0, 0.0)
            products = torch.ops.quantized.linear_dynamic(torch.cat([steps, self.anchor]), self.packed, False)
            y = products[:n].mul_(scale * (GRID_8BIT / STEPS_8BIT))
        if self.bias is not None:
            y += self.bias
        if self.rescored:
            self._rescore(rows, y)
        return y.view(*x.shape[:-1], self.out_features)

    def _rescore(self, rows: Tensor, y: Tensor) -> None:
        """y's `rescored` largest entries per row, computed again from the fp16 weights: a
        product and a sum along each row, so a row's bits stay its own."""
        top = y.topk(self.rescored, dim=1, sorted=False).indices  # [n, R]
        exact = (self.weight16[top].float() * rows[:, None, :]).sum(-1)
        if self.bias is not None:
            exact += self.bias[top]
        y.scatter_(1, top, exact)

    def extra_repr(self) -> str:
        kind = _rows_kind(self.two_rows)
        rescored = f", the largest {self.rescored} of a row again in fp16" if self.rescored else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, {kind}{rescored}"


def _rows_kind(two_rows: bool) -> str:
    return "two 7-bit rows" if two_rows else "8-bit rows"


def int8_kind(vnni: bool) -> str:
    """How int8_projection's logits are computed on a CPU with or without VNNI: what a journal
    records, so that a run resumed elsewhere never mixes two kinds of text."""
    return f"int8 ({_rows_kind(not vnni)}, {RESCORED} rescored)"


def _check(model: Whisper, kind: str) -> None:
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"{kind} weights run on a CPU in float32; this model is {model.dtype} on {model.device}")


def fp16_projection(model: Whisper) -> Fp16Linear:
    """The model's logit projection with fp16 weights, for TextDecoder.projection. CPU, float32 only."""
    _check(model, "fp16")
    return Fp16Linear(model.decoder.token_embedding.weight)


def int8_projection(model: Whisper) -> Int8Linear:
    """The model's logit projection in int8, for TextDecoder.projection. The decoder's linear
    layers stay fp16 (fp16_linears): int8 measured slower there, much slower in the encoder
    (1,500 rows a window, where float32 GEMMs run near their peak), and in a decode step's
    384-wide layers no faster even in 8-bit rows (quantising the rows costs what the products
    save). CPU, float32 only."""
    _check(model, "int8")
    return Int8Linear(model.decoder.token_embedding.weight, rescored=RESCORED)


def fp16_linears(model: Whisper) -> dict[str, Fp16Linear]:
    """Every linear layer of the decoder's blocks with fp16 weights, by name under
    `decoder.blocks` (for install_linears). fbgemm's fp16 GEMM measured faster than MKL's
    float32 GEMM on a CPU, for a step's rows and for a prompt's; and it gives a row the same
    bits whatever number of rows it computes, where MKL's float32 GEMM did not below 12 rows.
    CPU, float32 only."""
    _check(model, "fp16")
    return {name: Fp16Linear(m.weight, m.bias) for name, m in _plain_linears(model.decoder).items()}


def install_linears(decoder: nn.Module, linears: dict[str, nn.Module] | None) -> None:
    """Puts `linears` (fp16_linears) in the decoder's blocks, or with None the checkpoint's own
    back: each engine installs its own, as it does its logit projection."""
    for name, plain in _plain_linears(decoder).items():
        parent, _, attr = name.rpartition(".")
        module, wanted = decoder.blocks.get_submodule(parent), (linears or {}).get(name, plain)
        if getattr(module, attr) is not wanted:  # a module left as it is: nothing a compiled graph guards on changes
            setattr(module, attr, wanted)


def _plain_linears(decoder: nn.Module) -> dict[str, nn.Linear]:
    """The decoder blocks' own linear layers by name, noted the first time they are asked for."""
    if "plain_linears" not in vars(decoder):
        vars(decoder)["plain_linears"] = {name: m for name, m in decoder.blocks.named_modules() if isinstance(m, nn.Linear)}
    return vars(decoder)["plain_linears"]
