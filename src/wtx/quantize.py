"""int8 weights on a CPU, through fbgemm's dynamic linear: the logit projection.

Weights are int8 with a scale per output channel. Activations are quantised per row (per
token), so that a row's result never depends on the other rows of its batch, and finely enough
to add no error of their own: each row is divided by its largest magnitude and written as two
rows of integers within +-63, its value and its rounding error (in steps 126 times finer).
fbgemm's dynamic linear picks one scale for its whole input from the input's range; one fixed
anchor row [1, -1, 0, ...] pins that range to [-1, 1], whose grid holds these integers exactly.
The products are summed in int32, exactly, and each row is scaled back.

With `residual`, each weight is also kept with its rounding error, a second int8 matrix 254
times finer (15 bits a weight): one call multiplies by both, at about twice the cost, and the
products come within about 1e-3 of float32 where one int8 matrix is off by up to 0.2 (the
tiny.en logits). Beam search compares summed log-probabilities across a window's beams, and
measured less accurate with one matrix (docs/benchmarks.md)."""

import warnings

import torch
from torch import Tensor, nn

from wtx.model import Whisper

__all__ = ["Int8Linear", "int8_projection"]

GRID = 63.5  # fbgemm's dynamic linear (reduce_range) maps [-1, 1] onto 0..127: a grid of 1 / 63.5
STEPS = 63  # the grid points used on either side of zero, all of them inside [-1, 1]
RESIDUAL = 254  # a weight's rounding error (within half a step) in steps this much finer: +-127


def _pack(weight: Tensor, bias: Tensor | None, residual: bool = False) -> tuple[object, Tensor | None]:
    """fbgemm's prepacked int8 weight [N, K] (symmetric, a scale per output channel), or with
    `residual` [2N, K]: the weights' int8 values, then their rounding errors at 1 / RESIDUAL of
    the scale. The bias is kept apart, added after the rows are scaled back."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    if residual:
        unit = weight / scale[:, None]
        values = unit.round()
        error = ((unit - values) * RESIDUAL).round()
        weight = torch.cat([values * scale[:, None], error * (scale / RESIDUAL)[:, None]])
        scale = torch.cat([scale, scale / RESIDUAL])
    zero = torch.zeros(weight.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # quantised tensors are deprecated; the packed weight is what runs
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qweight, None)
    return packed, None if bias is None else bias.detach().float().clone()


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (with `residual`, two int8 matrices: W and its rounding
    error) and x quantised per row; x is float32 [..., K]."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, residual: bool = False):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.residual = residual
        self.packed, self.bias = _pack(weight, bias, residual)
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
        unit = rows * (STEPS / scale)
        coarse = unit.round()  # integers in [-STEPS, STEPS]
        fine = (unit - coarse).mul_(2 * STEPS).round_()  # its rounding error, as integers too
        # one call for both, so the weights are read once; the anchor row pins fbgemm's range to
        # [-1, 1], whose grid (1 / GRID) holds these integers / GRID exactly
        # (a row holding NaN or inf is zeroed for fbgemm, whose range check refuses it; its scale
        # makes its logits NaN, as in float32)
        steps = torch.cat([coarse, fine]).div_(GRID).nan_to_num_(0.0, 0.0, 0.0)
        products = torch.ops.quantized.linear_dynamic(torch.cat([steps, self.anchor]), self.packed, True)
        if self.residual:  # the values' products, plus their rounding errors'
            products = products[:, : self.out_features] + products[:, self.out_features :]
        y = products[n : 2 * n].mul(1 / (2 * STEPS)).add_(products[:n]).mul_(scale * (GRID / STEPS))
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{' x2' if self.residual else ''}"


def int8_projection(model: Whisper, residual: bool = False) -> Int8Linear:
    """The model's logit projection (the token embedding's transpose, 51,864 x 384 numbers that
    every decode step reads whole) in int8, for TextDecoder.projection. On 2 cores without AVX-512 (torch 2.13.0,
    8 rows) it took 4.9 ms against 23.7 ms in float32. The other linear layers stay float32:
    int8 measured slower there, by up to 4.9x in the encoder (1,500 rows a window, where float32
    GEMMs run near their peak) and no faster in a decode step (8 rows of 384). CPU, float32 only."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"int8 weights run on a CPU in float32; this model is {model.dtype} on {model.device}")
    return Int8Linear(model.decoder.token_embedding.weight, residual=residual)
