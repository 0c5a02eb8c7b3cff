#!/usr/bin/env python3
"""Compiled engine against eager engine on whole recordings: do they write the same text?

    python scripts/agreement.py --model tiny.en --files book.mp3 lecture.flac --json out.json
    python scripts/agreement.py --device cuda --model /tmp/base.pt -b 32 --files ...

Each file is cut into windows once, as `wtx transcribe` cuts them (pauses, Silero VAD); both
models (wtx.load_model, eager and compiled) transcribe those windows through the scheduler
(previous-text prompts, temperature fallback, seek tails), with the same options, device, dtype
and batch size. Reported per file: windows whose text is
identical, and the WER between the two full texts (whisper's EnglishTextNormalizer).
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
LONG_FILES = ["audio/lj001_0001-0032_concat.flac", "audio/long_mix_en.mp3", "tts/declaration_kal.mp3",
              "tts/alice_ch01_espeak.mp3", "tts/copperfield_ch01_slt.mp3"]  # fmt: skip


def transcribe(model, windows):
    """Per window index, the window's text; and the seconds it took."""
    from wtx.streams import Recording, WindowDone

    started = time.perf_counter()
    events = model.run([Recording("file", iter(windows), {}, "en")], ordered=True)
    texts = {e.result.window.index: " ".join(s.text for s in e.result.segments) for e in events if isinstance(e, WindowDone)}
    return texts, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", nargs="*", type=Path, help="audio files (default: the long files in ../shared)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default: fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("-b", "--batch-size", type=int, help="default: automatic, as wtx transcribe")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--emulate-precision-casts", action="store_true",
                        help="Inductor rounds fused intermediates to the model dtype, as eager does")
    parser.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                        help="diagnostic: set torch._inductor.config.KEY (true/false/integer), repeatable")
    parser.add_argument("--step-backend", default="inductor",
                        help="diagnostic: 'eager' compiles the encoder only and replays the eager step's kernels")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import jiwer
    import torch

    import wtx
    from wtx.metrics import normalize
    from wtx.pipeline import AudioReader

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = args.inductor + (["emulate_precision_casts=true"] if args.emulate_precision_casts else [])
    if settings:
        import torch._inductor.config as inductor_config

        for setting in settings:
            key, _, value = setting.partition("=")
            parsed = {"true": True, "false": False}.get(value.lower(), value)
            setattr(inductor_config, key, int(parsed) if isinstance(parsed, str) else parsed)
    files = args.files or [SHARED / f for f in LONG_FILES]
    files = [f for f in files if f.is_file()]
    if not files:
        print("no audio files found", file=sys.stderr)
        return 1
    options = dict(device=args.device, dtype=args.dtype, batch_size=args.batch_size)
    eager = wtx.load_model(args.model, **options)
    compiled = wtx.load_model(args.model, **options, compile=True, strict=True)
    if args.step_backend != "inductor":  # a diagnostic the API does not offer: rebuild its engine
        from dataclasses import replace

        from wtx.engine import Engine

        compiled.engine = Engine(replace(compiled.engine.options, step_backend=args.step_backend))
    used = eager.options
    report = {"model": args.model, "device": used["device"], "dtype": used["dtype"], "batch_size": used["batch_size"],
              "torch": torch.__version__, "emulate_precision_casts": args.emulate_precision_casts,
              "inductor": args.inductor, "step_backend": args.step_backend,
              "compile": {"source": compiled.engine.compile_report.source, "seconds": compiled.engine.compile_report.seconds},
              "files": []}  # fmt: skip
    for path in files:
        windows = list(AudioReader(str(path), "silence", eager.detector))
        reference, eager_s = transcribe(eager, windows)
        candidate, compiled_s = transcribe(compiled, windows)
        differ = [i for i in reference if reference.get(i) != candidate.get(i)]
        same = len(reference) - len(differ)
        wer = jiwer.wer(normalize(" ".join(reference.values())) or "-", normalize(" ".join(candidate.values())) or "-")
        row = {"file": path.name, "windows": len(reference), "identical_windows": same,
               "identical_share": same / max(1, len(reference)), "differing_windows": differ, "wer_between": wer,
               "eager_s": eager_s, "compiled_s": compiled_s}  # fmt: skip
        report["files"].append(row)
        print(f"{path.name:32} identical {same}/{len(reference)} ({row['identical_share']:.1%}), "
              f"WER between {wer:.2%}; eager {eager_s:.1f} s, compiled {compiled_s:.1f} s", flush=True)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    total = sum(r["windows"] for r in report["files"])
    same = sum(r["identical_windows"] for r in report["files"])
    print(f"all files: identical {same}/{total} ({same / max(1, total):.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
