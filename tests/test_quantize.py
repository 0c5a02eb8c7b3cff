"""Packed weights on a CPU (wtx.quantize): fp16 and int8, rows on their own, the engine's choice, the text."""

import functools

import pytest
import torch

from wtx.engine import pick_quantize
from wtx.quantize import Fp16Linear, Int8Linear, has_vnni


needs_vnni = pytest.mark.skipif(not has_vnni(), reason="8-bit activations need VNNI (without it fbgemm's int16 sums saturate)")
BOTH_KINDS = [True, pytest.param(False, marks=needs_vnni)]  # two 7-bit rows, one 8-bit row


@pytest.mark.parametrize("two_rows", BOTH_KINDS)
def test_int8_linear_is_close_to_float32(two_rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 1536)
    x = torch.randn(4, 7, 384)
    expected = linear(x)
    got = Int8Linear(linear.weight, linear.bias, two_rows)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert ((got - expected).norm() / expected.norm()).item() < 0.02


def test_fp16_weights_round_nothing_of_an_fp16_checkpoint():
    """Whisper's checkpoints hold fp16 weights: fbgemm's fp16 GEMM, summing in float32, comes
    within float32's own error of float64 on the bundled tiny.en projection, where one int8
    matrix is off by far more; a row's bits are its own, whatever rows are beside it."""
    from wtx.weights import load_checkpoint

    weight = load_checkpoint("tiny.en")["model_state_dict"]["decoder.token_embedding.weight"].float()
    assert torch.equal(weight.half().float(), weight)
    torch.manual_seed(0)
    x = torch.nn.functional.layer_norm(torch.randn(24, 384) * 3, (384,))
    exact = x.double() @ weight.double().T
    fp32 = (x @ weight.T - exact).abs().max().item()
    layer = Fp16Linear(weight)
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (24, weight.shape[0])
    assert (got - exact).abs().max().item() < 4 * fp32
    assert (Int8Linear(weight)(x) - exact).abs().max().item() > 100 * fp32
    assert all(torch.equal(layer(x[i : i + n]), got[i : i + n]) for n in (1, 3, 8) for i in (0, 5))
    assert "fp16" in repr(layer)


@pytest.mark.parametrize("two_rows", BOTH_KINDS)
def test_rescored_int8_logits_are_exact_where_they_are_largest(two_rows):
    """With `rescored`, each row's largest int8 logits are computed again from the fp16 weights:
    on the bundled tiny.en projection the largest logits and their order are float32's (the
    picks of greedy and beam search), the rest stay int8, and a row's bits are its own."""
    from wtx.quantize import RESCORED
    from wtx.weights import load_checkpoint

    weight = load_checkpoint("tiny.en")["model_state_dict"]["decoder.token_embedding.weight"].float()
    torch.manual_seed(0)
    x = torch.nn.functional.layer_norm(torch.randn(24, 384) * 3, (384,))
    exact = x @ weight.T
    plain, rescored = Int8Linear(weight, two_rows=two_rows), Int8Linear(weight, two_rows=two_rows, rescored=RESCORED)
    approx, got = plain(x), rescored(x)
    top = exact.topk(6, dim=1)  # a beam of 5 takes its row's 6 best
    assert torch.equal(got.topk(6, dim=1).indices, top.indices)
    torch.testing.assert_close(got.gather(1, top.indices), top.values, rtol=0, atol=1e-4)
    assert (approx.gather(1, top.indices) - top.values).abs().max().item() > 1e-2  # int8 alone is not exact
    changed = (got != approx).sum(1)
    assert changed.max().item() <= RESCORED and changed.min().item() > 0  # the rest stay int8
    assert all(torch.equal(rescored(x[i : i + n]), got[i : i + n]) for n in (1, 3, 8) for i in (0, 5))
    assert f"largest {RESCORED}" in repr(rescored)


def test_fp16_linear_adds_its_bias():
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 1536)
    x = torch.randn(2, 5, 384)
    torch.testing.assert_close(Fp16Linear(linear.weight.half().float(), linear.bias)(x),
                               torch.nn.functional.linear(x, linear.weight.half().float(), linear.bias))  # fmt: skip


