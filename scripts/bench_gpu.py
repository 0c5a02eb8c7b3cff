#!/usr/bin/env python3
"""Everything the engine issue measures, in one run: stock openai-whisper eager against the
wtx engine (eager, compiled cold and warm) on the same windows and decoding options.

    python scripts/bench_gpu.py --model tiny.en --audio book.mp3 --json out.json
    python scripts/bench_gpu.py --random-dims large-v3,large-v3-turbo --forced-tokens 100

Real weights: greedy decoding with timestamps, PR #43's protocol (one warm-up window, then each
window decoded alone) and batches of --batch-size. Random-weight shapes: end-of-text suppressed
on both sides, so every row decodes exactly --forced-tokens tokens.
Clocks are read only after torch.cuda.synchronize(); compile time is reported apart from
steady state; every pass repeats --repeat times and the median is quoted. Works on CPU too.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wtx import __version__  # noqa: E402
from wtx.audio import CHUNK_LENGTH, fixed_windows, stream_samples  # noqa: E402
from wtx.decode import DecodingOptions  # noqa: E402
from wtx.engine import Engine, EngineOptions  # noqa: E402
from wtx.metrics import agreement  # noqa: E402
from wtx.model import load_model  # noqa: E402
from wtx.reference import load_stock_model, stock_decode  # noqa: E402
from wtx.weights import load_checkpoint  # noqa: E402

RANDOM_DIMS = {
    "large-v3": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                     n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=32),
    "large-v3-turbo": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                           n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=4),
    "small": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=768, n_audio_head=12, n_audio_layer=12,
                  n_vocab=51865, n_text_ctx=448, n_text_state=768, n_text_head=12, n_text_layer=12),
}  # fmt: skip


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def peak_memory_reset(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def n_tokens(token_lists):
    return sum(len(t) + 1 for t in token_lists)  # + end-of-text, as both decoders sample it


def run_pass(name, decode_all, windows, device, repeat, audio_seconds):
    """decode_all() -> list of token lists (one per window). Warm-up once, then `repeat` timings."""
    log(f"-- {name}: warm-up")
    decode_all(windows[:1])
    peak_memory_reset(device)
    times, tokens = [], None
    for r in range(repeat):
        seconds, tokens = timed(lambda: decode_all(windows), device)
        times.append(seconds)
        log(f"   {name}: run {r + 1}/{repeat} {seconds:.3f} s")
    median = statistics.median(times)
    return {
        "pass": name, "times_s": times, "median_s": median, "windows": len(windows),
        "s_per_window": median / len(windows), "rtfx": audio_seconds / median,
        "tokens": n_tokens(tokens), "tokens_per_s": n_tokens(tokens) / median,
        "peak_mem_mib": peak_memory(device),
    }, tokens  # fmt: skip


def stock_pass(stock, batch_size, fp16, options):
    def decode_all(ws):
        return [r.tokens for r in stock_decode(stock, ws, batch_size, fp16=fp16, **options)]

    return decode_all


def engine_pass(engine, batch_size):
    def decode_all(ws):
        out = []
        for start in range(0, len(ws), batch_size):
            out.extend(r.tokens for r in engine.decode_batch(ws[start : start + batch_size]))
        return out

    return decode_all


def text_of(tokenizer, token_lists):
    return " ".join(tokenizer.decode([t for t in tokens if t < tokenizer.eot]) for tokens in token_lists)


def bench_model(args, device, dtype_name, checkpoint, windows, label, decoding, stock_options, rows, save):
    """All passes for one model on the same windows; appends result rows, saving after each."""
    audio_seconds = len(windows) * CHUNK_LENGTH
    fp16 = dtype_name == "fp16"
    stock = load_stock_model(checkpoint, device)
    reference = {}
    for bs in args.batch_sizes:
        row, tokens = run_pass(f"stock eager b{bs}", stock_pass(stock, bs, fp16, stock_options),
                               windows, device, args.repeat, audio_seconds)  # fmt: skip
        reference[bs] = tokens
        rows.append({**row, "model": label, "batch_size": bs, "kind": "stock"})
        save()
    del stock
    torch.cuda.empty_cache() if device.type == "cuda" else None

    model = load_model(checkpoint, device, {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name])
    variants = [("wtx eager", dict(compile=False))]
    for backend in args.backends:
        variants.append((f"wtx compiled[{backend}]", dict(compile=True, step_backend=backend)))
    for bs in args.batch_sizes:
        for name, extra in variants:
            options = EngineOptions(model=label, device=str(device), dtype=dtype_name, batch_size=bs,
                                    decoding=decoding, **extra)  # fmt: skip
            t = time.perf_counter()
            engine = Engine(options, model=model)
            setup_s = time.perf_counter() - t
            report = engine.compile_report
            row, tokens = run_pass(f"{name} b{bs}", engine_pass(engine, bs), windows, device, args.repeat, audio_seconds)
            ref_text = text_of(engine.tokenizer, reference[bs])
            agree = agreement(reference[bs], tokens, ref_text, text_of(engine.tokenizer, tokens))
            stock_row = next(r for r in rows if r["pass"] == f"stock eager b{bs}" and r["model"] == label)
            rows.append({
                **row, "model": label, "batch_size": bs, "kind": name,
                "setup_s": setup_s, "compile": report.source if report else None,
                "compile_s": report.seconds if report else None,
                "speedup_vs_stock_same_batch": stock_row["median_s"] / row["median_s"],
                "identical_windows_vs_stock": agree.identical_share, "wer_vs_stock": agree.wer,
            })  # fmt: skip
            if "stock eager b1" in [r["pass"] for r in rows if r["model"] == label]:
                b1 = next(r for r in rows if r["pass"] == "stock eager b1" and r["model"] == label)
                rows[-1]["speedup_vs_stock_b1"] = b1["median_s"] / row["median_s"]
            save()
            del engine


def warm_start(args, cache_dir, model_arg, batch_size, dtype_name, device):
    """A fresh process: model load + compile (or load artifacts) + first decoded window."""
    code = f"""
