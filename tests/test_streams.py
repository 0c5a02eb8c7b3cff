"""Batch rows as streams: previous-text prompts, fallbacks and resume, with a scripted decoder.

`decode_batch` is replaced by a script that returns chosen tokens per window, so these tests
check the scheduling in `Engine.transcribe_windows` alone, quickly and exactly.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from wtx.audio import N_SAMPLES, Window
from wtx.options import DecodingOptions
from wtx.segments import split_segments
from wtx.engine import Engine, EngineOptions
from wtx.segments import WindowResult
from wtx.model import ModelDimensions, Whisper

TINY = ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = Whisper(TINY).eval()
    torch.nn.init.normal_(model.decoder.positional_embedding, std=0.02)  # torch.empty otherwise
    return model


def windows(n: int, start: int = 0) -> list[Window]:
    silence = np.zeros(N_SAMPLES, dtype=np.float32)
    return [Window(i, 30.0 * i, 30.0, silence) for i in range(start, start + n)]


class Script:
    """Stands in for Engine.decode_batch; records every call.

    Each window decodes to "<|0.00|> w{index} <|ts|>"; `bad` lists (index, prompted) pairs
    whose decode comes out unlikely (avg log-prob -2), `silent` the same with no-speech 0.9.
    """

    def __init__(self, engine, bad=(), silent=()):
        self.engine, self.bad, self.silent = engine, set(bad), set(silent)
        self.calls = []  # (index, prompt, temperature)

    def __call__(self, batch, language=None, prompts=None, temperatures=None, languages=None):
        tokenizer = self.engine.tokenizer
        ts = tokenizer.timestamp_begin
        results = []
        for w, prompt, t in zip(batch, prompts, temperatures):
            self.calls.append((w.index, list(prompt), t))
            key = (w.index, bool(prompt))
            tokens = [ts, *tokenizer.encode(f" w{w.index}"), ts + 1400]  # single final timestamp: consumed
            logprob = -2.0 if key in self.bad | self.silent else -0.1
            no_speech = 0.9 if key in self.silent else 0.1
            result = WindowResult(w, tokens, "en", no_speech, logprob, [], t)
            if not result.is_silent(self.engine.options.decoding):
                result.segments = split_segments(tokens, tokenizer, w.offset, w.duration)
            results.append(result)
        return results


def engine_with(model, script_args=(), **options) -> tuple[Engine, Script]:
    options = {"batch_size": 2, **options}
    engine = Engine(EngineOptions(model="random-tiny", device="cpu", **options), model=model)
    script = Script(engine, *script_args)
    engine.decode_batch = script
    return engine, script


def text_tokens(engine, index: int) -> list[int]:
    ts = engine.tokenizer.timestamp_begin
    return [ts, *engine.tokenizer.encode(f" w{index}"), ts + 1400]


def test_rows_follow_consecutive_windows_with_previous_text(model):
    engine, script = engine_with(model, stream_windows=3)
    results = list(engine.transcribe_windows(windows(6)))  # 6 windows, 2 rows: 3 each
    assert [r.window.index for r in results] == list(range(6))  # in order
    prompts = {index: prompt for index, prompt, _ in script.calls}
    assert prompts[0] == [] and prompts[3] == []  # each row starts fresh
    assert prompts[1] == text_tokens(engine, 0)
    assert prompts[2] == text_tokens(engine, 0) + text_tokens(engine, 1)
    assert prompts[5] == text_tokens(engine, 3) + text_tokens(engine, 4)
    assert [index for index, _, _ in script.calls[:2]] == [0, 3]  # one window of each row per batch
    assert results[2].prompt == prompts[2] + text_tokens(engine, 2)  # what a resume would need


def test_rows_take_new_chunks_as_they_finish(model):
    engine, script = engine_with(model)
    journaled = {4: [7, 8]}
    results = list(engine.transcribe_windows(windows(6, start=5), prompts=journaled))
    assert [r.window.index for r in results] == list(range(5, 11))
    # chunks of 8 (the default): windows 5-7 continue chunk 0 from the journal, 8-10 start chunk 1
    prompts = {index: prompt for index, prompt, _ in script.calls}
    assert prompts[5] == [7, 8] and prompts[8] == []
    assert prompts[10] == text_tokens(engine, 8) + text_tokens(engine, 9)

    engine, script = engine_with(model, stream_windows=1)
    results = list(engine.transcribe_windows(windows(7)))  # chunks of one window, 2 rows
    assert [r.window.index for r in results] == list(range(7))
    assert all(prompt == [] for _, prompt, _ in script.calls)


def test_without_conditioning_every_window_is_alone(model):
    engine, script = engine_with(model, condition_on_previous_text=False)
    list(engine.transcribe_windows(windows(6)))
    assert all(prompt == [] for _, prompt, _ in script.calls)
    assert [index for index, _, _ in script.calls[:2]] == [0, 1]


def test_a_resumed_chunk_continues_from_the_journaled_prompt(model):
    engine, script = engine_with(model, stream_windows=3)
    journaled = {1: [11, 12, 13], 2: [21], 0: [1]}  # prompts after windows 0 to 2, from a journal
    results = list(engine.transcribe_windows(windows(4, start=2), prompts=journaled))
    assert [r.window.index for r in results] == [2, 3, 4, 5]
    prompts = {index: prompt for index, prompt, _ in script.calls}
    assert prompts[2] == [11, 12, 13]  # window 2 is mid-chunk (0-2): it continues
    assert prompts[3] == []  # window 3 starts a chunk, though window 2's prompt is known

    engine, script = engine_with(model, stream_windows=3)
    list(engine.transcribe_windows(windows(3, start=3), prompts=journaled))
    assert script.calls[0][:2] == (3, [])  # resumed at a chunk start: a fresh stream


def test_unlikely_windows_fall_back_to_higher_temperatures(model):
    engine, script = engine_with(model, [[(1, True)]], stream_windows=2)
    results = list(engine.transcribe_windows(windows(3)))
    tries = [(prompt != [], t) for index, prompt, t in script.calls if index == 1]
    # openai-whisper's temperature ladder, prompt kept; the last try stands
    assert tries == [(True, 0.0), (True, 0.2), (True, 0.4), (True, 0.6), (True, 0.8), (True, 1.0)]
    assert results[1].temperature == 1.0
    assert results[2].window.index == 2 and results[1].prompt == []  # above 0.5 the prompt starts over


def test_a_prompt_that_silences_speech_is_dropped_for_that_window(model):
    engine, script = engine_with(model, [(), [(1, True)]], stream_windows=2)
    results = list(engine.transcribe_windows(windows(3)))  # rows: windows 0-1 and 2
    tries = [(prompt != [], t) for index, prompt, t in script.calls if index == 1]
    assert tries == [(True, 0.0), (False, 0.0)]
    assert results[1].segments and results[1].segments[0].text == "w1"


def test_a_files_prompts_depend_on_neither_its_length_nor_the_batch_size(model):
    """Chunks of 8 windows (stream_windows) at every batch size, so each window has the same
    prompt, and the same text, however many rows decode beside it."""
    seen = []
    for batch_size in (1, 2, 8):
        engine, script = engine_with(model, batch_size=batch_size)
        list(engine.transcribe_windows(windows(20)))
        seen.append({index: prompt for index, prompt, _ in script.calls})
    assert seen[0] == seen[1] == seen[2]
    assert [index for index, prompt in seen[0].items() if not prompt] == [0, 8, 16]  # where chunks start
    engine, _ = engine_with(model, condition_on_previous_text=False)
    assert engine.scheduler().stream_length() == 1  # unprompted: any row takes any window


def test_engines_that_share_a_model_each_get_their_own_caches(model):
    options = EngineOptions(model="random-tiny", device="cpu", batch_size=2, decoding=DecodingOptions(sample_len=4))
    prompted = Engine(options, model=model)
    alone = Engine(replace(options, condition_on_previous_text=False), model=model)
    assert prompted.batch.n_slots != alone.batch.n_slots  # different cache lengths on one model
    for engine, n in ((prompted, 2), (alone, 1), (prompted, 2)):  # the third call finds the second's caches
        assert len(engine.decode_batch(windows(n), prompts=[[220] * 30] * n)) == n


def test_a_resumed_chunk_continues_from_the_journaled_speech_end(model):
    """Word timestamps: where a stream's speech last ended carries into its next window (a first
    word long after it is cut short); a resumed run picks it up from the journal midway through
    a chunk, so its words are the uninterrupted run's."""
    from wtx.words import WordTiming

    def align(texts, windows, languages, probabilities=True):  # every window: one 2 s word at its start
        return [[WordTiming(" w", list(t), 0.0, 2.0, 0.9)] if t else [] for t in texts]

    engine, _ = engine_with(model, stream_windows=3)
    engine.align = align
    whole = list(engine.transcribe_windows(windows(6), word_timestamps=True))  # chunks 0-2, 3-5
    assert [r.last_speech for r in whole[:2]] == [2.0, 32.0]
    first = [r.segments[0].words[0] for r in whole]
    assert (first[0].start, first[1].start, first[3].start) == (0.0, 30.6, 90.0)  # after a pause: cut to 1.4 s
    engine, _ = engine_with(model, stream_windows=3)
    engine.align = align
    journaled = {r.window.index: r.prompt for r in whole[:2]}
    ends = {r.window.index: r.last_speech for r in whole[:2]}
    resumed = list(engine.transcribe_windows(windows(4, start=2), prompts=journaled,
                                             word_timestamps=True, speech_ends=ends))  # fmt: skip
    assert [r.segments for r in resumed] == [r.segments for r in whole[2:]]
