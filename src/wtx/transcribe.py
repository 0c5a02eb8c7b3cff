"""The transcribe command's job: inputs -> windows -> engine -> writers, with progress.

Part of the CLI layer: it reports on stderr and writes data to stdout or files. Each input
either completes (all its files written atomically) or fails with a one-line error naming
it; the other inputs still run. Finished windows are journaled next to the outputs, so an
interrupted run resumes where it stopped. Returns the exit code.
"""

import math
import os
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from wtx.audio import CHUNK_LENGTH, SAMPLE_RATE, STDIN, is_pipe, probe_duration, stream_samples
from wtx.errors import WtxError
from wtx.inputs import Input
from wtx.journal import Entry, Journal, journal_path, source_identity
from wtx.names import display
from wtx.outputs import plan_outputs
from wtx.progress import TranscribeProgress, format_duration, stderr
from wtx.split import make_windows
from wtx.vad import speech_windows
from wtx.writers import TimedText, Transcript, render, write_outputs

EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM: what timeout, systemd, Kubernetes and Slurm send


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: finished work is kept and the run can be resumed."""


class PipeClosed(Exception):
    """The reader of stdout went away (`| head`): stop quietly, as Unix tools do."""


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
    vad: bool = True  # drop windows without speech (Silero VAD) before decoding


def _error(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True)


def _warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _unwritable(folder: Path) -> str | None:
    """Why outputs cannot be written into `folder`, or None."""
    if folder.exists() and not folder.is_dir():
        return f"{display(folder)}: is a file, not a folder; -o needs a folder (or '-' for stdout)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"{display(folder)}: cannot write outputs there ({e.strerror or e})"
    return None


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises Terminated in the main thread while the job runs."""

    def handler(signum, frame):
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError as e:
        # nothing more can reach the reader; point stdout at /dev/null so exiting flushes quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise PipeClosed() from e


def run_transcribe(inputs: list[Input], problems: list[str], job: Job) -> int:
    with _sigterm_as_interrupt():
        try:
            return _run(inputs, problems, job)
        except Terminated:
            _error("terminated before any input started; nothing was lost")
            return EXIT_TERMINATED


