"""CTranslate2 -> openai-whisper conversion: a tiny synthetic model.bin round trip."""

import io
import struct

import numpy as np
import pytest
import torch
import whisper.model

from wtx.ct2 import CT2FormatError, ct2_to_whisper, read_ct2

DIMS = whisper.model.ModelDimensions(
    n_mels=80, n_audio_ctx=12, n_audio_state=16, n_audio_head=2, n_audio_layer=2,
    n_vocab=51864, n_text_ctx=10, n_text_state=16, n_text_head=2, n_text_layer=2,
)  # fmt: skip
DTYPE_IDS = {np.dtype(np.float16): 4, np.dtype(np.int8): 1, np.dtype(np.int16): 2}


def write_ct2(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> bytes:
    out = io.BytesIO()

    def string(s: str) -> None:
        raw = s.encode() + b"\0"
        out.write(struct.pack("<H", len(raw)) + raw)

    out.write(struct.pack("<I", 6))
    string("WhisperSpec")
    out.write(struct.pack("<I", 3))
    out.write(struct.pack("<I", len(variables)))
    for name, value in variables.items():
        string(name)
        out.write(struct.pack("<B", value.ndim))
        for dim in value.shape:
            out.write(struct.pack("<I", dim))
        out.write(struct.pack("<B", DTYPE_IDS[value.dtype]))
        out.write(struct.pack("<I", value.nbytes))
        out.write(value.tobytes())
    out.write(struct.pack("<I", len(aliases)))
    for alias, name in aliases.items():
        string(alias)
        string(name)
    return out.getvalue()


def to_ct2(sd: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The layout CTranslate2's Whisper converter produces, from an openai-whisper state dict."""
    a = {k: v.numpy() for k, v in sd.items()}
    v: dict[str, np.ndarray] = {}

    def ln(src, dst):
        v[f"{dst}/gamma"], v[f"{dst}/beta"] = a[f"{src}.weight"], a[f"{src}.bias"]

    def lin(src, dst):
        v[f"{dst}/weight"], v[f"{dst}/bias"] = a[f"{src}.weight"], a[f"{src}.bias"]

    def qkv(src, dst):
        zero = np.zeros_like(a[f"{src}.query.bias"])
        v[f"{dst}/weight"] = np.concatenate([a[f"{src}.{n}.weight"] for n in ("query", "key", "value")])
        v[f"{dst}/bias"] = np.concatenate([a[f"{src}.query.bias"], zero, a[f"{src}.value.bias"]])

    for side, n_layer in (("encoder", DIMS.n_audio_layer), ("decoder", DIMS.n_text_layer)):
        for i in range(n_layer):
            s, d = f"{side}.blocks.{i}", f"{side}/layer_{i}"
            ln(f"{s}.attn_ln", f"{d}/self_attention/layer_norm")
            qkv(f"{s}.attn", f"{d}/self_attention/linear_0")
            lin(f"{s}.attn.out", f"{d}/self_attention/linear_1")
            ln(f"{s}.mlp_ln", f"{d}/ffn/layer_norm")
            lin(f"{s}.mlp.0", f"{d}/ffn/linear_0")
            lin(f"{s}.mlp.2", f"{d}/ffn/linear_1")
            if side == "decoder":
                ln(f"{s}.cross_attn_ln", f"{d}/attention/layer_norm")
                lin(f"{s}.cross_attn.query", f"{d}/attention/linear_0")
                zero = np.zeros_like(a[f"{s}.cross_attn.value.bias"])
                v[f"{d}/attention/linear_1/weight"] = np.concatenate(
                    [a[f"{s}.cross_attn.key.weight"], a[f"{s}.cross_attn.value.weight"]]
                )
                v[f"{d}/attention/linear_1/bias"] = np.concatenate([zero, a[f"{s}.cross_attn.value.bias"]])
                lin(f"{s}.cross_attn.out", f"{d}/attention/linear_2")
    lin("encoder.conv1", "encoder/conv1")
    lin("encoder.conv2", "encoder/conv2")
    v["encoder/position_encodings/encodings"] = a["encoder.positional_embedding"]
    ln("encoder.ln_post", "encoder/layer_norm")
    v["decoder/embeddings/weight"] = a["decoder.token_embedding.weight"]
    v["decoder/position_encodings/encodings"] = a["decoder.positional_embedding"]
    ln("decoder.ln", "decoder/layer_norm")
    v["encoder/num_heads"] = np.array(DIMS.n_audio_head, dtype=np.int16)
    v["decoder/num_heads"] = np.array(DIMS.n_text_head, dtype=np.int16)
    v["decoder/activation"] = np.array(3, dtype=np.int8)
    return v


@pytest.fixture(scope="module")
def reference_state():
    torch.manual_seed(0)
    model = whisper.model.Whisper(DIMS).half()
    for p in model.parameters():
        p.data.normal_()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_round_trip_is_bit_exact(reference_state):
    blob = write_ct2(to_ct2(reference_state), {"decoder/projection/weight": "decoder/embeddings/weight"})
    spec, variables, aliases = read_ct2(io.BytesIO(blob))
    assert spec == "WhisperSpec"
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    checkpoint = ct2_to_whisper(variables, alignment_heads=[[1, 0], [1, 1]])
    assert checkpoint["dims"] == DIMS.__dict__
    assert checkpoint["alignment_heads"] == [[1, 0], [1, 1]]
    got = checkpoint["model_state_dict"]
    assert got.keys() == reference_state.keys()
    for name, tensor in reference_state.items():
        assert got[name].dtype == torch.float16
        assert torch.equal(got[name], tensor), name


def test_converted_checkpoint_loads_in_both_models(reference_state):
    from wtx.model import load_model

    _, variables, _ = read_ct2(io.BytesIO(write_ct2(to_ct2(reference_state), {})))
    checkpoint = ct2_to_whisper(variables)
    stock = whisper.model.Whisper(whisper.model.ModelDimensions(**checkpoint["dims"]))
    stock.load_state_dict(checkpoint["model_state_dict"])  # strict: names and shapes match
    load_model(checkpoint)  # strict too


def test_nonzero_key_bias_is_refused(reference_state):
    variables = to_ct2(reference_state)
    variables["encoder/layer_0/self_attention/linear_0/bias"][DIMS.n_audio_state] = 1
    with pytest.raises(CT2FormatError, match="key bias"):
        ct2_to_whisper(variables)


def test_truncated_file_is_refused(reference_state):
    blob = write_ct2(to_ct2(reference_state), {})
    with pytest.raises(CT2FormatError, match="truncated"):
        read_ct2(io.BytesIO(blob[: len(blob) // 2]))


def test_wrong_version_is_refused():
    with pytest.raises(CT2FormatError, match="version"):
        read_ct2(io.BytesIO(struct.pack("<I", 5)))
