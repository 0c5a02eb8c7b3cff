"""--dtype auto (a CPU's bf16 encoder), the CPU's bf16 attention path, and the automatic modes
(text only, each window alone; timestamps for fixed windows)."""

from dataclasses import replace

import pytest
import torch

from wtx import engine
from wtx.engine import native_bf16, pick_condition, pick_dtype, pick_encoder_dtype, pick_text_only, resolve_modes
from wtx.options import DecodingOptions, EngineOptions


def test_auto_is_fp16_on_cuda_and_fp32_on_a_cpu():
    assert pick_dtype("auto", torch.device("cuda")) == torch.float16
    assert pick_dtype(None, torch.device("cuda")) == torch.float16
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bf16", torch.device("cpu")) == torch.bfloat16  # asked for: always


def test_decoder_attention_on_a_cpu_matches_sdpa():
    """The CPU's bf16 path (two matmuls, float32 softmax, the cache read up to the slot written)
    and its fp32 one (SDPA up to the slot written) against SDPA over the whole cache in float32."""
    from wtx.model import decoder_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 6, n, 64) for n in (1, 448, 448))
    input_pos = torch.tensor([300])
    mask = torch.arange(448)[None, None, None, :] <= 300
    mask = mask & (torch.arange(448) >= torch.tensor([0, 10, 200])[:, None, None, None])
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = decoder_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, input_pos)
    torch.testing.assert_close(got.float(), expected, atol=0.02, rtol=0.02)
    # fp32: SDPA itself, over the slots written only; the same as over the whole cache to rounding
    got = decoder_attention(q, k, v, mask, input_pos)
    sliced = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :301], v[:, :, :301], attn_mask=mask[..., :301])
    assert torch.equal(got, sliced)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(decoder_attention(q, k, v, mask), expected)  # no slot given: the whole cache


def test_decoder_attention_by_row_matches_sdpa():
    """A step of live windows (by_row): matmuls with a float32 softmax, SDPA's result to rounding."""
    from wtx.model import decoder_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 6, n, 64) for n in (1, 448, 448))
    mask = torch.arange(448)[None, None, None, :] <= torch.tensor([300, 200, 447])[:, None, None, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(decoder_attention(q, k, v, mask, by_row=True), expected, atol=1e-6, rtol=1e-5)


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert native_bf16(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 amx_tile amx_bf16\n")
    assert native_bf16(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n")  # bf16 converted, not native
    assert not native_bf16(cpuinfo)
    assert not native_bf16(tmp_path / "absent")  # not Linux


@pytest.mark.parametrize("native", [True, False])
def test_auto_runs_a_cpus_encoder_in_bf16_only_where_native(native):
    cpu, fp32 = torch.device("cpu"), torch.float32
    expected = torch.bfloat16 if native else fp32
    assert pick_encoder_dtype("auto", cpu, fp32, native=native) == expected
    assert pick_encoder_dtype(None, cpu, fp32, native=native) == expected
    assert pick_encoder_dtype("fp32", cpu, fp32, native=native) == fp32  # asked for: the whole model
    assert pick_encoder_dtype("auto", cpu, fp32, compile=True, native=native) == fp32
    assert pick_encoder_dtype("auto", torch.device("cuda"), torch.float16, native=native) == torch.float16
    assert pick_encoder_dtype("bf16", cpu, torch.bfloat16, native=native) == torch.bfloat16


def test_a_bf16_encoder_feeds_the_float32_decoder(monkeypatch):
    """--dtype auto where bf16 is native: the encoder in bf16, its features cast to the decoder's
    float32; --dtype fp32 keeps the whole model in float32. The same window's tokens, here on
    random weights, come out of both (the encoder's rounding is small beside the features)."""
    import numpy as np
    import whisper.model

    from wtx.audio import N_SAMPLES, Window
    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    dims = whisper.model.ModelDimensions(80, 1500, 64, 4, 2, 51864, 448, 64, 4, 2)
    torch.manual_seed(0)
    checkpoint = {"dims": dims.__dict__, "model_state_dict": whisper.model.Whisper(dims).state_dict()}
    monkeypatch.setattr("wtx.engine.load_checkpoint", lambda name: checkpoint)
    monkeypatch.setattr(engine, "native_bf16", lambda: True)
    window = Window(0, 0.0, 30.0, (np.random.default_rng(0).standard_normal(N_SAMPLES) * 0.1).astype(np.float32))
    decoding = DecodingOptions(beam_size=1, sample_len=8)
    runs = {}
    for dtype in ("auto", "fp32"):
        e = Engine(EngineOptions(model="random", device="cpu", dtype=dtype, quantize="fp16", batch_size=2, decoding=decoding))
        assert e.dtype == torch.float32
        assert e.encoder_dtype == (torch.bfloat16 if dtype == "auto" else torch.float32)
        runs[dtype] = e.decode_batch([window])[0].tokens
        features = e.model.decoder.blocks[0].cross_attn.cross_kv.k
        assert features.dtype == torch.float32
    assert runs["auto"] == runs["fp32"] and len(runs["fp32"]) > 0


def test_auto_modes_are_text_only_alone():
    auto = EngineOptions(decoding=DecodingOptions(without_timestamps=None), condition_on_previous_text=None)
    assert not auto.windows_alone  # undecided until resolved
    resolved = resolve_modes(auto)
    assert resolved.decoding.without_timestamps is True and resolved.condition_on_previous_text is False
    assert resolved.windows_alone
    # what is asked for stays, and prompts follow the mode unless asked for
    asked = replace(auto, decoding=DecodingOptions(without_timestamps=False))
    assert resolve_modes(asked).decoding.without_timestamps is False
    assert resolve_modes(asked).condition_on_previous_text is True
    prompted = replace(auto, condition_on_previous_text=True)
    assert resolve_modes(prompted).decoding.without_timestamps is True
    assert resolve_modes(prompted).condition_on_previous_text is True
    assert not resolve_modes(prompted).windows_alone
    assert resolve_modes(EngineOptions()) == EngineOptions()  # explicit defaults: timestamps, prompted
    assert (pick_text_only(None), pick_text_only(True), pick_text_only(False)) == (True, True, False)
    # windows cut every 30 s: timestamps, unless text only is asked for
    assert (pick_text_only(None, "fixed"), pick_text_only(True, "fixed"), pick_text_only(None, "silence")) == (False, True, True)
    assert (pick_condition(None, True), pick_condition(None, False), pick_condition(False, False)) == (False, True, False)
