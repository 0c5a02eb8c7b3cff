#!/usr/bin/env python3
"""A whole archive job in whole `wtx transcribe` processes: wall clock, GPU and host busy shares.

    python scripts/bench_archive.py [BOOKS...] --copies 20 --modes txt,greedy,compile \
        --cores 4,16 --repeat 3 --json out.json [--baseline-src .gpu/base/src] [-- wtx args]

The job: --copies copies of each book (default: the mp3s of ../shared/tts) under distinct names in
one folder (real copies: wtx takes hard links to one file, --link, as one input). Each mode
(--modes: defaults, txt, greedy, compile, base; see MODES) runs the whole job as a fresh process
pinned to the first N allowed cores (`taskset`, one N per --cores entry; counts above the cores
here are skipped): --warm-up untimed runs per mode and variant first (page cache, compiled
artifacts), then --repeat timed rounds. With --baseline-src, every round runs the current code and
then the baseline (PYTHONPATH set to that copy of another commit's src), so drift hits both.

Per run: the wall clock (start to exit, every output written), RTFx (job audio over wall), the
summary line's own RTFx, the GPU's busy share (NVML or `nvidia-smi`, every 0.2 s: the whole run,
and from the first to the last nonzero sample), the host busy share (CPU time of the process tree
over wall and cores) and the md5 of every output. All runs of a mode, every variant and core count,
must write the same bytes. --json keeps every run and the environment, rewritten after each run;
stdout gets a markdown table of medians at the end, stderr the progress.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench_ray import differing, outputs
from startup import _median, log, timed

ROOT = Path(__file__).resolve().parents[1]
BOOKS = ROOT.parent / "shared" / "tts"
SAMPLE = ROOT / "src" / "wtx" / "assets" / "sample.mp3"
MODES = {
    "defaults": [],
    "txt": ["-f", "txt"],
    "greedy": ["-f", "txt", "--beam-size", "1"],
    "compile": ["--compile"],
    "base": ["-m", "base"],
}
DEFAULTS = {"copies": 20, "modes": "defaults,txt,greedy,compile", "cores": None, "repeat": 3}
QUICK = {"copies": 2, "modes": "txt", "cores": None, "repeat": 1}
SUMMARY = re.compile(
    r"transcribed (\d+)/(\d+) inputs.*?, ((?:\d+:)?\d+:\d\d) of audio in ([\d.]+) s "
    r"\(([\d.]+)x real time\)"
)
INTERVAL_MS = 200
MEDIANS = (
    "wall_s",
    "rtfx",
    "summary_rtfx",
    "gpu_busy_pct",
    "gpu_busy_decoding_pct",
    "host_busy_pct",
)


def build_job(books: list[Path], copies: int, folder: Path, link: bool) -> list[Path]:
    """`copies` copies of every book in `folder`, named NNN_<book name> so that no two share a
    name: real copies, or hard links with `link`. Returns the files, copy by copy."""
    folder.mkdir(parents=True)
    files = []
    for c in range(copies):
        for book in books:
            copy = folder / f"{c:03d}_{book.name}"
            if link:
                os.link(book, copy)
            else:
                shutil.copyfile(book, copy)
            files.append(copy)
    return files


def job_audio_s(books: list[Path], copies: int) -> float | None:
    """The job's audio seconds from the books' container headers (None if one is unknown)."""
    sys.path.insert(0, str(ROOT / "src"))
    from wtx.audio import probe_duration

    durations = [probe_duration(str(book)) for book in books]
    return None if None in durations else copies * sum(durations)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, in order (os.cpu_count() where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


class GpuSampler:
    """The busy share (utilization.gpu, percent) of the first visible GPU every INTERVAL_MS from
    start() to stop(): through NVML where pynvml imports, else an `nvidia-smi -lms` child process;
    stop() returns the samples, or None where neither is there."""

    def __init__(self) -> None:
        self.device = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        self.samples: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.done = threading.Event()
        self.source = None

    def start(self) -> None:
        """Begin sampling; samples nothing (stop() gives None) without NVML and nvidia-smi."""
        nvml = self._nvml()
        if nvml is not None:
            self.source = "nvml"
            self.thread = threading.Thread(target=self._poll, args=nvml, daemon=True)
            self.thread.start()
            return
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "-i", self.device, "--query-gpu=utilization.gpu"]
            query += ["--format=csv,noheader,nounits", "-lms", str(INTERVAL_MS)]
            self.source = "nvidia-smi"
            self.proc = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)

    def _nvml(self) -> tuple | None:
        """pynvml and the device's handle, or None (no pynvml, no driver, a device UUID)."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(self.device))
        except (pynvml.NVMLError, ValueError):
            return None

    def _poll(self, pynvml, handle) -> None:
        while not self.done.wait(INTERVAL_MS / 1000):
            self.samples.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

    def stop(self) -> list[float] | None:
        """End sampling and return the samples (percent), or None where nothing sampled."""
        if self.thread is not None:
            self.done.set()
            self.thread.join()
        elif self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            out = self.proc.communicate()[0]
            self.samples = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]
        else:
            return None
        return self.samples


