"""The transcribe command's job: inputs -> windows -> engine -> writers, with progress.

Part of the CLI layer: it reports on stderr and writes data to stdout or files. Each input
either completes (all its files written atomically) or fails with a one-line error naming
it; the other inputs still run. Finished windows are journaled next to the outputs, so an
interrupted run resumes where it stopped. Returns the exit code.
"""

import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from wtx.audio import CHUNK_LENGTH, SAMPLE_RATE, STDIN, probe_duration, stream_samples
from wtx.errors import WtxError
from wtx.journal import Entry, Journal, journal_path, source_identity
from wtx.progress import TranscribeProgress, format_duration, stderr
from wtx.split import make_windows
from wtx.writers import TimedText, Transcript, output_paths, write_outputs

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Job:
    model: str = "tiny.en"
    out: Path | None = None  # None: next to each input
    to_stdout: bool = False
    formats: tuple[str, ...] = ("txt", "srt")
    language: str | None = None
    task: str = "transcribe"
    batch_size: int = 8
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    quiet: bool = False
    compile: bool = False
    strict: bool = False
    compare_eager: bool = False
    split: str = "silence"
    condition: bool = True  # prompt each window with the previous window's text
    skip_existing: bool = False
    resume: bool = True


def _error(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)


def _warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def _unwritable(folder: Path) -> str | None:
    """Why outputs cannot be written into `folder`, or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"{folder}: cannot write outputs there ({e.strerror or e})"
    return None


def run_transcribe(inputs: list[str], problems: list[str], job: Job) -> int:
    import torch

    from wtx.decode import DecodingOptions
    from wtx.engine import CompileError, Engine, EngineOptions

    for problem in problems:
        _error(problem)
    failed: list[str] = [p.split(":")[0] for p in problems]
    if job.out is not None and not job.to_stdout and (reason := _unwritable(job.out)):
        _error(reason)
        return 1
    skipped = []
    if job.skip_existing and not job.to_stdout:
        pending = []
        for source in inputs:
            paths = output_paths(source, job.formats, job.out)
            (skipped if source != STDIN and all(p.is_file() for p in paths.values()) else pending).append(source)
        inputs = pending
        for source in skipped:
            stderr.print(f"skipped {source}: its outputs already exist", highlight=False)
    if not inputs:
        if failed:
            _error(f"{len(failed)} input(s) failed")
            return 1
        return 0

    if job.threads:
        torch.set_num_threads(job.threads)
    durations = {f: probe_duration(f) for f in inputs}
    batch_size = job.batch_size
    if all(d is not None for d in durations.values()):
        # a batch larger than the longest input's window count would only decode padding
        longest = max(math.ceil(d / CHUNK_LENGTH) for d in durations.values())
        batch_size = max(1, min(batch_size, longest))
    options = EngineOptions(
        model=job.model, device=job.device, dtype=job.dtype, batch_size=batch_size,
        decoding=DecodingOptions(task=job.task, language=job.language), compile=job.compile,
        strict=job.strict, condition_on_previous_text=job.condition,
    )  # fmt: skip
    started = time.perf_counter()
    try:
        engine = Engine(options)
    except (WtxError, ValueError, CompileError) as e:
        _error(str(e))
        return 1
    report = engine.compile_report
    for warning in report.warnings if report else []:
        _warn(warning)
    if not job.quiet:
        how = {"compiled": "compiled in", "loaded": "loaded compiled artifacts in", "eager": "running eager after"}
        status = f", {how[report.source]} {report.seconds:.1f} s" if report else ", eager"
        stderr.print(
            f"model {job.model} on {engine.device} ({str(engine.dtype).removeprefix('torch.')}), "
            f"batch {batch_size}{status}; ready in {time.perf_counter() - started:.1f} s",
            highlight=False,
        )
    stock = None
    if job.compare_eager:
        from wtx.reference import load_stock_model
        from wtx.weights import load_checkpoint

        stock = load_stock_model(load_checkpoint(job.model), engine.device)
    config = {"model": job.model, "split": job.split, "condition": job.condition, "batch_size": batch_size, "task": job.task, "language": job.language,
              "dtype": str(engine.dtype), "device": engine.device.type}  # fmt: skip

    known = [d for d in durations.values() if d is not None]
    total = sum(known) if len(known) == len(inputs) else None
    audio_done = 0.0
    eager_seconds = 0.0
    work_started = time.perf_counter()
    current = None
    journal = None
    with TranscribeProgress(total, len(inputs), job.quiet) as progress:
        try:
            for source in inputs:
                current = name = "<stdin>" if source == STDIN else source
                paths = None if job.to_stdout else output_paths(source, job.formats, job.out)
                try:
                    if paths and (reason := _unwritable(next(iter(paths.values())).parent)):
                        raise WtxError(reason)
                    journal = None
                    if paths and job.resume and source != STDIN:
                        journal = Journal(journal_path(next(iter(paths.values()))), source_identity(source, config))
                        if journal.entries:
                            progress.log(f"resuming {name}: {len(journal.entries)} windows already done")
                    baseline_rtfx = None
                    if stock is not None:
                        progress.start_file(f"{Path(name).name} (eager baseline)", durations[source])
                        seconds, audio = _eager_baseline(engine, stock, source, progress, job.split)
                        progress.finish_file()
                        eager_seconds += seconds
                        baseline_rtfx = audio / seconds if seconds > 0 else None
                        work_started += seconds  # the summary times wtx alone
                    progress.start_file(Path(name).name, durations[source], baseline_rtfx)
                    transcript = _transcribe_one(engine, source, durations.get(source), progress, job, journal)
                    progress.finish_file()
                    if paths:
                        written = write_outputs(transcript, paths)
                        progress.log(f"wrote {', '.join(str(p) for p in written)}")
                    if journal:
                        journal.close(remove=True)
                        journal = None
                    audio_done += transcript.duration
                except (WtxError, OSError) as e:
                    progress.finish_file()
                    if journal:
                        journal.close(remove=not journal.entries)  # nothing to resume: leave no trace
                        journal = None
                    message = str(e) if isinstance(e, WtxError) else f"{name}: {e}"
                    _error(message)
                    failed.append(name)
        except KeyboardInterrupt:
            progress.progress.stop()
            saved = len(journal.entries) if journal else 0
            if journal:
                journal.close()
            hint = f"{saved} finished windows of {current} are saved; " if journal else ""
            _error(f"interrupted: {hint}run the same command again to resume "
                   f"(finished inputs are kept{'; add --skip-existing to skip them' if not job.skip_existing else ''})")
            return EXIT_INTERRUPTED

    elapsed = time.perf_counter() - work_started
    n_total = len(inputs) + len(problems)
    if not job.quiet:
        speed = audio_done / elapsed if elapsed > 0 else 0.0
        stderr.print(
            f"transcribed {len(inputs) - (len(failed) - len(problems))}/{n_total} inputs"
            f"{f' ({len(skipped)} skipped)' if skipped else ''}, "
            f"{format_duration(audio_done)} of audio in {elapsed:.1f} s ({speed:.1f}x real time)",
            highlight=False,
        )
        if stock is not None and eager_seconds > 0 and elapsed > 0:
            stderr.print(
                f"eager openai-whisper baseline: {eager_seconds:.1f} s on the same windows; "
                f"wtx speedup {eager_seconds / elapsed:.2f}x",
                highlight=False,
            )
    if failed:
        _error(f"{len(failed)} of {n_total} inputs failed: {', '.join(failed)}")
        return 1
    return 0


class counted:
    """Passes sample blocks through, counting the seconds of audio seen."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.seconds = 0.0

    def __iter__(self):
        for block in self.blocks:
            self.seconds += len(block) / SAMPLE_RATE
            yield block


