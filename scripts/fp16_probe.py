#!/usr/bin/env python3
"""Where does fp16 text start to differ between processes? Hashes every stage of one batch.

    python scripts/fp16_probe.py FILE --model /tmp/tiny.en.pt --json out.json   # run it twice

Decodes FILE's audio, cuts wtx's windows, and for the first batch records the sha256 of the
samples, the log-mel features, the encoder output, each decoder block's cross-attention K/V, the
prefill logits and the decoded tokens, three times in this process. Two processes' JSON files
show the first stage whose bytes differ between them, and whether it differs within a process.
"""

import argparse
import hashlib
import json
import sys

import numpy as np
import torch


def digest(t) -> str:
    if isinstance(t, np.ndarray):
        return hashlib.sha256(t.tobytes()).hexdigest()[:16]
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json")
    parser.add_argument("--variant", default="plain", choices=("plain", "zero-caches", "math-sdpa", "no-mask-stale"),
                        help="zero-caches: zero the KV caches before each repeat; math-sdpa: SDPA's math kernel only")
    args = parser.parse_args()
    from wtx.audio import stream_samples
    from wtx.engine import Engine, EngineOptions
    from wtx.features import log_mel_spectrogram
    from wtx.split import make_windows

    engine = Engine(EngineOptions(model=args.model, batch_size=args.batch_size))
    windows = list(make_windows(stream_samples(args.file), "silence"))[: args.batch_size]
    prompts = [[] if i % 2 else engine.tokenizer.encode(" The story so far, as it was told.") for i in range(len(windows))]
    repeats = []
    from contextlib import nullcontext

    context = nullcontext()
    if args.variant == "math-sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        context = sdpa_kernel(SDPBackend.MATH)
    for _ in range(3):
        if args.variant == "zero-caches" and engine.batch.loop is not None:
            for block in engine.model.decoder.blocks:
                block.attn.kv_cache.k.zero_()
                block.attn.kv_cache.v.zero_()
        stages = {"samples": digest(np.stack([w.samples for w in windows]))}
        with torch.no_grad(), context:
            samples = engine.batch.stack(windows).to(engine.device)
            mel = log_mel_spectrogram(samples, engine.dims.n_mels).to(engine.dtype)
            stages["mel"] = digest(mel)
            features = engine.model.encoder(mel)
            stages["encoder"] = digest(features)
            results = engine.decode_batch(windows, prompts=prompts)
            for i, block in enumerate(engine.model.decoder.blocks):
                stages[f"cross_k{i}"] = digest(block.cross_attn.cross_kv.k)
            stages["first_logits"] = digest(engine.batch.loop.logits)  # after the last step
            stages["tokens"] = hashlib.sha256(json.dumps([r.tokens for r in results]).encode()).hexdigest()[:16]
            stages["logprobs"] = hashlib.sha256(json.dumps([r.avg_logprob for r in results]).encode()).hexdigest()[:16]
        repeats.append(stages)
        print(json.dumps(stages), file=sys.stderr)
    same = all(r == repeats[0] for r in repeats)
    print(f"within this process: {'identical' if same else 'different'} over {len(repeats)} repeats", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"variant": args.variant, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                       "torch": torch.__version__, "repeats": repeats}, f, indent=2)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