def _run(inputs: list[Input], problems: list[str], job: Job) -> int:
    import torch

    from wtx.decode import DecodingOptions
    from wtx.engine import CompileError, Engine, EngineOptions

    for problem in problems:
        _error(problem)
    failed: list[str] = [p.rsplit(": ", 1)[0] for p in problems]
    if job.out is not None and not job.to_stdout and (reason := _unwritable(job.out)):
        _error(reason)
        return 1
    plan = plan_outputs(inputs, job.formats, None if job.to_stdout else job.out)
    if not job.to_stdout:
        for note in plan.notes:
            stderr.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
        for item in [i for i in inputs if i.path in plan.problems]:
            _error(plan.problems[item.path])
            failed.append(display(item.path))
        inputs = [i for i in inputs if i.path not in plan.problems]
    skipped = []
    if job.skip_existing and not job.to_stdout:
        pending = []
        for item in inputs:
            paths = plan.paths[item.path]
            done = item.path != STDIN and all(p.is_file() for p in paths.values())
            (skipped if done else pending).append(item)
        inputs = pending
        for item in skipped:
            stderr.print(f"skipped {display(item.path)}: its outputs already exist", highlight=False, markup=False)
    if not inputs:
        if failed:
            _error(f"{len(failed)} input(s) failed")
            return 1
        return 0

    if job.threads:
        torch.set_num_threads(job.threads)
    durations = {i.path: probe_duration(i.path) for i in inputs}
    batch_size = job.batch_size
    known = [d for d in durations.values() if d is not None]
    if len(known) == len(inputs):
        # a batch larger than the longest input's window count would only decode padding
        longest = max(math.ceil(d / CHUNK_LENGTH) for d in known)
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
    detector = None
    if job.vad:
        from wtx.vad import INSTALL, load_detector

        try:
            detector = load_detector(engine.device)
        except WtxError as e:
            _error(str(e))
            return 1
        if detector is None:
            _warn(f"silero-vad is not installed, so only silence is skipped and noise may turn into text: {INSTALL}")
    stock = None
    if job.compare_eager:
        from wtx.reference import load_stock_model
        from wtx.weights import load_checkpoint

        stock = load_stock_model(load_checkpoint(job.model), engine.device)
    # everything that changes a window's text: a journal written under other options is not resumed
    config = {"model": job.model, "split": job.split, "condition": job.condition, "batch_size": batch_size,
              "task": job.task, "language": job.language, "dtype": str(engine.dtype), "device": engine.device.type,
              "compiled": bool(report and report.source != "eager"), "vad": detector is not None,
              "threads": torch.get_num_threads() if engine.device.type == "cpu" else None}  # fmt: skip

    total = sum(known) if len(known) == len(inputs) else None
    audio_done = 0.0
    eager_seconds = 0.0
    work_started = time.perf_counter()
    current = None
    journal = None
    written_to_stdout = 0
    with TranscribeProgress(total, len(inputs), job.quiet) as progress:
        try:
            for item in inputs:
                source = item.path
                current = name = "<stdin>" if source == STDIN else display(source)
                paths = None if job.to_stdout else plan.paths[source]
                try:
                    if paths and (reason := _unwritable(next(iter(paths.values())).parent)):
                        raise WtxError(reason)
                    journal = None
                    if paths and job.resume and not is_pipe(source):
                        journal = Journal(journal_path(next(iter(paths.values()))), source_identity(source, config))
                        if journal.set_aside:
                            _warn(f"{name}: its journal could not be read ({journal.reason}); moved it to "
                                  f"{display(journal.set_aside)} and starting this input afresh")
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
                    transcript, warnings = _transcribe_one(engine, detector, source, durations[source], progress, job, journal)
                    progress.finish_file()
                    for warning in warnings + _duration_warnings(name, durations[source], transcript.duration):
                        _warn(warning)
                    if paths:
                        written = write_outputs(transcript, paths)
                        progress.log(f"wrote {', '.join(display(p) for p in written)}")
                    else:
                        _write_stdout(("\n" if written_to_stdout else "") + render(transcript, job.formats[0]))
                        written_to_stdout += 1
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
        except PipeClosed:
            progress.progress.stop()
            if journal:
                journal.close()
            return 0
        except KeyboardInterrupt as e:
            progress.progress.stop()
            saved = len(journal.entries) if journal else 0
            if journal:
                journal.close()
            hint = f"{saved} finished windows of {current} are saved; " if journal else ""
            what = "terminated" if isinstance(e, Terminated) else "interrupted"
            _error(f"{what}: {hint}run the same command again to resume "
                   f"(finished inputs are kept{'; add --skip-existing to skip them' if not job.skip_existing else ''})")
            return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED

    elapsed = time.perf_counter() - work_started
    n_total = len(inputs) + len(problems) + len(plan.problems)
    if not job.quiet:
        speed = audio_done / elapsed if elapsed > 0 else 0.0
        stderr.print(
            f"transcribed {n_total - len(failed)}/{n_total} inputs"
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


def _duration_warnings(name: str, header: float | None, decoded: float) -> list[str]:
    """A file that decodes to much less audio than its header promises is truncated or damaged."""
    if header is None or header - decoded <= max(1.0, 0.02 * header):
        return []
    return [f"{name}: decoded {format_duration(decoded)} of audio, but its header says "
            f"{format_duration(header)}; the file may be truncated or damaged"]  # fmt: skip


class counted:
    """Passes sample blocks through, counting the seconds of audio seen."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.seconds = 0.0

    def __iter__(self):
        for block in self.blocks:
            self.seconds += len(block) / SAMPLE_RATE
            yield block


class fed:
    """Passes windows through to the engine, noting for each the audio before it that no window
    covers (skipped silence), so progress counts it when the window is done."""

    def __init__(self, windows):
        self.windows = windows
        self.skipped_before: dict[int, float] = {}
        self.end = 0.0

    def __iter__(self):
        for w in self.windows:
            self.skipped_before[w.index] = max(0.0, w.offset - self.end)
            self.end = max(self.end, w.offset + w.duration)
            yield w


def _transcribe_one(
    engine, detector, source: str, duration: float | None, progress: TranscribeProgress, job: Job, journal: Journal | None
) -> tuple[Transcript, list[str]]:
    """One input's transcript, and the decoding problems to warn about. Each window is journaled
    as soon as it is complete, in whatever order the batch rows finish them."""
    done = dict(journal.entries) if journal else {}
    language = next(iter(done.values())).language if done else (job.language or "en")
    warnings: list[str] = []
    blocks = counted(stream_samples(source, warnings=warnings))
    windows = make_windows(blocks, job.split)
    if detector is not None:  # scored before journaled windows are left out: the same groups on resume
        windows = speech_windows(windows, detector)
    windows = fed(w for w in windows if w.index not in done)
    prompts = {index: entry.prompt for index, entry in done.items()}
    for result in engine.transcribe_windows(windows, duration, prompts, ordered=False):
        w = result.window
        entry = Entry(w.index, w.offset, w.duration, result.language,
                      [(s.start, s.end, s.text) for s in result.segments], result.prompt or [])  # fmt: skip
        if journal:
            journal.append(entry)
        done[w.index] = entry
        progress.advance(windows.skipped_before.get(w.index, 0.0) + w.duration)
        language = result.language
    progress.advance(max(0.0, blocks.seconds - windows.end))
    segments = [TimedText(*s) for index in sorted(done) for s in done[index].segments]
    return Transcript(source=source, duration=blocks.seconds, language=language, segments=segments), warnings


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

