#!/usr/bin/env python3
"""Start-up measured in fresh processes: what `import torch` and CUDA take alone, and where a
`wtx transcribe --compile` process spends its start, cold and with its artifacts loaded.

    python scripts/startup.py FILES... --warm 3 --json out.json -- --model tiny.en --beam-size 1

Runs, each a new process, sharing a wtx cache that starts empty (or --cache):
1. `wtx transcribe FILES --compile --profile-startup` once (`--steps graphs`: without --compile,
   the default): the cold compile, and the bytecode wtx keeps where the install has none;
2. the baseline, --baseline times: `import torch` and a first CUDA tensor (synchronized), with the
   same bytecode folder wtx uses, so both sides read the same kept bytecode;
3. the same transcribe command --warm times, loading the artifacts the first run saved.
Each row keeps the wall time, the phase table (wtx.startup), the "ready" line and the summary's
decoding time. The report: ready since the process started, against the baseline's median, and
the whole process against its decoding time.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "import torch; torch.zeros(1, device='cuda' if torch.cuda.is_available() else 'cpu'); " \
           "torch.cuda.synchronize() if torch.cuda.is_available() else None"  # fmt: skip
PHASE = re.compile(r"^(.+?)\s+(\d+\.\d+)\s+(\d+\.\d+)$")
SUMMARY = re.compile(r"of audio in ([\d.]+) s")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def timed(command, env) -> tuple[float, subprocess.CompletedProcess, float | None]:
    """Wall time, the finished process, and when its summary line ("transcribed ...") arrived."""
    started = time.perf_counter()
    summary_at, lines = None, []
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) as proc:
        for line in proc.stderr:
            lines.append(line)
            if summary_at is None and line.startswith("transcribed "):
                summary_at = time.perf_counter() - started
    wall = time.perf_counter() - started
    return wall, subprocess.CompletedProcess(command, proc.returncode, "", "".join(lines)), summary_at


def parse(stderr: str) -> dict:
    """The phase table, the model line and the summary's seconds from a transcribe's stderr."""
    phases, lines, decoding = [], [], None
    in_table = False
    for line in stderr.splitlines():
        if line.startswith("start-up phase"):
            in_table = True
            continue
        match = PHASE.match(line.strip()) if in_table else None
        if match:
            phases.append({"phase": match.group(1), "seconds": float(match.group(2)), "since_start": float(match.group(3))})
            continue
        in_table = False
        if line.startswith(("model ", "transcribed ", "warning", "error", "loading ", "compiling ")):
            lines.append(line)
        summary = SUMMARY.search(line) if line.startswith("transcribed ") else None
        if summary:
            decoding = float(summary.group(1))
    return {"phases": phases, "lines": lines, "decoding_s": decoding}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--warm", type=int, default=3, help="processes that load the saved artifacts")
    parser.add_argument("--baseline", type=int, default=3, help="processes of import torch and a CUDA tensor")
    parser.add_argument("--cache", help="the wtx cache to use (default: a new, empty one)")
    parser.add_argument("--steps", choices=("compile", "graphs"), default="compile",
                        help="compile: --compile (Inductor); graphs: the default on CUDA (CUDA graphs of the eager kernels)")
    parser.add_argument("--json")
    args, wtx_args = parser.parse_known_args()
    wtx_args = [a for a in wtx_args if a != "--"]
    work = Path(tempfile.mkdtemp(prefix="wtx-startup-"))
    cache = Path(args.cache) if args.cache else work / "cache"
    env = {**os.environ, "WTX_CACHE_DIR": str(cache),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    rows = []

    def transcribe(kind: str, i: int) -> None:
        out = work / f"{kind}{i}"
        command = [sys.executable, "-m", "wtx", "transcribe", *args.files, "-o", str(out), "-f", "txt",
                   "--no-resume", *(["--compile"] if args.steps == "compile" else []), "--profile-startup", *wtx_args]  # fmt: skip
        wall, proc, summary_at = timed(command, env)
        row = {"kind": kind, "run": i, "returncode": proc.returncode, "wall_s": round(wall, 3), **parse(proc.stderr),
               "exit_after_summary_s": round(wall - summary_at, 3) if summary_at is not None else None}  # fmt: skip
        if proc.returncode != 0:
            row["stderr_tail"] = proc.stderr[-2000:]
        rows.append(row)
        ready = next((p["since_start"] for p in row["phases"] if p["phase"] == "engine ready"), None)
        log(f"{kind} {i}: exit {proc.returncode}, {wall:.2f} s, ready at {ready} s, decoding {row['decoding_s']} s, "
            f"exited {row['exit_after_summary_s']} s after its summary")
        for phase in row["phases"]:
            log(f"   {phase['phase']:<40} {phase['seconds']:7.2f} {phase['since_start']:7.2f}")

    transcribe("cold", 0)
    bytecode = cache / "bytecode"
    base_env = {**env, **({"PYTHONPYCACHEPREFIX": str(bytecode)} if bytecode.is_dir() else {})}
    for i in range(args.baseline):
        wall, proc, _ = timed([sys.executable, "-c", BASELINE], base_env)
        rows.append({"kind": "baseline", "run": i, "returncode": proc.returncode, "wall_s": round(wall, 3),
                     "kept_bytecode": bytecode.is_dir()})  # fmt: skip
        log(f"baseline {i}: {wall:.2f} s")
    for i in range(args.warm):
        transcribe("warm", i)

    baseline = statistics.median(r["wall_s"] for r in rows if r["kind"] == "baseline") if args.baseline else None
    warm = [r for r in rows if r["kind"] == "warm" and r["returncode"] == 0]
    readies = [next(p["since_start"] for p in r["phases"] if p["phase"] == "engine ready") for r in warm if r["phases"]]
    report = {
        "baseline_median_s": baseline,
        "warm_ready_since_start_median_s": statistics.median(readies) if readies else None,
        "warm_wall_median_s": statistics.median(r["wall_s"] for r in warm) if warm else None,
        "warm_decoding_median_s": statistics.median(r["decoding_s"] for r in warm if r["decoding_s"]) if warm else None,
        "warm_exit_after_summary_median_s": _median([r["exit_after_summary_s"] for r in warm]),
    }
    if baseline and readies:
        report["ready_after_baseline_s"] = round(report["warm_ready_since_start_median_s"] - baseline, 3)
    if report["warm_wall_median_s"] and report["warm_decoding_median_s"]:
        report["wall_over_decoding"] = round(report["warm_wall_median_s"] / report["warm_decoding_median_s"], 3)
    result = {"command": sys.argv, "python": platform.python_version(), "platform": platform.platform(),
              "report": report, "rows": rows}  # fmt: skip
    try:
        import torch

        result["torch"] = torch.__version__
        result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
    except ImportError:
        pass
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    for key, value in report.items():
        print(f"{key}: {value}")
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