def gpu_busy(samples: list[float] | None) -> dict:
    """Mean busy percent over the whole run and over its decoding phase, taken as the samples
    from the first nonzero one to the last (None without samples, or no nonzero one)."""
    if not samples:
        return dict.fromkeys(
            ("gpu_busy_pct", "gpu_busy_decoding_pct", "gpu_samples", "gpu_decoding_samples")
        )
    nonzero = [i for i, v in enumerate(samples) if v > 0]
    active = samples[nonzero[0] : nonzero[-1] + 1] if nonzero else []
    return {
        "gpu_busy_pct": round(statistics.fmean(samples), 1),
        "gpu_busy_decoding_pct": round(statistics.fmean(active), 1) if active else None,
        "gpu_samples": len(samples),
        "gpu_decoding_samples": len(active),
    }


def summary(stderr: str) -> dict:
    """The numbers of wtx's summary line ("transcribed N/M inputs, H:MM:SS of audio in X s
    (Yx real time)"), None each where the line is missing."""
    match = SUMMARY.search(stderr)
    if not match:
        return {"inputs": None, "summary_audio_s": None, "summary_s": None, "summary_rtfx": None}
    done, total, clock, seconds, rtfx = match.groups()
    audio = sum(int(part) * 60**i for i, part in enumerate(reversed(clock.split(":"))))
    return {
        "inputs": f"{done}/{total}",
        "summary_audio_s": audio,
        "summary_s": float(seconds),
        "summary_rtfx": float(rtfx),
    }


def md5s(folder: Path) -> dict[str, str]:
    """The md5 of every output file in `folder` (bench_ray.outputs: hidden files left out)."""
    if not folder.is_dir():
        return {}
    return {name: hashlib.md5(data).hexdigest() for name, data in outputs(folder).items()}


def run_once(command: list[str], env: dict, out: Path, cores: int, audio_s: float | None) -> dict:
    """One fresh `wtx transcribe` process, timed from start to exit, with the GPU sampled over
    it and the CPU time of its process tree (RUSAGE_CHILDREN, read before the sampler's own
    child is reaped). The row keeps the md5 of every output; the outputs are removed."""
    shutil.rmtree(out, ignore_errors=True)
    sampler = GpuSampler()
    sampler.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, proc, summary_at = timed(command, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    samples = sampler.stop()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    own = summary(proc.stderr)
    audio = audio_s or own["summary_audio_s"]
    row = {
        "returncode": proc.returncode,
        "wall_s": round(wall, 3),
        "rtfx": round(audio / wall, 1) if audio else None,
        **own,
        "exit_after_summary_s": round(wall - summary_at, 3) if summary_at is not None else None,
        **gpu_busy(samples),
        "gpu_sampler": sampler.source,
        "cpu_s": round(cpu, 2),
        "cpu_per_wall": round(cpu / wall, 2),
        "host_busy_pct": round(100 * cpu / wall / cores, 1),
        "md5": md5s(out),
    }
    if proc.returncode != 0:
        row["stderr_tail"] = proc.stderr[-3000:]
    shutil.rmtree(out, ignore_errors=True)
    return row


def variant_env(src: Path) -> dict:
    """This environment with `src` first on PYTHONPATH (a folder holding the wtx package)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])),
    }


def package_of(env: dict) -> dict:
    """Which wtx a variant's environment imports, and its version (this interpreter)."""
    code = "import wtx; print(wtx.__file__); print(getattr(wtx, '__version__', None))"
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-500:]}
    module, version = proc.stdout.splitlines()[:2]
    return {"module": module, "version": version}


