"""CUDA graphs of the eager kernels, the default on CUDA: the same tokens as eager decoding."""

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from wtx.transcribe import _steps_run_as

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "wtx" / "assets" / "sample.mp3"


def test_journals_tell_the_three_ways_of_running_the_steps_apart():
    """Inductor's code, eager kernels in CUDA graphs and eager launches write different bits
    (or may): a journal is resumed only the way it was written."""
    assert _steps_run_as("compiled") is True and _steps_run_as("loaded") is True
    assert _steps_run_as("graphs") == "graphs"
    assert _steps_run_as("eager") is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("beam_size", [1, 5])
def test_cuda_graphs_give_the_eager_tokens(beam_size):
    from wtx.audio import fixed_windows, stream_samples
    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    windows = list(itertools.islice(fixed_windows(stream_samples(str(SAMPLE))), 3))
    options = EngineOptions(model="tiny.en", device="cuda", batch_size=4, strict=True, condition_on_previous_text=False,
                            decoding=DecodingOptions(beam_size=beam_size, best_of=beam_size))  # fmt: skip
    eager = Engine(replace(options, cuda_graph=False))
    graphs = Engine(options)
    assert eager.compile_report is None and graphs.compile_report.source == "graphs"
    for temperatures in (None, [0.0, 0.6, 1.0]):  # the greedy (or beam) and the sampling variants
        ours = graphs.decode_batch(windows, temperatures=temperatures)
        theirs = eager.decode_batch(windows, temperatures=temperatures)
        assert [r.tokens for r in ours] == [r.tokens for r in theirs]
        assert sum(len(r.tokens) for r in ours) > 50  # the last window is the sample's short tail


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_detectors_graph_gives_its_eager_scores():
    """Silero VAD on CUDA replays one captured group: the same frame scores as running it call by
    call, for a full group and a group of one window (padded to the group's shape), also while
    another thread replays decoder graphs."""
    import threading

    import numpy as np

    from wtx.audio import fixed_windows, stream_samples
    from wtx.engine import Engine, EngineOptions
    from wtx.vad import load_detector

    from wtx.audio import N_SAMPLES

    detector = load_detector("cuda")
    assert detector is not None and detector.graph is not None
    assert detector.static.shape == (detector.group * detector.parts, N_SAMPLES // detector.parts)  # what speech() gives it
    windows = list(fixed_windows(stream_samples(str(SAMPLE))))
    rows = np.stack([windows[i % len(windows)].samples for i in range(detector.group)])
    rows = rows.reshape(detector.group * detector.parts, -1)
    with torch.jit.optimized_execution(False):
        eager = detector._frames(torch.from_numpy(rows).cuda())
    assert torch.equal(detector.probabilities(rows), eager)
    assert 0 < int((eager > 0.5).sum()) < eager.numel()  # speech and pauses, not a constant
    engine = Engine(EngineOptions(model="tiny.en", device="cuda", batch_size=2, decoding=replace(
        EngineOptions().decoding, beam_size=1)))  # fmt: skip
    busy = threading.Thread(target=lambda: [engine.decode_batch(windows[:2]) for _ in range(3)])
    busy.start()
    decisions = [detector.speech(windows[:1]) for _ in range(5)]
    busy.join()
    assert decisions == [detector.speech(windows[:1])] * 5
