#!/usr/bin/env python3
"""How the decode step runs on CUDA, each way in fresh processes on the same files: eager
kernels launched one by one, CUDA graphs of the eager kernels, and Inductor's code in CUDA
graphs (cold compile, then its artifacts loaded).

    python scripts/graph_backends.py FILES... --model tiny.en -b 32 --beam-sizes 1,5 --json out.json

Every process builds an engine through wtx's API, transcribes the files one after another
(no VAD: the same windows for every backend) and reports its start-up phases (wtx.startup),
the decoding time (device synchronized) and the text. The report gives each backend's ready
time, decoding time, and how many words differ from the Inductor run's text.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from reproducibility import words_differing  # scripts/, beside this one

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from wtx import startup
from wtx.bytecode import keep_bytecode
keep_bytecode()
import torch
startup.mark("import torch")
from dataclasses import replace
from wtx.api import Model
from wtx.engine import Engine, EngineOptions
from wtx.options import DecodingOptions
spec = json.loads(sys.argv[1])
decoding = replace(DecodingOptions(), beam_size=spec["beam"], best_of=spec["beam"])
options = EngineOptions(model=spec["model"], batch_size=spec["batch"], compile=spec["compile"],
                        step_backend=spec["backend"], strict=True, decoding=decoding)
engine = Engine(options)
startup.mark("engine ready")
model = Model(engine)
started = time.perf_counter()
texts = []
for path in spec["files"]:
    segments, info = model.transcribe(path)
    texts.append(" ".join(s.text.strip() for s in segments))
torch.cuda.synchronize() if torch.cuda.is_available() else None
decoding_s = time.perf_counter() - started
report = engine.compile_report
print(json.dumps({"phases": startup.phases(), "decoding_s": decoding_s, "texts": texts,
                  "source": report.source if report else "eager", "compile_s": report.seconds if report else None}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--beam-sizes", default="1,5")
    parser.add_argument("--json")
    args = parser.parse_args()
    env = {**os.environ, "WTX_CACHE_DIR": tempfile.mkdtemp(prefix="wtx-backends-"),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    runs = [("eager", False, "inductor"), ("graphs", True, "eager"), ("inductor cold", True, "inductor"),
            ("inductor warm", True, "inductor")]  # fmt: skip
    rows = []
    for beam in [int(b) for b in args.beam_sizes.split(",")]:
        for name, compile, backend in runs:
            spec = {"model": args.model, "batch": args.batch_size, "beam": beam, "compile": compile,
                    "backend": backend, "files": [str(Path(f).resolve()) for f in args.files]}  # fmt: skip
            proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"beam {beam} {name}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                rows.append({"beam": beam, "run": name, "error": proc.stderr[-3000:]})
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            ready = next(since for phase, _, since in result["phases"] if phase == "engine ready")
            rows.append({"beam": beam, "run": name, "ready_s": ready, **result})
            print(f"beam {beam} {name}: ready at {ready:.2f} s, decoding {result['decoding_s']:.2f} s "
                  f"({result['source']}, {result['compile_s']})", file=sys.stderr, flush=True)  # fmt: skip
    table = []
    for row in rows:
        if "error" in row:
            continue
        reference = next(r for r in rows if r["beam"] == row["beam"] and r["run"] == "inductor warm" and "error" not in r)
        differing = sum(words_differing(a, b) for a, b in zip(reference["texts"], row["texts"]))
        total = sum(len(t.split()) for t in reference["texts"])
        table.append({"beam": row["beam"], "run": row["run"], "ready_s": round(row["ready_s"], 2),
                      "decoding_s": round(row["decoding_s"], 3), "words_differing_from_inductor": differing,
                      "words": total})  # fmt: skip
    result = {"command": sys.argv, "python": platform.python_version(), "table": table, "rows": rows}
    try:
        import torch

        result.update(torch=torch.__version__, device=torch.cuda.get_device_name(0))
    except (ImportError, RuntimeError, AssertionError):
        pass
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"{'beam':>4} {'run':<14} {'ready s':>8} {'decoding s':>10} {'words differing':>16}")
    for t in table:
        print(f"{t['beam']:>4} {t['run']:<14} {t['ready_s']:>8} {t['decoding_s']:>10} "
              f"{t['words_differing_from_inductor']:>9}/{t['words']}")  # fmt: skip
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
