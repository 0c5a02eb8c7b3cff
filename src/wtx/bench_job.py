"""The bench command's job: the eager baseline and the engine side by side on the same windows.

Part of the CLI layer: rich progress and the final table go to stderr; --json and --plot
write files atomically. Returns the exit code.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.console import Console
from rich.table import Table

from wtx import __version__
from wtx.atomic import atomic_path, atomic_write
from wtx.audio import fixed_windows, stream_samples
from wtx.bench import SCHEMA_VERSION, compare, reference_wer, run_pass, speedup, tokens_text
from wtx.errors import WtxError
from wtx.progress import stderr

SAMPLE = Path(__file__).parent / "assets" / "sample.mp3"

WARM_LOAD = """
import json, sys, time
started = time.perf_counter()
from wtx.engine import Engine, EngineOptions
from wtx.options import DecodingOptions
e = Engine(EngineOptions(model={model!r}, device={device!r}, dtype={dtype!r}, batch_size={batch_size}, compile=True,
                         condition_on_previous_text=False, decoding=DecodingOptions(beam_size={beam_size})))
print(json.dumps({{"source": e.compile_report.source, "compile_s": e.compile_report.seconds,
                  "process_ready_s": time.perf_counter() - started}}))
"""


def _versions() -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    import whisper

    return {"wtx": __version__, "torch": torch.__version__, "triton": triton_version,
            "openai-whisper": whisper.__version__, "python": platform.python_version()}  # fmt: skip


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _warm_load(model: str, device, dtype: str, batch_size: int, beam_size: int) -> dict:
    """Engine start with compiled artifacts on disk, in a fresh process."""
    code = WARM_LOAD.format(model=model, device=str(device), dtype=dtype, batch_size=batch_size, beam_size=beam_size)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plot(passes: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [p["name"] for p in passes]
    rtfx = [p["rtfx"] for p in passes]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4))
    bars = ax.bar(names, rtfx, color=["#888888" if p["kind"] == "stock" else "#2a7ab9" for p in passes])
    ax.bar_label(bars, labels=[f"{r:.0f}x" for r in rtfx])
    ax.set_ylabel("audio seconds per second (RTFx)")
    ax.set_title("wtx bench: real-time factor per pass (higher is faster)")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def run_bench(
    files: list[str], *, model: str, batch_size: int, compare_eager: bool, max_windows: int | None,
    repeat: int, reference: Path | None, json_path: Path | None, plot_path: Path | None,
    device: str | None, dtype: str | None, threads: int | None, compile: bool, quiet: bool, beam_size: int = 1,
    quantize: str = "auto",
) -> int:  # fmt: skip
    import torch

    from wtx.engine import Engine, EngineOptions, pick_device, pick_dtype
    from wtx.options import DecodingOptions
    from wtx.reference import load_stock_model, stock_decode
    from wtx.weights import load_checkpoint

    if threads:
        torch.set_num_threads(threads)
    sources = files or [str(SAMPLE)]
    try:
        windows = [w for s in sources for w in fixed_windows(stream_samples(s))]
        checkpoint = load_checkpoint(model)
    except WtxError as e:
        stderr.print(f"[bold red]error:[/] {e}", highlight=False)
        return 1
    windows = windows[:max_windows] if max_windows else windows
    if not windows:
        stderr.print("[bold red]error:[/] the inputs hold no audio", highlight=False)
        return 1
    batch_size = min(batch_size, len(windows))  # no pass pads beyond the windows there are
    torch_device = pick_device(device)
    # stock openai-whisper runs fp32 only on a CPU: both sides run it there unless told otherwise
    dtype_name = dtype or ("fp16" if pick_dtype(None, torch_device) == torch.float16 else "fp32")
    # every pass decodes each window on its own, as whisper.decode() does: no previous-text prompts
    # (and at temperature 0 only: no fallback, so best_of plays no part)
    engine_options = dict(model=model, device=str(torch_device), dtype=dtype_name, batch_size=batch_size,
                          condition_on_previous_text=False, decoding=DecodingOptions(beam_size=beam_size))  # fmt: skip
    try:
        eager = Engine(EngineOptions(**engine_options, quantize=quantize, cuda_graph=False))
    except ValueError as e:  # --quantize int8 where it cannot run
        stderr.print(f"[bold red]error:[/] {e}", highlight=False)
        return 1
    tokenizer = eager.tokenizer
    how = f"beam {beam_size}" if beam_size > 1 else "greedy"
    options = f"{how}, timestamps, language=en, sample_len={eager.sample_len}, {dtype_name}, {torch_device}"
    beam = {"beam_size": beam_size} if beam_size > 1 else {}

    def to_text(token_lists):
        return tokens_text(tokenizer, token_lists)

    def engine_decode(engine):
        return lambda ws: [r.tokens for r in engine.decode_batch(list(ws))]

    plans = []
    if compare_eager:
        stock = load_stock_model(checkpoint, torch_device)
        fp16 = dtype_name == "fp16"
        for bs in dict.fromkeys([1, batch_size]):
            decode = (lambda b: lambda ws: [r.tokens for r in stock_decode(stock, list(ws), b, fp16=fp16, **beam)])(bs)
            plans.append((f"stock eager b{bs}", "stock", bs, decode))
    int8 = f" {eager.quantized}" if eager.quantized else ""
    plans.append((f"wtx eager b{batch_size}{int8}", "wtx-eager", batch_size, engine_decode(eager)))
    if torch_device.type == "cuda":  # the default on CUDA: the same kernels, replayed as CUDA graphs
        graphs = Engine(EngineOptions(**engine_options, quantize=quantize))
        plans.append((f"wtx graphs b{batch_size}", "wtx-graphs", batch_size, engine_decode(graphs)))

    compile_info = None
    # no refresh thread: it would compete for the GIL with the launch-bound eager passes it times
    progress = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("windows"), TimeElapsedColumn(), console=stderr, disable=quiet,
                        auto_refresh=False)  # fmt: skip
    refreshed = [0.0]

    def advance(task, n: int) -> None:
        progress.advance(task, n)
        if time.perf_counter() - refreshed[0] >= 0.5:  # redraw between batches, twice a second at most
            progress.refresh()
            refreshed[0] = time.perf_counter()

    results = []
    with progress:
        for name, kind, bs, decode in plans:
            task = progress.add_task(name, total=len(windows) * repeat)
            results.append(run_pass(name, kind, bs, windows, options, decode, to_text, repeat, torch_device,
                                    on_window=lambda n, t=task: advance(t, n)))  # fmt: skip
            results[-1].quantized = eager.quantized if kind == "wtx-eager" else None
        if compile:
            task = progress.add_task(f"compiling b{batch_size}", total=None)
            progress.refresh()
            compiled = Engine(EngineOptions(**engine_options, compile=True))
            report = compiled.compile_report
            progress.update(task, total=1, completed=1, refresh=True)
            compile_info = {"first": {"source": report.source, "seconds": report.seconds, "warnings": report.warnings}}
            if report.source != "eager":
                compile_info["warm_load"] = _warm_load(model, torch_device, dtype_name, batch_size, beam_size)
                name = f"wtx compiled b{batch_size}"
                task = progress.add_task(name, total=len(windows) * repeat)
                result = run_pass(name, "wtx-compiled", batch_size, windows, options, engine_decode(compiled),
                                  to_text, repeat, torch_device, on_window=lambda n: advance(task, n))  # fmt: skip
                result.compile = compile_info
                results.append(result)

    # the baseline: stock eager at the same batch size, else (without --compare-eager) wtx eager
    stock_passes = {r.batch_size: r for r in results if r.kind == "stock"}
    eager_pass = next(r for r in results if r.kind == "wtx-eager")
    baselines = {r.name: stock_passes.get(r.batch_size, eager_pass) for r in results}
    slowest_b1 = stock_passes.get(1)
    ref_text = reference.read_text() if reference else None
    for r in results:
        base = baselines[r.name]
        r.speedup = speedup(base, r)
        if r is not base:
            r.agreement = compare(base, r)
        if ref_text is not None:
            r.reference_wer = reference_wer(r, ref_text)

    report_json = {
        "schema": SCHEMA_VERSION, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": _versions(),
        "device": _device_name(torch_device), "model": model, "dtype": dtype_name,
        "batch_size": batch_size, "beam_size": beam_size,
        "repeat": repeat, "inputs": sources, "windows": len(windows),
        "audio_seconds": sum(w.duration for w in windows), "options": options,
        "baseline": {name: base.name for name, base in baselines.items()}, "compile": compile_info,
        "passes": [r.summary() for r in results],
    }  # fmt: skip
    if slowest_b1 is not None:
        for p, r in zip(report_json["passes"], results):
            p["speedup_vs_stock_b1"] = speedup(slowest_b1, r)

    _print_table(report_json, quiet)
    if json_path:
        with atomic_write(json_path) as f:
            json.dump(report_json, f, indent=2)
            f.write("\n")
    if plot_path:
        try:
            _plot(report_json["passes"], plot_path)
        except ImportError:
            stderr.print("[bold red]error:[/] --plot needs matplotlib: pip install 'wtx[plot]'", highlight=False)
            return 1
    return 0


def _print_table(report: dict, quiet: bool) -> None:
    if quiet:
        return
    table = Table(title=f"wtx bench: {report['model']}, {report['windows']} windows "
                        f"({report['audio_seconds']:.0f} s of audio), {report['device']}")  # fmt: skip
    for column in ("pass", "s", "win/s", "RTFx", "tok/s", "speedup", "same", "WER", "ref WER", "MiB"):
        table.add_column(column, justify="right" if column != "pass" else "left", no_wrap=True)
    for p in report["passes"]:
        a = p.get("agreement") or {}
        table.add_row(
            p["name"], f"{p['median_s']:.3f}", f"{p['windows_per_s']:.2f}", f"{p['rtfx']:.1f}",
            f"{p['tokens_per_s']:.0f}", f"{p['speedup']:.2f}x",
            f"{a['identical_windows']}/{a['windows']}" if a else "base",
            f"{a['wer']:.2%}" if a else "-",
            f"{p['reference_wer']:.2%}" if p.get("reference_wer") is not None else "-",
            f"{p['peak_memory_mib']:.0f}" if p.get("peak_memory_mib") else "-",
        )  # fmt: skip
    # a pipe or log file has no width of its own: give the table room instead of wrapping it
    console = stderr if stderr.is_terminal else Console(stderr=True, width=120)
    console.print(table)
    stderr.print("s: median seconds per pass; same: windows with identical tokens; WER: against the "
                 "baseline's text; MiB: peak device memory (CPU: process RSS high-water mark)", highlight=False)
    compile_info = report.get("compile")
    if compile_info:
        first = compile_info["first"]
        line = f"compile: {first['source']} in {first['seconds']:.1f} s"
        warm = compile_info.get("warm_load") or {}
        if "compile_s" in warm:
            line += f"; a new process {warm['source']} artifacts in {warm['compile_s']:.1f} s (ready after {warm['process_ready_s']:.1f} s)"
        stderr.print(line, highlight=False)
