"""--dtype auto, and the CPU's bf16 attention path."""

import torch

from wtx.engine import pick_dtype


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
