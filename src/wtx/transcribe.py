"""The transcribe command's job: inputs -> windows -> engine -> writers, with progress.

Part of the CLI layer: it reports on stderr and writes data to stdout or files. Each input
either completes (all its files written atomically) or fails with a one-line error naming
it; the other inputs still run. Finished windows are journaled next to the outputs, so an
interrupted run resumes where it stopped. Returns the exit code.
"""

import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from rich.markup import escape

from wtx.atomic import sweep
from wtx.audio import STDIN, is_pipe, probe_duration, stream_samples
from wtx.cluster import ClusterOptions
from wtx.errors import WtxError
from wtx.inputs import Input
from wtx.journal import Entry, Journal, journal_path, remove_leftover, source_identity
from wtx.names import display
from wtx.outputs import complete, plan_outputs
from wtx.progress import TranscribeProgress, format_duration, stderr
from wtx.api import Model
from wtx.pipeline import AudioReader
from wtx.readahead import ReadAhead
from wtx.split import make_windows
from wtx.streams import Recording, WindowDone
from wtx.segments import Word
from wtx.subtitles import SubtitleOptions
from wtx.transcript import TimedText, Transcript
from wtx.writers import render, write_outputs

# on a CPU Inductor's code for the decode step measured slower than eager (docs/benchmarks.md)
CPU_COMPILE_ENV = "WTX_CPU_COMPILE"  # =1: compile on a CPU anyway (measurements, tests)
CPU_COMPILE_NOTE = (f"--compile: not used on a CPU, where compiled decoding measured slower than eager; "
                    f"running eager ({CPU_COMPILE_ENV}=1 compiles anyway)")


def _compiles_on(device_type: str, job: "Job") -> bool:
    """Whether --compile applies on this kind of device; on a CPU it does not (a line says so)."""
    if not job.compile or device_type != "cpu" or os.environ.get(CPU_COMPILE_ENV):
        return job.compile
    if not job.quiet:
        _status(CPU_COMPILE_NOTE)
    return False

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
    batch_size: int | None = None  # None: automatic (wtx.autobatch)
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None  # None or "auto": int8 logits or fp16 weights on a CPU in fp32, eager (engine.pick_quantize)
    threads: int | None = None
    quiet: bool = False
    compile: bool = False
    strict: bool = False
    compare_eager: bool = False
    split: str = "silence"
    condition: bool | None = None  # prompt each window with the previous window's text; None: auto (engine.pick_condition)
    skip_existing: bool = False
    resume: bool = True
    vad: bool = True  # drop windows without speech (Silero VAD) before decoding
    beam_size: int = 5  # openai-whisper's CLI default; 1 decodes greedily
    best_of: int = 5  # samples per window at a fallback temperature (the CLI: the beam size)
    patience: float = 1.0
    length_penalty: float | None = None
    word_timestamps: bool | None = None  # None: where text only writes subtitles (_times_words)
    without_timestamps: bool | None = None  # text only: a window is one segment; None: auto (engine.pick_text_only)
    subtitles: SubtitleOptions = SubtitleOptions()
    ray: "ClusterOptions | None" = None  # run on Ray Data (wtx.cluster); None: in this process
    cuda_graphs: bool = True  # on CUDA, replay the decode steps as CUDA graphs (with or without compile)
    profile_startup: bool = False  # print where the start went (wtx.startup) once the model is ready


def _error(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True)


def _first(names: list[str], shown: int = 5) -> str:
    """The first `shown` names, then how many more: one line, however many failed."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


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
def _handlers(handlers: dict):
    """The signal handlers given (signal -> handler) while the block runs, the previous ones after
    it. Outside the main thread, where Python delivers no signals, nothing is installed."""
    try:
        previous = {s: signal.signal(s, handler) for s, handler in handlers.items()}
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _sigterm_as_interrupt():
    """SIGTERM raises Terminated in the main thread while the job runs."""

    def handler(signum, frame):
        raise Terminated()

    return _handlers({signal.SIGTERM: handler})


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait until the block ends and are then delivered as they would have
    been: an input's outputs and the removal of its journal happen together or not at all (a
    journal left beside finished outputs would be resumed needlessly). Ignored signals stay ignored."""
    caught: list[int] = []

    def hold(signum, frame):
        caught.append(signum)

    live = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) not in (signal.SIG_IGN, None)]
    try:
        with _handlers(dict.fromkeys(live, hold)):
            yield
    finally:
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


