#!/usr/bin/env python3
"""The tokens of the three ways of running CUDA decode steps, on random weights: for checking a
change on a GPU machine that has neither ffmpeg nor Whisper's weights.

    python scripts/gpu_tokens.py --json new.json                    # on the GPU machine
    python scripts/gpu_tokens.py --json new.json --against old.json # the same tokens as before?

Builds a model of tiny.en's shapes (or --dims of another) with seeded random weights, 3 windows
of seeded noise (the last one 11 s, padded), and decodes them with eager launches, CUDA graphs of
the eager kernels and Inductor (`--compile`), at beam 1 and beam 5, greedy and with the fallback
temperatures [0, 0.6, 1.0] (sampling); text only with --without-timestamps. Prints whether CUDA graphs give the eager tokens (they
must) and whether Inductor does (its own bits: on random weights near-ties can part); with
--against, whether every token list equals an earlier run's (the code before a change).
The JSON keeps every token list.
"""

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

TINY = dict(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
            n_vocab=51864, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)  # fmt: skip


def random_checkpoint(dims: dict, path: Path) -> None:
    import torch

    from wtx.model import ModelDimensions, Whisper

    shapes = Whisper(ModelDimensions(**dims)).state_dict()  # every tensor replaced: a seed per tensor
    state = {name: torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) * 0.05
             for i, (name, t) in enumerate(shapes.items())}  # fmt: skip
    torch.save({"dims": dims, "model_state_dict": state}, path)


def noise_windows():
    import numpy as np

    from wtx.audio import N_SAMPLES, SAMPLE_RATE, Window

    rng = np.random.default_rng(0)
    durations = (30.0, 30.0, 11.0)
    windows = []
    for i, duration in enumerate(durations):
        samples = (0.1 * rng.standard_normal(N_SAMPLES)).astype(np.float32)
        samples[int(duration * SAMPLE_RATE) :] = 0.0
        windows.append(Window(index=i, offset=30.0 * i, duration=duration, samples=samples))
    return windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=json.loads, default=TINY, help="ModelDimensions as JSON (default: tiny.en's)")
    parser.add_argument("--sample-len", type=int, default=64, help="tokens per window at most")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--against", type=Path, help="an earlier run's JSON: are the tokens the same?")
    parser.add_argument("--without-timestamps", action="store_true", help="decode text only (--without-timestamps)")
    args = parser.parse_args()

    import torch

    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    workdir = tempfile.TemporaryDirectory()  # the random checkpoint, removed at exit
    checkpoint = Path(workdir.name) / "random.pt"
    random_checkpoint(args.dims, checkpoint)
    windows = noise_windows()
    runs = {}
    for beam in (1, 5):
        text_only = {"without_timestamps": True} if args.without_timestamps else {}  # (code before the option: not given)
        decoding = DecodingOptions(beam_size=beam, best_of=beam, sample_len=args.sample_len, **text_only)
        options = EngineOptions(model=str(checkpoint), device="cuda", batch_size=4, strict=True,
                                condition_on_previous_text=False, decoding=decoding)  # fmt: skip
        started = time.perf_counter()
        engines = {"eager": Engine(replace(options, cuda_graph=False)), "graphs": Engine(options),
                   "compiled": Engine(replace(options, compile=True))}  # fmt: skip
        print(f"beam {beam}: engines ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for temperatures in (None, [0.0, 0.6, 1.0]):
            key = f"beam {beam}, temperatures {temperatures}"
            tokens = {name: [list(map(int, r.tokens)) for r in engine.decode_batch(windows, temperatures=temperatures)]
                      for name, engine in engines.items()}  # fmt: skip
            runs[key] = {"tokens": tokens, "graphs_equal_eager": tokens["graphs"] == tokens["eager"],
                         "compiled_equal_eager": [a == b for a, b in zip(tokens["compiled"], tokens["eager"])]}  # fmt: skip
            print(f"{key}: CUDA graphs == eager {runs[key]['graphs_equal_eager']}, "
                  f"compiled == eager per window {runs[key]['compiled_equal_eager']}")  # fmt: skip
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "dims": args.dims,
              "without_timestamps": args.without_timestamps, "runs": runs}  # fmt: skip
    args.json.write_text(json.dumps(report, indent=1))
    workdir.cleanup()
    ok = all(run["graphs_equal_eager"] for run in runs.values())
    if args.against is not None:
        before = json.loads(args.against.read_text())["runs"]
        for key, run in runs.items():
            same = {name: run["tokens"][name] == before[key]["tokens"][name] for name in run["tokens"]}
            print(f"{key}: the same tokens as {args.against.name}: {same}")
            ok = ok and all(same.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
