#!/usr/bin/env python3
"""How fast the audio side runs, apart from decoding: each file decoded (ffmpeg or PyAV), cut
into windows ending in pauses and, with --vad, scored by Silero VAD, as `wtx transcribe` reads it.

    python scripts/read_speed.py FILES... --vad --device cuda --repeat 3 --json read.json

Each file is read --repeat times one after another (the first pass also warms the detector), and
once more with every file in its own thread at the same time. The report: seconds and audio
seconds per second for each file, for all files in sequence and for the threads together; set it
against the decoding rate to see whether the reader keeps the batch rows fed.
"""

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def read(path: str, split: str, detector) -> tuple[float, float, int]:
    """(seconds taken, seconds of audio, windows kept) for one pass over one file."""
    from wtx.pipeline import AudioReader

    started = time.perf_counter()
    reader = AudioReader(path, split, detector)
    windows = sum(1 for _ in reader)  # the detector's scores are read on the host: no sync needed
    return time.perf_counter() - started, reader.seconds, windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--split", default="silence", choices=("silence", "fixed"))
    parser.add_argument("--vad", action="store_true", help="score windows with Silero VAD, as the default run does")
    parser.add_argument("--device", default=None, help="where the detector runs (default: CUDA if there, else CPU)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    from wtx.engine import pick_device

    device = pick_device(args.device)
    detector = None
    if args.vad:
        from wtx.vad import load_detector

        detector = load_detector(device)
        if detector is None:
            print("silero-vad is not installed", file=sys.stderr)
            return 1

    rows = []
    for path in args.files:
        passes = [read(path, args.split, detector) for _ in range(args.repeat)]
        seconds = statistics.median(p[0] for p in passes)
        audio, windows = passes[0][1], passes[0][2]
        rows.append({"file": Path(path).name, "audio_s": round(audio, 2), "windows": windows,
                     "pass_s": [round(p[0], 3) for p in passes], "median_s": round(seconds, 3),
                     "audio_per_s": round(audio / seconds, 1)})  # fmt: skip
        print(f"{Path(path).name}: {audio:.0f} s of audio, {windows} windows, {seconds:.3f} s "
              f"({audio / seconds:.0f}x real time)", file=sys.stderr)  # fmt: skip

    results: dict[str, tuple] = {}

    def one(path):
        results[path] = read(path, args.split, detector)

    threads = [threading.Thread(target=one, args=(p,)) for p in args.files]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together = time.perf_counter() - started
    audio = sum(r["audio_s"] for r in rows)
    sequence = sum(r["median_s"] for r in rows)
    report = {"audio_s": round(audio, 2), "sequential_s": round(sequence, 3), "sequential_audio_per_s": round(audio / sequence, 1),
              "threads_s": round(together, 3), "threads_audio_per_s": round(audio / together, 1)}  # fmt: skip
    result = {"command": sys.argv, "python": platform.python_version(), "torch": torch.__version__,
              "device": str(device), "cpu_threads": torch.get_num_threads(), "vad": args.vad,
              "report": report, "files": rows}  # fmt: skip
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    for key, value in report.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