@pytest.mark.parametrize("two_rows", BOTH_KINDS)
def test_a_rows_result_does_not_depend_on_the_other_rows(two_rows):
    """Activations are quantised per row: a row gives the same bits alone, or beside rows of
    any size (one scale for the whole input would let a loud row change a quiet one's text)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 384)
    layer = Int8Linear(linear.weight, linear.bias, two_rows)
    quiet = torch.randn(1, 384) * 0.01
    alone = layer(quiet)
    beside_loud = layer(torch.cat([quiet, torch.randn(5, 384) * 100]))[:1]
    beside_positive = layer(torch.cat([torch.rand(3, 384), quiet]))[-1:]
    assert torch.equal(alone, beside_loud)
    assert torch.equal(alone, beside_positive)


def test_the_default_packs_int8_logits_with_vnni_and_fp16_weights_without_on_a_cpu_in_float32_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pick_quantize("auto", cpu, torch.float32, vnni=False) == "fp16"
    assert pick_quantize(None, cpu, torch.float32, vnni=False) == "fp16"
    assert pick_quantize("auto", cpu, torch.float32, vnni=True) == "int8"
    assert pick_quantize(None, cpu, torch.float32) == ("int8" if has_vnni() else "fp16")  # this CPU's
    assert pick_quantize("fp16", cpu, torch.float32, vnni=True) == "fp16"  # asked for
    assert pick_quantize("int8", cpu, torch.float32) == "int8"  # asked for
    assert not pick_quantize("auto", cpu, torch.bfloat16)
    assert not pick_quantize("auto", cuda, torch.float16)
    assert not pick_quantize("auto", cpu, torch.float32, compile=True)
    assert pick_quantize("none", cpu, torch.float32) is None
    for asked in ("fp16", "int8"):
        for where in [(cuda, torch.float16), (cpu, torch.bfloat16)]:
            with pytest.raises(ValueError, match=f"--quantize {asked} runs on a CPU in fp32"):
                pick_quantize(asked, *where)
        with pytest.raises(ValueError, match="compiled"):
            pick_quantize(asked, cpu, torch.float32, compile=True)


def test_an_eager_cpu_encodes_window_by_window_and_the_padding_once():
    """The padding rows (all zeros) are encoded once and their keys and values reused; every
    other window on its own, with the keys and values a batch of them gives."""
    import numpy as np

    from wtx.audio import N_SAMPLES
    from wtx.engine import Engine, EngineOptions
    from wtx.features import log_mel_spectrogram

    torch.set_num_threads(2)
    engine = Engine(EngineOptions(model="tiny.en", device="cpu", dtype="fp32", batch_size=3))  # encoder too
    speech = torch.from_numpy((0.1 * np.random.default_rng(0).standard_normal((2, N_SAMPLES))).astype(np.float32))
    samples = torch.stack([speech[0], torch.zeros(N_SAMPLES), speech[1]])
    engine.batch.ensure_loop()  # the cross-attention buffers
    with torch.no_grad():
        engine.batch._encode(samples)
        keys = engine.model.decoder.blocks[0].cross_attn.cross_kv.k.clone()
        batched = engine.model.encoder(log_mel_spectrogram(samples, engine.dims.n_mels))
        engine.model.decoder.set_audio_features(batched)
    torch.testing.assert_close(keys, engine.model.decoder.blocks[0].cross_attn.cross_kv.k)
    silence = engine.batch._silence
    assert silence is not None
    cross_kv = engine.model.decoder.blocks[0].cross_attn.cross_kv
    cross_kv.k[2].zero_()
    engine.batch._encode_window(torch.zeros(N_SAMPLES), 2)
    assert torch.equal(cross_kv.k[2], silence[0][0]) and torch.equal(silence[0][0], keys[1])


@needs_vnni
def test_8bit_rows_are_exact_integer_products():
    """With VNNI a row is rounded to integers within +-127 of its largest magnitude / 127, and
    fbgemm sums their products with the int8 weights exactly: the result is that integer sum,
    scaled back, to float32's rounding (no saturation, no second rounding on fbgemm's grid)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(1536, 384)
    layer = Int8Linear(linear.weight, linear.bias, two_rows=False)
    x = torch.randn(6, 1536) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 5.0, 0.1])[:, None]
    qweight, _ = torch.ops.quantized.linear_unpack(layer.packed)
    w_int, w_scale = qweight.int_repr().double(), qweight.q_per_channel_scales().double()
    scale = x.abs().amax(1, keepdim=True).double()
    k = (x.double() * (127 / scale)).round()
    expected = (k @ w_int.T) * (scale / 127) * w_scale + linear.bias.double()
    got = layer(x).double()
    assert ((got - expected).abs() / (expected.abs() + scale)).max().item() < 1e-5


