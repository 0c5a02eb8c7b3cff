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
import gc
import json
import os
import platform
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
from wtx.bench import compare, run_pass, speedup, tokens_text  # noqa: E402
from wtx.decode import get_tokenizer  # noqa: E402
from wtx.options import DecodingOptions  # noqa: E402
from wtx.engine import Engine, EngineOptions  # noqa: E402
from wtx.model import ModelDimensions, load_model  # noqa: E402
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


def bench_model(args, device, dtype_name, checkpoint, windows, label, decoding, stock_options, rows, save):
    """All passes for one model on the same windows (wtx.bench.run_pass: warm-up on a full
    batch, synchronized clocks, median of repeats); appends result rows, saving after each."""
    fp16 = dtype_name == "fp16"
    options = f"{decoding}, {dtype_name}, {device}"  # identical for every pass: comparisons are checked
    stock = load_stock_model(checkpoint, device)
    tokenizer = get_tokenizer(ModelDimensions(**checkpoint["dims"]), "en", "transcribe")

    def to_text(token_lists):
        return tokens_text(tokenizer, token_lists)

    def add(result, baseline=None, **extra):
        row = {**result.summary(), "model": label, "s_per_window": result.median_s / result.windows, **extra}
        if baseline is not None:
            row["speedup_vs_stock_same_batch"] = speedup(baseline, result)
            agree = compare(baseline, result)
            row["identical_windows_vs_stock"], row["wer_vs_stock"] = agree["identical_share"], agree["wer"]
            b1 = reference.get(1)
            if b1 is not None:
                row["speedup_vs_stock_b1"] = speedup(b1, result)
        rows.append(row)
        save()
        log(f"   {result.name}: median {result.median_s:.3f} s")

    reference = {}
    for bs in args.batch_sizes:
        decode = (lambda b: lambda ws: [r.tokens for r in stock_decode(stock, list(ws), b, fp16=fp16, **stock_options)])(bs)
        reference[bs] = run_pass(f"stock eager b{bs}", "stock", bs, windows, options, decode, to_text, args.repeat, device)
        add(reference[bs])
    stock = None  # the stock passes are done: free its memory before the engine passes
    torch.cuda.empty_cache() if device.type == "cuda" else None

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    variants = [("wtx eager", dict(compile=False))]
    for backend in args.backends:
        variants.append((f"wtx compiled[{backend}]", dict(compile=True, step_backend=backend)))
    for bs in args.batch_sizes:
        for name, extra in variants:  # each engine on a model of its own, as in `wtx bench`
            engine = Engine(EngineOptions(model=label, device=str(device), dtype=dtype_name, batch_size=bs,
                                          decoding=decoding, condition_on_previous_text=False, **extra),
                            model=load_model(checkpoint, device, dtype))  # fmt: skip
            report = engine.compile_report
            decode = lambda ws, e=engine: [r.tokens for r in e.decode_batch(list(ws))]  # noqa: E731
            result = run_pass(f"{name} b{bs}", name, bs, windows, options, decode, to_text, args.repeat, device)
            add(result, reference[bs], compile=report.source if report else None,
                compile_s=report.seconds if report else None)  # fmt: skip
            del engine
            gc.collect()


def warm_start(args, cache_dir, model_arg, batch_size, dtype_name, device):
    """A fresh process: model load + compile (or load artifacts) + first decoded window."""
    code = f"""
import json, time, sys
t0 = time.perf_counter()
sys.path.insert(0, {str(ROOT / 'src')!r})
import numpy as np, torch
from wtx.engine import Engine, EngineOptions
from wtx.audio import fixed_windows, stream_samples
imported = time.perf_counter() - t0
e = Engine(EngineOptions(model={model_arg!r}, device={str(device)!r}, dtype={dtype_name!r}, batch_size={batch_size}, compile=True, strict=True, condition_on_previous_text=False))
ready = time.perf_counter() - t0
w = next(fixed_windows(stream_samples({str(args.audio)!r})))
r = e.decode_batch([w])
torch.cuda.synchronize() if torch.cuda.is_available() else None
import torch._dynamo.utils as du
from wtx.compile_cache import loads
print(json.dumps({{"first_window_s": time.perf_counter() - t0, "imports_s": imported, "engine_ready_s": ready, "compile": e.compile_report.source,
  "compile_s": e.compile_report.seconds, "ahead_of_time": e.compile_report.ahead_of_time, "loaded": dict(loads),
  "fxgraph_cache_hit": du.counters["inductor"]["fxgraph_cache_hit"],
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
        # openai-whisper leaves the decoder's positional embedding as torch.empty (garbage, maybe NaN)
        torch.nn.init.normal_(stock_random.decoder.positional_embedding, std=0.02)
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
        print(f"{r['model'][:44]:<44} {r['name']:<28} {r['s_per_window']:8.4f} {r['rtfx']:8.1f} {r['tokens_per_s']:9.0f} "
              f"{r.get('speedup_vs_stock_same_batch', 1.0):8.2f} {r.get('identical_windows_vs_stock', 1.0):6.2f} "
              f"{r.get('wer_vs_stock', 0.0):6.3f} {comp:>12} {r['peak_memory_mib'] or 0:7.0f}")  # fmt: skip
    for key in ("start_cold", "start_warm"):
        if key in results:
            print(key, json.dumps(results[key]))
    if "e2e" in results:
        print("e2e", results["e2e"]["summary"], "rc", results["e2e"]["returncode"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
