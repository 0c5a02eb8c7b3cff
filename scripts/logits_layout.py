#!/usr/bin/env python3
"""The logit projection's two layouts on a CPU: rows times the embedding's transpose (stock
openai-whisper's `x @ W.T`) against the embedding times the rows' transpose (`(W @ x.T).T`, what
wtx runs on a CPU), timed at several row counts, with whether the two give the same bits.

    python scripts/logits_layout.py --threads 2 --rows 1,4,8,20,40 --json layout.json

Random float32 weights of tiny.en's vocabulary (51,864 x 384; --n-state for other models), the
median of --repeat calls after three warm-up calls each.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def timed(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4,8,20,40")
    parser.add_argument("--n-vocab", type=int, default=51864)
    parser.add_argument("--n-state", type=int, default=384)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    weight = torch.randn(args.n_vocab, args.n_state)
    rows = []
    for n in map(int, args.rows.split(",")):
        x = torch.randn(n, args.n_state)
        stock = timed(lambda: x @ weight.T, args.repeat)
        ours = timed(lambda: (weight @ x.T).T.contiguous(), args.repeat)
        same = torch.equal(x @ weight.T, (weight @ x.T).T.contiguous())
        rows.append({"rows": n, "x_at_wt_ms": round(stock, 3), "w_at_xt_ms": round(ours, 3), "same_bits": same})
        print(f"{n:4d} rows: x @ W.T {stock:7.2f} ms, (W @ x.T).T {ours:7.2f} ms, same bits: {same}", file=sys.stderr)
    result = {"command": sys.argv, "torch": torch.__version__, "threads": args.threads,
              "platform": platform.platform(), "processor": platform.processor(), "rows": rows}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
