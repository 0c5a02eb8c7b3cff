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
  tiny.en logit. Activations are quantised per row (per token), so that a row's result never
  depends on the other rows of its batch, and finely enough to add no error of their own: each
  row is divided by its largest magnitude and written as two rows of integers within +-63, its
  value and its rounding error (in steps 126 times finer). fbgemm's dynamic linear picks one
  scale for its whole input from the input's range; one fixed anchor row [1, -1, 0, ...] pins
  that range to [-1, 1], whose grid holds these integers exactly. The products are summed in
  int32, exactly, and each row is scaled back.

On 2 cores (AMD EPYC with AVX-512, torch 2.13.0), tiny.en's projection for 8 rows: fp16 2.1 ms,
int8 2.3 ms, float32 5.8 ms; for 20 rows (4 windows x 5 beams) 4.9, 4.7 and 14.8 ms."""

import warnings

import torch
from torch import Tensor, nn

from wtx.model import Whisper

__all__ = ["Fp16Linear", "Int8Linear", "fp16_linears", "fp16_projection", "install_linears", "int8_projection"]

GRID = 63.5  # fbgemm's dynamic linear (reduce_range) maps [-1, 1] onto 0..127: a grid of 1 / 63.5
STEPS = 63  # the grid points used on either side of zero, all of them inside [-1, 1]


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
    """y = x W^T + b with W in int8 and x quantised per row; x is float32 [..., K]."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.packed, self.bias = _pack(weight, bias)
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
        y = products[n : 2 * n].mul(1 / (2 * STEPS)).add_(products[:n]).mul_(scale * (GRID / STEPS))
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _check(model: Whisper, kind: str) -> None:
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"{kind} weights run on a CPU in float32; this model is {model.dtype} on {model.device}")


def fp16_projection(model: Whisper) -> Fp16Linear:
    """The model's logit projection with fp16 weights, for TextDecoder.projection. CPU, float32 only."""
    _check(model, "fp16")
    return Fp16Linear(model.decoder.token_embedding.weight)


def int8_projection(model: Whisper) -> Int8Linear:
    """The model's logit projection in int8, for TextDecoder.projection. The other linear layers
    stay float32: int8 measured slower there, by up to 4.9x in the encoder (1,500 rows a window,
    where float32 GEMMs run near their peak) and no faster in a decode step (8 rows of 384).
    CPU, float32 only."""
    _check(model, "int8")
    return Int8Linear(model.decoder.token_embedding.weight)


def fp16_linears(model: Whisper) -> dict[str, Fp16Linear]:
    """Every linear layer of the decoder's blocks with fp16 weights, by name under
    `decoder.blocks` (for install_linears). fbgemm's fp16 GEMM took 0.07 ms against MKL's 0.12 ms
    for 8 rows of an MLP layer on 2 cores, and 5.8 against 7.4 ms for a prompt's 908 rows; and it
    gives a row the same bits whatever number of rows it computes, where MKL's float32 GEMM did
    not below 12 rows. CPU, float32 only."""
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