def _write_stdout(text: str, stream=None) -> None:
    stream = stream or sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError as e:
        # nothing more can reach the reader; point stdout at /dev/null so exiting flushes quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
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
            # its own outputs (the plan never gives an input another's), all of one set
            done = item.path != STDIN and complete(paths)
            (skipped if done else pending).append(item)
            if done:
                sweep(list(paths.values()))
        inputs = pending
        for item in skipped:
            message = f"skipped {display(item.path)}: its outputs already exist"
            stderr.print(message, highlight=False, markup=False, soft_wrap=True)  # one line
            # a journal left by a run killed after writing the outputs
            remove_leftover(journal_path(next(iter(plan.paths[item.path].values()))))
    if not inputs:
        if failed:
            _error(f"{len(failed)} input(s) failed")
            return 1
        return 0

    # the audio is decoded while torch and the model load (on Ray the CPU stage reads it;
    # --compare-eager reads every input for stock openai-whisper first)
    local = job.ray is None and not job.compare_eager
    _open_files_for_every_journal()  # many inputs are in flight at once: journals, ffmpeg pipes
    readahead = ReadAhead([i.path for i in inputs] if local else [])
    try:
        return _run_loaded(inputs, problems, failed, plan, skipped, job, readahead)
    finally:
        readahead.close()


def _run_loaded(inputs, problems, failed, plan, skipped, job: Job, readahead: ReadAhead) -> int:
    # every input's duration from its header (for the progress bar and the checks after
    # reading), asked of ffmpeg a few at a time while torch and the model load: one after
    # another, many short clips measured a long wait before the first window could decode
    probes = ThreadPoolExecutor(max(2, os.cpu_count() or 1), thread_name_prefix="wtx-probe")
    probing = {i.path: probes.submit(probe_duration, i.path) for i in inputs}
    probes.shutdown(wait=False)  # its threads finish the probes, then end
    import torch

    from wtx.engine import pick_device, pick_text_only
    from wtx.options import DecodingOptions, EngineOptions

    if job.threads:
        torch.set_num_threads(job.threads)
    # on Ray the workers' device decides (_ray_backend)
    compile = job.compile if job.ray is not None else _compiles_on(pick_device(job.device).type, job)
    options = EngineOptions(
        model=job.model, device=job.device, dtype=job.dtype, quantize=job.quantize, batch_size=job.batch_size,
        decoding=DecodingOptions(task=job.task, language=job.language, beam_size=job.beam_size, best_of=job.best_of,
                                 patience=job.patience, length_penalty=job.length_penalty,
                                 without_timestamps=pick_text_only(job.without_timestamps, job.split)),
        compile=compile, cuda_graph=job.cuda_graphs,
        strict=job.strict, condition_on_previous_text=job.condition,
    )  # fmt: skip
    with ExitStack() as stack:
        if job.ray is None:
            backend = _local_backend(options, job)
        else:
            backend = _ray_backend(options, job, stack)
        if isinstance(backend, int):
            return backend
        durations = {path: probe.result() for path, probe in probing.items()}
        known = [d for d in durations.values() if d is not None]
        return _transcribe(inputs, problems, failed, plan, skipped, durations, known, backend, job, readahead)


