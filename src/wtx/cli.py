"""The wtx command line. Parses options, prints to stderr, writes data to stdout or files,
and picks exit codes. torch is imported only inside the commands that need it."""

import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Optional

import typer

from wtx import __version__

DTYPE_HELP = ("auto, fp32, fp16 or bf16. auto (the default): fp16 on CUDA; on a CPU fp32, with the "
              "encoder in bf16 where the CPU computes bf16 natively (AMX or AVX-512 BF16: 1.5x faster "
              "encoder on 2 cores, the same average WER). fp32: all of the model in fp32. bf16 on a CPU "
              "is faster still (1.2x at beam 5, 1.5x at beam 1) but measured less accurate at beam 5.")
QUANTIZE_CHOICES = ("auto", "fp16", "int8", "none")
QUANTIZE_HELP = ("auto, fp16, int8 or none: packed weights for the decoder on a CPU in fp32, eager. fp16: the "
                 "decoder's linear layers and logit projection (the token embedding, read whole at every "
                 "decode step) with fbgemm's fp16 weights and fp32 sums; Whisper's checkpoints are fp16, so "
                 "nothing is rounded (the logits 2.8x faster than fp32 for 8 rows on 2 cores). int8: the "
                 "logit projection in int8 (a scale per token, activations quantised per row; 2.3x faster than "
                 "fp16 at beam 5 on a CPU with VNNI), each row's 16 largest logits computed again from the fp16 "
                 "weights (so the picks are ranked exactly), the linear layers in fp16, "
                 "and beside a bf16 encoder the cross-attention keys and values in bf16. "
                 "auto (the default): there, int8 on a CPU with VNNI, else fp16; none elsewhere.")
BENCH_DTYPE_HELP = "fp32, fp16 or bf16 (default: fp16 on CUDA, fp32 on CPU, where stock openai-whisper runs fp32 only)."

