#!/usr/bin/env python3
"""Long-form accuracy: normalized WER of wtx and of stock openai-whisper on files with references.

    python scripts/eval_wer.py                                  # every long file, tiny.en
    python scripts/eval_wer.py --models tiny.en,base --markdown docs/accuracy.md --json out.json
    python scripts/eval_wer.py --files ../shared/audio/jfk.flac:../shared/audio/jfk.txt

Configurations (CPU fp32 by default; --device cuda runs fp16; --dtype sets wtx's):
  silence    wtx --timestamps --condition: --split silence (windows end at the
             quietest pause), Silero VAD, beam 5
  greedy     the same at --beam-size 1
  unprompted wtx --timestamps --no-condition (every window decoded without previous text), beam 5
  fixed      wtx --timestamps --condition --split fixed (plain 30 s windows), beam 5
  text-only  wtx --without-timestamps --no-condition (text only, each window alone: a CPU's
             defaults), beam 5
  text-only-greedy  the same at --beam-size 1
  plain      wtx's decode_batch on fixed 30 s windows, each alone, greedy: the same work as `decode`
  decode     stock whisper.decode() on the same fixed 30 s windows, greedy
  transcribe stock model.transcribe() (sequential, conditioned on previous text, temperature
             fallback), greedy: the Python API's default
  transcribe-beam5  the same with beam_size=5, best_of=5: openai-whisper's CLI defaults
  fw-beam1, fw-beam5  faster-whisper's BatchedInferencePipeline (int8 on the CPU, float16 on
             CUDA; its own VAD; batch --batch-size) at beam 1 and 5, on the bundled packages'
             CTranslate2 models (pip install faster-whisper)
Every row reports its speed (audio seconds / wall seconds) beside its WER.
Both sides are normalized with whisper's EnglishTextNormalizer (jiwer aligns them); the
normalizer drops text in parentheses, which the narrators read aloud, so parentheses in the
reference are removed first and their words kept. Boundary
errors: alignment errors whose hypothesis time lies within 1 s of a window boundary (windowed
configurations only; word times are interpolated inside segments); beside them, how many of the
file's errors would fall there by chance if they were spread evenly over its duration. Every row
also counts its errors near the other configurations' boundaries (`errors_near`): stock
transcribe()'s errors within 1 s of wtx's silence cuts say how many errors those times hold when
nothing is cut there.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
LONG_FILES = [
    ("audio/lj001_0001-0032_concat.flac", "audio/lj001_0001-0032_concat.txt"),
    ("audio/long_mix_en.mp3", "audio/long_mix_en.txt"),
    ("tts/declaration_kal.mp3", "texts/us_declaration_of_independence.txt"),
    ("tts/alice_ch01_espeak.mp3", "texts/carroll_alice_ch01.txt"),
    ("tts/copperfield_ch01_slt.mp3", "texts/dickens_copperfield_ch01.txt"),
]
CONFIGS = ("silence", "greedy", "unprompted", "fixed", "text-only", "text-only-greedy", "plain", "decode", "transcribe",
           "transcribe-beam5", "fw-beam1", "fw-beam5")
DEFAULT_CONFIGS = ("silence", "fixed", "decode", "transcribe")
BOUNDARY_S = 1.0


def timed_words(segments):
    """[(word, time)] from (start, end, text) segments: normalized words, times interpolated."""
    from wtx.metrics import normalize

    words = []
    for start, end, text in segments:
        pieces = normalize(text).split()
        for i, w in enumerate(pieces):
            words.append((w, start + (end - start) * (i + 0.5) / max(1, len(pieces))))
    return words


def score(reference: str, segments, boundaries):
    import jiwer

    from wtx.metrics import normalize

    ref = normalize(reference.replace("(", " ").replace(")", " "))  # spoken: keep the words
    words = timed_words(segments)
    hyp = " ".join(w for w, _ in words)
    if not hyp:
        return {"wer": 1.0, "errors": len(ref.split()), "ref_words": len(ref.split()), "boundary_errors": None}
    out = jiwer.process_words(ref, hyp)
    errors = out.substitutions + out.deletions + out.insertions
    boundary_errors = None
    if boundaries is not None:
        times = [t for _, t in words]
        boundary_errors = 0
        for chunk in out.alignments[0]:
            if chunk.type == "equal":
                continue
            if chunk.type == "delete":  # no hypothesis word: use the neighbouring one's time
                positions = [min(chunk.hyp_start_idx, len(times) - 1)]
                count = chunk.ref_end_idx - chunk.ref_start_idx
            else:
                positions = list(range(chunk.hyp_start_idx, chunk.hyp_end_idx))
                count = 1
            for p in positions:
                if any(abs(times[p] - b) <= BOUNDARY_S for b in boundaries):
                    boundary_errors += count
    expected = None
    if boundaries is not None:
        duration = max(end for _, end, _ in segments)
        expected = errors * near_seconds(boundaries, duration) / duration if duration > 0 else 0.0
    return {"wer": errors / len(ref.split()), "errors": errors, "ref_words": len(ref.split()),
            "boundary_errors": boundary_errors, "boundary_errors_by_chance": expected}  # fmt: skip


def near_seconds(boundaries, duration):
    """Seconds of [0, duration] within BOUNDARY_S of a boundary: where errors count as boundary
    errors. An error rate spread evenly over the file would put errors * this / duration there."""
    covered, reach = 0.0, 0.0
    for b in sorted(boundaries):
        start, end = max(b - BOUNDARY_S, reach, 0.0), min(b + BOUNDARY_S, duration)
        covered += max(0.0, end - start)
        reach = max(reach, end)
    return covered


def cross_count(reference: str, decoded: dict) -> None:
    """Fills each row's errors_near[other]: its errors within 1 s of the other config's boundaries."""
    for config, (row, segments, _) in decoded.items():
        for other, (_, _, boundaries) in decoded.items():
            if other != config and boundaries is not None and other not in row["errors_near"]:
                row["errors_near"][other] = score(reference, segments, boundaries)["boundary_errors"]


# the configurations wtx runs, and which of the loaded wtx models each runs
WTX_MODEL = {"silence": "prompted", "fixed": "prompted", "plain": "prompted", "greedy": "greedy", "unprompted": "unprompted",
             "text-only": "text-only", "text-only-greedy": "text-only-greedy"}


def wtx_quantized(config, models) -> str | None:
    """The wtx model's packed logit weights, "fp16" or "int8" (None: float32, stock and faster-whisper)."""
    return models[WTX_MODEL[config]].engine.quantized if config in WTX_MODEL else None


