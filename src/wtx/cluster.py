"""`wtx transcribe --ray`: the same job on Ray Data, over the GPUs (or CPUs) of one or many machines.

    driver: the CLI process                 Ray Data (streaming, with backpressure)
    plans each file, keeps its journal ---> from_items(FilePlan)
                                            -> flat_map(cut_file)      CPU tasks: ffmpeg, pause cuts
                                            -> map_batches(ChunkDecoder)  a pool of long-lived
                                               workers, one engine each (compiled once per node)
    journals, assembles, writes outputs <--- ChunkDone and FileEnd rows, as they finish
    atomically, shows progress

Chunks travel, never files (wtx.chunks): a 20-hour file spreads over every worker. A worker
keeps its batch rows full from any call in flight (four at a time), so rows of one batch hold
chunks of several files, as in a single process; a chunk's text does not depend on what it ran
beside, so the outputs are byte-identical to a single-process run with the same options on the
same kind of device. A retried call (a worker died) may deliver a chunk twice: the driver keeps
the first. Ray's own logs and messages go to a log file, never to wtx's stdout or stderr.
"""

import contextlib
import fcntl
import itertools
import logging
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from queue import Queue

from wtx.chunks import Chunk, ChunkDone, FileEnd, FilePlan, cut_file, without_samples
from wtx.errors import WtxError
from wtx.options import EngineOptions
from wtx.pipeline import AudioReader
from wtx.streams import Recording, RecordingDone, WindowDone, chunk_span

REQUIREMENT = "ray[data]>=2.60,<2.61"
INSTALL = "pip install 'wtx[ray]'"
TESTED = ((2, 60),)  # (major, minor) releases the tests ran on
CALLS_IN_FLIGHT = 4  # per worker, all served at once: while one call's last chunks finish, the others' fill the rows
CONNECT_TIMEOUT_ENV = "WTX_RAY_CONNECT_TIMEOUT"  # seconds to wait for a cluster's head (default 30)
CONNECT_TIMEOUT = 30.0
CRASH_ENV = "WTX_RAY_CRASH_ONCE"  # tests only: "PATH:N" - a worker exits on its Nth call if PATH exists, once


@dataclass(frozen=True)
class ClusterOptions:
    address: str = "local"  # local (a Ray instance of this machine), auto, or HOST:PORT
    workers: int | None = None  # None: one per GPU of the cluster, or one on CPUs
    cpus_per_worker: float = 1.0  # CPUs per CPU-stage task (decoding and cutting one file)


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs to build the same engine as a single process would."""

    engine: EngineOptions  # device and batch size resolved
    threads: int  # torch's CPU threads, as the driver's (Ray sets OMP_NUM_THREADS to a worker's CPUs)
    vad: bool
    word_timestamps: bool
    crash: str | None = None
    word_probabilities: bool = True  # with word_timestamps: computed (else NaN; only .json shows them)


@dataclass(frozen=True)
class Resolved:
    """What a worker's device makes of the options (resolved before the job starts: on a worker,
    or with `--ray local` in the driver, whose machine is the cluster)."""

    device: str
    dtype: str
    batch_size: int
    max_prompt: int
    multilingual: bool
    vad: bool
    native_bf16: bool = False  # the worker's CPU computes bf16 natively (engine.pick_encoder_dtype)
    vnni: bool = False  # the worker's CPU has VNNI (engine.pick_quantize)
    without_timestamps: bool = False  # text only (engine.pick_text_only)
    condition: bool = True  # windows prompted with the previous text (engine.pick_condition)


def connect(options: ClusterOptions, workers_hint: int = 1, on_status=None):
    """Starts or joins the Ray cluster, quietly; on_status(line) hears which address it joins.
    Raises WtxError without Ray or on another release, and when no cluster answers at the
    address within connect_timeout() seconds."""
    try:
        import ray
    except ImportError as e:
        raise WtxError(f"--ray needs Ray Data: {INSTALL}") from e
    version = tuple(int(p) for p in ray.__version__.split(".")[:2])
    if version not in TESTED:
        raise WtxError(f"--ray was tested with {REQUIREMENT}, not ray {ray.__version__}: {INSTALL}")
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if options.address == "local":
        # logical CPUs for the workers and one CPU-stage task, however few cores there are
        cpus = max(os.cpu_count() or 1, workers_hint + int(options.cpus_per_worker + 0.999))
        ray.init(address="local", num_cpus=cpus, **quiet)
    else:
        if on_status is not None:
            on_status(f"connecting to the Ray cluster at {options.address} ...")
        timeout = connect_timeout()
        _check_listening(options.address, timeout)
        try:
            _join(ray, options.address, timeout, quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise WtxError(f"--ray {options.address}: cannot join the Ray cluster ({e})") from e
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray").setLevel(logging.ERROR)
    return ray


def connect_timeout() -> float:
    """How long to wait for a cluster's head: WTX_RAY_CONNECT_TIMEOUT seconds, else 30."""
    try:
        return max(0.1, float(os.environ.get(CONNECT_TIMEOUT_ENV, CONNECT_TIMEOUT)))
    except ValueError:
        return CONNECT_TIMEOUT


