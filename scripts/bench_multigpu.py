#!/usr/bin/env python3
"""One long job on 1 and N GPUs of one host with `--ray local`: scaling, identity, a killed worker.

    python3 scripts/bench_multigpu.py BOOKS... --hours 20 --clips 200 --gpus 1,8 --kill \
        --json out.json -- --model tiny.en --compile

The job: copies of the long files (`BOOKS`) until they make `--hours` of audio, plus `--clips`
short WAV clips (2 to 25 s, seeded) cut from them. A small run first fills the compile cache
(its cold compile is reported apart); then the whole job runs on each GPU count in `--gpus`
(`CUDA_VISIBLE_DEVICES` set to the first N, one worker per GPU), each a fresh process timed from
its start to its exit, every output written. Reported per count: the wall clock, audio seconds per
second, the scaling efficiency (N-GPU throughput over N times the 1-GPU throughput), each GPU's
mean utilisation (`nvidia-smi`, every 0.5 s), how full the workers kept their batch rows, and
whether every output equals the 1-GPU run's byte for byte. With `--kill`, the largest count runs
once more and one worker (a process using the last GPU) is killed with SIGKILL halfway through:
the job must finish with the same bytes, and the time lost is reported. The CPU stage (decoding
and cutting the whole job, one process per core) is timed alone, to set against the decoding rate.

Without CUDA, the counts are CPU workers (`--workers N`), and the killed worker is found by name.
"""

import argparse
import functools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench_ray import differing, digests, outputs, worker_lines  # noqa: E402
from read_speed import read  # noqa: E402

ROWS_USED = re.compile(r"([\d.]+)% of rows used")