def run_config(config, models, stock, audio_path):
    """(segments, window boundaries) of one configuration on one file. models: "prompted" and
    "unprompted" wtx models (wtx.load_model); stock: openai-whisper's model."""
    import torch

    from wtx.audio import CHUNK_LENGTH, fixed_windows, load_audio, stream_samples
    from wtx.pipeline import AudioReader
    from wtx.reference import stock_decode
    from wtx.segments import split_segments
    from wtx.streams import Recording, WindowDone

    engine = models["prompted"].engine

    if config == "plain":  # the engine's decode_batch: each window alone, as whisper.decode()
        windows = list(fixed_windows(stream_samples(str(audio_path))))
        segments = []
        size = engine.options.batch_size
        for start in range(0, len(windows), size):
            for r in engine.decode_batch(windows[start : start + size]):
                segments += [(s.start, s.end, s.text) for s in r.segments]
        return segments, [w.offset + CHUNK_LENGTH for w in windows[:-1]]
    if config.startswith("fw-"):
        return faster_whisper_segments(models["faster-whisper"](), audio_path, int(config.removeprefix("fw-beam")),
                                       models["fw_batch_size"]), None  # fmt: skip
    if config in WTX_MODEL and config != "plain":
        segments, boundaries = [], []
        model = models[WTX_MODEL[config]]
        # the CLI's own path: audio -> windows -> speech windows (Silero VAD) -> the scheduler
        windows = AudioReader(str(audio_path), "fixed" if config == "fixed" else "silence", model.detector)
        recording = Recording(audio_path.name, iter(windows), {}, "en")
        for event in model.run([recording], ordered=True):
            if isinstance(event, WindowDone):
                r = event.result
                segments += [(s.start, s.end, s.text) for s in r.segments]
                boundaries.append(r.window.offset + r.window.duration)
            elif event.error is not None:
                raise event.error
        return segments, boundaries[:-1]
    if config == "decode":
        windows = list(fixed_windows(stream_samples(str(audio_path))))
        segments = []
        fp16 = engine.dtype == torch.float16
        for w, r in zip(windows, stock_decode(stock, windows, engine.options.batch_size, fp16=fp16)):
            segments += [(s.start, s.end, s.text) for s in split_segments(r.tokens, engine.tokenizer, w.offset, w.duration)]
        return segments, [w.offset + CHUNK_LENGTH for w in windows[:-1]]
    if config in ("transcribe", "transcribe-beam5"):
        fp16 = engine.dtype == torch.float16
        beam = {"beam_size": 5, "best_of": 5} if config == "transcribe-beam5" else {}
        result = stock.transcribe(load_audio(str(audio_path)), fp16=fp16, language="en", verbose=None, **beam)
        return [(s["start"], s["end"], s["text"]) for s in result["segments"]], None
    raise ValueError(config)