@dataclass
class _Backend:
    """Where the windows are decoded: this process's engine, or workers on Ray (wtx.cluster)."""

    device: str  # the device type: cpu or cuda
    dtype: str
    batch_size: int
    compiled: bool | str  # how the decode steps run (_steps_run_as)
    vad: bool
    threads: int | None  # torch's CPU threads, on a CPU
    events: Callable[[Iterator[Recording]], Iterator]  # recordings -> the scheduler's events
    stock: object = None  # --compare-eager: stock openai-whisper, and the engine it compares with
    engine: object = None
    stdout: object = None  # where data goes (None: sys.stdout)
    quantized: str | None = None  # the decoder's packed weights: "fp16" or "int8" (wtx.quantize)
    encoder_dtype: str = ""  # the encoder's: bf16 on some CPUs (engine.pick_encoder_dtype); "": dtype
    without_timestamps: bool = False  # text only, as resolved for the device (engine.pick_text_only)
    condition: bool = True  # windows prompted with the previous text (engine.pick_condition)
    word_timestamps: bool = False  # every word timed (_times_words)
    vnni: bool = False  # the decoding CPU has VNNI: how int8 logits are computed (quantize.int8_kind)


def _precision_note(dtype, encoder_dtype, quantized: str | None) -> str:
    """What the status line adds after the dtype: a bf16 encoder, the decoder's fp16 weights, int8
    logits, bf16 cross-attention keys and values (engine.pick_cross_dtype)."""
    from wtx.engine import pick_cross_dtype  # torch is loaded by now

    packed = {"fp16": ", fp16 decoder weights", "int8": ", int8 logits"}.get(quantized, "")
    if pick_cross_dtype(quantized, encoder_dtype, dtype) != dtype:
        packed += ", bf16 cross-attention"
    return (", bf16 encoder" if encoder_dtype != dtype else "") + packed


def _times_words(job: Job, without_timestamps: bool) -> bool:
    """--word-timestamps, or where it is not given: on where text only (a window, up to 30 s, is
    one segment) writes .srt or .vtt, whose cues then follow the words."""
    if job.word_timestamps is not None:
        return job.word_timestamps
    return without_timestamps and any(f in ("srt", "vtt") for f in job.formats)


def _shows_probabilities(job: Job) -> bool:
    """Whether an output shows the words' probabilities (.json does); else they are not computed."""
    return "json" in job.formats


def _modes_note(without_timestamps: bool, condition: bool) -> str:
    """What the status line says of the decoding mode (engine.resolve_modes)."""
    text = "text only" if without_timestamps else "timestamps"
    return f"{text}, {'each window prompted with the text before it' if condition else 'each window alone'}"


def _note(message: str) -> None:
    stderr.print(f"note: {message}", highlight=False, markup=False, soft_wrap=True)


def _status(line: str) -> None:
    stderr.print(line, highlight=False, soft_wrap=True)  # one line, however narrow: logs are read by scripts


def _local_backend(options, job: Job) -> "_Backend | int":
    import torch

    from wtx import startup
    from wtx.autobatch import engine_batch_warning
    from wtx.engine import CompileError, Engine
    from wtx.quantize import has_vnni

    startup.mark("import torch")
    started = time.perf_counter()
    try:
        engine = Engine(options, on_status=None if job.quiet else _status)
    except (WtxError, ValueError, CompileError) as e:
        _error(str(e))
        return 1
    batch_size = engine.options.batch_size  # never the inputs': a file's text must not depend on the others
    report = engine.compile_report
    for warning in report.warnings if report else []:
        _warn(warning)
    if job.batch_size is not None and (warning := engine_batch_warning(engine)):
        _warn(warning)
    startup.mark("engine ready")
    if not job.quiet:
        how = {"compiled": "compiled in", "loaded": "loaded compiled artifacts in", "graphs": "captured CUDA graphs in", "eager": "running eager after"}
        status = f", {how[report.source]} {report.seconds:.1f} s" if report else ", eager"
        weights = _precision_note(engine.dtype, engine.encoder_dtype, engine.quantized)
        _status(f"model {job.model} on {engine.device} ({str(engine.dtype).removeprefix('torch.')}{weights}), "
                f"{_modes_note(engine.options.decoding.without_timestamps, engine.options.condition_on_previous_text)}, batch {batch_size}{' (auto)' if job.batch_size is None else ''}{status}; "
                f"ready in {time.perf_counter() - started:.1f} s")  # fmt: skip
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
        startup.mark("voice-activity detector loaded")
    if job.profile_startup:
        stderr.print(startup.table(), highlight=False, markup=False)
    stock = None
    if job.compare_eager:
        from wtx.reference import load_stock_model
        from wtx.weights import load_checkpoint

        stock = load_stock_model(load_checkpoint(job.model), engine.device)
    model = Model(engine, detector)
    words, probabilities = _times_words(job, engine.options.decoding.without_timestamps), _shows_probabilities(job)
    return _Backend(
        engine.device.type, str(engine.dtype), batch_size, _steps_run_as(report.source if report else "eager"),
        detector is not None, torch.get_num_threads() if engine.device.type == "cpu" else None,
        lambda recordings: model.run(recordings, ordered=False, word_timestamps=words, vad=True,
                                     word_probabilities=probabilities),
        stock, engine, quantized=engine.quantized, encoder_dtype=str(engine.encoder_dtype),
        without_timestamps=engine.options.decoding.without_timestamps, condition=engine.options.condition_on_previous_text,
        word_timestamps=words, vnni=has_vnni(),
    )  # fmt: skip


