"""Silence-aware windows, seek points, subtitle rules and the WER harness."""

import random
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, shared_file
from wtx.audio import N_SAMPLES, SAMPLE_RATE
from wtx.decode import get_tokenizer
from wtx.segments import seek_point, stretches_timestamps
from wtx.split import FRAME, SEARCH, SMOOTH, frame_energy_db, quietest_cut, silence_windows, speech_start
from wtx.subtitles import MAX_CUE, MAX_LINE, MAX_LINES, MIN_CUE, subtitle_cues
from wtx.transcript import TimedText, Transcript
from tests.test_decode import TINY_EN


def tones_and_silences(rng: random.Random, seconds: float):
    """Tone bursts of 0.3-4 s separated by silences of 0.3-1.5 s: (samples, silent intervals)."""
    parts, silences, t = [], [], 0.0
    while t < seconds:
        burst = rng.uniform(0.3, 4.0)
        n = int(burst * SAMPLE_RATE)
        parts.append((0.3 * np.sin(2 * np.pi * rng.uniform(200, 800) * np.arange(n) / SAMPLE_RATE)).astype(np.float32))
        t += n / SAMPLE_RATE
        gap = rng.uniform(0.3, 1.5)
        silences.append((t, t + gap))
        parts.append(np.zeros(int(gap * SAMPLE_RATE), dtype=np.float32))
        t += int(gap * SAMPLE_RATE) / SAMPLE_RATE
    return np.concatenate(parts), silences


def blocks_of(samples: np.ndarray):
    for i in range(0, len(samples), N_SAMPLES):
        yield samples[i : i + N_SAMPLES]


@pytest.mark.parametrize("seed", range(5))
def test_window_boundaries_fall_inside_silences(seed):
    samples, silences = tones_and_silences(random.Random(seed), 200.0)
    windows = list(silence_windows(blocks_of(samples)))
    assert windows[0].offset == 0.0
    for a, b in zip(windows, windows[1:]):
        cut = a.offset + a.duration
        assert b.offset == pytest.approx(cut)  # contiguous: nothing dropped, nothing twice
        assert a.duration <= 30.0
        assert any(lo <= cut <= hi for lo, hi in silences), f"cut at {cut:.2f} s is inside a tone"
    total = windows[-1].offset + windows[-1].duration
    assert total == pytest.approx(len(samples) / SAMPLE_RATE, abs=0.01)
    for w in windows:  # exact offsets: each window's samples are the recording's
        start = int(round(w.offset * SAMPLE_RATE))
        n = int(round(w.duration * SAMPLE_RATE))
        assert np.array_equal(w.samples[:n], samples[start : start + n])


@pytest.mark.parametrize("seed", range(3))
def test_cut_and_skip_measure_only_what_they_need(seed):
    """quietest_cut and speech_start measure part of a window; they must decide as if they had
    measured all of it (the straightforward version below)."""

    def whole_cut(samples):
        smooth = np.convolve(frame_energy_db(samples), np.ones(SMOOTH) / SMOOTH, mode="same")
        first = max(0, len(smooth) - int(SEARCH * 50))
        candidates = np.flatnonzero(smooth[first:] <= smooth[first:].min() + 1.0)
        return (first + int(candidates[-1])) * FRAME + FRAME // 2

    def whole_skip(samples):
        loud = np.flatnonzero(frame_energy_db(samples) > -45.0)
        if len(loud) == 0:
            return None
        return 0 if loud[0] * FRAME < 2.0 * SAMPLE_RATE else int(loud[0]) * FRAME - int(0.3 * SAMPLE_RATE)

    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(40):  # noise bursts and near-silences of random loudness and length
        parts = [rng.standard_normal(int(rng.uniform(0.05, 8) * SAMPLE_RATE)) * rng.choice([0.002, 0.05, 0.3])
                 for _ in range(rng.integers(2, 12))]  # fmt: skip
        cases.append(np.concatenate(parts).astype(np.float32)[: int(rng.uniform(12, 30) * SAMPLE_RATE)])
    # the pause right where the search starts: its smoothing reaches before the searched part
    loud = (rng.standard_normal(N_SAMPLES) * 0.3).astype(np.float32)
    gap = N_SAMPLES - int(SEARCH * SAMPLE_RATE) + int(rng.integers(-4, 2)) * FRAME
    loud[gap : gap + 4 * FRAME] *= 0.001
    cases.append(loud)
    for samples in cases:
        assert quietest_cut(samples) == whole_cut(samples)
        assert speech_start(samples) == whole_skip(samples)


def test_long_silence_is_skipped():
    tone = (0.3 * np.sin(np.arange(3 * SAMPLE_RATE) / 10)).astype(np.float32)
    samples = np.concatenate([tone, np.zeros(70 * SAMPLE_RATE, np.float32), tone])
    windows = list(silence_windows(blocks_of(samples)))
    assert len(windows) == 2
    assert windows[1].offset > 70  # the minute of silence was never decoded
    assert list(silence_windows(blocks_of(np.zeros(45 * SAMPLE_RATE, np.float32)))) == []


