"""Word timestamps agree with stock openai-whisper's word_timestamps=True (tiny.en, fp32, CPU)."""

import itertools
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import audio_file, shared_file, tiny_engine_and_stock
from wtx.audio import fixed_windows, stream_samples
from wtx.reference import stock_word_timestamps
from wtx.segments import Segment, Word, split_segments
from wtx.streams import Recording, WindowDone
from wtx.timing import backtrace, dtw, median_filter, sorting_network
from wtx.words import WordTiming, add_word_timestamps


@pytest.fixture(scope="module")
def engine_and_stock():
    return tiny_engine_and_stock(batch_size=4)


def stock_words_for(engine, stock, results) -> list[list[dict]]:
    """Stock add_word_timestamps on each window's own segments (before words moved their
    times), the last speech carried from window to window as transcribe() carries it."""
    last_speech, words = 0.0, []
    for r in results:
        segments = split_segments(r.tokens, engine.tokenizer, r.window.offset, r.window.duration)
        theirs = [w for s in stock_word_timestamps(stock, engine.tokenizer, r.window, segments, last_speech) for w in s["words"]]
        if theirs:
            last_speech = theirs[-1]["end"]
        words.append(theirs)
    return words


@pytest.mark.slow
@pytest.mark.parametrize("relative, n", [("sample", 2), ("audio/lj001_0001-0032_concat.flac", None),
                                         ("tts/copperfield_ch01_slt.mp3", 10)])  # fmt: skip
def test_word_times_match_stock(engine_and_stock, relative, n):
    """The scheduler's words (one aligning pass per batch of four) against stock's on the same
    windows and tokens: the same words, and start and end within 20 ms for at least 95%."""
    engine, stock = engine_and_stock
    windows = list(itertools.islice(fixed_windows(stream_samples(str(audio_file(relative)))), n))
    events = engine.scheduler(word_timestamps=True).run([Recording("a", windows)], ordered=True)
    results = [e.result for e in events if isinstance(e, WindowDone)]
    assert [r.window.index for r in results] == [w.index for w in windows]
    close = total = 0
    for result, theirs in zip(results, stock_words_for(engine, stock, results)):
        ours = [w for s in result.segments for w in s.words]
        assert [w.word for w in ours] == [w["word"] for w in theirs]
        for a, b in zip(ours, theirs):
            total += 1
            close += abs(a.start - b["start"]) <= 0.02 and abs(a.end - b["end"]) <= 0.02
        assert all(0 <= w.probability <= 1 and w.start <= w.end for w in ours)
    print(f"\n{relative}: {close}/{total} words within 20 ms of stock's")
    assert total > 40 * len(windows)
    assert close >= 0.95 * total


@pytest.mark.slow
@pytest.mark.parametrize("alone", [True, False], ids=["each window alone", "the batch at a fixed width"])
def test_a_windows_words_are_the_same_beside_any_neighbours(alone):
    """Window 0 decoded beside windows 1 to 3, then beside 5 to 7 (other texts, other lengths):
    the same words, times and probabilities, bit for bit, in both ways the aligning pass runs
    (each window alone, a CPU's; the whole batch padded to a fixed width, a GPU's), so a file
    re-batched after a Ray worker died writes the same bytes. With the CPU's defaults, a batch
    padded to its longest text instead moved a word's probability here."""
    import wtx

    engine = wtx.load_model("tiny.en", device="cpu", batch_size=4, vad=False).engine  # the CPU's defaults: int8 logits, bf16 K/V
    windows = list(itertools.islice(fixed_windows(stream_samples(str(shared_file("audio/lj001_0001-0032_concat.flac")))), 8))
    assert len(windows) == 8
    engine.align.alone = alone  # this test's own engine

    def words(*groups):
        recordings = [Recording(str(i), group) for i, group in enumerate(groups)]
        events = engine.scheduler(word_timestamps=True).run(recordings, ordered=True)
        done = [e.result for e in events if isinstance(e, WindowDone)]
        return {r.window.offset: [(w.word, w.start, w.end, w.probability) for s in r.segments for w in s.words] for r in done}

    first, second = words(windows[:4], windows[4:]), words(windows[:1], windows[5:])
    assert sum(map(len, first.values())) > 100
    for offset, timed in second.items():
        assert timed == first[offset], offset