def _ray_backend(options, job: Job, stack: ExitStack) -> "_Backend | int":
    import torch

    from wtx import cluster
    from wtx.engine import pick_encoder_dtype, pick_quantize

    started = time.perf_counter()
    threads = job.threads or torch.get_num_threads()  # this machine's choice, as a single process makes it
    out, err, log = stack.enter_context(cluster.quiet_output())
    previous, stderr.file = stderr.file, err
    stack.callback(setattr, stderr, "file", previous)
    try:
        with ThreadPoolExecutor(1) as pool:
            # with --ray local this machine is the cluster: resolve the options here while Ray starts
            resolving = pool.submit(cluster.resolve_here, options) if job.ray.address == "local" else None
            ray = cluster.connect(job.ray, job.ray.workers or 1, None if job.quiet else _status)
            stack.callback(ray.shutdown)
            if resolving is not None:
                resolved = resolving.result()
                device = job.device or resolved.device
            else:
                device = cluster.cluster_device(ray, job.device)
                resolved = cluster.probe(ray, replace(options, device=device))
        options = replace(options, device=device)
    except WtxError as e:
        _error(str(e))
        return 1
    except Exception as e:  # Ray's own errors: what it said, and where its log is
        _error(f"--ray: {type(e).__name__}: {e} (Ray's log: {display(log)})")
        return 1
    if resolved.multilingual and job.language is None:
        _error(f"--ray: {job.model} is multilingual; give --language (language detection runs in a single process only)")
        return 2
    workers = job.ray.workers or (int(ray.cluster_resources().get("GPU", 0)) if device.startswith("cuda") else 1)
    options = replace(options, batch_size=resolved.batch_size, compile=_compiles_on(resolved.device, job),
                      decoding=replace(options.decoding, without_timestamps=resolved.without_timestamps),
                      condition_on_previous_text=resolved.condition)  # fmt: skip
    dtype = getattr(torch, resolved.dtype.removeprefix("torch."))
    encoder_dtype = pick_encoder_dtype(options.dtype, torch.device(resolved.device), dtype, options.compile, resolved.native_bf16)
    try:
        quantized = pick_quantize(options.quantize, torch.device(resolved.device), dtype, options.compile, resolved.vnni)
    except ValueError as e:
        _error(str(e))
        return 1
    # the workers use this process's thread count, also on a GPU (Ray sets OMP_NUM_THREADS to a
    # worker's CPUs), though only a CPU's count is part of what the journal calls the same run
    words = _times_words(job, resolved.without_timestamps)
    settings = cluster.Settings(options, threads, job.vad and resolved.vad, words,
                                os.environ.get(cluster.CRASH_ENV), _shows_probabilities(job))  # fmt: skip
    threads = threads if resolved.device == "cpu" else None
    if job.vad and not resolved.vad:
        from wtx.vad import INSTALL

        _warn(f"silero-vad is not installed on the workers, so only silence is skipped: {INSTALL}")
    if not job.quiet:
        weights = _precision_note(dtype, encoder_dtype, quantized)
        _status(f"model {job.model} on {workers} Ray worker(s) ({resolved.device}, {resolved.dtype.removeprefix('torch.')}{weights}), "
                f"{_modes_note(resolved.without_timestamps, resolved.condition)}, batch {resolved.batch_size}{' (auto)' if job.batch_size is None else ''}"
                f"{', compiled by the first worker of each node' if options.compile else ', eager'}; "
                f"cluster ready in {time.perf_counter() - started:.1f} s")  # fmt: skip

    def events(recordings):
        try:
            yield from cluster.run(ray, recordings, settings, resolved, job.ray, workers)
        except WtxError:
            raise
        except Exception as e:  # the job failed on the cluster: its first cause, and where Ray's log is
            raise WtxError(f"--ray: the job failed on the cluster: {_first_cause(e)} (Ray's log: {display(log)})") from e

    graphs = resolved.device == "cuda" and options.cuda_graph
    steps = _steps_run_as("compiled" if options.compile else "graphs" if graphs else "eager")
    return _Backend(resolved.device, resolved.dtype, resolved.batch_size, steps, settings.vad, threads,
                    events, stdout=out, quantized=quantized, encoder_dtype=str(encoder_dtype),
                    without_timestamps=resolved.without_timestamps, condition=resolved.condition, word_timestamps=words,
                    vnni=resolved.vnni)  # fmt: skip