def _head(address: str) -> tuple[str, int] | None:
    """(HOST, PORT) of an address written HOST:PORT (or ray://HOST:PORT); None for 'auto'."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _check_listening(address: str, timeout: float) -> None:
    """A WtxError at once when nothing accepts a connection at HOST:PORT (Ray itself would
    retry for minutes, silently)."""
    head = _head(address)
    if head is None:
        return
    try:
        socket.create_connection(head, timeout=timeout).close()
    except OSError as e:
        timed_out = isinstance(e, TimeoutError)
        reason = f"no answer within {timeout:g} s" if timed_out else e.strerror or str(e)
        raise WtxError(f"--ray {address}: no Ray cluster there ({reason}); start one on that "
                       f"machine (ray start --head --port={head[1]}) or give its head's "
                       f"address") from e  # fmt: skip


def _join(ray, address: str, timeout: float, quiet: dict) -> None:
    """ray.init(address), waited for at most `timeout` seconds: a head that accepts connections
    but does not answer (not Ray, or overloaded) is a WtxError, not a silent wait. Ray's own
    errors are raised as they came."""
    outcome: list[BaseException | None] = []
    finished = threading.Event()

    def init() -> None:
        try:
            ray.init(address=address, **quiet)
            outcome.append(None)
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)
        finally:
            finished.set()

    threading.Thread(target=init, name="wtx-ray-connect", daemon=True).start()
    if not finished.wait(timeout):
        raise WtxError(f"--ray {address}: the Ray cluster did not answer within {timeout:g} s; "
                       f"check that a Ray head runs there, or set {CONNECT_TIMEOUT_ENV} to wait "
                       f"longer")  # fmt: skip
    if outcome[0] is not None:
        raise outcome[0]


def cluster_device(ray, device: str | None) -> str:
    if device is not None:
        return device
    return "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"


def resolve_here(engine: EngineOptions) -> Resolved:
    """The automatic options as this machine resolves them (with `--ray local` it is the cluster)."""
    from wtx.autobatch import pick_batch_size
    from wtx.engine import native_bf16, pick_device, pick_dtype, resolve_modes
    from wtx.model import ModelDimensions
    from wtx.quantize import has_vnni
    from wtx.vad import model_file
    from wtx.weights import load_checkpoint

    dims = ModelDimensions(**load_checkpoint(engine.model)["dims"])
    device = pick_device(engine.device)
    dtype = pick_dtype(engine.dtype, device)
    engine = resolve_modes(engine)
    batch = engine.batch_size or pick_batch_size(dims, device, dtype, engine.decoding.group, engine.windows_alone)
    max_prompt = dims.n_text_ctx // 2 - 1 if engine.condition_on_previous_text else 0
    return Resolved(device.type, str(dtype), batch, max_prompt, dims.is_multilingual, model_file() is not None,
                    native_bf16(), has_vnni(), engine.decoding.without_timestamps, engine.condition_on_previous_text)  # fmt: skip


def probe(ray, engine: EngineOptions) -> Resolved:
    """Resolves the automatic options on a worker's kind of device (its free memory, its model)."""
    gpus = 1 if engine.device.startswith("cuda") else 0
    return ray.get(ray.remote(num_cpus=0 if gpus else 1, num_gpus=gpus)(resolve_here).remote(engine))