def environment(variants: dict[str, Path], wtx: list[str]) -> dict:
    """Versions, hardware and the code each variant runs, for the JSON."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "wtx_command": wtx,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": len(allowed_cpus()),
    }
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:
        env.update(torch=None, cuda=None)
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    env["gpus"] = None
    if shutil.which("nvidia-smi"):
        gpus = subprocess.run(smi, check=False, capture_output=True, text=True)
        env["gpus"] = gpus.stdout.strip().splitlines() if gpus.returncode == 0 else None
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=False, capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"],
        check=False,
        capture_output=True,
        text=True,
    )
    env["git_commit"] = head.stdout.strip() if head.returncode == 0 else None
    env["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    env["variants"] = {
        name: {"src": str(src), **package_of(variant_env(src))} for name, src in variants.items()
    }
    return env


def identity(runs: list[dict]) -> dict:
    """Per mode: whether every successful run (warm-ups included) wrote the bytes of the mode's
    first, and the files that differ anywhere. Marks each run with its own `differs`."""
    result = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        done = [r for r in runs if r["mode"] == mode and r["returncode"] == 0]
        reference = done[0]["md5"] if done else {}
        names: set[str] = set()
        for r in done:
            r["differs"] = differing(r["md5"], reference)
            names.update(r["differs"])
        result[mode] = {
            "identical": bool(done) and not names,
            "differing": sorted(names),
            "files": len(reference),
            "reference_md5": reference,
        }
    return result


def rows(runs: list[dict]) -> list[dict]:
    """The medians of the timed runs for every (mode, cores, variant), in the order run."""
    table = []
    keys = dict.fromkeys((r["mode"], r["cores"], r["variant"]) for r in runs if not r["warm_up"])
    for mode, cores, variant in keys:
        group = [r for r in runs if (r["mode"], r["cores"], r["variant"]) == (mode, cores, variant)]
        done = [r for r in group if r["returncode"] == 0]
        timed_ok = [r for r in done if not r["warm_up"]]
        table.append(
            {
                "mode": mode,
                "cores": cores,
                "variant": variant,
                "runs": len(timed_ok),
                "failed": sum(r["returncode"] != 0 for r in group if not r["warm_up"]),
                **{key: _median([r[key] for r in timed_ok]) for key in MEDIANS},
                "identical": all(not r.get("differs") for r in done) if done else None,
            }
        )
    return table


def cell(value) -> str:
    """A number for the table: one decimal for floats, '-' for None."""
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def gpu_cell(row: dict) -> str:
    """The GPU busy percent of a run or row: whole run / decoding phase ('-' unsampled)."""
    if row["gpu_busy_pct"] is None:
        return "-"
    return f"{cell(row['gpu_busy_pct'])} / {cell(row['gpu_busy_decoding_pct'])}"


def markdown(table: list[dict]) -> str:
    """The table of medians as markdown: GPU busy as whole run / decoding phase, in percent."""
    head = ["mode", "cores", "variant", "wall s", "RTFx", "wtx RTFx", "GPU busy %", "host busy %"]
    lines = ["| " + " | ".join([*head, "identical"]) + " |", "|---" * (len(head) + 1) + "|"]
    for r in table:
        wall = cell(r["wall_s"]) + (f" ({r['failed']} failed)" if r["failed"] else "")
        cells = [r["mode"], r["cores"], r["variant"], wall, cell(r["rtfx"])]
        cells += [cell(r["summary_rtfx"]), gpu_cell(r), cell(r["host_busy_pct"])]
        cells.append(cell(r["identical"]))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def write_json(path: Path | None, report: dict) -> None:
    """The report to `path`, replaced whole (a run cut short still leaves the runs so far)."""
    if path is not None:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(partial, path)


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The options, with --quick's or the full job's defaults where an option was not given;
    the arguments after `--` go to every wtx run."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "books", nargs="*", type=Path, help="long recordings (default: ../shared/tts/*.mp3)"
    )
    parser.add_argument("--copies", type=int, help="copies of each book in the job (default 20)")
    parser.add_argument(
        "--modes", help=f"comma-separated, of {', '.join(MODES)} (default {DEFAULTS['modes']})"
    )
    parser.add_argument("--cores", help="comma-separated host core counts (default: all allowed)")
    parser.add_argument(
        "--repeat", type=int, help="timed runs per mode, core count and variant (default 3)"
    )
    parser.add_argument(
        "--warm-up", type=int, default=1, help="untimed runs per mode and variant first"
    )
    parser.add_argument(
        "--wtx", default="python -m wtx", help="the wtx command ('python': this interpreter)"
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another commit's src (or a folder holding src/): run in turns",
    )
    parser.add_argument(
        "--folder",
        type=Path,
        help="where the job and outputs go (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--link",
        action="store_true",
        help="hard links, not copies (wtx takes links to one file as one input)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 2 copies of the sample, txt, 1 run"
    )
    parser.add_argument("--json", type=Path)
    args, extra = parser.parse_known_args()
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not args.books:
        args.books = [SAMPLE] if args.quick else sorted(BOOKS.glob("*.mp3"))
    unknown = set(args.modes.split(",")) - MODES.keys()
    if unknown or not args.books:
        parser.error(
            f"unknown modes {sorted(unknown)}" if unknown else f"no books in {BOOKS}: name some"
        )
    if shutil.which("taskset") is None:
        parser.error("taskset not found: it comes with util-linux")
    return args, [a for a in extra if a != "--"]


def core_counts(spec: str | None) -> list[int]:
    """The core counts asked for that this host allows (all allowed cores by default)."""
    allowed = len(allowed_cpus())
    counts = [int(n) for n in spec.split(",")] if spec else [allowed]
    for n in counts:
        if n > allowed:
            log(f"skipping {n} cores: {allowed} allowed here")
    return [n for n in counts if n <= allowed]


def main() -> int:
    args, extra = parse_args()
    modes = args.modes.split(",")
    counts = core_counts(args.cores)
    if not counts:
        sys.exit("no core count fits this host")
    wtx = shlex.split(args.wtx)
    wtx[0] = sys.executable if wtx[0] == "python" else wtx[0]
    variants = {"current": ROOT / "src"}
    if args.baseline_src:
        base = args.baseline_src.resolve()
        variants["baseline"] = base / "src" if (base / "src" / "wtx").is_dir() else base
    top = args.folder or Path(tempfile.mkdtemp(prefix="wtx-archive-"))
    if (top / "job").exists():
        sys.exit(f"{top / 'job'} exists: name a --folder without a job in it")
    files = build_job([b.resolve() for b in args.books], args.copies, top / "job", args.link)
    audio_s = job_audio_s(args.books, args.copies)
    log(f"job: {len(files)} files, {audio_s or 0:.0f} s of audio, in {top / 'job'}")
    report = {
        "environment": environment(variants, wtx),
        "books": [str(b) for b in args.books],
        "copies": args.copies,
        "files": len(files),
        "audio_s": audio_s,
        "link": args.link,
        "modes": {m: MODES[m] + extra for m in modes},
        "cores": counts,
        "repeat": args.repeat,
        "warm_up": args.warm_up,
        "gpu_interval_ms": INTERVAL_MS,
        "runs": [],
    }
    runs = report["runs"]

    def one(mode: str, cores: int, variant: str, i: int, warm_up: bool) -> None:
        out = top / "out" / mode / f"{variant}-c{cores}-{i}"
        pin = ["taskset", "-c", ",".join(map(str, allowed_cpus()[:cores]))]
        command = [*pin, *wtx, "transcribe", *map(str, files), "-o", str(out)]
        command += report["modes"][mode]
        row = {
            "mode": mode,
            "cores": cores,
            "variant": variant,
            "run": i,
            "warm_up": warm_up,
            **run_once(command, variant_env(variants[variant]), out, cores, audio_s),
        }
        runs.append(row)
        report["identity"] = identity(runs)
        write_json(args.json, report)
        log(
            f"{mode}, {cores} cores, {variant}, {'warm-up' if warm_up else 'run'} {i}: "
            f"exit {row['returncode']}, {row['wall_s']:.1f} s, {row['rtfx']}x "
            f"(wtx {row['summary_rtfx']}x, {row['inputs']} inputs), GPU busy {gpu_cell(row)}, "
            f"host {row['host_busy_pct']} %, same bytes {not row.get('differs')}"
        )
        if row["returncode"] != 0:
            log(row["stderr_tail"][-800:])

    for mode in modes:
        for variant in variants:
            for i in range(args.warm_up):
                one(mode, max(counts), variant, i, warm_up=True)
        for cores in counts:
            for i in range(args.repeat):
                for variant in variants:  # in turns, so drift hits every variant alike
                    one(mode, cores, variant, i, warm_up=False)
    report["table"] = rows(runs)
    write_json(args.json, report)
    if not (args.folder or args.keep):
        shutil.rmtree(top, ignore_errors=True)
    print(markdown(report["table"]))
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