def _steps_run_as(source: str) -> bool | str:
    """How the decode steps ran, as journals record it: True (Inductor's code), "graphs" (CUDA
    graphs of the eager kernels) or False (eager); a journal is resumed only the same way."""
    return {"compiled": True, "loaded": True, "graphs": "graphs"}.get(source, False)


def _saved(journals: list[tuple[str, int]]) -> str:
    """What the closed journals keep, for the line that says how to resume."""
    return "; ".join(f"{n} finished windows of {name} are saved" for name, n in journals)


def _first_cause(error: BaseException) -> str:
    """What failed first, on one line: Ray's task errors carry the worker's traceback as text,
    whose first exception line (not one of Ray's own) names the cause."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    for line in text.splitlines():
        match = re.match(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.*)", line.strip())
        if match and not match.group(1).startswith("ray."):
            return f"{match.group(1)}: {match.group(2)}"
    said = text.strip().splitlines()
    return f"{type(error).__name__}{': ' + said[0] if said else ''}"


def _open_files_for_every_journal() -> None:
    """On Ray every input's journal is open from the start, and in this process those of the
    inputs in flight: the soft limit on open files goes up to the hard one (a folder of thousands
    of clips)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def journal_config(job: Job, backend: _Backend) -> dict:
    """Everything that changes a window's text, as resolved for the device: a journal written
    under other options is not resumed."""
    from wtx.quantize import int8_kind  # torch is loaded by now

    quantized = int8_kind(backend.vnni) if backend.quantized == "int8" else backend.quantized
    return {"model": job.model, "split": job.split, "condition": backend.condition,
            "batch_size": backend.batch_size, "task": job.task, "language": job.language,
            "dtype": backend.dtype, "encoder_dtype": backend.encoder_dtype or backend.dtype,
            "quantized": quantized, "device": backend.device,
            "compiled": backend.compiled, "vad": backend.vad, "threads": backend.threads,
            "beam_size": job.beam_size, "best_of": job.best_of, "patience": job.patience,
            "length_penalty": job.length_penalty, "word_timestamps": backend.word_timestamps,
            "word_probabilities": backend.word_timestamps and _shows_probabilities(job),
            "without_timestamps": backend.without_timestamps}  # fmt: skip