@contextlib.contextmanager
def compile_lock(enabled: bool):
    """The first worker on a node to start builds its engine alone; the others wait for it,
    then build theirs side by side.

    The first compiles (on a cold cache) and saves what it compiled; the others then only load
    it, and loading, seconds per worker, is what every GPU's worker does at once: one at a time,
    eight GPUs' workers would start a minute apart. The first holds the lock file exclusively,
    the others share it (flock)."""
    if not enabled:
        yield
        return
    from wtx.paths import cache_dir, private_dir

    folder = private_dir(cache_dir())
    fd = os.open(folder / "compile.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a worker holds it: wait until the first is done
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


class _Call:
    def __init__(self, chunks: int):
        self.open = chunks
        self.results: dict = {}
        self.done = threading.Event()
        if not chunks:
            self.done.set()


class ChunkDecoder:
    """A Ray Data worker: one engine, and one scheduler serving every call's chunks."""

    def __init__(self, settings: Settings):
        from wtx.bytecode import keep_bytecode

        keep_bytecode()
        import torch

        from wtx.engine import Engine
        from wtx.vad import load_detector

        started = time.perf_counter()
        torch.set_num_threads(settings.threads)
        with compile_lock(settings.engine.compile):
            engine = Engine(settings.engine)
        self.detector = load_detector(engine.device) if settings.vad else None
        self.crash = settings.crash
        self.feed: Queue = Queue()
        self.calls: dict[int, _Call] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()  # the call counter and the detector
        self.count = 0
        self.error: BaseException | None = None
        self.scheduler = scheduler = engine.scheduler(settings.word_timestamps, settings.word_probabilities)
        threading.Thread(target=self._serve, args=(scheduler,), name="wtx-serve", daemon=True).start()
        report = engine.compile_report
        self.ready = time.perf_counter()
        _log(f"engine ready in {self.ready - started:.1f} s"
             f"{f' ({report.source} in {report.seconds:.1f} s)' if report else ''}")  # fmt: skip

    def _serve(self, scheduler) -> None:
        try:
            for event in scheduler.serve(self.feed):
                call_id, key, number = event.key
                call = self.calls[call_id]
                if isinstance(event, WindowDone):
                    call.results.setdefault((key, number), []).append(without_samples(event.result))
                else:
                    call.open -= 1
                    if call.open == 0:
                        call.done.set()
        except BaseException as e:  # handed to every waiting call
            self.error = e
            for call in list(self.calls.values()):
                call.done.set()

    def _crash_if_asked(self) -> None:
        if self.crash:
            path, n = self.crash.rsplit(":", 1)
            if self.count == int(n) and os.path.exists(path):
                os.remove(path)
                os._exit(1)

    def _speech(self, chunks: list[Chunk]) -> list[list[bool]]:
        """Whether each window of each chunk holds speech, scored on this worker's device."""
        if self.detector is None:
            return [[True] * len(c.windows) for c in chunks]
        windows = [w for c in chunks for w in c.windows]
        group = self.detector.group
        with self.lock:
            flags = iter([f for i in range(0, len(windows), group) for f in self.detector.speech(windows[i : i + group])])
        return [[next(flags) for _ in c.windows] for c in chunks]

    def __call__(self, batch: dict) -> dict:
        started = time.perf_counter()
        with self.lock:
            self.count += 1
            call_id = next(self.ids)
        self._crash_if_asked()
        items = [pickle.loads(p) for p in batch["payload"]]
        chunks = [c for c in items if isinstance(c, Chunk)]
        call = self.calls[call_id] = _Call(len(chunks))
        speech = self._speech(chunks)
        for chunk, flags in zip(chunks, speech):
            plan, windows = chunk.plan, [w for w, f in zip(chunk.windows, flags) if f]
            self.feed.put(Recording((call_id, plan.key, chunk.number), windows, plan.prompts,
                                    plan.language, plan.speech_ends, plan.span))  # fmt: skip
        call.done.wait()
        del self.calls[call_id]
        if self.error is not None:
            raise RuntimeError(f"the worker's scheduler failed: {self.error!r}") from self.error
        out = [ChunkDone(c.plan.key, c.number, sorted(call.results.get((c.plan.key, c.number), []), key=lambda r: r.window.index),
                         c.skipped_before, tuple((w.index, w.duration) for w, f in zip(c.windows, flags) if not f))
               for c, flags in zip(chunks, speech)]  # fmt: skip
        out += [item for item in items if isinstance(item, FileEnd)]
        scheduler = self.scheduler
        _log(f"call {call_id}: {len(chunks)} chunks, {len(self.calls)} calls open, from {started - self.ready:.2f} s in "
             f"{time.perf_counter() - started:.2f} s; so far {scheduler.batches} batches, "
             f"{scheduler.rows_used / max(1, scheduler.batches * scheduler.options.batch_size):.1%} of rows used")
        return {"payload": [pickle.dumps(item) for item in out]}


def _log(line: str) -> None:
    """A worker's own log line (Ray keeps it in the worker's log, never on the driver's terminal)."""
    print(f"wtx worker: {line}", file=sys.stderr, flush=True)


def _cut_rows(row: dict) -> Iterator[dict]:
    started = time.time()
    for item in cut_file(pickle.loads(row["payload"])):
        yield {"payload": pickle.dumps(item)}
    ended = time.time()
    _log(f"cut {os.path.basename(item.key)} in {ended - started:.2f} s, ending at {ended:.2f}")


def run(ray, recordings: Iterable[Recording], settings: Settings, resolved: Resolved,
        options: ClusterOptions, workers: int) -> Iterator[WindowDone | RecordingDone]:  # fmt: skip
    """The scheduler's events for `recordings` (their windows: AudioReaders, not yet read),
    decoded on the cluster; each reader's seconds and warnings are filled in before its
    RecordingDone, as reading it in this process would have."""
    engine = settings.engine
    plans, readers, silent = [], {}, {}
    for recording in recordings:
        reader = recording.windows
        if not isinstance(reader, AudioReader):  # it could not be opened: its windows raise why
            try:
                list(reader)
            except Exception as e:
                yield RecordingDone(recording.key, e)
            continue
        span = chunk_span(resolved.max_prompt, engine.stream_windows)
        plans.append(FilePlan(recording.key, reader.split, span, recording.language, frozenset(reader.skip),
                              dict(recording.prompts), dict(recording.speech_ends)))  # fmt: skip
        readers[recording.key] = reader
        silent[recording.key] = recording.silent
    if not plans:
        return
    gpus = 1 if resolved.device == "cuda" else 0
    # calls run side by side in each worker (Ray Data runs one at a time unless told), all
    # feeding its one scheduler
    pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=CALLS_IN_FLIGHT,
                                      max_concurrent_calls_per_actor=CALLS_IN_FLIGHT, enable_true_multi_threading=True)
    dataset = (
        ray.data.from_items([{"payload": pickle.dumps(p)} for p in plans], override_num_blocks=len(plans))
        .flat_map(_cut_rows, num_cpus=options.cpus_per_worker)
        .map_batches(ChunkDecoder, fn_constructor_kwargs={"settings": settings}, batch_size=engine.batch_size,
                     compute=pool, num_gpus=gpus, num_cpus=0 if gpus else 1, batch_format="numpy")
    )  # fmt: skip
    got: dict[str, set[int]] = {key: set() for key in readers}
    ends: dict[str, FileEnd] = {}
    for row in dataset.iter_rows():
        item = pickle.loads(row["payload"])
        key = item.key
        if key not in readers:
            continue  # finished already: a retried call's copy
        if isinstance(item, ChunkDone):
            if item.number in got[key]:
                continue
            got[key].add(item.number)
            readers[key].skipped_before.update(item.skipped_before)
            if silent[key] is not None:
                for index, duration in item.silent:
                    silent[key](index, duration)
            for result in item.results:
                yield WindowDone(key, result)
        else:
            ends[key] = item
        end = ends.get(key)
        if end is not None and (end.error is not None or end.numbers <= got[key]):
            reader = readers.pop(key)
            reader.seconds = end.seconds
            reader.warnings.extend(end.warnings)
            yield RecordingDone(key, end.error)


@contextlib.contextmanager
def quiet_output():
    """Points this process's stdout and stderr (the file descriptors: Ray writes from C++ too)
    at a private log file while Ray runs; yields (stdout, stderr) for wtx's own data and progress,
    and the log's path."""
    import sys

    fd, log = tempfile.mkstemp(prefix="wtx-ray-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved[0]), "w", encoding=sys.stdout.encoding, errors=sys.stdout.errors)
    err = os.fdopen(os.dup(saved[1]), "w", encoding=sys.stderr.encoding, errors="backslashreplace")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield out, err, log
    finally:
        for stream in (out, err, sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved:
            os.close(f)
        for stream in (out, err):
            with contextlib.suppress(OSError, ValueError):
                stream.close()

