import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SAMPLE = ROOT / "src" / "wtx" / "assets" / "sample.mp3"


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wtx-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(cache_root, monkeypatch):
    """Every test uses a private cache dir, never the user's ~/.cache/wtx."""
    monkeypatch.setenv("WTX_CACHE_DIR", str(cache_root))


def shared_file(relative: str) -> Path:
    """A file of ../shared. Where ../shared is absent (a clone on its own) the test skips; where
    it is there but lacks the file, the test skips too, except under CI=true, where it fails (a
    broken ../shared must not make the tests needing it go quietly missing)."""
    path = SHARED / relative
    if not path.is_file():
        if SHARED.is_dir() and os.environ.get("CI") == "true":
            pytest.fail(f"{path} is not available, though CI=true and {SHARED} is there")
        pytest.skip(f"{path} is not available")
    return path


def audio_file(relative: str) -> Path:
    """The bundled sample for "sample", else shared_file(relative): parity tests name both, so a
    clone without ../shared still runs them on the sample."""
    return SAMPLE if relative == "sample" else shared_file(relative)


def run_wtx(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "wtx", *args], input=stdin, capture_output=True, env=full_env, timeout=900
    )


def make_wav(path: Path, seconds: float, rate: int = 16000, channels: int = 1, freq: float = 440.0) -> Path:
    """A sine tone written with the standard library's wave module."""
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    frames = np.repeat(tone[:, None], channels, axis=1).tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return path


def tiny_engine_and_stock(batch_size: int, decoding=None):
    """The parity set-up: tiny.en on the CPU in fp32, fixed windows decoded without prompts or
    tails, and stock openai-whisper's model from the same checkpoint."""
    import torch

    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions
    from wtx.reference import load_stock_model
    from wtx.weights import load_checkpoint

    torch.set_num_threads(2)
    options = EngineOptions(model="tiny.en", device="cpu", dtype="fp32", quantize="none", batch_size=batch_size, seek_tails=False,
                            condition_on_previous_text=False, decoding=decoding or DecodingOptions())  # fmt: skip
    return Engine(options), load_stock_model(load_checkpoint("tiny.en"))