def test_dtw_takes_whisper_paths():
    """The batched anti-diagonal DTW finds whisper's path (its numba dtw) on random matrices,
    padded to one shape, ties included (a quantised matrix has many)."""
    from whisper.timing import dtw_cpu

    rng = np.random.default_rng(0)
    shapes = [(1, 1), (1, 9), (7, 1), (12, 40), (40, 12), (33, 150)]
    matrices = [rng.standard_normal(s) for s in shapes[:3]] + [np.round(rng.standard_normal(s), 1) for s in shapes[3:]]
    cost = torch.zeros(len(shapes), 40, 150, dtype=torch.float64)
    for i, m in enumerate(matrices):
        cost[i, : m.shape[0], : m.shape[1]] = torch.from_numpy(m)
    trace = dtw(cost).numpy()
    for i, m in enumerate(matrices):
        theirs = dtw_cpu(m.copy())
        ours = backtrace(trace[:, i], *m.shape)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1]), shapes[i]


INTERPRETED_KERNEL = """
import torch
from wtx import dtw_kernel, timing

generator = torch.Generator().manual_seed(0)
for shape in [(1, 1, 1), (2, 1, 9), (2, 9, 1), (3, 5, 7), (2, 30, 200)]:
    cost = torch.randn(*shape, dtype=torch.float64, generator=generator).round(decimals=1)  # many ties
    assert torch.equal(dtw_kernel.dtw_steps(timing.skew(cost)), timing.dtw(cost)), shape
"""


def test_the_dtw_kernel_takes_the_loops_steps_in_tritons_interpreter():
    """The GPU's DTW kernel (wtx.dtw_kernel), run by Triton's interpreter on the CPU: the same
    steps as the tensor loop, bit for bit, on matrices with ties, from 1x1 up."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when Triton is imported: a process of its own
    subprocess.run([sys.executable, "-c", INTERPRETED_KERNEL], env=env, check=True, timeout=300)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_dtw_kernel_takes_the_loops_steps():
    """On a GPU, one Triton kernel does the DTW: the same steps as the tensor loop, bit for bit,
    on random matrices with ties, from 1x1 to a full batch of 30 s windows."""
    from wtx import dtw_kernel

    if not dtw_kernel.usable(torch.device("cuda")):
        pytest.skip("Triton is not installed")
    generator = torch.Generator().manual_seed(0)
    for shape in [(1, 1, 1), (2, 1, 9), (2, 9, 1), (3, 5, 7), (4, 30, 200), (32, 226, 1500)]:
        cost = torch.randn(*shape, dtype=torch.float64, generator=generator).round(decimals=1)  # many ties
        cuda = cost.cuda()
        steps = dtw(cuda)
        assert not dtw_kernel._failure, dtw_kernel._failure
        dtw_kernel.triton, kept = None, dtw_kernel.triton  # the tensor loop, on the same device
        try:
            loop = dtw(cuda)
        finally:
            dtw_kernel.triton = kept
        assert torch.equal(steps.cpu(), loop.cpu()) and torch.equal(steps.cpu(), dtw(cost)), shape


def test_median_filter_is_whispers():
    from whisper.timing import median_filter as whisper_median_filter

    x = torch.randn(3, 11, 60)
    x[0, 0, :8] = 0.5  # ties
    for width in (3, 5, 7, 9):  # 7, whisper's, takes Knuth's network; the others odd-even transposition
        assert torch.equal(median_filter(x, width), whisper_median_filter(x, width)), width
    assert torch.equal(median_filter(x.round(decimals=1), 7), whisper_median_filter(x.round(decimals=1), 7))
    short = torch.randn(2, 3, 3)
    assert torch.equal(median_filter(short, 7), short)


@pytest.mark.parametrize("width", [3, 5, 7, 9])
def test_sorting_networks_sort_every_input(width):
    """By the 0-1 principle, a comparator network sorts every input if it sorts every 0-1 input."""
    for bits in itertools.product((0, 1), repeat=width):
        wires = list(bits)
        for i, j in sorting_network(width):
            wires[i], wires[j] = min(wires[i], wires[j]), max(wires[i], wires[j])
        assert wires == sorted(wires), bits


def random_alignment(rng: random.Random, n: int) -> list[WordTiming]:
    """Words with pauses, long words, sentence ends and punctuation to merge, as find_alignment gives them."""
    pieces = [" The", " man", ",", " said", " \"", "Yes", ".", "\"", " (", "Then", ")", " he", " left", "!", " It", "'s", " over", "?"]
    alignment, t = [], 0.0
    for i in range(n):
        t += rng.choice([0.0, 0.0, 0.02, 0.5, 2.5])
        duration = rng.choice([0.0, 0.1, 0.2, 0.3, 1.5, 3.0])
        alignment.append(WordTiming(pieces[i % len(pieces)], [1000 + i], round(t, 2), round(t + duration, 2), rng.random()))
        t += duration
    return alignment


def test_segment_rules_are_whispers(monkeypatch):
    """The rules after alignment (long words cut at sentence ends and pauses, punctuation merged,
    segment times from words) against whisper's add_word_timestamps fed the same alignments."""
    import whisper.timing

    rng = random.Random(0)
    for trial in range(200):
        alignment = random_alignment(rng, rng.randint(1, 30))
        cuts = sorted(rng.sample(range(1, len(alignment) + 1), k=min(len(alignment), rng.randint(1, 4))))
        if cuts[-1] != len(alignment):
            cuts.append(len(alignment))
        offset, last_speech = rng.choice([0.0, 30.0, 61.37]), rng.choice([0.0, 20.0, 60.0])
        segments, start = [], 0
        for cut in cuts:
            words = alignment[start:cut]
            seg_start = round(offset + words[0].start + rng.choice([-1.0, 0.0, 0.7]), 2)
            seg_end = round(offset + words[-1].end + rng.choice([-1.0, 0.0, 0.7]), 2)
            segments.append(Segment(max(0.0, seg_start), seg_end, "x", tuple(t for w in words for t in w.tokens)))
            start = cut

        def copy(timings):
            return [whisper.timing.WordTiming(w.word, list(w.tokens), w.start, w.end, w.probability) for w in timings]

        monkeypatch.setattr(whisper.timing, "find_alignment", lambda *a, timings=copy(alignment), **k: timings)
        dicts = [{"seek": offset * 100, "start": s.start, "end": s.end, "tokens": list(s.tokens)} for s in segments]
        whisper.timing.add_word_timestamps(segments=dicts, model=None, tokenizer=type("T", (), {"eot": 50256}),
                                           mel=None, num_frames=0, last_speech_timestamp=last_speech)  # fmt: skip
        ours = add_word_timestamps(segments, [WordTiming(w.word, list(w.tokens), w.start, w.end, w.probability) for w in alignment],
                                   offset, last_speech)  # fmt: skip
        for mine, theirs in zip(ours, dicts, strict=True):
            assert (mine.start, mine.end) == (theirs["start"], theirs["end"]), trial
            assert [(w.word, w.start, w.end) for w in mine.words] == [(w["word"], w["start"], w["end"]) for w in theirs["words"]], trial