def _transcribe(inputs, problems, failed, plan, skipped, durations, known, backend: _Backend, job: Job,
                readahead: ReadAhead) -> int:  # fmt: skip
    config = journal_config(job, backend)
    stock, engine = backend.stock, backend.engine

    total = sum(known) if len(known) == len(inputs) else None
    work_started = time.perf_counter()
    eager_seconds = 0.0
    with TranscribeProgress(total, len(inputs), job.quiet) as progress:
        baselines: dict[str, float | None] = {}
        if stock is not None:  # stock openai-whisper first, file by file, on the same windows
            for item in inputs:
                progress.start_file(item.path, f"{_short(item)} (eager baseline)", durations[item.path])
                try:
                    seconds, audio = _eager_baseline(engine, stock, item.path, progress, item.path, job.split)
                except WtxError:
                    seconds, audio = 0.0, 0.0  # the real pass reports the input's error
                progress.finish_file(item.path)
                eager_seconds += seconds
                baselines[item.path] = audio / seconds if seconds > 0 else None
            work_started = time.perf_counter()  # the summary times wtx alone
        run = _Run(job, plan, durations, config, progress, baselines, backend, readahead.stream_samples)
        try:
            for event in backend.events(run.recordings(inputs)):
                if isinstance(event, WindowDone):
                    run.window_done(event.key, event.result)
                else:
                    run.recording_done(event.key, event.error)
        except PipeClosed:
            progress.progress.stop()
            run.close_journals()
            return 0
        except WtxError as e:  # the backend failed as a whole (on Ray: the cluster)
            progress.progress.stop()
            hint = _saved(run.close_journals())
            _error(f"{e}; {hint + '; ' if hint else ''}run the same command again to resume")
            return 1
        except KeyboardInterrupt as e:
            progress.progress.stop()
            hint = _saved(run.close_journals())
            what = "terminated" if isinstance(e, Terminated) else "interrupted"
            _error(f"{what}: {hint + '; ' if hint else ''}run the same command again to resume "
                   f"(finished inputs are kept{'; add --skip-existing to skip them' if not job.skip_existing else ''})")
            return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
    failed += run.failed

    elapsed = time.perf_counter() - work_started
    n_total = len(inputs) + len(problems) + len(plan.problems)
    if not job.quiet:
        speed = run.audio_done / elapsed if elapsed > 0 else 0.0
        stderr.print(
            f"transcribed {n_total - len(failed)}/{n_total} inputs"
            f"{f' ({len(skipped)} skipped)' if skipped else ''}, "
            f"{format_duration(run.audio_done)} of audio in {elapsed:.1f} s ({speed:.1f}x real time)",
            highlight=False, soft_wrap=True,
        )
        if stock is not None and eager_seconds > 0 and elapsed > 0:
            stderr.print(
                f"eager openai-whisper baseline: {eager_seconds:.1f} s on the same windows; "
                f"wtx speedup {eager_seconds / elapsed:.2f}x",
                highlight=False, soft_wrap=True,
            )
    if failed:
        _error(f"{len(failed)} of {n_total} inputs failed: {_first(failed)}")
        return 1
    return 0


def _duration_warnings(name: str, header: float | None, decoded: float) -> list[str]:
    """A file that decodes to much less audio than its header promises is truncated or damaged."""
    if header is None or header - decoded <= max(1.0, 0.02 * header):
        return []
    return [f"{name}: decoded {format_duration(decoded)} of audio, but its header says "
            f"{format_duration(header)}; the file may be truncated or damaged"]  # fmt: skip


def _name(source: str) -> str:
    return "<stdin>" if source == STDIN else display(source)


def _short(item: Input) -> str:
    return Path(_name(item.path)).name


@dataclass
class _Input:
    """One input while its windows are decoded: its journal, its audio, its finished windows."""

    item: Input
    paths: dict[str, Path] | None
    journal: Journal | None = None
    reader: AudioReader | None = None
    done: dict = field(default_factory=dict)  # window index -> Entry
    prompts: dict = field(default_factory=dict)  # the Recording's: journaled index -> prompt
    ends: dict = field(default_factory=dict)  # the Recording's: journaled index -> last speech
    advanced: float = 0.0  # seconds of its audio shown as done, window by window
    silent: float = 0.0  # seconds shown as done with the windows the detector dropped (the reading thread's)


def _failing(error: Exception):
    raise error
    yield  # a generator that raises when iterated