def test_seek_point_follows_transcribe():
    tok = get_tokenizer(TINY_EN, "en", "transcribe")
    ts = tok.timestamp_begin
    text = tok.encode(" hi")
    assert seek_point([ts, *text, ts + 100], tok) is None  # single timestamp ending
    assert seek_point([ts, *text, ts + 100, ts + 100], tok) == pytest.approx(2.0)
    assert seek_point([ts, *text, ts + 100, ts + 100, *text], tok) == pytest.approx(2.0)
    assert seek_point([*text], tok) is None


def test_stretched_timestamps_mark_skipped_speech():
    tok = get_tokenizer(TINY_EN, "en", "transcribe")
    ts = tok.timestamp_begin
    sentence = tok.encode(" To the voice of justice and of consanguinity.")  # 45 characters
    end = tok.encode(" The end.")
    # 0-3 s: a normal pace (15 characters a second); then the same text over 3 s, or over 17 s
    normal = [ts, *sentence, ts + 150, ts + 150]
    assert not stretches_timestamps(normal + [*sentence, ts + 300, ts + 300, *end, ts + 350], tok)
    assert stretches_timestamps(normal + [*sentence, ts + 1000, ts + 1000, *end, ts + 1050], tok)
    assert stretches_timestamps([ts, *sentence, ts + 860, ts + 860, *end, ts + 900], tok)  # first segment too
    # short segments are never judged, nor the final one (a single timestamp ends it)
    assert not stretches_timestamps([ts, *tok.encode(" Yes."), ts + 150, ts + 150, *end, ts + 200], tok)
    assert not stretches_timestamps(normal + [*sentence, ts + 1000], tok)


def test_subtitle_rules_hold_on_generated_segments():
    rng = random.Random(1)
    words = "the keeper climbed the stairs at dusk and trimmed every wick extraordinarily carefully".split()
    segments, t = [], 0.0
    for _ in range(200):
        duration = rng.uniform(0.2, 25.0)
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
        segments.append(TimedText(round(t, 2), round(t + duration, 2), text))
        t += duration + rng.choice([0.0, 0.0, 0.4, 2.0])
    cues = subtitle_cues(Transcript("x", t, "en", segments))
    assert " ".join(c.text.replace("\n", " ") for c in cues).split() == " ".join(s.text for s in segments).split()
    for i, cue in enumerate(cues):
        lines = cue.text.split("\n")
        assert len(lines) <= MAX_LINES and all(len(line) <= MAX_LINE for line in lines)
        assert cue.end - cue.start <= MAX_CUE + 1e-6
        if i + 1 < len(cues):
            nxt = cues[i + 1]
            assert cue.end <= nxt.start + 1e-6  # no overlaps
            assert cue.end - cue.start >= min(MIN_CUE, nxt.start - cue.start) - 1e-6


@pytest.mark.slow
def test_wer_harness_runs_on_a_short_file(tmp_path):
    audio, ref = shared_file("audio/jfk.flac"), shared_file("audio/jfk.txt")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_wer.py"), "--files", f"{audio}:{ref}",
         "--markdown", str(tmp_path / "acc.md"), "--json", str(tmp_path / "acc.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    rows = json.loads((tmp_path / "acc.json").read_text())
    assert {r["config"] for r in rows} == {"silence", "fixed", "decode", "transcribe"}
    assert all(0 <= r["wer"] < 0.2 for r in rows)  # a clean 11 s clip: every configuration nearly right
    stock = next(r for r in rows if r["config"] == "transcribe")
    assert set(stock["errors_near"]) == {"silence", "fixed", "decode"}  # its errors at the others' cuts
    assert "| **average** |" in (tmp_path / "acc.md").read_text()


def load_eval_wer():
    """scripts/eval_wer.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_wer", ROOT / "scripts" / "eval_wer.py")
    eval_wer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_wer)
    return eval_wer


def test_boundary_reach_counts_overlaps_once():
    eval_wer = load_eval_wer()
    # 1 s either side: [9, 11], [19, 21.5] (two boundaries overlapping), [99, 100.5] (clipped at the end)
    assert eval_wer.near_seconds([10, 20, 20.5, 100], 100.5) == pytest.approx(6.0)
    assert eval_wer.near_seconds([0.5], 10) == pytest.approx(1.5)  # clipped at the start
    assert eval_wer.near_seconds([], 10) == 0.0


def test_errors_near_counts_one_configs_errors_at_anothers_cuts():
    eval_wer = load_eval_wer()
    reference = "one two three four five six"
    # six words over 6 s: word i is timed at i + 0.5 s
    cut = [(0.0, 6.0, "one two three four five six")], [2.5]  # no errors, a cut at 2.5 s
    uncut = [(0.0, 6.0, "one two tree four five sex")], None  # errors at 2.5 s and 5.5 s, no cuts
    decoded = {}
    for config, (segments, boundaries) in {"silence": cut, "transcribe": uncut}.items():
        row = {**eval_wer.score(reference, segments, boundaries), "errors_near": {}}
        decoded[config] = (row, segments, boundaries)
    eval_wer.cross_count(reference, decoded)
    assert decoded["transcribe"][0]["errors_near"] == {"silence": 1}  # "tree", not "sex"
    assert decoded["silence"][0]["errors_near"] == {}  # transcribe() has no cuts
    assert decoded["silence"][0]["boundary_errors"] == 0