import json, time, sys
t0 = time.perf_counter()
sys.path.insert(0, {str(ROOT / 'src')!r})
import numpy as np, torch
from wtx.engine import Engine, EngineOptions
from wtx.audio import fixed_windows, stream_samples
e = Engine(EngineOptions(model={model_arg!r}, device={str(device)!r}, dtype={dtype_name!r}, batch_size={batch_size}, compile=True, strict=True))
w = next(fixed_windows(stream_samples({str(args.audio)!r})))
r = e.decode_batch([w])
torch.cuda.synchronize() if torch.cuda.is_available() else None
import torch._dynamo.utils as du
print(json.dumps({{"first_window_s": time.perf_counter() - t0, "compile": e.compile_report.source,
  "compile_s": e.compile_report.seconds, "fxgraph_cache_hit": du.counters["inductor"]["fxgraph_cache_hit"],
  "fxgraph_cache_miss": du.counters["inductor"]["fxgraph_cache_miss"], "text": e.tokenizer.decode(r[0].tokens)[:80]}}))
"""
    env = {**os.environ, "WTX_CACHE_DIR": str(cache_dir)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        log(out.stderr[-3000:])
        return {"error": out.stderr[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def end_to_end(args, cache_dir, model_arg, batch_size, device):
    """`wtx transcribe FILE --compile` in a fresh process with the cache filled."""
    env = {**os.environ, "WTX_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out_dir = Path(args.out_dir) / "e2e"
    cmd = [sys.executable, "-m", "wtx", "transcribe", str(args.e2e), "--compile", "--model", model_arg,
           "-b", str(batch_size), "-o", str(out_dir), "-f", "txt", "--device", str(device)]  # fmt: skip
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    summary = [line for line in out.stderr.splitlines() if "transcribed" in line or "compiled" in line or "ready" in line]
    return {"cmd": " ".join(cmd), "returncode": out.returncode, "process_wall_s": wall, "summary": summary,
            "stderr_tail": out.stderr[-1500:] if out.returncode else ""}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", help="name or .pt path (real weights)")
    parser.add_argument("--label", help="name to report for --model (default: its file stem)")
    parser.add_argument("--audio", type=Path, help="audio for the windows (real-weight passes)")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--backends", default="inductor,eager", help="compiled step backends to time")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--random-dims", default="", help="comma list of shapes: " + ",".join(RANDOM_DIMS))
    parser.add_argument("--forced-tokens", type=int, default=100)
    parser.add_argument("--random-windows", type=int, default=32)
    parser.add_argument("--warm-start", action="store_true", help="time cold and warm first-window in fresh processes")
    parser.add_argument("--e2e", type=Path, help="run `wtx transcribe FILE --compile` end to end")
    parser.add_argument("--e2e-batch-size", type=int, default=32)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.backends = [b for b in args.backends.split(",") if b]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype_name = args.dtype or ("fp16" if device.type == "cuda" else "fp32")
    label = args.label or Path(args.model).name.removesuffix(".pt")

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv,
        "versions": {"wtx": __version__, "torch": torch.__version__, "python": platform.python_version(),
                     "triton": getattr(__import__("triton"), "__version__", None) if device.type == "cuda" else None},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(), "dtype": dtype_name, "rows": [],
    }  # fmt: skip

    def save():
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    if args.warm_start and args.audio:
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="wtx-bench-cache-"))
        for key in ("cold", "warm"):
            log(f"-- warm start: {key} process")
            results[f"start_{key}"] = warm_start(args, cache, args.model, args.e2e_batch_size, dtype_name, device)
            log(f"   {results[f'start_{key}']}")
            save()
        if args.e2e:
            log("-- end to end")
            results["e2e"] = end_to_end(args, cache, args.model, args.e2e_batch_size, device)
            log(f"   {results['e2e']}")
            save()

    if args.audio and args.windows:
        checkpoint = load_checkpoint(args.model)
        windows = []
        for w in fixed_windows(stream_samples(str(args.audio))):
            if w.duration == CHUNK_LENGTH:  # full windows only, so audio seconds are exact
                windows.append(w)
            if len(windows) == args.windows:
                break
        bench_model(args, device, dtype_name, checkpoint, windows, label, DecodingOptions(), {}, results["rows"], save)

    for shape in [s for s in args.random_dims.split(",") if s]:
        torch.manual_seed(0)
        import whisper.model

        dims = whisper.model.ModelDimensions(**RANDOM_DIMS[shape])
        with torch.device(device):
            stock_random = whisper.model.Whisper(dims)
        checkpoint = {"dims": RANDOM_DIMS[shape], "model_state_dict": stock_random.state_dict()}
        rng = np.random.default_rng(0)
        from wtx.audio import N_SAMPLES, Window

        windows = [Window(i, i * 30.0, 30.0, (0.1 * rng.standard_normal(N_SAMPLES)).astype(np.float32))
                   for i in range(args.random_windows)]  # fmt: skip
        from whisper.tokenizer import get_tokenizer

        eot = get_tokenizer(True, num_languages=100).eot
        decoding = DecodingOptions(language="en", sample_len=args.forced_tokens, suppress_eot=True)
        stock_options = dict(suppress_tokens=[-1, eot], sample_len=args.forced_tokens)
        label_r = f"{shape} (random weights, {args.forced_tokens} forced tokens)"
        bench_model(args, device, dtype_name, checkpoint, windows, label_r, decoding, stock_options, results["rows"], save)
        del stock_random, checkpoint
        save()

    save()
    print(f"\n{'model':<44} {'pass':<28} {'s/win':>8} {'RTFx':>8} {'tok/s':>9} {'speedup':>8} {'ident':>6} {'WER':>6} {'compile':>12} {'MiB':>7}")
    for r in results["rows"]:
        comp = f"{r.get('compile') or ''} {r['compile_s']:.1f}s" if r.get("compile_s") else ""
        print(f"{r['model'][:44]:<44} {r['pass']:<28} {r['s_per_window']:8.4f} {r['rtfx']:8.1f} {r['tokens_per_s']:9.0f} "
              f"{r.get('speedup_vs_stock_same_batch', 1.0):8.2f} {r.get('identical_windows_vs_stock', 1.0):6.2f} "
              f"{r.get('wer_vs_stock', 0.0):6.3f} {comp:>12} {r['peak_mem_mib'] or 0:7.0f}")  # fmt: skip
    for key in ("start_cold", "start_warm"):
        if key in results:
            print(key, json.dumps(results[key]))
    if "e2e" in results:
        print("e2e", results["e2e"]["summary"], "rc", results["e2e"]["returncode"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