app = typer.Typer(
    name="wtx",
    help="Transcribe long recordings with a rewritten, compile-ready OpenAI Whisper.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wtx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """wtx: long-form Whisper transcription, as fast as the hardware allows."""


def _parse_formats(value: str) -> list[str]:
    from wtx.writers import FORMATS

    formats = [f.strip().lower() for f in value.split(",") if f.strip()]
    if value.strip().lower() == "all":
        return list(FORMATS)
    if not formats:
        given = ", ".join(FORMATS)
        why = f"give one or more of {given} (comma-separated), or all"
        raise typer.BadParameter(why, param_hint="--format")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise typer.BadParameter(f"unknown format {', '.join(unknown) or value!r}; choose from {', '.join(FORMATS)} or all")
    return list(dict.fromkeys(formats))


def _check_inputs(inputs: list[str]) -> None:
    """Usage errors (exit 2): stdin twice, or a path on the command line that does not exist or
    cannot be one (a name too long). (Paths read from --from-list are checked one by one later:
    a missing one fails alone.)"""
    import glob

    from wtx.inputs import unusable
    from wtx.names import display

    if inputs.count("-") > 1:
        raise typer.BadParameter("'-' (stdin) can be given only once", param_hint="FILES")
    for source in inputs:
        if reason := unusable(source):
            raise typer.BadParameter(f"{display(source)}: {reason}", param_hint="FILES")
        if source != "-" and not Path(source).exists() and not glob.has_magic(source):
            raise typer.BadParameter(f"{display(source)}: no such file", param_hint="FILES")


def _parse_batch_size(value: str) -> int | None:
    """--batch-size: None for auto, else an integer from 1 to 256 (a usage error otherwise)."""
    if value == "auto":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise typer.BadParameter(f"{value!r}: give auto or a whole number from 1 to 256", param_hint="--batch-size")
    return int(value)


def _check_choice(value: str, choices: tuple[str, ...], flag: str) -> None:
    if value not in choices:
        raise typer.BadParameter(f"choose {', '.join(choices[:-1])} or {choices[-1]}", param_hint=flag)


def _usage(check, *args):
    """check(*args)'s result; its InvalidOption as a usage error (exit 2) naming the flag."""
    from wtx.errors import InvalidOption

    try:
        return check(*args)
    except InvalidOption as e:
        raise typer.BadParameter(e.reason, param_hint="--" + e.option.replace("_", "-")) from None


def _check_device(device: str | None) -> None:
    """Usage errors (exit 2) for a device this torch cannot use, saying which ones it can."""
    from wtx.options import check_device

    _usage(check_device, device)


def _fit_language(model: str, language: str | None, task: str) -> tuple[str | None, str]:
    """-l as its code (names and codes in any case; a usage error for others), and with an
    English-only model English and transcribe, after a warning (openai-whisper's rule)."""
    from wtx.options import fit_english_only, language_code

    language, task, warning = fit_english_only(model, _usage(language_code, language), task)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    return language, task


@app.command()
def transcribe(
    files: Annotated[Optional[list[str]], typer.Argument(help="Audio or video files ffmpeg can read, directories (searched recursively for audio and video) or glob patterns; '-' reads stdin.", show_default=False)] = None,
    from_list: Annotated[Optional[str], typer.Option("--from-list", help="Read more inputs from this file, one path per line ('-': stdin).")] = None,
    skip_existing: Annotated[bool, typer.Option("--skip-existing", help="Skip inputs whose output files all exist already.")] = False,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Journal finished windows next to the outputs and resume an interrupted run from them.")] = True,
    model: Annotated[str, typer.Option("--model", "-m", help="tiny.en or base (bundled), an openai-whisper name in ~/.cache/whisper, or a .pt path.")] = "tiny.en",
    output_dir: Annotated[Optional[str], typer.Option("--output-dir", "-o", help="Directory for the output files (default: next to each input); '-' writes each transcript to stdout, in one format (files separated by a blank line).")] = None,
    output_format: Annotated[Optional[str], typer.Option("--format", "-f", help="Comma-separated output formats: txt, srt, vtt, json, tsv, or all (default: txt,srt; with -o -, one format, default txt).", show_default=False)] = None,
    language: Annotated[Optional[str], typer.Option("--language", "-l", help="Spoken language: a code or an English name, any case (e.g. de or German; an unknown one lists the codes). English-only (.en) models transcribe English, with a warning for another. Default: English for .en models, detected once per file otherwise.")] = None,
    task: Annotated[str, typer.Option("--task", help="transcribe, or translate (to English; multilingual models only).")] = "transcribe",
    batch_size: Annotated[str, typer.Option("--batch-size", "-b", metavar="N|auto", help="Windows decoded together, from any of the inputs (1-256), or auto: the size that measured fastest for the model on this device within its free memory (on an H200 64 for tiny.en and base greedy, 32 with beam search; on a CPU 24 in text-only mode with each window alone, else 8). Every batch is padded to this many rows, so a file's text never depends on the other inputs, and a file is cut into the same chunks at every size (one window each; 8 when windows are prompted), so a different size changes its text only through rounding.")] = "auto",
    device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda or cuda:N (default: cuda if available).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)] = "auto",
    quantize: Annotated[str, typer.Option("--quantize", help=QUANTIZE_HELP)] = "auto",
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads for torch (default: torch's choice).")] = None,
    compile: Annotated[bool, typer.Option("--compile/--no-compile", envvar="WTX_COMPILE", help="torch.compile the encoder and decode step (Inductor; CUDA graphs on GPU). Compiled artifacts are cached on disk, so later runs start fast. Also WTX_COMPILE=1. Not used on a CPU, where it measured slower than eager (WTX_CPU_COMPILE=1 forces it).")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="With --compile: fail if compilation fails, instead of warning and running eager.")] = False,
    split: Annotated[str, typer.Option("--split", help="Where windows end: 'silence' (the quietest pause in a window's last seconds, so no word is cut; long silences skipped) or 'fixed' (every 30 s, as whisper.decode() on plain chunks; decoded with timestamps unless --without-timestamps is given, since a window cut mid-speech ends early in text only).")] = "silence",
    condition: Annotated[Optional[bool], typer.Option("--condition/--no-condition", help="Prompt each window with the text of the window before it, as openai-whisper's transcribe() does (condition_on_previous_text); batch rows then follow consecutive windows. --no-condition decodes every window on its own, as faster-whisper's batched pipeline. Default: prompted with timestamps, each window alone in text-only mode.", show_default=False)] = None,
    beam_size: Annotated[int, typer.Option("--beam-size", min=1, max=16, help="Beams per window at temperature 0, as openai-whisper's CLI and faster-whisper default to; 1 decodes greedily (fastest).")] = 5,
    best_of: Annotated[Optional[int], typer.Option("--best-of", min=1, max=16, help="Samples per window at a fallback temperature (a window whose text failed the compression-ratio or log-probability test); the best is kept. Default: the beam size (5; with --beam-size 1, one sample, the fastest).", show_default=False)] = None,
    patience: Annotated[float, typer.Option("--patience", help="Beam search stops once round(beam-size x patience) hypotheses have ended (1.0: as soon as beam-size have). Above 0 and at most 20.")] = 1.0,
    length_penalty: Annotated[Optional[float], typer.Option("--length-penalty", min=0.0, max=2.0, help="Rank hypotheses by log-probability / ((5 + length) / 6) ** this; default: / length.")] = None,
    word_timestamps: Annotated[Optional[bool], typer.Option("--word-timestamps/--no-word-timestamps", help="Time every word (openai-whisper's method: the alignment heads' cross-attention, aligned by dynamic time warping). Words go into .json (word, start, end, probability) and .tsv (a row per word); subtitle cues take their times from words. Costs one more decoder pass per batch. Default: on where windows are decoded as text only and .srt or .vtt is written (so cues follow the speech), else off.", show_default=False)] = None,
    without_timestamps: Annotated[Optional[bool], typer.Option("--without-timestamps/--timestamps", help="--without-timestamps decodes text only (openai-whisper's without_timestamps): each window (at most 30 s, ending in a pause) is one segment, and subtitle cues split it by characters, or by words with --word-timestamps; fewer decode steps, no window tails decoded again. --timestamps decodes Whisper's timestamp tokens: segments of a few seconds within each window. Default: text only (faster, and more accurate on the long files measured, on a CPU and on a GPU: docs/benchmarks.md), timestamps with --split fixed.", show_default=False)] = None,
    max_line_width: Annotated[Optional[int], typer.Option("--max-line-width", min=1, help="With --word-timestamps: characters per subtitle line (default 42, cues never spanning segments). With --max-line-count too, cues may span segments and break at pauses of 3 s, as openai-whisper's.", show_default=False)] = None,
    max_line_count: Annotated[Optional[int], typer.Option("--max-line-count", min=1, help="With --word-timestamps: lines per subtitle cue (default 2).", show_default=False)] = None,
    max_words_per_line: Annotated[Optional[int], typer.Option("--max-words-per-line", min=1, help="With --word-timestamps: words per subtitle line; each run of this many words starts a cue unless --max-line-width and --max-line-count are given.", show_default=False)] = None,
    highlight_words: Annotated[bool, typer.Option("--highlight-words", help="With --word-timestamps: in .srt and .vtt, one cue per spoken word with that word underlined (<u>...</u>), karaoke style.")] = False,
    vad: Annotated[bool, typer.Option("--vad/--no-vad", help="Drop windows that hold no speech (Silero VAD) before decoding, so noise, tones and music do not turn into invented text. --no-vad keeps only the silence rules.")] = True,
    compare_eager: Annotated[bool, typer.Option("--compare-eager", help="First run stock openai-whisper eager on the same windows, then show wtx's live speedup over it and in the summary.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summary; errors are still printed.")] = False,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="On CUDA, replay the decode steps as CUDA graphs, captured at start-up: of the eager kernels (about a second; the same text as eager), or with --compile of Inductor's code. --no-cuda-graphs launches every kernel from Python.")] = True,
    profile_startup: Annotated[bool, typer.Option("--profile-startup", help="Once the model is ready, print where the start went on stderr: each phase (imports, CUDA, weights, compiled artifacts, CUDA graphs) with its seconds, timed from the process's start.")] = False,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="local|auto|HOST:PORT", help="Run on Ray Data (pip install 'wtx\\[ray]'): 'local' starts Ray on this machine, 'auto' joins the cluster this machine belongs to, HOST:PORT joins that head. Files are cut into chunks on the cluster's CPUs and decoded by a pool of workers, one per GPU; the outputs equal a single process's on the same kind of device. Inputs must be readable at the same path on every node.", show_default=False)] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="With --ray: decoding workers, each holding one engine (default: one per GPU of the cluster; on CPUs, one).", show_default=False)] = None,
    cpus_per_worker: Annotated[float, typer.Option("--cpus-per-worker", min=0.1, help="With --ray: CPUs each task of the CPU stage (decoding and cutting one file's audio) takes.")] = 1.0,
) -> None:
    """Transcribe recordings into .txt/.srt/.vtt/.json/.tsv files, or to stdout."""
    from wtx import startup
    from wtx.bytecode import keep_bytecode
    from wtx.inputs import expand, read_list

    keep_bytecode()
    startup.mark("Python and wtx's command line")

    files = list(files or [])
    _check_inputs(files)
    if from_list is not None:
        if from_list == "-" and "-" in files:
            raise typer.BadParameter("stdin cannot be both an input and the list", param_hint="--from-list")
        try:
            files += read_list(from_list)
        except OSError as e:
            raise typer.BadParameter(f"{from_list}: {e.strerror or e}", param_hint="--from-list") from e
    if not files:
        raise typer.BadParameter("give at least one input (a file, directory, pattern, '-' or --from-list)", param_hint="FILES")
    if output_dir == "":
        why = "give a folder, or '-' for stdout (leave -o out to write beside each input)"
        raise typer.BadParameter(why, param_hint="--output-dir")
    to_stdout = output_dir == "-"
    default_formats = "txt" if to_stdout else "txt,srt"
    formats = _parse_formats(output_format if output_format is not None else default_formats)
    if to_stdout and len(formats) > 1:
        raise typer.BadParameter("with -o - (stdout) choose one format", param_hint="--format")
    _check_choice(dtype, ("auto", "fp32", "fp16", "bf16"), "--dtype")
    _check_choice(quantize, QUANTIZE_CHOICES, "--quantize")
    _check_choice(task, ("transcribe", "translate"), "--task")
    _check_choice(split, ("silence", "fixed"), "--split")
    _check_device(device)
    rows = _parse_batch_size(batch_size)
    from wtx.options import check_patience

    _usage(check_patience, patience, beam_size)
    language, task = _fit_language(model, language, task)
    from wtx.subtitles import SubtitleOptions

    subtitles = SubtitleOptions(max_line_width, max_line_count, max_words_per_line, highlight_words)
    if subtitles.any and word_timestamps is not True:
        flag = next(f for f, v in [("--max-line-width", max_line_width), ("--max-line-count", max_line_count),
                                   ("--max-words-per-line", max_words_per_line), ("--highlight-words", highlight_words)] if v)  # fmt: skip
        raise typer.BadParameter("needs --word-timestamps: subtitle lines are laid out by word times", param_hint=flag)
    out = None if output_dir in (None, "-") else Path(output_dir)
    cluster = _cluster_options(ray, workers, cpus_per_worker, files, compare_eager)

    from wtx.transcribe import Job, run_transcribe

    expanded = expand(files)
    job = Job(
        model=model, out=out, to_stdout=to_stdout, formats=tuple(formats), language=language,
        task=task, batch_size=rows, device=device, dtype=dtype, quantize=quantize, threads=threads, quiet=quiet,
        compile=compile, strict=strict, compare_eager=compare_eager, split=split,
        condition=condition, skip_existing=skip_existing, resume=resume, vad=vad,
        beam_size=beam_size, best_of=best_of or beam_size, patience=patience, length_penalty=length_penalty,
        word_timestamps=word_timestamps, without_timestamps=without_timestamps, subtitles=subtitles, ray=cluster, cuda_graphs=cuda_graphs, profile_startup=profile_startup,
    )  # fmt: skip
    raise typer.Exit(run_transcribe(expanded.inputs, expanded.problems, job))


