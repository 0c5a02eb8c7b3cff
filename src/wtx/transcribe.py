"""The transcribe command's job: inputs -> windows -> engine -> writers, with progress.

Part of the CLI layer: it reports on stderr and writes data to stdout or files. Each input
either completes (all its files written atomically) or fails with a one-line error naming
it; the other inputs still run. Returns the exit code.
"""

import math
import sys
import time
from pathlib import Path

from wtx.audio import CHUNK_LENGTH, SAMPLE_RATE, STDIN, probe_duration, stream_samples
from wtx.errors import WtxError
from wtx.split import make_windows
from wtx.progress import TranscribeProgress, format_duration, stderr
from wtx.writers import Transcript, output_paths, write_outputs


def _error(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


def run_transcribe(
    files: list[str], *, model: str, out: Path | None, to_stdout: bool, formats: list[str],
    language: str | None, task: str, batch_size: int, device: str | None, dtype: str | None,
    threads: int | None, quiet: bool, compile: bool = False, strict: bool = False,
    compare_eager: bool = False, split: str = "silence",
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

    stock = None
    if compare_eager:
        from wtx.reference import load_stock_model
        from wtx.weights import load_checkpoint

        stock = load_stock_model(load_checkpoint(model), engine.device)
    known = [d for d in durations.values() if d is not None]
    total = sum(known) if len(known) == len(files) else None
    failed: list[str] = []
    audio_done = 0.0
    eager_seconds = 0.0
    work_started = time.perf_counter()
    with TranscribeProgress(total, len(files), quiet) as progress:
        for source in files:
            name = "<stdin>" if source == STDIN else source
            baseline_rtfx = None
            try:
                if stock is not None:
                    progress.start_file(f"{Path(name).name} (eager baseline)", durations[source])
                    seconds, audio = _eager_baseline(engine, stock, source, progress, split)
                    progress.finish_file()
                    eager_seconds += seconds
                    baseline_rtfx = audio / seconds if seconds > 0 else None
                    work_started += seconds  # the summary times wtx alone
                progress.start_file(Path(name).name, durations[source], baseline_rtfx)
                transcript = _transcribe_one(engine, source, progress, to_stdout, split)
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
        if stock is not None and eager_seconds > 0 and elapsed > 0:
            stderr.print(
                f"eager openai-whisper baseline: {eager_seconds:.1f} s on the same windows; "
                f"wtx speedup {eager_seconds / elapsed:.2f}x",
                highlight=False,
            )
    if failed:
        _error(f"{len(failed)} of {len(files)} inputs failed: {', '.join(failed)}")
        return 1
    return 0


def _transcribe_one(engine, source: str, progress: TranscribeProgress, to_stdout: bool, split: str) -> Transcript:
    segments = []
    duration = 0.0
    language = engine.options.decoding.language or "en"
    blocks = counted(stream_samples(source))
    for result in engine.transcribe_windows(make_windows(blocks, split)):
        end = result.window.offset + result.window.duration
        progress.advance(end - duration)  # skipped silence counts as done
        duration = end
        language = result.language
        segments.extend(result.segments)
        if to_stdout:
            for segment in result.segments:
                sys.stdout.write(segment.text + "\n")
            sys.stdout.flush()
    progress.advance(blocks.seconds - duration)  # trailing silence
    return Transcript(source=source, duration=blocks.seconds, language=language, segments=segments)


class counted:
    """Passes sample blocks through, counting the seconds of audio seen."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.seconds = 0.0

    def __iter__(self):
        for block in self.blocks:
            self.seconds += len(block) / SAMPLE_RATE
            yield block


def _eager_baseline(engine, stock, source: str, progress: TranscribeProgress, split: str) -> tuple[float, float]:
    """Stock openai-whisper `decode()` on the same windows and batch size: (seconds, audio seconds).

    The audio is decoded here as well, so both passes are timed the same way."""
    import torch

    from wtx.engine import batched
    from wtx.reference import stock_decode

    fp16 = engine.dtype == torch.float16
    started = time.perf_counter()
    audio = 0.0
    for batch in batched(make_windows(stream_samples(source), split), engine.options.batch_size):
        stock_decode(stock, batch, len(batch), fp16=fp16, language=engine.options.decoding.language or "en")
        seconds = sum(w.duration for w in batch)
        audio += seconds
        progress.advance(seconds, len(batch))
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - started, audio
