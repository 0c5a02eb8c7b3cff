"""Where a process's start goes: named phases, timed from the moment the process started.

The loading code marks the end of each phase (`mark`); `wtx transcribe --profile-startup` prints
the table once the engine is ready. The origin is the process's start as the operating system
counts it (Linux: /proc, 10 ms ticks), so the first row holds Python's own start and wtx's
imports; elsewhere it is the import of this module.
"""

import os
import time

_marks: list[tuple[str, float]] = []


def _process_started() -> float:
    """perf_counter()'s reading at the moment this process started."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks since boot
    except (OSError, ValueError, IndexError):
        return now
    return now - max(0.0, age)


ORIGIN = _process_started()


def mark(phase: str) -> None:
    """`phase` ended now."""
    _marks.append((phase, time.perf_counter()))


def phases() -> list[tuple[str, float, float]]:
    """(phase, its seconds, seconds since the process started) for each mark, in order."""
    rows, before = [], ORIGIN
    for phase, at in _marks:
        rows.append((phase, at - before, at - ORIGIN))
        before = at
    return rows


def table() -> str:
    width = max((len(p) for p, _, _ in phases()), default=0)
    lines = [f"{'start-up phase':<{width}}  seconds  since start"]
    lines += [f"{phase:<{width}}  {took:7.2f}  {since:11.2f}" for phase, took, since in phases()]
    return "\n".join(lines)
