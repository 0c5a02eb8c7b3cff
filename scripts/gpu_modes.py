#!/usr/bin/env python3
"""The decoding modes on a GPU machine without ffmpeg: timestamps with prompts (`--timestamps`),
text only with each window alone (the default), and timestamps with each window alone.

    python scripts/gpu_modes.py prepare --out .gpu/windows.npz --texts .gpu/texts     # here
    python scripts/gpu_modes.py run --windows .gpu/windows.npz --texts .gpu/texts \\
        --weights /tmp/tiny.en.pt --json $OUT/gpu_modes.json                          # there

`prepare` cuts the three books of ../shared/tts into wtx's windows (pause cuts, Silero VAD) and
stores each window's audio in 8-bit mu-law (about 43 MB), with the reference texts beside them.
`run` decodes every window of the three books through one scheduler per mode (fp16, CUDA graphs
of the eager kernels, batch auto), at beam 5 and 1: a warm-up pass, then the median of three
(synchronized), the batches run, and the WER of each book against its reference.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SHARED = ROOT.parent / "shared"
BOOKS = {"copperfield_ch01_slt": "dickens_copperfield_ch01.txt", "alice_ch01_espeak": "carroll_alice_ch01.txt",
         "declaration_kal": "us_declaration_of_independence.txt"}  # fmt: skip
MODES = [("timestamps, prompts (--timestamps)", dict(without_timestamps=False, condition_on_previous_text=True)),
         ("text only, each window alone (the default)", dict(without_timestamps=True, condition_on_previous_text=False)),
         ("timestamps, each window alone", dict(without_timestamps=False, condition_on_previous_text=False))]  # fmt: skip


def prepare(args) -> None:
    import torch

    from wtx.pipeline import AudioReader
    from wtx.vad import load_detector

    detector = load_detector(torch.device("cpu"))
    stored = {}
    for name, text in BOOKS.items():
        for w in AudioReader(str(SHARED / "tts" / f"{name}.mp3"), "silence", detector):
            x = np.clip(w.samples[: round(w.duration * 16000)], -1, 1)
            y = np.sign(x) * np.log1p(255 * np.abs(x)) / np.log(256)
            stored[f"{name}/{w.index}/{w.offset!r}/{w.duration!r}"] = np.round((y + 1) / 2 * 255).astype(np.uint8)
        Path(args.texts).mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED / "texts" / text, Path(args.texts) / f"{name}.txt")
    np.savez(args.out, **stored)


def load_windows(path: str) -> dict:
    from wtx.audio import N_SAMPLES, Window

    books: dict[str, list] = {}
    stored = np.load(path)
    for key in stored.files:
        name, index, offset, duration = key.split("/")
        q = stored[key].astype(np.float32) / 255 * 2 - 1
        x = np.sign(q) * (np.power(256.0, np.abs(q)) - 1) / 255
        samples = np.zeros(N_SAMPLES, np.float32)
        samples[: len(x)] = x
        books.setdefault(name, []).append(Window(int(index), float(offset), float(duration), samples))
    return {name: sorted(ws, key=lambda w: w.index) for name, ws in books.items()}


def run(args) -> None:
    import torch

    import wtx
    from wtx.metrics import wer
    from wtx.streams import Recording, RecordingDone, WindowDone

    books = load_windows(args.windows)
    audio = sum(w.duration for ws in books.values() for w in ws)
    refs = {n: (Path(args.texts) / f"{n}.txt").read_text().replace("(", " ").replace(")", " ") for n in books}
    rows = []
    for beam in (5, 1):
        for label, mode in MODES:
            model = wtx.load_model(args.weights, device="cuda", beam_size=beam, vad=False, **mode)
            batch, batches = model.engine.batch, [0]
            run_steps = batch.run_steps
            batch.run_steps = lambda: (batches.__setitem__(0, batches[0] + 1), run_steps())[1]
            seconds, texts = [], {}
            for attempt in range(4):  # a warm-up pass, then three timed
                recordings = [Recording(n, iter(ws), {}, "en") for n, ws in books.items()]
                parts: dict[str, list[str]] = {n: [] for n in books}
                batches[0] = 0
                torch.cuda.synchronize()
                started = time.perf_counter()
                for event in model.run(recordings, ordered=True):
                    if isinstance(event, WindowDone):
                        parts[event.key].extend(s.text.strip() for s in event.result.segments)
                    elif isinstance(event, RecordingDone) and event.error is not None:
                        raise event.error
                torch.cuda.synchronize()
                if attempt:
                    seconds.append(time.perf_counter() - started)
                texts = {n: " ".join(p) for n, p in parts.items()}
            wers = {n: round(100 * wer(refs[n], texts[n]), 2) for n in books}
            median = statistics.median(seconds)
            rows.append({"beam": beam, "config": label, "batch_size": model.engine.options.batch_size,
                         "seconds": [round(s, 3) for s in seconds], "median_s": round(median, 3),
                         "rtfx": round(audio / median, 1), "batches": batches[0], "wer": wers,
                         "wer_avg": round(sum(wers.values()) / len(wers), 2)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del model
            torch.cuda.empty_cache()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "audio_s": audio,
              "windows": sum(len(ws) for ws in books.values()), "rows": rows}  # fmt: skip
    Path(args.json).write_text(json.dumps(report, indent=1))
    for r in rows:
        print(f"beam {r['beam']}  {r['config']:48s} {r['median_s']:7.3f} s {r['rtfx']:8.1f}x  "
              f"batches {r['batches']:3d}  WER {r['wer_avg']}%")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", default=".gpu/windows.npz")
    p.add_argument("--texts", default=".gpu/texts")
    r = sub.add_parser("run")
    r.add_argument("--windows", default=".gpu/windows.npz")
    r.add_argument("--texts", default=".gpu/texts")
    r.add_argument("--weights", default="/tmp/tiny.en.pt")
    r.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gpu_modes.json"))
    args = parser.parse_args()
    prepare(args) if args.command == "prepare" else run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
