#!/usr/bin/env python3
"""Which windows the voice-activity detector drops, per file, and what scoring them costs.

    python scripts/vad_windows.py ../shared/tts/*.mp3 --json docs/bench/vad_windows_cpu.json

Windows are cut as `wtx transcribe` cuts them (--split silence); a file whose windows all hold
speech is transcribed exactly as without the detector, so its WER cannot change.
"""

import argparse
import json
import platform
import sys
import time

import torch

from wtx import __version__
from wtx.audio import stream_samples
from wtx.split import make_windows
from wtx.vad import CUDA_GROUP, CUDA_PARTS, GROUP, PARTS, load_detector, speech_windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--split", default="silence", choices=("silence", "fixed"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    detector = load_detector()
    if detector is None:
        sys.exit("silero-vad is not installed")
    rows = []
    for path in args.files:
        windows = list(make_windows(stream_samples(path), args.split))
        started = time.perf_counter()
        kept = {w.index for w in speech_windows(windows, detector)}
        seconds = time.perf_counter() - started
        audio = sum(w.duration for w in windows)
        dropped = [{"index": w.index, "offset": round(w.offset, 2), "duration": round(w.duration, 2)}
                   for w in windows if w.index not in kept]  # fmt: skip
        rows.append({"file": path, "windows": len(windows), "dropped": dropped, "audio_s": round(audio, 1),
                     "vad_s": round(seconds, 2), "vad_rtfx": round(audio / seconds, 1)})  # fmt: skip
        print(f"{path}: {len(dropped)} of {len(windows)} windows dropped; scored {audio:.0f} s of audio "
              f"in {seconds:.2f} s ({audio / seconds:.0f}x real time)", file=sys.stderr)  # fmt: skip
    if args.json:
        meta = {"wtx": __version__, "torch": torch.__version__, "threads": args.threads, "split": args.split,
                "group": GROUP, "cuda_group": CUDA_GROUP, "parts": PARTS, "cuda_parts": CUDA_PARTS, "machine": platform.processor() or platform.machine()}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "files": rows}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
