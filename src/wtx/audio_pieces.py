"""Decoding one long file on several processes at once (PyAV), sample for sample as one pass.

The file is cut at whole seconds into pieces, one per worker process. A worker demuxes from the
start (cheap), decodes from a little before its piece (so the decoder's state, such as MP3's bit
reservoir and overlap, is the same as in one pass), and keeps the samples from its piece's start.
Where the file needs resampling, the worker also starts its resampler a second early, at a
whole second from the first sample, so its output lands on the one-pass output grid.

Every seam is checked: a worker also decodes the first second of the next piece, which must
equal, sample for sample, what the next worker made of it. When a seam differs or a worker
fails, the caller decodes the file in one pass instead (and reports any error from there).

Only regular files of codecs checked this way (MP3, FLAC, PCM) are split, and only files short
enough to hold decoded in memory (MAX_SECONDS: 460 MB of samples); longer ones stream as before.
WTX_AUDIO_WORKERS sets the number of processes (default: half the CPUs, at most 8; 0 or 1: off).
"""

import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16000
MIN_PIECE_SECONDS = 120  # shorter pieces do not pay for a worker
MAX_SECONDS = 2 * 3600
CODECS = ("mp3", "mp3float", "flac")  # and every pcm_*: seams checked bit for bit on real files
PRIME_SECONDS = 1  # decoded and resampled before a piece, then dropped
DECODER_PRIME_SECONDS = 0.5  # packets decoded before the resampler starts, then dropped
CHECK_SECONDS = 1  # decoded past a piece's end, compared with the next piece's start


