#!/usr/bin/env python3
"""Decoding throughput through the Python API: batch sizes, and many short files against one.

    python scripts/throughput.py FILES... --model tiny.en --compile --batch-sizes 16,32,64,128 --json b.json
    python scripts/throughput.py FILES... --model tiny.en --compile -b 32 --clips 200 --json clips.json

The files are decoded and cut into windows (pause-cut, Silero VAD) once, before any clock
starts; what is timed is the scheduler and the engine alone: `Model.run()` over in-memory
windows, synchronized before each clock read, after --warm-up untimed passes (default 1), the
median of --repeat passes. Compile (or load) time is reported apart.

--batch-sizes: every file (--copies times) through one run at each batch size; decoding RTFx and
peak device memory.
--clips N: N clips of 20 to 60 s (lengths from a fixed seed) cut one after another from the
files' audio, wrapping around when it runs out, decoded (a) as N recordings in one run and
(b) concatenated into one recording; the report gives (a)'s time over (b)'s and their RTFx.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def read_audio(path: str) -> np.ndarray:
    from wtx.audio import stream_samples

    return np.concatenate(list(stream_samples(path)))


def cut_clips(audio: np.ndarray, n: int, seed: int = 0) -> list[np.ndarray]:
    from wtx.audio import SAMPLE_RATE

    lengths = np.random.default_rng(seed).uniform(20, 60, n)
    clips, start = [], 0
    for seconds in lengths:
        size = int(seconds * SAMPLE_RATE)
        if start + size > len(audio):
            start = 0
        clips.append(audio[start : start + size])
        start += size
    return clips


def windows_of(model, audio: np.ndarray) -> list:
    from wtx.pipeline import AudioReader

    return list(AudioReader(audio, "silence", model.detector))


def timed_runs(model, recordings: list[tuple[str, list]], repeat: int, warm_up: int = 1) -> list[float]:
    """Seconds per pass of every recording through one scheduler run, after `warm_up` passes."""
    import torch

    from wtx.streams import Recording, RecordingDone

    language = model.engine.options.decoding.language or "en"
    seconds = []
    for i in range(warm_up + repeat):
        batch = [Recording(key, iter(ws), {}, language) for key, ws in recordings]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        done = sum(isinstance(e, RecordingDone) and e.error is None for e in model.run(batch))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if done != len(batch):
            raise RuntimeError(f"{len(batch) - done} recordings failed")
        if i >= warm_up:
            seconds.append(time.perf_counter() - started)
    return seconds


def load(args, batch_size: int):
    import wtx

    started = time.perf_counter()
    model = wtx.load_model(args.model, device=args.device, dtype=args.dtype, compile=args.compile,
                           batch_size=batch_size, strict=args.compile, beam_size=args.beam_size)  # fmt: skip
    report = model.engine.compile_report
    return model, {"load_s": round(time.perf_counter() - started, 2),
                   "compile": report.source if report else "eager", "compile_s": round(report.seconds, 2) if report else 0}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--batch-sizes", help="comma-separated batch sizes to measure on the files")
    parser.add_argument("--clips", type=int, help="measure N clips against their concatenation")
    parser.add_argument("--copies", type=int, default=1, help="each file this many times, as separate recordings")
    parser.add_argument("--beam-size", type=int, default=5, help="beams per window (wtx's default 5; 1: greedy)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm-up", type=int, default=1, help="untimed passes first (eager on a CPU needs none)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    from wtx.audio import SAMPLE_RATE

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    audios = {Path(f).name: read_audio(f) for f in args.files}
    meta = {"model": args.model, "compile": args.compile, "beam_size": args.beam_size, "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
            "threads": torch.get_num_threads(), "files": list(audios), "copies": args.copies, "repeat": args.repeat,
            "warm_up": args.warm_up,
            "audio_s": round(args.copies * sum(len(a) for a in audios.values()) / SAMPLE_RATE, 1)}  # fmt: skip
    result: dict = {"meta": meta}
    windows = None
    if args.batch_sizes:
        rows = []
        for b in [int(x) for x in args.batch_sizes.split(",")]:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            model, loaded = load(args, b)
            if windows is None:  # VAD and cutting are the same for every batch size
                windows = [(name, windows_of(model, audio)) for name, audio in audios.items()]
                windows = [(f"{name}#{i}", ws) for i in range(args.copies) for name, ws in windows]
            passes = timed_runs(model, windows, args.repeat, args.warm_up)
            median = statistics.median(passes)
            row = {"batch_size": b, **loaded, "passes_s": [round(s, 3) for s in passes], "median_s": round(median, 3),
                   "rtfx": round(meta["audio_s"] / median, 1),
                   "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}  # fmt: skip
            rows.append(row)
            log(f"batch {b}: {row['compile']} in {row['compile_s']} s; {median:.2f} s per pass, {row['rtfx']}x real time")
            del model
        result["batch_sizes"] = rows
    if args.clips:
        model, loaded = load(args, args.batch_size)
        clips = cut_clips(np.concatenate(list(audios.values())), args.clips)
        clip_s = sum(len(c) for c in clips) / SAMPLE_RATE
        many = [(f"clip{i:03d}", windows_of(model, c)) for i, c in enumerate(clips)]
        joined = np.concatenate(clips)
        one = [("joined", windows_of(model, joined))]
        apart = statistics.median(timed_runs(model, many, args.repeat, args.warm_up))
        together = statistics.median(timed_runs(model, one, args.repeat, args.warm_up))
        result["clips"] = {"batch_size": args.batch_size, **loaded, "clips": args.clips, "audio_s": round(clip_s, 1),
                           "windows_clips": sum(len(w) for _, w in many), "windows_joined": len(one[0][1]),
                           "clips_s": round(apart, 3), "joined_s": round(together, 3),
                           "clips_rtfx": round(clip_s / apart, 1), "joined_rtfx": round(clip_s / together, 1),
                           "time_ratio": round(apart / together, 3), "rtfx_share": round(together / apart, 3)}  # fmt: skip
        log(f"{args.clips} clips ({clip_s / 60:.1f} min): {apart:.2f} s ({clip_s / apart:.1f}x); "
            f"joined: {together:.2f} s ({clip_s / together:.1f}x); time ratio {apart / together:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
