#!/usr/bin/env python3
"""Word error rate of wtx against stock openai-whisper `decode()` on the same fixed 30 s windows.

    python scripts/eval_wer.py [--model tiny.en] [--json out.json] [FILE REFERENCE ...]

With no files it scores ../shared/audio/lj001_0001-0032_concat.flac against its reference.
Both sides are normalized with whisper's EnglishTextNormalizer. CPU, fp32, batch 8.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [
    (ROOT.parent / "shared/audio/lj001_0001-0032_concat.flac", ROOT.parent / "shared/audio/lj001_0001-0032_concat.txt"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="*", help="audio file and reference text file, repeated")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("give audio files and reference files in pairs")
    pairs = [(Path(a), Path(r)) for a, r in zip(args.pairs[::2], args.pairs[1::2])] or DEFAULT

    import torch

    from wtx.audio import fixed_windows, stream_samples
    from wtx.engine import Engine, EngineOptions
    from wtx.metrics import word_errors
    from wtx.reference import load_stock_model, stock_decode
    from wtx.weights import load_checkpoint

    torch.set_num_threads(args.threads)
    engine = Engine(EngineOptions(model=args.model, device="cpu", dtype="fp32", batch_size=args.batch_size))
    stock = load_stock_model(load_checkpoint(args.model))
    rows = []
    for audio, reference in pairs:
        if not audio.is_file() or not reference.is_file():
            print(f"skipping {audio}: audio or reference missing", file=sys.stderr)
            continue
        windows = list(fixed_windows(stream_samples(str(audio))))
        ref = reference.read_text()
        t = time.perf_counter()
        ours = " ".join(s.text for r in engine.transcribe_windows(windows) for s in r.segments)
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        theirs = " ".join(r.text for r in stock_decode(stock, windows, args.batch_size))
        t_theirs = time.perf_counter() - t
        w_ours, w_theirs = word_errors(ref, ours), word_errors(ref, theirs)
        rows.append({
            "file": audio.name, "model": args.model, "windows": len(windows),
            "wer_wtx": w_ours.rate, "wer_stock_decode": w_theirs.rate,
            "errors_wtx": w_ours.errors, "errors_stock_decode": w_theirs.errors, "reference_words": w_ours.words,
            "seconds_wtx": t_ours, "seconds_stock_decode": t_theirs,
        })  # fmt: skip
        print(
            f"{audio.name}: WER wtx {w_ours.rate:.2%} | stock whisper.decode() {w_theirs.rate:.2%} "
            f"| difference {100 * (w_ours.rate - w_theirs.rate):+.2f} points ({len(windows)} windows, {args.model})"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