@pytest.mark.parametrize("packed", [Int8Linear, functools.partial(Int8Linear, two_rows=True), Fp16Linear])
def test_a_row_of_nan_gives_non_finite_logits_and_leaves_the_others_alone(packed):
    """fbgemm's int8 linear refuses a non-finite input: such a row gives NaN, as in float32, not an
    error; in either, the other rows keep their bits."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 64)
    layer = packed(linear.weight, linear.bias)
    x = torch.randn(3, 384)
    broken = x.clone()
    broken[1, 5] = float("nan")
    broken[2, 7] = float("inf")
    got = layer(broken)
    assert got[1].isnan().all() and not got[2].isfinite().any()
    assert torch.equal(got[0], layer(x[:1])[0])


def test_engines_that_share_a_model_each_keep_their_own_logits():
    """An engine packs its own logit projection and linear layers, not the model it was given: an
    engine in float32 on the same model gives the same tokens before and after the int8 and fp16
    ones ran."""
    import numpy as np

    from wtx.audio import N_SAMPLES, Window
    from wtx.engine import Engine, EngineOptions
    from wtx.model import load_model
    from wtx.weights import load_checkpoint

    model = load_model(load_checkpoint("tiny.en"), torch.device("cpu"), torch.float32)
    noise = (0.05 * np.random.default_rng(1).standard_normal(N_SAMPLES)).astype(np.float32)
    window = [Window(index=0, offset=0.0, duration=30.0, samples=noise)]
    plain = Engine(EngineOptions(model="tiny.en", device="cpu", quantize="none", batch_size=1), model=model)
    before = plain.decode_batch(window)[0].tokens
    int8 = Engine(EngineOptions(model="tiny.en", device="cpu", quantize="int8", batch_size=1), model=model)
    int8.decode_batch(window)
    assert model.decoder.projection is int8.batch.projection is not None
    assert plain.decode_batch(window)[0].tokens == before
    assert model.decoder.projection is None
    fp16 = Engine(EngineOptions(model="tiny.en", device="cpu", quantize="fp16", batch_size=1), model=model)
    fp16.decode_batch(window)
    assert isinstance(model.decoder.blocks[0].mlp[0], Fp16Linear)
    assert plain.decode_batch(window)[0].tokens == before
    assert type(model.decoder.blocks[0].mlp[0]) is torch.nn.Linear and model.decoder.projection is None


def test_int8_keeps_the_cross_attention_in_bf16_beside_a_bf16_encoder_only():
    from wtx.engine import pick_cross_dtype

    f32, bf16 = torch.float32, torch.bfloat16
    assert pick_cross_dtype("int8", bf16, f32) == bf16
    assert pick_cross_dtype("int8", f32, f32) == f32  # --dtype fp32, or no native bf16
    assert pick_cross_dtype("fp16", bf16, f32) == f32  # the default stays exact
    assert pick_cross_dtype(None, torch.float16, torch.float16) == torch.float16


@pytest.mark.slow
def test_bf16_cross_attention_gives_a_window_the_same_tokens_in_any_batch():
    """With bf16 keys and values a window's tokens still depend on nothing else in its batch:
    alone, or beside other windows, one of which ends early (live rows), at beam 5 and greedy."""
    from dataclasses import replace

    from tests.conftest import shared_file
    from wtx.audio import fixed_windows, stream_samples
    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    path = shared_file("tts/copperfield_ch01_slt.mp3")
    windows = [w for _, w in zip(range(3), fixed_windows(stream_samples(str(path))))]
    samples = windows[1].samples.copy()
    samples[64000:] = 0.0  # 4 s of speech, then silence: ends long before the others
    windows[1] = replace(windows[1], samples=samples, duration=4.0)
    tokens = {}
    for beam in (5, 1):
        options = EngineOptions(model="tiny.en", device="cpu", quantize="int8", batch_size=4,
                                decoding=DecodingOptions(beam_size=beam, without_timestamps=True))  # fmt: skip
        engine = Engine(options)
        if engine.batch.cross_dtype != torch.bfloat16:
            pytest.skip("this CPU computes bf16 emulated: the cross-attention stays float32")
        together = engine.decode_batch(windows)
        alone = [engine.decode_batch([w])[0] for w in windows]
        assert [r.tokens for r in together] == [r.tokens for r in alone]
        tokens[beam] = [r.tokens for r in together]
    assert len(tokens[1][0]) > 60 and len(tokens[1][1]) < 30  # real speech was decoded