def piece_bounds(duration: float, workers: int) -> list[tuple[int, int | None]]:
    """Whole-second [first, last) bounds of the pieces; the last piece runs to the end (None)."""
    n = max(1, min(workers, int(duration // MIN_PIECE_SECONDS)))
    cuts = [round(i * duration / n) for i in range(n)]
    return [(cuts[i], cuts[i + 1] if i + 1 < n else None) for i in range(n)]


def decode_piece(source: str, first: int, last: int | None) -> np.ndarray:
    """16 kHz mono float32 samples from second `first` to `last` + CHECK_SECONDS (or the end).

    Seconds count from the first decoded sample, as in one pass over the file."""
    import av

    with av.open(source) as container:
        stream = container.streams.audio[0]
        native = _is_native(stream)
        origin = None  # pts of the first decoded sample, in samples at the stream's rate
        rate = stream.codec_context.sample_rate
        begin = max(0, first - (0 if native else PRIME_SECONDS))  # seconds fed to the output
        stop = None if last is None else last + CHECK_SECONDS
        resampler = None if native else av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        decoder = stream.codec_context
        out: list[np.ndarray] = []
        produced = 0  # output samples since `begin`
        for packet in container.demux(stream):
            if origin is None:
                origin = _first_sample(source, stream.index)
                if origin is None:
                    return np.zeros(0, dtype=np.float32)
            if not packet.size:
                continue  # the demuxer's end-of-stream packet: flushed below
            if packet.pts is not None:
                at = float(packet.pts * stream.time_base) - origin / rate
                if at < begin - DECODER_PRIME_SECONDS and begin > 0:
                    continue  # before the decoder's priming stretch: demuxed only
                if stop is not None and at > stop + DECODER_PRIME_SECONDS:
                    break
            for frame in decoder.decode(packet):
                frame = _from_sample(frame, origin, begin * rate, stream.time_base)
                if frame is None:
                    continue
                for piece in [frame] if native else resampler.resample(frame):
                    out.append(piece.to_ndarray().reshape(-1))
                    produced += out[-1].shape[0]
            if stop is not None and produced >= (stop - begin) * SAMPLE_RATE:
                break
        if last is None:
            for frame in decoder.decode(None):
                frame = _from_sample(frame, origin, begin * rate, stream.time_base)
                if frame is not None:
                    out.extend(p.to_ndarray().reshape(-1) for p in ([frame] if native else resampler.resample(frame)))
            if resampler is not None:
                out.extend(p.to_ndarray().reshape(-1) for p in resampler.resample(None))
    samples = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
    samples = samples[(first - begin) * SAMPLE_RATE :]
    return samples if stop is None else samples[: (stop - first) * SAMPLE_RATE]


def _is_native(stream) -> bool:
    ctx = stream.codec_context
    return ctx.format is not None and ctx.format.name in ("flt", "fltp") and ctx.layout.name == "mono" and ctx.sample_rate == SAMPLE_RATE


def _first_sample(source: str, index: int) -> int | None:
    """The pts of the file's first decoded sample, in samples at the stream's rate."""
    import av

    with av.open(source) as container:
        stream = container.streams.audio[index]
        for frame in container.decode(stream):
            return round(float(frame.pts * stream.time_base) * stream.codec_context.sample_rate)
    return None


def _from_sample(frame, origin: int, start: int, time_base):
    """`frame`, cut to begin at sample `start` (counted from `origin`); None if it ends before."""
    rate = frame.sample_rate
    at = round(float(frame.pts * time_base) * rate) - origin
    if at >= start:
        return frame
    skip = start - at
    if skip >= frame.samples:
        return None
    import av

    array = frame.to_ndarray()
    planar = frame.format.is_planar
    channels = len(frame.layout.channels)
    kept = array[:, skip:] if planar else array[:, skip * channels :]
    cut = av.AudioFrame.from_ndarray(np.ascontiguousarray(kept), format=frame.format.name, layout=frame.layout.name)
    cut.sample_rate = rate
    cut.pts = frame.pts + round(skip / rate / time_base)
    cut.time_base = time_base
    return cut


def join(pieces: list[np.ndarray], bounds: list[tuple[int, int | None]]) -> np.ndarray | None:
    """The pieces joined at their seams, or None when a seam's check samples differ."""
    check = CHECK_SECONDS * SAMPLE_RATE
    kept = []
    for (first, last), samples, following in zip(bounds, pieces, pieces[1:] + [None]):
        if last is None:
            kept.append(samples)
            continue
        length = (last - first) * SAMPLE_RATE
        if following is None or not np.array_equal(samples[length : length + check], following[:check]):
            return None
        kept.append(samples[:length])
    return np.concatenate(kept)


@dataclass(frozen=True)
class Plan:
    duration: float
    workers: int


def workers_wanted() -> int:
    chosen = os.environ.get("WTX_AUDIO_WORKERS", "").strip()
    if chosen:
        return int(chosen) if chosen.isdigit() else 1
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def plan(source: str) -> Plan | None:
    """How to split `source` across processes, or None to decode it in one pass."""
    workers = workers_wanted()
    if workers < 2:
        return None
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(source) as container:
            stream = container.streams.audio[0]
            codec = stream.codec_context.name
            duration = container.duration / 1e6 if container.duration else None
    except Exception:  # unreadable here: the one-pass decoder reports why
        return None
    if duration is None or not (2 * MIN_PIECE_SECONDS <= duration <= MAX_SECONDS):
        return None
    if codec not in CODECS and not codec.startswith("pcm_"):
        return None
    return Plan(duration, workers)


def decode_in_pieces(source: str, plan: Plan) -> np.ndarray | None:
    """The whole file decoded by `plan.workers` processes; None when it cannot be split exactly.

    Workers are `python -m wtx.audio_pieces` processes writing float32 samples to a pipe (no
    multiprocessing: it would import the caller's main module in every worker)."""
    bounds = piece_bounds(plan.duration, plan.workers)
    if len(bounds) < 2:
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "WTX_AUDIO_WORKERS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "wtx.audio_pieces", source, str(first), str(last)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                         start_new_session=True)  # Ctrl-C reaches the parent, which stops them
        for first, last in bounds
    ]  # fmt: skip
    outputs: list[bytes] = [b""] * len(procs)

    def read(i: int) -> None:
        outputs[i] = procs[i].stdout.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    try:
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        if any(proc.wait() != 0 for proc in procs):
            return None  # a broken file or worker: the one-pass decoder reports it
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return join([np.frombuffer(out, dtype=np.float32) for out in outputs], bounds)


def _main(argv: list[str]) -> int:
    source, first, last = argv
    samples = decode_piece(source, int(first), None if last == "None" else int(last))
    sys.stdout.buffer.write(samples.astype(np.float32, copy=False).tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