def _cluster_options(ray: str | None, workers: int | None, cpus_per_worker: float, files: list[str], compare_eager: bool):
    """--ray's options, or None; usage errors (exit 2) for what cannot run on a cluster."""
    if ray is None:
        if workers is not None or cpus_per_worker != 1.0:
            raise typer.BadParameter("needs --ray", param_hint="--workers" if workers is not None else "--cpus-per-worker")
        return None
    if "-" in files:
        raise typer.BadParameter("stdin ('-') is read by a single process; give files with --ray", param_hint="--ray")
    if compare_eager:
        raise typer.BadParameter("--compare-eager runs in a single process; leave out --ray", param_hint="--ray")
    if ray not in ("local", "auto") and not (":" in ray and ray.rsplit(":", 1)[1].isdigit()):
        raise typer.BadParameter(f"{ray!r}: choose local, auto or HOST:PORT", param_hint="--ray")
    from wtx.cluster import ClusterOptions

    return ClusterOptions(ray, workers, cpus_per_worker)


@app.command()
def bench(
    files: Annotated[Optional[list[str]], typer.Argument(help="Audio files to cut into windows (default: the bundled sample).", show_default=False)] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="Model name or .pt path, as for transcribe.")] = "tiny.en",
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, max=256, help="Windows per batch for the batched passes.")] = 8,
    beam_size: Annotated[int, typer.Option("--beam-size", min=1, max=16, help="Beams per window for every pass, stock and wtx (1: greedy, whisper.decode()'s default).")] = 1,
    compare_eager: Annotated[bool, typer.Option("--compare-eager", help="Also time stock openai-whisper whisper.decode() (eager) at batch 1 and --batch-size: the baseline for speedups and agreement.")] = False,
    compile: Annotated[bool, typer.Option("--compile/--no-compile", help="Time the compiled engine (cold compile and warm-cache load reported apart).")] = True,
    windows: Annotated[Optional[int], typer.Option("--windows", "-n", min=1, help="Use only the first N windows (default: all).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", "-r", min=1, help="Timed repeats per pass; the median is reported.")] = 3,
    reference: Annotated[Optional[Path], typer.Option("--reference", exists=True, dir_okay=False, help="Reference transcript: each pass's WER against it (normalized with whisper's EnglishTextNormalizer).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write every raw number, with versions and device, as JSON.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG bar chart of RTFx per pass (needs matplotlib: pip install 'wtx\\[plot]').")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda or cuda:N (default: cuda if available).")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help=BENCH_DTYPE_HELP)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads for torch.")] = None,
    quantize: Annotated[str, typer.Option("--quantize", help="The wtx eager pass's --quantize, as for transcribe: auto, fp16, int8 or none (stock and compiled passes run without it; the agreement shows its cost).")] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or table on stderr.")] = False,
) -> None:
    """Time stock eager Whisper and the wtx engine on the same windows; report speedup and agreement."""
    from wtx.bytecode import keep_bytecode

    keep_bytecode()
    files = files or []
    if files:
        from wtx.inputs import expand

        _check_inputs(files)
        expanded = expand(files)
        if expanded.problems:
            raise typer.BadParameter("; ".join(expanded.problems), param_hint="FILES")
        files = [i.path for i in expanded.inputs]
    if dtype is not None:
        _check_choice(dtype, ("fp32", "fp16", "bf16"), "--dtype")
    _check_choice(quantize, QUANTIZE_CHOICES, "--quantize")
    _check_device(device)
    from wtx.bench_job import run_bench

    code = run_bench(
        files, model=model, batch_size=batch_size, compare_eager=compare_eager, max_windows=windows,
        repeat=repeat, reference=reference, json_path=json_path, plot_path=plot, device=device,
        dtype=dtype, threads=threads, compile=compile, quiet=quiet, beam_size=beam_size,
        quantize=quantize,
    )  # fmt: skip
    raise typer.Exit(code)


