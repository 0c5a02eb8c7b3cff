"""Beam search and best-of sampling agree with stock openai-whisper `decode()` (tiny.en, fp32, CPU)."""

import itertools
from dataclasses import replace

import pytest
import torch

from tests.conftest import audio_file, tiny_engine_and_stock
from tests.test_parity import compare
from wtx.audio import fixed_windows, stream_samples
from wtx.beam import best_hypothesis
from wtx.engine import Engine
from wtx.options import DecodingOptions
from wtx.reference import stock_decode

BEAM = DecodingOptions(beam_size=5, best_of=5)


@pytest.fixture(scope="module")
def engine_and_stock():
    return tiny_engine_and_stock(batch_size=4, decoding=BEAM)


def first_windows(relative: str, n: int):
    return list(itertools.islice(fixed_windows(stream_samples(str(audio_file(relative)))), n))


@pytest.mark.slow
@pytest.mark.parametrize("relative, n", [("sample", 2), ("audio/lj001_0001-0032_concat.flac", None),
                                         ("tts/copperfield_ch01_slt.mp3", 4)])  # fmt: skip
def test_beam_tokens_match_stock_decode(engine_and_stock, relative, n):
    """Beam 5 on the same fixed 30 s windows, four to a batch: stock decode(beam_size=5)'s tokens."""
    engine, stock = engine_and_stock
    windows = first_windows(relative, n)
    ours = [r for i in range(0, len(windows), 4) for r in engine.decode_batch(windows[i : i + 4])]
    theirs = stock_decode(stock, windows, batch_size=4, beam_size=5)
    result, text = compare(engine, theirs, ours, f"beam 5 {relative}")
    assert result.identical_share >= 0.95
    assert len(text.split()) > 50 * len(windows)
    greedy = stock_decode(stock, windows, batch_size=4)
    assert any(a.tokens != b.tokens for a, b in zip(greedy, theirs))  # beam search changed something


@pytest.mark.slow
@pytest.mark.parametrize("patience, length_penalty", [(2.0, None), (1.0, 1.0), (0.5, None)])
def test_patience_and_length_penalty_match_stock(engine_and_stock, patience, length_penalty):
    """Against stock decode() one window at a time: in a batch, stock goes on extending the beams
    of windows already complete until every window is, and with patience below 1 those beams are
    among its hypotheses, so its text depends on the batch. The engine's never does."""
    engine, stock = engine_and_stock
    windows = first_windows("tts/copperfield_ch01_slt.mp3", 2)
    decoding = replace(BEAM, patience=patience, length_penalty=length_penalty)
    options = replace(engine.options, decoding=decoding)
    ours = Engine(options, model=engine.model).decode_batch(windows)
    theirs = stock_decode(stock, windows, batch_size=1, beam_size=5, patience=patience, length_penalty=length_penalty)
    result, _ = compare(engine, theirs, ours, f"patience {patience}, length penalty {length_penalty}")
    assert result.identical == len(windows)


def test_a_window_decodes_the_same_in_any_batch(engine_and_stock):
    """Beams of one window never mix with another's: a window alone, or with others (beam rows
    and best-of rows in one batch), gives the same tokens."""
    engine, _ = engine_and_stock
    windows = first_windows("audio/lj001_0001-0032_concat.flac", 3)
    alone = [engine.decode_batch([w])[0] for w in windows]
    together = engine.decode_batch(windows, temperatures=[0.0, 0.6, 0.0])
    assert together[0].tokens == alone[0].tokens and together[2].tokens == alone[2].tokens
    sampled_alone = engine.decode_batch([windows[1]], temperatures=[0.6])[0]
    assert together[1].tokens == sampled_alone.tokens
    assert together[1].temperature == 0.6


