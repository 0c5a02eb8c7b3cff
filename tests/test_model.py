"""The rewritten model computes what openai-whisper's model computes, from the same weights."""

import pytest
import torch
import whisper.model

from wtx.model import LiveWindows, load_model

DIMS = whisper.model.ModelDimensions(
    n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=2,
    n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    stock = whisper.model.Whisper(DIMS)
    for p in stock.parameters():
        p.data.normal_(std=0.2)
    checkpoint = {"dims": DIMS.__dict__, "model_state_dict": stock.state_dict()}
    return stock.eval(), load_model(checkpoint)


@torch.inference_mode()
def test_encoder_matches(models):
    stock, ours = models
    mel = torch.randn(2, 80, 3000)
    torch.testing.assert_close(ours.encoder(mel), stock.encoder(mel), rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_cached_decoding_matches_full_forward(models):
    """Prefill then one token at a time through the static cache == stock full-sequence logits."""
    stock, ours = models
    mel = torch.randn(3, 80, 3000)
    xa = stock.encoder(mel)
    tokens = torch.randint(0, 50000, (3, 9))
    expected = stock.decoder(tokens, xa)

    ours.setup_caches(3, DIMS.n_text_ctx)
    ours.decoder.set_audio_features(xa)
    pad = torch.zeros(3, dtype=torch.long)
    got = [ours.decoder(tokens[:, :4], torch.arange(4), pad)]
    for pos in range(4, 9):
        got.append(ours.decoder(tokens[:, pos : pos + 1], torch.tensor([pos]), pad))
    torch.testing.assert_close(torch.cat(got, dim=1), expected, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_left_padded_rows_match_unpadded_decoding(models):
    """Rows with prefixes of different lengths, left-padded into one batch, decode as if alone."""
    stock, ours = models
    mel = torch.randn(2, 80, 3000)
    xa = stock.encoder(mel)
    lengths = [7, 3]  # row 1 is left-padded by 4 slots
    rows = [torch.randint(0, 50000, (1, n + 2)) for n in lengths]  # prefix, then two steps
    expected = [stock.decoder(r, xa[i : i + 1])[:, -3:] for i, r in enumerate(rows)]

    width = max(lengths)
    pad = torch.tensor([width - n for n in lengths])
    prefix = torch.stack([torch.cat([torch.zeros(p, dtype=torch.long), r[0, :n]]) for p, r, n in zip(pad.tolist(), rows, lengths)])
    ours.setup_caches(2, width + 2)
    ours.decoder.set_audio_features(xa)
    got = [ours.decoder(prefix, torch.arange(width), pad)[:, -1:]]
    for step in range(2):
        token = torch.stack([r[0, n + step] for r, n in zip(rows, lengths)])[:, None]
        got.append(ours.decoder(token, torch.tensor([width + step]), pad))
    got = torch.cat(got, dim=1)
    for i in range(2):
        torch.testing.assert_close(got[i : i + 1], expected[i], rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_live_windows_decode_as_the_whole_batch(models):
    """Windows of 2 rows each (beams sharing their audio), some of them ended: the live windows'
    rows get the logits the whole batch gives them, reading their own window's audio and cache;
    the ended rows' logits are zeros."""
    stock, ours = models
    xa = stock.encoder(torch.randn(3, 80, 3000))
    ours.setup_caches(3, 8, group=2)
    ours.decoder.set_audio_features(xa)
    pad = torch.zeros(6, dtype=torch.long)
    prefix = torch.randint(0, 50000, (6, 4))
    ours.decoder(prefix, torch.arange(4), pad)
    token = torch.randint(0, 50000, (6, 1))
    whole = ours.decoder(token, torch.tensor([4]), pad)
    live = ours.decoder(token, torch.tensor([4]), pad, LiveWindows([0, 2], group=2))
    torch.testing.assert_close(live[[0, 1, 4, 5]], whole[[0, 1, 4, 5]], rtol=1e-5, atol=1e-5)
    assert not live[2:4].any()


def test_live_windows_come_in_runs_of_neighbours():
    live = LiveWindows([0, 1, 3, 5, 6, 7], group=2)
    assert live.runs() == [slice(0, 2), slice(3, 4), slice(5, 8)]
    assert live.run_rows()[1] == (slice(3, 4), slice(6, 8))
    assert LiveWindows([], group=5).runs() == []


@pytest.mark.parametrize("group", [1, 3])
@torch.inference_mode()
def test_a_live_window_gets_the_same_bits_whichever_windows_decode_beside_it(models, group):
    """A step's attention for live windows runs in runs of neighbours; a window's logits are
    the same bits alone, in a run of three and beside a gap, so its text never depends on
    which windows of its batch are still decoding."""
    stock, ours = models
    xa = stock.encoder(torch.randn(4, 80, 3000))
    ours.setup_caches(4, 8, group=group)
    ours.decoder.set_audio_features(xa)
    pad = torch.tensor([0, 1, 2, 0] * group).view(group, 4).T.reshape(-1)
    ours.decoder(torch.randint(0, 50000, (4 * group, 4)), torch.arange(4), pad)
    token = torch.randint(0, 50000, (4 * group, 1))

    def step(windows):
        return ours.decoder(token, torch.tensor([4]), pad, LiveWindows(windows, group))

    alone = {w: step([w])[w * group : (w + 1) * group] for w in range(4)}
    for windows in ([0, 1, 2], [1, 3], [0, 1, 2, 3]):
        logits = step(windows)
        for w in windows:
            assert torch.equal(logits[w * group : (w + 1) * group], alone[w]), (windows, w)


def test_caches_are_preallocated_once(models):
    _, ours = models
    ours.setup_caches(5, 300)
    cache = ours.decoder.blocks[0].attn.kv_cache
    assert cache.k.shape == (5, DIMS.n_text_head, 300, DIMS.n_text_state // DIMS.n_text_head)
    ours.setup_caches(5, 300)
    assert ours.decoder.blocks[0].attn.kv_cache is cache


def test_loading_a_model_leaves_dynamo_unimported_and_torch_init_intact():
    """An eager run never imports TorchDynamo (seconds of start-up); load_model restores nn.init."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, torch
        from wtx.model import ModelDimensions, Whisper, load_model
        dims = ModelDimensions(80, 1500, 64, 4, 2, 51864, 448, 64, 4, 2)
        state = Whisper(dims).state_dict()
        state["decoder.positional_embedding"].normal_()  # torch.empty: it may hold NaN, never equal to itself
        model = load_model({"dims": dims.__dict__, "model_state_dict": state})
        assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
        assert all(p.device.type == "cpu" for p in model.parameters())
        w = torch.empty(3, 3)
        torch.nn.init.ones_(w)
        assert bool((w == 1).all())  # the initialisers work again after loading
        print("torch._dynamo" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
