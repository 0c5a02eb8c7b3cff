"""The transcribe command's job: inputs -> windows -> engine -> writers, with progress.

Part of the CLI layer: it reports on stderr and writes data to stdout or files. Each input
either completes (all its files written atomically) or fails with a one-line error naming
it; the other inputs still run. Returns the exit code.
"""

import math
import sys
import time
from pathlib import Path

from wtx.audio import CHUNK_LENGTH, STDIN, fixed_windows, probe_duration, stream_samples
from wtx.errors import WtxError
from wtx.progress import TranscribeProgress, format_duration, stderr
from wtx.writers import Transcript, output_paths, write_outputs


def _error(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


def run_transcribe(
    files: list[str], *, model: str, out: Path | None, to_stdout: bool, formats: list[str],
    language: str | None, task: str, batch_size: int, device: str | None, dtype: str | None,
    threads: int | None, quiet: bool, compile: bool = False, strict: bool = False,
) -> int:  # fmt: skip
    import torch

    from wtx.decode import DecodingOptions
    from wtx.engine import CompileError, Engine, EngineOptions

    if threads:
        torch.set_num_threads(threads)
    durations = {f: probe_duration(f) for f in files}
    if all(d is not None for d in durations.values()):
        # a batch larger than the longest input's window count would only decode padding
        longest = max(math.ceil(d / CHUNK_LENGTH) for d in durations.values())
        batch_size = max(1, min(batch_size, longest))
    options = EngineOptions(
        model=model, device=device, dtype=dtype, batch_size=batch_size,
        decoding=DecodingOptions(task=task, language=language), compile=compile, strict=strict,
    )  # fmt: skip
    started = time.perf_counter()
    try:
        engine = Engine(options)
    except (WtxError, ValueError, CompileError) as e:
        _error(str(e))
        return 1
    report = engine.compile_report
    for warning in report.warnings if report else []:
        stderr.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if not quiet:
        how = {"compiled": "compiled in", "loaded": "loaded compiled artifacts in", "eager": "running eager after"}
        status = f", {how[report.source]} {report.seconds:.1f} s" if report else ", eager"
        stderr.print(
            f"model {model} on {engine.device} ({str(engine.dtype).removeprefix('torch.')}), "
            f"batch {batch_size}{status}; ready in {time.perf_counter() - started:.1f} s",
            highlight=False,
        )

    known = [d for d in durations.values() if d is not None]
    total = sum(known) if len(known) == len(files) else None
    failed: list[str] = []
    audio_done = 0.0
    work_started = time.perf_counter()
    with TranscribeProgress(total, len(files), quiet) as progress:
        for source in files:
            name = "<stdin>" if source == STDIN else source
            progress.start_file(Path(name).name, durations[source])
            try:
                transcript = _transcribe_one(engine, source, progress, to_stdout)
            except WtxError as e:
                progress.finish_file()
                progress.log(f"failed: {name}")
                _error(str(e))
                failed.append(name)
                continue
            except OSError as e:
                progress.finish_file()
                _error(f"{name}: {e}")
                failed.append(name)
                continue
            audio_done += transcript.duration
            progress.finish_file()
            if not to_stdout:
                try:
                    written = write_outputs(transcript, output_paths(source, formats, out))
                except OSError as e:
                    _error(f"{name}: cannot write outputs: {e}")
                    failed.append(name)
                    continue
                progress.log(f"wrote {', '.join(str(p) for p in written)}")

    elapsed = time.perf_counter() - work_started
    if not quiet:
        speed = audio_done / elapsed if elapsed > 0 else 0.0
        stderr.print(
            f"transcribed {len(files) - len(failed)}/{len(files)} files, "
            f"{format_duration(audio_done)} of audio in {elapsed:.1f} s "
            f"({speed:.1f}x real time)",
            highlight=False,
        )
    if failed:
        _error(f"{len(failed)} of {len(files)} inputs failed: {', '.join(failed)}")
        return 1
    return 0


def _transcribe_one(engine, source: str, progress: TranscribeProgress, to_stdout: bool) -> Transcript:
    segments = []
    duration = 0.0
    language = engine.options.decoding.language or "en"
    for result in engine.transcribe_windows(fixed_windows(stream_samples(source))):
        duration = result.window.offset + result.window.duration
        language = result.language
        segments.extend(result.segments)
        progress.advance(result.window.duration)
        if to_stdout:
            for segment in result.segments:
                sys.stdout.write(segment.text + "\n")
            sys.stdout.flush()
    return Transcript(source=source, duration=duration, language=language, segments=segments)
