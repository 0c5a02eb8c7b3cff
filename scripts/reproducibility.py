#!/usr/bin/env python3
"""The reproducibility contract, measured: the same command in fresh processes, outputs compared.

    python scripts/reproducibility.py FILES... --runs eager,eager,compile,compile,compile \\
        --json out.json -- --model tiny.en -b 8

Each run is a new `wtx transcribe` process writing txt and json into a folder of its own. The
runs share a wtx cache that starts empty: the first compile run compiles, the later ones load its
artifacts. The
JSON holds each run's wall time, its summary and compile lines, and each output's sha256; the
report says which runs gave identical bytes, and how many words differ from the first run of
the same mode where they do not.
"""

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def words_differing(a: str, b: str) -> int:
    import difflib

    x, y = a.split(), b.split()
    matcher = difflib.SequenceMatcher(a=x, b=y, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--runs", default="eager,eager,compile,compile,compile")
    parser.add_argument("--json")
    parser.add_argument("--workdir", help="where outputs go (default: a temporary folder)")
    args, wtx_args = parser.parse_known_args()
    wtx_args = [a for a in wtx_args if a != "--"]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="wtx-repro-"))
    env = {**os.environ, "WTX_CACHE_DIR": str(work / "cache")}  # a fresh cache: the first compile is cold
    runs = []
    for i, mode in enumerate(args.runs.split(",")):
        out = work / f"run{i}-{mode}"
        command = [sys.executable, "-m", "wtx", "transcribe", *args.files, "-o", str(out), "-f", "txt,json",
                   "--no-resume", *(["--compile"] if mode == "compile" else []), *wtx_args]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        lines = [line for line in proc.stderr.splitlines() if line.startswith(("model ", "transcribed ", "warning", "error"))]
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*"))} if out.exists() else {}
        runs.append({"run": i, "mode": mode, "returncode": proc.returncode, "wall_s": round(wall, 2), "stderr": lines,
                     "outputs": files, "folder": str(out)})  # fmt: skip
        print(f"run {i} ({mode}): exit {proc.returncode}, {wall:.1f} s; {' | '.join(lines)}", file=sys.stderr)
    report = []
    for mode in dict.fromkeys(r["mode"] for r in runs):
        same = [r for r in runs if r["mode"] == mode]
        first = same[0]
        for r in same[1:]:
            diff = {}
            for name in first["outputs"]:
                if name.endswith(".txt") and first["outputs"][name] != r["outputs"].get(name):
                    a = (Path(first["folder"]) / name).read_text()
                    b = (Path(r["folder"]) / name).read_text() if (Path(r["folder"]) / name).exists() else ""
                    diff[name] = words_differing(a, b)
            report.append({"mode": mode, "runs": [first["run"], r["run"]], "identical": r["outputs"] == first["outputs"],
                           "words_differing": diff})  # fmt: skip
            print(f"{mode}: run {first['run']} vs {r['run']}: "
                  f"{'identical bytes' if r['outputs'] == first['outputs'] else f'differ {diff}'}", file=sys.stderr)
    if args.json:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
        meta = {"torch": torch.__version__, "device": device, "files": args.files, "wtx_args": wtx_args}
        Path(args.json).write_text(json.dumps({"meta": meta, "runs": runs, "comparisons": report}, indent=2) + "\n")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