@pytest.mark.parametrize("beam_size, quantize", [(5, "none"), (5, "fp16"), (1, "fp16")])
def test_a_cpu_step_computes_only_the_windows_still_decoding(engine_and_stock, monkeypatch, beam_size, quantize):
    """Eagerly on a CPU a batch's padding windows end before the first step, and a window whose
    rows have ended drops out of the steps' attention and logits; the tokens stay those of the
    window decoded alone (float32 logits window by window, or fp16 logit weights for all live
    rows in one call, as --quantize auto runs them)."""
    engine, _ = engine_and_stock
    if quantize != "none":
        decoding = engine.options.decoding if beam_size > 1 else DecodingOptions()
        engine = Engine(replace(engine.options, decoding=decoding, quantize=quantize), model=engine.model)
        assert engine.quantized == quantize
    windows = first_windows("audio/lj001_0001-0032_concat.flac", 2)
    alone = [engine.decode_batch([w])[0].tokens for w in windows]
    loop = engine.batch.ensure_loop()
    seen = []
    live_windows = loop.live_windows
    monkeypatch.setattr(loop, "live_windows", lambda: seen.append(live_windows()) or seen[-1])
    together = engine.decode_batch(windows)  # 2 windows in a batch of 4
    assert [r.tokens for r in together] == alone
    assert seen[0].windows == [0, 1] and seen[0].group == beam_size
    assert seen[-1].windows != [0, 1]  # one of them ended first and was no longer computed
    assert all(set(b.windows) <= set(a.windows) for a, b in itertools.pairwise(seen))


@pytest.mark.parametrize("beam_size", [5, 1])
def test_a_cpu_step_over_the_live_rows_only_gives_the_same_tokens(engine_and_stock, monkeypatch, beam_size):
    """With fp16 weights a step takes the live windows' rows only, through the linear layers
    and the vocabulary-wide work: the tokens are those of every row computed."""
    import wtx.batch
    from wtx.decode import DecodeLoop
    from wtx.model import LiveWindows

    engine, _ = engine_and_stock
    decoding = engine.options.decoding if beam_size > 1 else DecodingOptions()
    engine = Engine(replace(engine.options, decoding=decoding, quantize="fp16"), model=engine.model)
    windows = first_windows("audio/lj001_0001-0032_concat.flac", 3)
    compact_runs = LiveWindows.compact_runs
    calls = []
    monkeypatch.setattr(LiveWindows, "compact_runs", lambda self: calls.append(self) or compact_runs(self))
    live_rows = [r.tokens for r in engine.decode_batch(windows)]  # 3 windows in a batch of 4
    assert calls and all(live.compact for live in calls)
    monkeypatch.setattr(DecodeLoop, "live_rows", lambda self: None)  # every row's vocabulary-wide work
    monkeypatch.setattr(wtx.batch, "Fp16Linear", type(None))  # no rows_apart: every row's decoder pass
    calls.clear()
    assert [r.tokens for r in engine.decode_batch(windows)] == live_rows
    assert not calls


def test_greedy_rows_are_the_default_decoding():
    """beam_size 1 is the greedy engine (one row per window), as openai-whisper's DecodingOptions."""
    assert DecodingOptions().group == 1
    assert BEAM.group == 5 and BEAM.max_candidates == 5
    assert replace(BEAM, fallback_temperatures=(), best_of=9).group == 5  # no fallback: no samples
    with pytest.raises(ValueError, match="keeps no hypothesis"):
        DecodingOptions(beam_size=5, patience=0.05)


@pytest.mark.parametrize("length_penalty", [None, 0.0, 1.0])
def test_best_hypothesis_is_whisper_maximum_likelihood_ranker(length_penalty):
    from whisper.decoding import MaximumLikelihoodRanker

    groups = [[([1] * 3, -1.2), ([1] * 9, -3.0), ([1] * 5, -1.9)], [([1] * 2, -0.3), ([1] * 20, -4.1)],
              [([1] * 4, -2.0), ([1] * 4, -2.0)]]  # fmt: skip
    ranker = MaximumLikelihoodRanker(length_penalty)
    chosen = ranker.rank([[torch.tensor(t) for t, _ in g] for g in groups], [[lp for _, lp in g] for g in groups])
    assert [best_hypothesis(g, length_penalty) for g in groups] == [g[i] for g, i in zip(groups, chosen)]