class _Run:
    """What the CLI does with the scheduler's events: journal each window, show progress, write
    each input's outputs as soon as it is complete (stdout: in input order), report failures."""

    def __init__(self, job: Job, plan, durations: dict, config: dict, progress: TranscribeProgress,
                 baselines: dict[str, float | None], backend: "_Backend", read=stream_samples):  # fmt: skip
        """read(source, warnings=...): an input's decoded blocks (wtx.readahead's where it read ahead)."""
        self.job, self.plan, self.durations, self.config = job, plan, durations, config
        self.read = read
        self.progress, self.baselines = progress, baselines
        self.stdout = backend.stdout
        self.inputs: dict[str, _Input] = {}
        self.order: list[str] = []
        self.finished: dict[str, object] = {}  # stdout: transcripts waiting for earlier inputs
        self.written = 0
        self.failed: list[str] = []
        self.audio_done = 0.0

    def recordings(self, inputs: list[Input]) -> Iterator[Recording]:
        """One Recording per input, opened (journal and all) when the scheduler reads ahead to it."""
        for item in inputs:
            state = _Input(item, None if self.job.to_stdout else self.plan.paths[item.path])
            self.order.append(item.path)
            self.inputs[item.path] = state
            try:
                yield self._open(state)
            except (WtxError, OSError) as e:
                yield Recording(item.path, _failing(e))

    def _open(self, state: _Input) -> Recording:
        source, job, name = state.item.path, self.job, _name(state.item.path)
        if state.paths and (reason := _unwritable(next(iter(state.paths.values())).parent)):
            raise WtxError(reason)
        if state.paths and job.resume and not is_pipe(source):
            state.journal = Journal(journal_path(next(iter(state.paths.values()))), source_identity(source, self.config))
            if state.journal.set_aside:
                _warn(f"{name}: its journal was not used ({state.journal.reason}); moved it to "
                      f"{display(state.journal.set_aside)} and starting this input afresh")
            if state.journal.restarted:
                _note(f"{name}: its journal is not resumed ({state.journal.restarted}); "
                      f"starting this input over")
            if state.journal.entries:
                self.progress.log(f"resuming {name}: {len(state.journal.entries)} windows already done")
            state.done = dict(state.journal.entries)
        journaled = {index: (entry.offset, entry.duration) for index, entry in state.done.items()}
        # speech: the scheduler's
        state.reader = AudioReader(source, job.split, skip=state.done, read=self.read,
                                   journaled=journaled, stale=partial(self.journal_stale, state))
        state.prompts = {index: entry.prompt for index, entry in state.done.items()}
        state.ends = {index: entry.last_speech for index, entry in state.done.items()
                      if entry.last_speech is not None}  # fmt: skip
        language = next(iter(state.done.values())).language if state.done else job.language
        self._bar(state)  # from the start of its reading: a file decoded in one batch shows its real rate
        return Recording(source, state.reader, state.prompts, language, state.ends,
                         silent=partial(self.window_silent, state))  # fmt: skip

    def journal_stale(self, state: _Input, index: int) -> None:
        """The journaled windows from `index` on are not the input's (in the reading thread,
        before that window is passed on): they are decoded again, and nothing of theirs is used."""
        for i in [i for i in list(state.done) if i >= index]:
            del state.done[i]
            state.prompts.pop(i, None)
            state.ends.pop(i, None)
        _note(f"{_name(state.item.path)}: its journal does not match its audio from window "
              f"{index} on; decoding from there again")

    def _bar(self, state: _Input) -> None:
        key = state.item.path
        self.progress.start_file(key, _short(state.item), self.durations[key], self.baselines.get(key))

    def window_done(self, key: str, result) -> None:
        state = self.inputs[key]
        w = result.window
        entry = Entry(w.index, w.offset, w.duration, result.language,
                      [(s.start, s.end, s.text, tuple((w.word, w.start, w.end, w.probability) for w in s.words))
                       for s in result.segments], result.prompt or [], result.last_speech)  # fmt: skip
        if state.journal:
            state.journal.append(entry)
        state.done[w.index] = entry
        self._bar(state)
        seconds = state.reader.skipped_before.get(w.index, 0.0) + w.duration
        state.advanced += seconds
        self.progress.advance(seconds, key=key)

    def window_silent(self, state: _Input, index: int, duration: float) -> None:
        """A window the detector dropped (in the scheduler's reading thread, or on --ray as its
        chunk's results arrive): its audio is done."""
        seconds = state.reader.skipped_before.get(index, 0.0) + duration
        state.silent += seconds
        self.progress.advance(seconds, windows=0, key=state.item.path)

    def recording_done(self, key: str, error: Exception | None) -> None:
        state = self.inputs[key]
        name = _name(key)
        self._bar(state)
        try:
            if error is not None:
                raise error
            reader = state.reader
            self.progress.advance(max(0.0, reader.seconds - state.advanced - state.silent), windows=0, key=key)
            self.progress.finish_file(key)
            for warning in reader.warnings + _duration_warnings(name, self.durations[key], reader.seconds):
                _warn(warning)
            done = state.done
            language = next(iter(done.values())).language if done else (self.job.language or "en")
            segments = [TimedText(start, end, text, tuple(Word(*w) for w in words))
                        for index in sorted(done) for start, end, text, words in done[index].segments]  # fmt: skip
            transcript = Transcript(source=key, duration=reader.seconds, language=language, segments=segments)
            with _signals_held():
                if state.paths:
                    written = write_outputs(transcript, state.paths, self.job.subtitles)
                    self.progress.log(f"wrote {', '.join(display(p) for p in written)}")
                else:
                    self.finished[key] = transcript
                    self._flush_stdout()
                if state.journal:
                    state.journal.close(remove=True)
                    state.journal = None
            self.audio_done += reader.seconds
        except (WtxError, OSError) as e:
            self.progress.finish_file(key)
            if state.journal:
                state.journal.close(remove=not state.journal.entries)  # nothing to resume: leave no trace
                state.journal = None
            _error(str(e) if isinstance(e, WtxError) else f"{name}: {e}")
            self.failed.append(name)
            if not state.paths:
                self.finished[key] = None
                self._flush_stdout()
        del self.inputs[key]

    def _flush_stdout(self) -> None:
        while self.order and self.order[0] in self.finished:
            transcript = self.finished.pop(self.order.pop(0))
            if transcript is not None:
                _write_stdout(("\n" if self.written else "") + render(transcript, self.job.formats[0], self.job.subtitles), self.stdout)
                self.written += 1

    def close_journals(self) -> list[tuple[str, int]]:
        """Closes the journals of the inputs in flight, keeping them: (name, windows saved)."""
        saved = []
        for key, state in list(self.inputs.items()):
            if state.journal:
                if state.journal.entries:
                    saved.append((_name(key), len(state.journal.entries)))
                state.journal.close(remove=not state.journal.entries)  # nothing to resume: no trace
                state.journal = None
        return saved


def _eager_baseline(engine, stock, source: str, progress: TranscribeProgress, key: str, split: str) -> tuple[float, float]:
    """Stock openai-whisper `decode()` on the same windows and batch size: (seconds, audio seconds).

    The audio is decoded here as well, so both passes are timed the same way."""
    import torch

    from wtx.prefetch import batched
    from wtx.reference import stock_decode

    fp16 = engine.dtype == torch.float16
    decoding = engine.options.decoding
    beam = {"beam_size": decoding.beam_size, "patience": decoding.patience} if decoding.beam_size > 1 else {}
    started = time.perf_counter()
    audio = 0.0
    for batch in batched(make_windows(stream_samples(source), split), engine.options.batch_size):
        stock_decode(stock, batch, len(batch), fp16=fp16, language=decoding.language or "en",
                     length_penalty=decoding.length_penalty, without_timestamps=decoding.without_timestamps, **beam)
        seconds = sum(w.duration for w in batch)
        audio += seconds
        progress.advance(seconds, len(batch), key=key)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - started, audio

