"""Where windows are cut: every 30 s (`fixed`), or at the quietest pause near the end (`silence`).

Silence-aware cutting works on the streamed samples with a small look-ahead buffer: each window
ends at the quietest 20 ms frame (energy smoothed over 200 ms) in its last SEARCH seconds, so no
window ends inside a word. Windows stay at most 30 s, are padded to 30 s for batching, and carry
exact offsets. Long stretches of silence are skipped: a window starts at the next speech.
"""

from collections.abc import Iterator

import numpy as np

from wtx.audio import CHUNK_LENGTH, N_SAMPLES, SAMPLE_RATE, Window, fixed_windows, pad_window

SPLITS = ("silence", "fixed")
FRAME = SAMPLE_RATE // 50  # 20 ms
SEARCH = 10.0  # seconds at the end of a window searched for the cut
SMOOTH = 10  # frames (200 ms) of energy smoothing
SILENCE_DB = -45.0  # frames quieter than this (dBFS) count as silence
MIN_SKIP = 2.0  # seconds of silence at a window start before it is skipped
KEEP = 0.3  # seconds of silence kept before speech that follows a skipped stretch


def frame_energy_db(samples: np.ndarray) -> np.ndarray:
    """Mean-square energy per 20 ms frame, in dB relative to full scale."""
    n = len(samples) // FRAME
    frames = samples[: n * FRAME].reshape(n, FRAME).astype(np.float64)
    return 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)


def quietest_cut(samples: np.ndarray) -> int:
    """Sample index of the quietest point in the last SEARCH seconds of `samples` (<= 30 s long)."""
    n = len(samples) // FRAME
    first = max(0, n - int(SEARCH * 50))
    # only the searched frames and the SMOOTH before them count: the rest is never looked at
    start = max(0, first - SMOOTH)
    energy = frame_energy_db(samples[start * FRAME : n * FRAME])
    smooth = np.convolve(energy, np.ones(SMOOTH) / SMOOTH, mode="same")
    region = smooth[first - start :]
    # the latest frame among the quietest (within 1 dB), so windows stay long
    candidates = np.flatnonzero(region <= region.min() + 1.0)
    return (first + int(candidates[-1])) * FRAME + FRAME // 2


def speech_start(samples: np.ndarray) -> int | None:
    """Samples of leading silence to skip (0 unless it lasts MIN_SKIP s); None if all is silence."""
    head = int(MIN_SKIP * SAMPLE_RATE) // FRAME  # frames starting within MIN_SKIP s
    if (frame_energy_db(samples[: head * FRAME]) > SILENCE_DB).any():
        return 0  # most windows: speech right away, and the rest need not be measured
    loud = np.flatnonzero(frame_energy_db(samples[head * FRAME :]) > SILENCE_DB)
    if len(loud) == 0:
        return None
    return (head + int(loud[0])) * FRAME - int(KEEP * SAMPLE_RATE)


def silence_windows(blocks: Iterator[np.ndarray]) -> Iterator[Window]:
    """Cuts a sample stream into windows of at most 30 s that end in the quietest pause."""
    buffer = np.zeros(0, dtype=np.float32)
    offset = 0  # absolute sample index of buffer[0]
    index = 0
    exhausted = False
    blocks = iter(blocks)
    while True:
        while not exhausted and len(buffer) < N_SAMPLES + FRAME:
            block = next(blocks, None)
            if block is None:
                exhausted = True
            else:
                buffer = np.concatenate([buffer, block])
        if len(buffer) == 0:
            return
        skip = speech_start(buffer[:N_SAMPLES])
        if skip is None:  # the next 30 s hold no speech at all
            if exhausted and len(buffer) <= N_SAMPLES:
                return
            skip = min(len(buffer), N_SAMPLES) - int(KEEP * SAMPLE_RATE)
        if skip:
            buffer, offset = buffer[skip:], offset + skip
            continue
        if len(buffer) <= N_SAMPLES and exhausted:
            cut = len(buffer)
        else:
            cut = quietest_cut(buffer[:N_SAMPLES])
        yield Window(index, offset / SAMPLE_RATE, cut / SAMPLE_RATE, pad_window(buffer[:cut].copy()))
        index += 1
        buffer, offset = buffer[cut:], offset + cut


def has_sound(window: Window) -> bool:
    """Whether any 20 ms of the window's real audio is louder than silence."""
    samples = window.samples[: int(round(window.duration * SAMPLE_RATE))]
    return len(samples) >= FRAME and bool((frame_energy_db(samples) > SILENCE_DB).any())


def make_windows(blocks: Iterator[np.ndarray], split: str) -> Iterator[Window]:
    """The recording's windows. Silence is never decoded, whatever the split: `silence` skips
    it while cutting, and `fixed` drops windows without a sound (each keeps its index and offset)."""
    if split == "fixed":
        return (w for w in fixed_windows(blocks) if has_sound(w))
    if split == "silence":
        return silence_windows(blocks)
    raise ValueError(f"unknown split {split!r}: choose {' or '.join(SPLITS)}")


__all__ = ["CHUNK_LENGTH", "SPLITS", "make_windows", "silence_windows", "quietest_cut"]
