"""Decoding audio with FFmpeg and cutting it into 30-second windows that carry their offsets.

Audio is streamed from ffmpeg window by window (never decoded whole), as 16 kHz mono float32.
The binary is the system's `ffmpeg`, else the one imageio-ffmpeg ships; where neither exists,
FFmpeg's libraries are used through PyAV if it is installed.
"""

import os
import re
import select
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from itertools import chain

import numpy as np

from wtx.errors import AudioError, FFmpegMissing
from wtx.names import display

SAMPLE_RATE = 16000
CHUNK_LENGTH = 30  # seconds per window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a window
HOP_LENGTH = 160
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window

STDIN = "-"
# a peak past which samples are scaled down: only float files reach it (decoded integer or lossy
# audio stays within a little of full scale, 1.0, resampled or not)
LOUDEST = 8.0


@dataclass(frozen=True)
class Window:
    """One 30-second slice of a recording; `samples` is padded with silence to N_SAMPLES."""

    index: int
    offset: float  # seconds from the start of the recording
    duration: float  # seconds of real audio in the window (<= 30)
    samples: np.ndarray  # float32 [N_SAMPLES]


def ffmpeg_binary() -> str | None:
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        return None


PROTOCOLS = "file,pipe"  # all ffmpeg may open: never a URL, whatever a name or a playlist says
# the demuxers an input may be read with: audio and video files, which open nothing but themselves;
# never a playlist or a list of files (hls, dash, concat, imf...), which would read other local files
_DEMUXERS = (
    "aa", "aac", "aax", "ac3", "ac4", "adp", "adx", "aiff", "amr", "amrnb", "amrwb", "ape", "aptx", "asf",
    "ast", "au", "avi", "bfstm", "brstm", "caf", "codec2", "daud", "dfpwm", "dsf", "dss", "dts", "dtshd",
    "dv", "eac3", "epaf", "flac", "flv", "g722", "g723_1", "g726", "g726le", "g729", "gsm", "gxf", "hca",
    "iff", "ilbc", "ircam", "live_flv", "loas", "lxf", "matroska", "mlp", "mmf", "mov", "mp3", "mpc",
    "mpc8", "mpeg", "mpegts", "mxf", "nistsphere", "nut", "nuv", "ogg", "oma", "pva", "qcp", "rm", "rso",
    "sbc", "shn", "sln", "smjpeg", "sol", "sox", "spdif", "tak", "truehd", "tta", "voc", "vqf", "w64",
    "wav", "wsaud", "wtv", "wv", "wve", "xa", "xwma",
)  # fmt: skip
DEMUXERS = ",".join(_DEMUXERS)
# what reads other files, told by its first bytes (to name what was refused)
_LISTS = {b"#EXTM3U": "hls", b"ffconcat version": "concat"}


def _display(source: str) -> str:
    return "<stdin>" if source == STDIN else display(source)


def is_pipe(source: str) -> bool:
    """stdin, or a FIFO or character device such as bash's <(...): read once, in order."""
    if source == STDIN:
        return True
    try:
        mode = os.stat(source).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _is_fifo(source: str) -> bool:
    """A named pipe (or bash's /dev/fd/N), which a reader opens before its writer may have."""
    if source == STDIN:
        return False
    try:
        return stat.S_ISFIFO(os.stat(source).st_mode)
    except OSError:
        return False


_fifos: dict[str, int] = {}  # FIFO -> our read end, opened without waiting for a writer
_fifos_lock = threading.Lock()


def _fifo_end(source: str) -> int:
    """Our read end of the FIFO `source`, opened at once (a plain open waits for a writer, which may
    never come) and kept until it is read: closed, it would leave a writer with no reader."""
    with _fifos_lock:
        if source not in _fifos:
            _fifos[source] = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return _fifos[source]


