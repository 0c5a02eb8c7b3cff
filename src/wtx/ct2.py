"""Read CTranslate2 Whisper models (model.bin) and convert them to openai-whisper checkpoints.

The file format (CTranslate2 binary version 6): a header, then named tensors, then aliases.
Reading never executes anything from the file: it is parsed as plain structs and raw arrays.
The conversion is lossless: the float16 arrays are copied bit for bit.
"""

import struct
from typing import BinaryIO

import numpy as np

# CTranslate2's DataType enum, in order.
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SUPPORTED_BINARY_VERSION = 6


class CT2FormatError(ValueError):
    pass


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise CT2FormatError("model.bin is truncated")
    return struct.unpack(fmt, raw)[0]


def _read_string(f: BinaryIO) -> str:
    length = _read(f, "<H")
    raw = f.read(length)
    if len(raw) != length or not raw.endswith(b"\0"):
        raise CT2FormatError("model.bin has a malformed string")
    return raw[:-1].decode("utf-8")


def read_ct2(f: BinaryIO) -> tuple[str, dict[str, np.ndarray], dict[str, str]]:
    """Returns (spec name, {variable name: array}, {alias: variable name})."""
    version = _read(f, "<I")
    if version != SUPPORTED_BINARY_VERSION:
        raise CT2FormatError(f"unsupported CTranslate2 binary version {version}")
    spec = _read_string(f)
    _read(f, "<I")  # spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(_read(f, "<I")):
        name = _read_string(f)
        shape = tuple(_read(f, "<I") for _ in range(_read(f, "<B")))
        dtype_id = _read(f, "<B")
        if dtype_id not in CT2_DTYPES:
            raise CT2FormatError(f"{name}: unsupported dtype id {dtype_id}")
        num_bytes = _read(f, "<I")
        raw = f.read(num_bytes)
        if len(raw) != num_bytes:
            raise CT2FormatError("model.bin is truncated")
        variables[name] = np.frombuffer(raw, dtype=CT2_DTYPES[dtype_id]).reshape(shape)
    aliases = {_read_string(f): _read_string(f) for _ in range(_read(f, "<I"))}
    return spec, variables, aliases


def _count_layers(variables: dict, prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in variables:
        n += 1
    return n


def _scalar(variables: dict, name: str) -> int:
    return int(variables[name].reshape(-1)[0])


def ct2_to_whisper(variables: dict[str, np.ndarray], alignment_heads=None) -> dict:
    """Map CTranslate2 WhisperSpec variables onto openai-whisper's state dict names.

    Self-attention `linear_0` is the fused [q; k; v] projection (its k bias is zero, as
    openai-whisper's key has no bias); cross-attention `linear_0` is q and `linear_1` the
    fused [k; v]; the last linear of each attention is the output projection.
    """
    import torch

    if variables.get("encoder/conv1/weight") is None:
        raise CT2FormatError("not a CTranslate2 Whisper model (no encoder/conv1/weight)")
    sd: dict[str, np.ndarray] = {}

    def ln(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = variables[f"{src}/gamma"]
        sd[f"{dst}.bias"] = variables[f"{src}/beta"]

    def linear(dst: str, src: str, bias: bool = True) -> None:
        sd[f"{dst}.weight"] = variables[f"{src}/weight"]
        if bias:
            sd[f"{dst}.bias"] = variables[f"{src}/bias"]

    def fused_qkv(dst: str, src: str) -> None:
        w, b = variables[f"{src}/weight"], variables[f"{src}/bias"]
        wq, wk, wv = np.split(w, 3, axis=0)
        bq, bk, bv = np.split(b, 3, axis=0)
        if np.any(bk != 0):
            raise CT2FormatError(f"{src}: key bias is not zero; cannot map to openai-whisper")
        sd[f"{dst}.query.weight"], sd[f"{dst}.query.bias"] = wq, bq
        sd[f"{dst}.key.weight"] = wk
        sd[f"{dst}.value.weight"], sd[f"{dst}.value.bias"] = wv, bv

    def mlp(dst: str, src: str) -> None:
        ln(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")

    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    sd["encoder.positional_embedding"] = variables["encoder/position_encodings/encodings"]
    n_audio_layer = _count_layers(variables, "encoder")
    for i in range(n_audio_layer):
        dst, src = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        fused_qkv(f"{dst}.attn", f"{src}/self_attention/linear_0")
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        mlp(dst, src)
    ln("encoder.ln_post", "encoder/layer_norm")

    sd["decoder.token_embedding.weight"] = variables["decoder/embeddings/weight"]
    sd["decoder.positional_embedding"] = variables["decoder/position_encodings/encodings"]
    n_text_layer = _count_layers(variables, "decoder")
    for i in range(n_text_layer):
        dst, src = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        fused_qkv(f"{dst}.attn", f"{src}/self_attention/linear_0")
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        ln(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        wk, wv = np.split(variables[f"{src}/attention/linear_1/weight"], 2, axis=0)
        bk, bv = np.split(variables[f"{src}/attention/linear_1/bias"], 2, axis=0)
        if np.any(bk != 0):
            raise CT2FormatError(f"{src}: cross-attention key bias is not zero")
        sd[f"{dst}.cross_attn.key.weight"] = wk
        sd[f"{dst}.cross_attn.value.weight"], sd[f"{dst}.cross_attn.value.bias"] = wv, bv
        linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        mlp(dst, src)
    ln("decoder.ln", "decoder/layer_norm")

    conv1 = variables["encoder/conv1/weight"]
    embeddings = variables["decoder/embeddings/weight"]
    dims = {
        "n_mels": int(conv1.shape[1]),
        "n_audio_ctx": int(variables["encoder/position_encodings/encodings"].shape[0]),
        "n_audio_state": int(conv1.shape[0]),
        "n_audio_head": _scalar(variables, "encoder/num_heads"),
        "n_audio_layer": n_audio_layer,
        "n_vocab": int(embeddings.shape[0]),
        "n_text_ctx": int(variables["decoder/position_encodings/encodings"].shape[0]),
        "n_text_state": int(embeddings.shape[1]),
        "n_text_head": _scalar(variables, "decoder/num_heads"),
        "n_text_layer": n_text_layer,
    }
    # np.array copies: arrays from np.frombuffer are read-only
    state = {k: torch.from_numpy(np.array(v)) for k, v in sd.items()}
    checkpoint = {"dims": dims, "model_state_dict": state}
    if alignment_heads is not None:
        checkpoint["alignment_heads"] = [[int(layer), int(head)] for layer, head in alignment_heads]
    return checkpoint
