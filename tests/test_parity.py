"""The engine agrees with stock openai-whisper `decode()` on the same 30 s windows (tiny.en, fp32, CPU)."""

import itertools
from dataclasses import replace

import pytest

from tests.conftest import audio_file, tiny_engine_and_stock
from wtx.audio import fixed_windows, stream_samples
from wtx.engine import Engine
from wtx.metrics import agreement
from wtx.reference import stock_decode

pytestmark = pytest.mark.slow

FILES = {
    "sample": ("sample", 2),  # the bundled sample's two full windows: it runs without ../shared
    "lj001_0001-0032_concat": ("audio/lj001_0001-0032_concat.flac", None),
    "copperfield_first_5min": ("tts/copperfield_ch01_slt.mp3", 10),  # 10 windows = 5 minutes
}


@pytest.fixture(scope="module")
def engine_and_stock():
    return tiny_engine_and_stock(batch_size=8)


def compare(engine, theirs, ours, label):
    """Token and text agreement of the engine's results with stock DecodingResults: (Agreement, our text)."""
    ours_text = " ".join(engine.tokenizer.decode(r.tokens) for r in ours)
    theirs_text = " ".join(r.text for r in theirs)
    result = agreement([r.tokens for r in theirs], [r.tokens for r in ours], theirs_text, ours_text)
    print(f"{label}: {result.identical}/{result.windows} windows identical, WER {result.wer:.2%}")
    return result, ours_text


@pytest.mark.parametrize("name", FILES)
def test_tokens_match_stock_decode(engine_and_stock, name):
    relative, n_windows = FILES[name]
    path = audio_file(relative)
    engine, stock = engine_and_stock
    windows = list(itertools.islice(fixed_windows(stream_samples(str(path))), n_windows))
    ours = list(engine.transcribe_windows(windows))
    theirs = stock_decode(stock, windows, batch_size=8)

    result, ours_text = compare(engine, theirs, ours, name)
    assert result.identical_share >= 0.95
    assert result.wer <= 0.01
    assert len(ours_text.split()) > 50 * len(windows)  # real speech was decoded, not silence


PROMPTED = [("sample", 2), ("tts/copperfield_ch01_slt.mp3", 6)]


@pytest.mark.parametrize("relative, n", PROMPTED)
def test_prompted_windows_match_stock_decode_with_prompt(engine_and_stock, relative, n):
    """Rows conditioned on previous text (prompts of different lengths, one empty, left-padded in one
    batch) give stock decode(prompt=...)'s tokens, window by window."""
    engine, stock = engine_and_stock
    windows = list(itertools.islice(fixed_windows(stream_samples(str(audio_file(relative)))), n))
    unprompted = stock_decode(stock, windows, batch_size=8)
    prompts = [[]] + [r.tokens for r in unprompted[:-1]]  # each window's predecessor, as transcribe() does
    theirs = [stock_decode(stock, [w], batch_size=1, prompt=p or None)[0] for w, p in zip(windows, prompts)]
    prompted = Engine(replace(engine.options, condition_on_previous_text=True), model=engine.model)
    ours = prompted.decode_batch(windows, prompts=prompts)

    result, _ = compare(engine, theirs, ours, "prompted")
    assert result.identical_share >= 0.8  # 5 of 6, or every window of 2
    assert result.wer <= 0.01
    assert sum(a.tokens != b.tokens for a, b in zip(theirs, unprompted)) >= 1  # the prompts changed the output


# the least words per window: text only, stock decode() too leaves some of the sample out
TEXT_ONLY = [("sample", 2, 30), ("tts/copperfield_ch01_slt.mp3", 6, 50)]


@pytest.mark.parametrize("relative, n, words", TEXT_ONLY)
def test_text_only_windows_match_stock_decode_without_timestamps(engine_and_stock, relative, n,
                                                                 words):
    """without_timestamps: <|notimestamps|> ends the prefix and no timestamp rule applies, as
    stock decode(without_timestamps=True); each window's text is one segment over its audio."""
    engine, stock = engine_and_stock
    windows = list(itertools.islice(fixed_windows(stream_samples(str(audio_file(relative)))), n))
    text_only = Engine(replace(engine.options, decoding=replace(engine.options.decoding, without_timestamps=True)),
                       model=engine.model)  # fmt: skip
    ours = text_only.decode_batch(windows)
    theirs = stock_decode(stock, windows, batch_size=8, without_timestamps=True)

    result, ours_text = compare(engine, theirs, ours, "without timestamps")
    assert result.identical_share >= 0.8  # 5 of 6, or every window of 2
    assert result.wer <= 0.01
    assert len(ours_text.split()) > words * len(windows)
    assert all(t < engine.tokenizer.eot for r in ours for t in r.tokens)  # text tokens only
    for r, w in zip(ours, windows):
        assert [(s.start, s.end) for s in r.segments] == [(w.offset, w.offset + w.duration)]