def _fifo_waits(fd: int, timeout_ms: int | None) -> bool:
    """Whether a FIFO still has nothing to read after `timeout_ms` (None: until it has): no
    writer yet, or one that wrote nothing yet. A writer that came and went counts as something."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return not poller.poll(timeout_ms)


def is_ready(source: str) -> bool:
    """Whether reading `source` would start without waiting: False only for a FIFO whose writer has
    written nothing yet (wtx.streams reads such inputs after the others)."""
    if not _is_fifo(source):
        return True
    try:
        return not _fifo_waits(_fifo_end(source), 0)
    except OSError:
        return True  # reading it reports the error


def _open_fifo(source: str):
    """The FIFO `source` as a file, once its writer has written (or come and gone)."""
    fd = _fifo_end(source)
    _fifo_waits(fd, None)
    with _fifos_lock:
        del _fifos[source]
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _open_pipe(source: str):
    """A pipe's bytes as a file: stdin, a FIFO (see _open_fifo) or a character device."""
    if source == STDIN:
        return sys.stdin.buffer
    return _open_fifo(source) if _is_fifo(source) else open(source, "rb")


def is_readable_input(source: str) -> bool:
    """A regular file, or a pipe (see is_pipe)."""
    return source == STDIN or os.path.isfile(source) or is_pipe(source)


def ffmpeg_url(source: str) -> str:
    """What ffmpeg is given for `source`: the local file itself, never a name read as a URL
    (`http://...` names a file in a folder called `http:` here)."""
    return "pipe:0" if is_pipe(source) else "file:" + os.path.abspath(source)


def probe_duration(source: str) -> float | None:
    """Duration in seconds from the container header, or None where unknown (pipes, no header)."""
    if is_pipe(source):
        return None
    binary = ffmpeg_binary()
    if binary is None:
        return _pyav_duration(source)
    result = subprocess.run(
        [binary, "-hide_banner", "-nostdin", "-protocol_whitelist", PROTOCOLS, "-format_whitelist", DEMUXERS,
         "-i", ffmpeg_url(source)],
        capture_output=True, text=True, errors="replace",
    )  # fmt: skip
    match = re.search(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)", result.stderr)
    if not match:
        return None
    h, m, s = match.groups()
    return int(h) * 3600 + int(m) * 60 + float(s)


def _refused(source: str, stderr: str = "") -> str:
    """The error line for an input in a format not in DEMUXERS: what it is, where that is known."""
    named = re.search(r"\[(\w+) @ 0x[0-9a-f]+\] (\[error\] )?Format not on whitelist", stderr)
    kind = named.group(1) if named else None  # newer ffmpegs name none there
    if kind is None and not is_pipe(source):
        with suppress(OSError), open(source, "rb") as f:
            head = f.read(64).lstrip()
            kind = next((k for magic, k in _LISTS.items() if head.startswith(magic)), None)
    what = f"a playlist ({kind}) that would read other files" if kind else (
        "not in a format wtx reads: a playlist or a list of files, which would read other files")
    return f"{_display(source)}: {what}; wtx reads only media files"


def _refuses(stderr: str) -> bool:
    """Whether ffmpeg stopped at an input's format, one not in DEMUXERS."""
    return "Format not on whitelist" in stderr


def _pyav_duration(source: str) -> float | None:
    try:
        import av

        with av.open(ffmpeg_url(source), options=_PYAV_OPTIONS) as container:
            return container.duration / 1e6 if container.duration else None
    except Exception:
        return None