cache_app = typer.Typer(help="Inspect or clear the wtx cache (converted models, compiled artifacts).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info() -> None:
    """List what the cache holds, with sizes (WTX_CACHE_DIR, default ~/.cache/wtx)."""
    from wtx.compile_cache import entries
    from wtx.paths import cache_dir

    typer.echo(f"cache: {cache_dir()}", err=True)
    found = _or_exit(entries)
    if not found:
        typer.echo("empty", err=True)
    for entry in found:
        typer.echo(f"{entry.bytes / 2**20:10.1f} MiB  {entry.files:6d} files  {entry.path}")


@cache_app.command("clear")
def cache_clear(
    models: Annotated[bool, typer.Option("--models", help="Also remove converted model checkpoints.")] = False,
) -> None:
    """Remove compiled artifacts (and, with --models, converted checkpoints)."""
    from wtx.compile_cache import clear

    removed = _or_exit(lambda: clear(include_models=models))
    for path in removed:
        typer.echo(f"removed {path}", err=True)
    if not removed:
        typer.echo("nothing to remove", err=True)


def _or_exit(call):
    """call()'s result; a WtxError is its one line on stderr and exit 1."""
    from wtx.errors import WtxError

    try:
        return call()
    except WtxError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e


def main() -> None:
    import signal

    def terminated(signum, frame):
        raise SystemExit(143)  # before a command installs its own handler: nothing to keep

    signal.signal(signal.SIGTERM, terminated)
    try:
        app()
        code = 0
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    except SystemExit as e:
        code = e.code
    _leave(code)


def _monitored() -> bool:
    """Whether a profiler or debugger watches through sys.monitoring (cProfile from Python 3.12)."""
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


def _leave(code) -> None:
    """Ends the process as Python's own exit does, less tearing down its modules: torch's teardown
    (CUDA's included) takes most of a second once the work is done. What the interpreter's exit
    runs first still runs: threading's shutdown (thread pools stop, other non-daemon threads are
    waited for), then atexit callbacks (Inductor's caches, Ray's shutdown), then the streams are
    flushed; the process exits with `code`, as SystemExit gives it. Under a profiler or a tracer
    (cProfile, a debugger), which write their results after the program returns, it exits the
    ordinary way."""
    import atexit
    import threading

    if sys.getprofile() is not None or sys.gettrace() is not None or _monitored():
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    threading._shutdown()  # CPython's, as Py_Finalize calls it
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a reader that went away, or a closed stream
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
