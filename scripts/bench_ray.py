"""`wtx transcribe` in one process against `--ray local`: whole-process wall clock, and identity.

    python scripts/bench_ray.py FILES... [--repeat 2] [--json out.json] [-- extra transcribe args]

Runs the same command once untimed (it compiles, with --compile, and fills the cache), then
alternately in one process and with `--ray local --workers N`, each in a fresh process, timed
from start to exit (every output written). Every run's outputs must equal the first's, byte for
byte. Prints the medians and the ratio of throughputs; the JSON keeps every run, with the lines
the Ray workers logged (engine start, and per call how full the batch rows were kept).
"""

import argparse
import glob
import hashlib
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUMMARY = re.compile(r"transcribed \d+/\d+ inputs.*?in ([\d.]+) s")


RAY_LOGS = "/tmp/ray/session_latest/logs/worker-*.err"  # the session a local Ray run just ended


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def digests(written: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest()[:16] for name, data in written.items()}


def differing(got: dict[str, bytes], reference: dict[str, bytes]) -> list[str]:
    return sorted(name for name in got.keys() | reference.keys() if got.get(name) != reference.get(name))


def worker_lines() -> list[str]:
    lines = []
    for path in sorted(glob.glob(RAY_LOGS)):
        with open(path, errors="replace") as f:
            lines += [line.strip() for line in f if "wtx worker:" in line]
    return lines


def run(files: list[str], extra: list[str], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "wtx", "transcribe", *files, "-o", str(out), *extra]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stderr.splitlines() if "ready in" in line or "transcribed" in line]
    match = SUMMARY.search(proc.stderr)
    return {"command": command[3:], "wall_s": wall, "work_s": float(match.group(1)) if match else None,
            "stderr": lines, "stdout_bytes": len(proc.stdout)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    import wtx

    root = Path(tempfile.mkdtemp(prefix="wtx-bench-ray-"))
    warm = run(args.files, extra, root / "warm")
    reference = outputs(root / "warm")
    warm["sha256"] = digests(reference)
    modes = {"single": [], "ray": []}
    ray_args = ["--ray", "local", "--workers", str(args.workers)]
    for _ in range(args.repeat):
        for mode, more in (("single", []), ("ray", ray_args)):
            result = run(args.files, extra + more, root / mode)
            written = outputs(root / mode)
            result["sha256"] = digests(written)
            result["differs"] = differing(written, reference)
            result["identical"] = not result["differs"]
            if mode == "ray":
                result["workers_log"] = worker_lines()
            modes[mode].append(result)
            print(f"{mode:6s} wall {result['wall_s']:.1f} s, identical: {result['identical']}", file=sys.stderr, flush=True)
    from wtx.audio import probe_duration

    audio = sum(probe_duration(f) or 0.0 for f in args.files)
    medians = {mode: statistics.median(r["wall_s"] for r in runs) for mode, runs in modes.items()}
    report = {
        "files": args.files, "audio_s": audio, "extra": extra, "workers": args.workers, "warm_up": warm,
        "runs": modes, "median_wall_s": medians,
        "ray_throughput_share": medians["single"] / medians["ray"],
        "identical": all(r["identical"] for runs in modes.values() for r in runs),
        "versions": {"python": platform.python_version(), "wtx": wtx.__version__, **_versions()},
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"audio {audio / 3600:.2f} h; median wall: one process {medians['single']:.1f} s "
          f"({audio / medians['single']:.0f}x), --ray local {medians['ray']:.1f} s ({audio / medians['ray']:.0f}x); "
          f"ray/single throughput {report['ray_throughput_share']:.1%}; identical: {report['identical']}")  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


def _versions() -> dict:
    found = {}
    for name in ("torch", "ray", "triton"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            pass
    return found


if __name__ == "__main__":
    main()