def _ffmpeg_reason(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else "ffmpeg failed without a message"


_TAG = re.compile(r"^(\[[^\]]* @ 0x[0-9a-f]+\] )?\[(\w+)\] ?")  # -loglevel level+info's prefixes
_LOUD = ("error", "fatal", "panic")


def _ffmpeg_errors(stderr: bytes) -> bytes:
    """What ffmpeg said at -loglevel error, out of what it said at level+info."""
    kept = []
    for line in stderr.decode("utf-8", "replace").splitlines():
        tag = _TAG.match(line)
        if tag is not None and tag.group(2) in _LOUD:
            kept.append((tag.group(1) or "") + line[tag.end() :])
    return "\n".join(kept).encode()


def _tracks_note(source: str, stderr: str) -> str | None:
    """Which of several audio tracks ffmpeg read (from its info lines), or None for one track."""
    listing = stderr.split("[info] Stream mapping:", 1)
    line = r"^\[info\]   Stream #0:(\d+)\S*: Audio: .*?( \(default\))?$"
    tracks = re.findall(line, listing[0], re.MULTILINE)
    used = re.search(r"^\[info\]   Stream #0:(\d+) -> #0:0", listing[-1], re.MULTILINE)
    if len(tracks) < 2 or used is None:
        return None
    numbers = [int(n) for n, _ in tracks]
    track = numbers.index(int(used.group(1))) + 1 if int(used.group(1)) in numbers else None
    if track is None:
        return None
    return _tracks_line(source, len(tracks), track, bool(tracks[track - 1][1]))


def _tracks_line(source: str, count: int, track: int, default: bool) -> str:
    name, flag = _display(source), " (the default)" if default else ""
    return (f"{name}: has {count} audio tracks, transcribed track {track}{flag} alone; for track "
            f"N, extract it: ffmpeg -i {shlex.quote(name)} -map 0:a:N-1 -c:a copy track.mka")


class _Unmixed(AudioError):
    """Channels with no layout, which ffmpeg cannot mix to mono by itself."""

    def __init__(self, source: str, channels: int):
        super().__init__(f"{_display(source)}: {channels} channels with no layout, which wtx mixes "
                         f"to mono only from a file, not a pipe; save it to a file first")
        self.channels = channels


def _mixed(channels: int) -> str:
    """An ffmpeg filter that averages `channels` channels into one (pan's '<': gains sum to 1)."""
    return "pan=mono|c0<" + "+".join(f"c{i}" for i in range(channels))


def _ffmpeg_read(binary: str, source: str, block: int, warnings: list[str]) -> Iterator[np.ndarray]:
    """_ffmpeg_stream, once more with the channels averaged where ffmpeg could not mix them."""
    try:
        yield from _ffmpeg_stream(binary, source, block, warnings)
    except _Unmixed as e:
        if is_pipe(source):
            raise
        yield from _ffmpeg_stream(binary, source, block, warnings, _mixed(e.channels))


def _ffmpeg_stream(binary: str, source: str, block: int, warnings: list[str],
                   mix: str | None = None) -> Iterator[np.ndarray]:  # fmt: skip
    """Yields float32 blocks of `block` samples (the last one shorter) from an ffmpeg pipe.
    What ffmpeg reported about a file it could still decode goes into `warnings`, and which track
    it read of several. `mix`: a filter that makes the channels one. Raises _Unmixed, having
    yielded nothing, where ffmpeg cannot mix the channels by itself."""
    cmd = [
        binary, "-nostdin", "-hide_banner", "-loglevel", "level+info", "-nostats", "-threads", "0",
        "-protocol_whitelist", PROTOCOLS, "-format_whitelist", DEMUXERS, "-i", ffmpeg_url(source),
        "-vn", *(["-af", mix] if mix else []),
        "-f", "f32le", "-ac", "1", "-acodec", "pcm_f32le", "-ar", str(SAMPLE_RATE), "-",
    ]  # fmt: skip
    piped = is_pipe(source)
    if piped:
        cmd.remove("-nostdin")
    # a pipe is handed over as ffmpeg's stdin: a child does not inherit bash's /dev/fd/N
    stdin = _open_pipe(source) if piped else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        if piped and source != STDIN:
            stdin.close()
    stderr_chunks: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    drain.start()
    try:
        nbytes, yielded = block * 4, False
        while True:
            buf = bytearray(nbytes)  # writable, so the samples can become tensors without a copy
            view, got = memoryview(buf), 0
            while got < nbytes and (n := proc.stdout.readinto(view[got:])):
                got += n
            if got == 0:
                break
            yield np.frombuffer(buf, dtype=np.float32, count=got // 4)
            yielded = True
        proc.wait()
        drain.join()
        said = b"".join(stderr_chunks).decode("utf-8", "replace")
        messages = _ffmpeg_errors(said.encode())
        reason = _ffmpeg_reason(messages)
        if proc.returncode != 0 and _refuses(said):
            raise AudioError(_refused(source, said))
        unmixed = re.search(r"Rematrix is needed between (\d+) channels and mono", said)
        if proc.returncode != 0 and unmixed and mix is None and not yielded:
            raise _Unmixed(source, int(unmixed.group(1)))
        if note := _tracks_note(source, said):
            warnings.append(note)
        if proc.returncode != 0:
            raise AudioError(f"{_display(source)}: ffmpeg cannot decode it: {reason}")
        if messages.strip():
            warnings.append(f"{_display(source)}: ffmpeg reported decoding errors: {reason}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # not left to the collector: a folder of clips runs many ffmpegs
        drain.join(timeout=1.0)  # ffmpeg has ended: its stderr is at its end
        if not drain.is_alive():
            proc.stderr.close()


_PYAV_OPTIONS = {"protocol_whitelist": PROTOCOLS, "format_whitelist": DEMUXERS}


def _pyav_open(source: str):
    """PyAV's container for `source`, read only as a media file (DEMUXERS) that opens no other."""
    import av

    fifo = is_pipe(source) and source != STDIN
    file = _open_pipe(source) if is_pipe(source) else None
    try:
        return av.open(ffmpeg_url(source) if file is None else file, options=_PYAV_OPTIONS)
    except BaseException as e:
        if fifo:
            file.close()
        if isinstance(e, av.error.ArgumentError):  # what an input in a format not in DEMUXERS gets
            raise AudioError(_refused(source)) from e
        raise


def _pyav_track(source: str, tracks, warnings: list[str]):
    """The audio track the ffmpeg binary reads: a default one, the one of most channels among
    them, the first of those; of several, a note in `warnings` says which."""
    import av

    default = av.stream.Disposition.default
    # max: the first of ties
    stream = max(tracks, key=lambda s: (bool(s.disposition & default), s.channels))
    if len(tracks) > 1:
        track = list(tracks).index(stream) + 1
        is_default = bool(stream.disposition & default)
        warnings.append(_tracks_line(source, len(tracks), track, is_default))
    return stream


def _averaged(frame):
    """A frame's channels averaged into one, as 32-bit floats (as ffmpeg's pan filter mixes)."""
    import av

    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:  # interleaved: one row of samples * channels
        samples = samples.reshape(-1, channels).T
    if samples.dtype.kind == "u":
        samples = (samples.astype(np.float32) - 128) / 128
    elif samples.dtype.kind == "i":
        samples = samples.astype(np.float32) / np.float32(2 ** (8 * samples.dtype.itemsize - 1))
    mean = samples.mean(axis=0, dtype=np.float32)[None, :]
    mono = av.AudioFrame.from_ndarray(mean, format="flt", layout="mono")
    mono.sample_rate = frame.sample_rate
    return mono


def _pyav_stream(source: str, block: int, warnings: list[str]) -> Iterator[np.ndarray]:
    """The same stream through PyAV, for machines without an ffmpeg binary."""
    try:
        import av
    except ImportError as e:
        raise FFmpegMissing(
            "no ffmpeg found: install it (apt-get install ffmpeg) or pip install imageio-ffmpeg"
        ) from e
    try:
        container = _pyav_open(source)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        # samples not yet emitted, as bytes: a frame's plane is copied straight in, which costs
        # less than a to_ndarray() per frame (an MP3 frame at 16 kHz holds only 576 samples)
        pending = bytearray()
        nbytes = block * 4
        with container:
            stream = _pyav_track(source, container.streams.audio, warnings)
            stream.thread_type = "AUTO"
            frames = container.decode(stream)
            native = (
                stream.codec_context.format is not None
                and stream.codec_context.format.name in ("flt", "fltp")
                and stream.codec_context.layout.name == "mono"
                and stream.rate == SAMPLE_RATE
            )
            # channels with no layout past the 8 ffmpeg guesses one for, or that the resampler
            # cannot mix: averaged here (as the binary's reader does, _mixed)
            layout = stream.codec_context.layout
            mixing = len(layout.channels) > 8 and all(c.name == "NONE" for c in layout.channels)
            for frame in frames if native else chain(frames, [None]):  # None flushes the resampler
                try:
                    mixed = _averaged(frame) if mixing and frame is not None else frame
                    outs = [frame] if native else resampler.resample(mixed)
                except (av.error.ArgumentError, ValueError):
                    if mixing or pending or frame is None:
                        raise
                    mixing = True
                    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
                    outs = resampler.resample(_averaged(frame))
                for out in outs:
                    pending += memoryview(out.planes[0])[: out.samples * 4]  # mono float32: one plane
                while len(pending) >= nbytes:
                    yield np.frombuffer(pending[:nbytes], dtype=np.float32)  # a copy: writable
                    del pending[:nbytes]
        if pending:
            yield np.frombuffer(pending, dtype=np.float32)
    except (av.FFmpegError, IndexError) as e:
        reason = "no audio stream" if isinstance(e, IndexError) else str(e)
        raise AudioError(f"{_display(source)}: cannot decode it: {reason}") from e


def stream_samples(source: str, block: int = N_SAMPLES, warnings: list[str] | None = None) -> Iterator[np.ndarray]:
    """16 kHz mono float32 samples of `source` (a path, a pipe or '-'), in blocks of `block`
    samples. Problems in a file that still decoded are appended to `warnings`."""
    if not is_readable_input(source):
        raise AudioError(f"{_display(source)}: no such file")
    warnings = [] if warnings is None else warnings
    binary = ffmpeg_binary()
    if binary is not None:
        return _sanitised(_ffmpeg_read(binary, source, block, warnings), source, warnings)
    return _sanitised(_pyav_stream(source, block, warnings), source, warnings)


def _sanitised(blocks: Iterator[np.ndarray], source: str, warnings: list[str]) -> Iterator[np.ndarray]:
    """The blocks with samples that are not numbers (NaN, infinity) as silence, and a recording
    louder than LOUDEST scaled down to full scale from its first such block on (both only a float
    file's); each noted once in `warnings`, naming the file. Other samples pass unchanged."""
    nonfinite, peak = 0, 0.0
    for samples in blocks:
        finite = np.isfinite(samples)
        if not finite.all():
            nonfinite += samples.size - int(np.count_nonzero(finite))
            samples[~finite] = 0.0
        top = max(float(samples.max(initial=0.0)), -float(samples.min(initial=0.0)))
        if top > LOUDEST or peak:
            peak = max(peak, top)
            samples /= np.float32(peak)
        yield samples
    if nonfinite:
        warnings.append(f"{_display(source)}: {nonfinite} samples were not numbers (NaN or infinity); "
                        "read them as silence")
    if peak:
        warnings.append(f"{_display(source)}: samples far beyond full scale (peak {peak:.3g}); "
                        "scaled them down to full scale")


def load_audio(source: str) -> np.ndarray:
    """The whole recording as one array (for tests and short clips)."""
    blocks = list(stream_samples(source))
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


def pad_window(samples: np.ndarray) -> np.ndarray:
    if len(samples) == N_SAMPLES:
        return samples
    out = np.zeros(N_SAMPLES, dtype=np.float32)
    out[: len(samples)] = samples
    return out


def fixed_windows(blocks: Iterator[np.ndarray]) -> Iterator[Window]:
    """Cuts a sample stream into consecutive 30-second windows, the last one padded."""
    index = 0
    for samples in blocks:
        if len(samples) == 0:
            continue
        yield Window(
            index=index,
            offset=index * CHUNK_LENGTH,
            duration=len(samples) / SAMPLE_RATE,
            samples=pad_window(samples),
        )
        index += 1