def test_api_segments_carry_words():
    """Model.transcribe(word_timestamps=True): every segment's words, inside it and in order."""
    import wtx

    model = wtx.load_model("tiny.en", device="cpu", batch_size=2, beam_size=1, vad=False)
    segments, info = model.transcribe(str(shared_file("audio/jfk.flac")), word_timestamps=True)
    segments = list(segments)
    assert info.options["word_timestamps"]
    words = [w for s in segments for w in s.words]
    assert "".join(w.word for w in words).strip() == " ".join(s.text for s in segments)
    assert all(isinstance(w, Word) and 0 <= w.start <= w.end <= info.duration for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    plain, _ = model.transcribe(str(shared_file("audio/jfk.flac")))
    assert [s.text for s in plain] == [s.text for s in segments]  # words never change the text


@pytest.mark.parametrize("alone", [True, False], ids=["each window alone", "the batch in one pass"])
def test_words_without_their_probabilities_keep_their_times(alone):
    """Where no output shows the words' probabilities (only .json does), they are not computed:
    the same words at the same times, bit for bit, with NaN for each probability; in the CPU's
    pass of each window alone and in the GPU's pass over the whole batch alike."""
    import math

    import wtx

    model = wtx.load_model("tiny.en", device="cpu", batch_size=2, beam_size=1, vad=False)
    model.engine.align.alone = alone
    windows = list(fixed_windows(stream_samples(str(shared_file("audio/jfk.flac")))))

    def words(probabilities: bool):
        events = model.run([Recording("jfk", windows)], ordered=True, word_timestamps=True, word_probabilities=probabilities)
        return [w for e in events if isinstance(e, WindowDone) for s in e.result.segments for w in s.words]

    with_them, without = words(True), words(False)
    assert len(with_them) > 15 and all(0 < w.probability <= 1 for w in with_them)
    assert [(w.word, w.start, w.end) for w in without] == [(w.word, w.start, w.end) for w in with_them]
    assert all(math.isnan(w.probability) for w in without)


def test_words_survive_the_journal(tmp_path):
    """A resumed run writes the words of the windows journaled before the interruption."""
    from wtx.journal import Entry, Journal

    words = ((" Now,", 60.0, 61.02, 0.73), (" then", 61.1, 61.5, 0.9))
    entry = Entry(2, 60.0, 30.0, "en", [(60.0, 61.5, "Now, then", words), (62.0, 63.0, "no words", ())], [1, 2])
    identity = {"version": 3, "source": "x"}
    journal = Journal(tmp_path / ".x.wtx-journal", identity)
    journal.append(entry)
    journal.close()
    assert Journal(tmp_path / ".x.wtx-journal", identity).entries == {2: entry}