def make_job(books: list[str], hours: float, clips: int, folder: Path) -> tuple[list[Path], float]:
    """Copies of the books until `hours`, and `clips` WAV clips cut from them: (files, audio seconds)."""
    from wtx.audio import SAMPLE_RATE, load_audio

    folder.mkdir(parents=True)
    audio = {book: load_audio(book) for book in books}
    files, seconds, k = [], 0.0, 0
    while seconds < hours * 3600:
        book = books[k % len(books)]
        copy = folder / f"{k:03d}_{Path(book).name}"
        shutil.copyfile(book, copy)
        files.append(copy)
        seconds += len(audio[book]) / SAMPLE_RATE
        k += 1
    rng = random.Random(0)
    for c in range(clips):
        samples = audio[books[c % len(books)]]
        length = int(rng.uniform(2, 25) * SAMPLE_RATE)
        start = rng.randrange(0, max(1, len(samples) - length))
        clip = folder / f"clip_{c:03d}.wav"
        with wave.open(str(clip), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(SAMPLE_RATE)
            w.writeframes((np.clip(samples[start : start + length], -1, 1) * 32767).astype("<i2").tobytes())
        files.append(clip)
        seconds += length / SAMPLE_RATE
    return files, seconds


def cpu_stage(files: list[Path]) -> dict:
    """Decoding and cutting every file of the job, one process per core (no voice detection)."""
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(os.cpu_count()) as pool:
        passes = pool.map(functools.partial(read, split="silence", detector=None), [str(f) for f in files], chunksize=1)
    audio = sum(seconds for _, seconds, _ in passes)
    wall = time.perf_counter() - started
    return {"processes": os.cpu_count(), "wall_s": round(wall, 2), "audio_s": round(audio, 1),
            "audio_per_s": round(audio / wall, 1)}  # fmt: skip


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def kill_a_worker(gpus: int) -> dict:
    """SIGKILL to one worker: a process on the last visible GPU, or (CPU workers) one by name."""
    pids = []
    if gpus:
        uuid = subprocess.run(["nvidia-smi", "-i", str(gpus - 1), "--query-gpu=uuid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout  # fmt: skip
        pids = [int(line.split(",")[0]) for line in apps.splitlines() if line.strip().endswith(uuid)]
    else:
        pids = [int(p) for p in subprocess.run(["pgrep", "-f", "ChunkDecoder"], capture_output=True, text=True).stdout.split()]
    if not pids:
        return {"killed": None}
    os.kill(pids[-1], signal.SIGKILL)
    return {"killed": pids[-1]}


def run(job: Path, count: int, gpus: int, extra: list[str], out: Path, kill_at: float | None = None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    more = ["--ray", "local"]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(count)))
    else:
        more += ["--workers", str(count)]
    command = [sys.executable, "-m", "wtx", "transcribe", str(job), "-o", str(out), *more, *extra]
    sampler = None
    if gpus:
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits",
                                    "-lms", "500"], stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    fault: dict = {}
    if kill_at is not None:
        timer = threading.Timer(kill_at, lambda: fault.update(kill_a_worker(count if gpus else 0), at_s=kill_at))
        timer.start()
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if kill_at is not None:
        timer.cancel()  # a job that ended first kills nothing afterwards
    utilisation: dict[str, list[float]] = {}
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)
        for line in sampler.communicate()[0].splitlines():
            index, value = line.split(",")
            if int(index) < count:
                utilisation.setdefault(index.strip(), []).append(float(value))
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [float(m.group(1)) for line in worker_lines() if (m := ROWS_USED.search(line))]
    return {"count": count, "wall_s": round(wall, 2), "fault": fault or None,
            "utilisation_mean": {i: round(sum(v) / len(v), 1) for i, v in utilisation.items()},
            "rows_used_last_calls": rows[-count:], "summary": [line for line in proc.stderr.splitlines() if "transcribed" in line or "ready" in line][-3:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("books", nargs="+")
    parser.add_argument("--hours", type=float, default=20.0)
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--gpus", default="1,8", help="GPU counts (CPU workers without CUDA), the first the baseline")
    parser.add_argument("--kill", action="store_true", help="once more at the largest count, killing a worker halfway")
    parser.add_argument("--json", type=Path)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    counts = [int(n) for n in args.gpus.split(",")]
    gpus = gpu_count()
    if gpus and max(counts) > gpus:
        sys.exit(f"{max(counts)} GPUs asked for, {gpus} here")
    root = Path(tempfile.mkdtemp(prefix="wtx-multigpu-"))
    files, audio = make_job(args.books, args.hours, args.clips, root / "job")
    print(f"job: {len(files)} files, {audio / 3600:.2f} h", file=sys.stderr, flush=True)
    report = {"books": args.books, "files": len(files), "audio_s": round(audio, 1), "extra": extra, "gpus_here": gpus,
              "cpu_stage": cpu_stage(files)}  # fmt: skip
    print(f"CPU stage: {report['cpu_stage']}", file=sys.stderr, flush=True)
    warm = root / "warm"
    warm.mkdir()
    for f in files[-8:]:
        shutil.copyfile(f, warm / f.name)
    report["warm_up"] = run(warm, max(counts), gpus, extra, root / "warm_out")
    runs, reference = [], None
    for count in counts:
        result = run(root / "job", count, gpus, extra, root / f"out{count}")
        written = outputs(root / f"out{count}")
        reference = reference or written
        result["identical"] = not differing(written, reference)
        result["audio_per_s"] = round(audio / result["wall_s"], 1)
        result["efficiency"] = round(result["audio_per_s"] / (count * runs[0]["audio_per_s"] / runs[0]["count"]), 3) if runs else 1.0
        runs.append(result)
        print(f"{count}: {result['wall_s']} s, {result['audio_per_s']}x, efficiency {result['efficiency']}, "
              f"identical {result['identical']}, utilisation {result['utilisation_mean']}", file=sys.stderr, flush=True)  # fmt: skip
    report["runs"] = runs
    if args.kill:
        clean = runs[-1]
        result = run(root / "job", clean["count"], gpus, extra, root / "fault", kill_at=clean["wall_s"] / 2)
        result["identical"] = not differing(outputs(root / "fault"), reference)
        result["lost_s"] = round(result["wall_s"] - clean["wall_s"], 2)
        report["fault"] = result
        print(f"killed {result['fault']}: {result['wall_s']} s ({result['lost_s']:+.1f} s), identical {result['identical']}",
              file=sys.stderr, flush=True)  # fmt: skip
    report["sha256"] = digests(reference)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