def ct2_checkpoint(folder: Path) -> Path:
    """A CTranslate2 model folder (model.bin, config.json) converted to an openai-whisper
    checkpoint in a temporary file, for wtx and stock: the machine has no bundled packages."""
    import io
    import tempfile

    import torch

    from wtx.ct2 import ct2_to_whisper, read_ct2

    _, variables, _ = read_ct2(io.BytesIO((folder / "model.bin").read_bytes()))
    heads = json.loads((folder / "config.json").read_text()).get("alignment_heads")
    path = Path(tempfile.mkdtemp(prefix="wtx-eval-")) / f"{folder.name}.pt"
    torch.save(ct2_to_whisper(variables, heads), path)
    return path


def ct2_folder(name: str) -> Path:
    """The bundled package's CTranslate2 model as a folder faster-whisper can load: tiny.en's
    package folder itself; base's two model.bin parts joined into a temporary folder; a
    folder given as the model, as it is."""
    import shutil
    import tempfile

    from wtx.weights import BUNDLED, package_file

    if Path(name).is_dir():
        return Path(name)

    model = BUNDLED[name]
    parts = [package_file(pkg, rel) for pkg, rel in model.parts]
    config = package_file(*model.config)
    if len(parts) == 1:
        return parts[0].parent
    folder = Path(tempfile.mkdtemp(prefix=f"wtx-ct2-{name}-"))
    with open(folder / "model.bin", "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    for extra in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(config.parent / extra, folder / extra)
    return folder


def faster_whisper_loader(name: str, device: str, threads: int):
    """A function that loads faster-whisper's model of `name` once, when first called."""
    loaded = []

    def load():
        if not loaded:
            from faster_whisper import BatchedInferencePipeline, WhisperModel

            cuda = device.startswith("cuda")
            model = WhisperModel(str(ct2_folder(name)), device="cuda" if cuda else "cpu",
                                 compute_type="float16" if cuda else "int8", cpu_threads=threads)  # fmt: skip
            loaded.append(BatchedInferencePipeline(model))
        return loaded[0]

    return load


def faster_whisper_segments(pipeline, audio_path, beam_size: int, batch_size: int):
    """faster-whisper on the audio as wtx decodes it (16 kHz mono float32, decoded inside the
    timed run): its own decoder needs a PyAV older than 19."""
    from wtx.audio import load_audio

    audio = load_audio(str(audio_path))
    segments, _ = pipeline.transcribe(audio, language="en", beam_size=beam_size, batch_size=batch_size)
    return [(s.start, s.end, s.text) for s in segments]


def markdown(rows, command, batch_size=8):
    models = sorted({r["model"] for r in rows}, key=lambda m: ["tiny.en", "base"].index(m) if m in ("tiny.en", "base") else 9)
    lines = ["# Long-form accuracy", "", f"Measured with `{command}` (batch {batch_size}).",
             "WER normalized with whisper's EnglishTextNormalizer; `boundary` counts alignment errors within 1 s of a window boundary.", ""]  # fmt: skip
    for model in models:
        mrows = [r for r in rows if r["model"] == model]
        files = list(dict.fromkeys(r["file"] for r in mrows))
        configs = [c for c in CONFIGS if any(r["config"] == c for r in mrows)]
        control = "transcribe" in configs
        extra = " transcribe() errors at the same times |" if control else ""
        lines += [f"## {model}", "", "| file | " + " | ".join(configs) + " | boundary errors silence / fixed (by chance) |" + extra,
                  "|---|" + "---|" * (len(configs) + 1 + control)]  # fmt: skip
        for f in files:
            cells, b, found = [], {}, {}
            for c in configs:
                r = found[c] = next((r for r in mrows if r["file"] == f and r["config"] == c), None)
                cells.append(f"{r['wer']:.2%}" if r else "—")
                if r and r["boundary_errors"] is not None:
                    chance = r.get("boundary_errors_by_chance")
                    b[c] = f"{r['boundary_errors']}" + (f" ({chance:.0f})" if chance is not None else "")
            line = f"| {f} | " + " | ".join(cells) + f" | {b.get('silence', '—')} / {b.get('fixed', '—')} |"
            if control:
                near = (found["transcribe"] or {}).get("errors_near", {})
                line += f" {near.get('silence', '—')} / {near.get('fixed', '—')} |"
            lines.append(line)
        avg = []
        for c in configs:
            vals = [r["wer"] for r in mrows if r["config"] == c]
            avg.append(f"{sum(vals) / len(vals):.2%}" if vals else "—")
        speed = []
        for c in configs:
            done = [r for r in mrows if r["config"] == c and r.get("audio_s")]
            speed.append(f"{sum(r['audio_s'] for r in done) / sum(r['seconds'] for r in done):.1f}x" if done else "—")
        lines += ["| **average** | " + " | ".join(avg) + " | |" + " |" * control,
                  "| **speed, all files (x real time)** | " + " | ".join(speed) + " | |" + " |" * control, ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny.en", help="comma-separated: bundled names, .pt paths, or "
                        "CTranslate2 model folders (named like the model: /tmp/tiny.en)")  # fmt: skip
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="from " + ",".join(CONFIGS))
    parser.add_argument("--files", nargs="*", help="AUDIO:REFERENCE pairs (default: the long files in ../shared)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="wtx's batch rows (streams) and stock decode's batch")
    parser.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (fp16)")
    parser.add_argument("--dtype", help="fp32, fp16 or bf16 for wtx (default: fp32 on CPU, fp16 on CUDA)")
    parser.add_argument("--quantize", default="auto", choices=("auto", "fp16", "int8", "none"),
                        help="wtx's --quantize (packed logit weights on a CPU in fp32; auto: fp16)")
    parser.add_argument("--fw-batch-size", type=int, default=8, help="faster-whisper's batch (default 8, its own default)")
    parser.add_argument("--fw-device", help="faster-whisper's device (default: --device); cpu runs it int8, "
                        "where CTranslate2 has no CUDA libraries it can load")  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--texts", type=Path, help="folder for each row's segments (MODEL.CONFIG.FILE.tsv: start, "
                        "end, text), to read the errors")  # fmt: skip
    args = parser.parse_args()

    import torch

    import wtx
    from wtx.reference import load_stock_model
    from wtx.weights import load_checkpoint

    torch.set_num_threads(args.threads)
    if args.files:
        pairs = [tuple(Path(p) for p in f.split(":", 1)) for f in args.files]
    else:
        pairs = [(SHARED / a, SHARED / r) for a, r in LONG_FILES]
    pairs = [(a, r) for a, r in pairs if a.is_file() and r.is_file()]
    if not pairs:
        print("no audio/reference pairs found", file=sys.stderr)
        return 1
    from wtx.audio import probe_duration

    durations = {audio: probe_duration(str(audio)) for audio, _ in pairs}
    rows = []
    for model in args.models.split(","):
        dtype = args.dtype or ("fp16" if args.device.startswith("cuda") else "fp32")
        options = dict(device=args.device, dtype=dtype, batch_size=args.batch_size, quantize=args.quantize)
        weights = str(ct2_checkpoint(Path(model))) if Path(model).is_dir() else model
        text_only = dict(condition_on_previous_text=False, without_timestamps=True)
        timestamps = dict(condition_on_previous_text=True, without_timestamps=False)  # whatever the device
        wanted = {WTX_MODEL.get(c, "prompted") for c in args.configs.split(",")} | {"prompted"}
        loaders = {"prompted": lambda: wtx.load_model(weights, **options, **timestamps),
                   "greedy": lambda: wtx.load_model(weights, **options, **timestamps, beam_size=1),
                   "unprompted": lambda: wtx.load_model(weights, **options, **(timestamps | {"condition_on_previous_text": False})),
                   "text-only": lambda: wtx.load_model(weights, **options, **text_only),
                   "text-only-greedy": lambda: wtx.load_model(weights, **options, **text_only, beam_size=1)}
        models = {name: load() for name, load in loaders.items() if name in wanted}
        models |= {"faster-whisper": faster_whisper_loader(model, args.fw_device or args.device, args.threads),
                   "fw_batch_size": args.fw_batch_size}  # fmt: skip
        stock = load_stock_model(load_checkpoint(weights), args.device)
        for audio, reference in pairs:
            text = reference.read_text()
            decoded = {}  # config -> (row, segments, boundaries), for errors_near
            for config in args.configs.split(","):
                if config.startswith("fw-"):
                    models["faster-whisper"]()  # loaded before the clock starts, as the wtx models are
                started = time.perf_counter()
                segments, boundaries = run_config(config, models, stock, audio)
                label = Path(model).name.removesuffix(".pt")  # /tmp/base.pt or /tmp/base -> base
                seconds = time.perf_counter() - started
                fw = config.startswith("fw-")
                device = (args.fw_device or args.device) if fw else args.device
                row = {"model": label, "device": device, "dtype": ("float16" if device.startswith("cuda") else "int8") if fw else dtype,
                       "quantized": wtx_quantized(config, models),
                       "threads": args.threads, "file": audio.name, "config": config, "seconds": seconds,
                       "audio_s": durations[audio], "rtfx": durations[audio] / seconds,
                       **score(text, segments, boundaries), "errors_near": {}}  # fmt: skip
                rows.append(row)
                decoded[config] = (row, segments, boundaries)
                if args.texts:
                    args.texts.mkdir(parents=True, exist_ok=True)
                    lines = [f"{start:.2f}\t{end:.2f}\t{text.strip()}\n" for start, end, text in segments]
                    (args.texts / f"{label}.{config}.{audio.stem}.tsv").write_text("".join(lines))
                cross_count(text, decoded)
                b = "" if row["boundary_errors"] is None else (
                    f", boundary errors {row['boundary_errors']} ({row['boundary_errors_by_chance']:.0f} by chance)")
                print(f"{model:8} {audio.name:32} {config:16} WER {row['wer']:.2%}{b} ({seconds:.0f} s, {row['rtfx']:.1f}x)",
                      flush=True)  # fmt: skip
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.markdown:
        command = "python scripts/eval_wer.py " + " ".join(sys.argv[1:])
        args.markdown.write_text(markdown(rows, command.strip(), args.batch_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