def _transcribe_one(
    engine, source: str, duration: float | None, progress: TranscribeProgress, job: Job, journal: Journal | None
) -> Transcript:
    done = dict(journal.entries) if journal else {}
    language = next(iter(done.values())).language if done else (job.language or "en")
    blocks = counted(stream_samples(source))
    windows = (w for w in make_windows(blocks, job.split) if w.index not in done)
    position = 0.0
    prompts = {index: entry.prompt for index, entry in done.items()}
    for result in engine.transcribe_windows(windows, duration, prompts):
        w = result.window
        entry = Entry(w.index, w.offset, w.duration, result.language,
                      [(s.start, s.end, s.text) for s in result.segments], result.prompt or [])  # fmt: skip
        if journal:
            journal.append(entry)
        done[w.index] = entry
        progress.advance(max(0.0, w.offset + w.duration - position))  # skipped silence counts too
        position = max(position, w.offset + w.duration)
        language = result.language
        if job.to_stdout:
            for segment in result.segments:
                sys.stdout.write(segment.text + "\n")
            sys.stdout.flush()
    progress.advance(max(0.0, blocks.seconds - position))
    segments = [TimedText(*s) for index in sorted(done) for s in done[index].segments]
    return Transcript(source=source, duration=blocks.seconds, language=language, segments=segments)


def _eager_baseline(engine, stock, source: str, progress: TranscribeProgress, split: str) -> tuple[float, float]:
    """Stock openai-whisper `decode()` on the same windows and batch size: (seconds, audio seconds).

    The audio is decoded here as well, so both passes are timed the same way."""
    import torch

    from wtx.prefetch import batched
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

