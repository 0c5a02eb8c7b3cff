"""rich progress on stderr: audio time done / total, windows/s, real-time factor, ETA."""

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

stderr = Console(stderr=True, emoji=False)  # ":a:" in a name or a command is no emoji


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class AudioTimeColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else format_duration(task.total)
        return Text(f"{format_duration(task.completed)}/{total}", style="progress.download")


class ThroughputColumn(ProgressColumn):
    """Windows per second and real-time factor (audio seconds per wall second)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0 or task.completed <= 0:
            return Text("- win/s -x RT", style="progress.data.speed")
        windows = task.fields.get("windows", 0)
        rtfx = task.completed / elapsed
        text = f"{windows / elapsed:.1f} win/s {rtfx:.0f}x RT"
        baseline = task.fields.get("baseline_rtfx")
        if baseline:
            text += f" {rtfx / baseline:.1f}x eager"
        return Text(text, style="progress.data.speed")


class TranscribeProgress:
    """One bar per file and one overall bar; `quiet` makes every call a no-op."""

    def __init__(self, total_audio: float | None, n_files: int, quiet: bool = False):
        self.quiet = quiet
        self.started = time.perf_counter()
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=14),
            AudioTimeColumn(),
            ThroughputColumn(),
            TimeRemainingColumn(),
            console=stderr,
            disable=quiet,
            transient=False,
        )
        self.overall = None
        if n_files > 1:
            self.overall = self.progress.add_task(f"all {n_files} files", total=total_audio, windows=0)
        self.tasks: dict = {}  # key -> task id, one bar per file in flight

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.overall is not None:  # probed durations differ from decoded ones by a few ms
            task = self.progress.tasks[self.overall]
            self.progress.update(self.overall, total=task.completed)
        self.progress.__exit__(*exc)

    def start_file(self, key, name: str, duration: float | None, baseline_rtfx: float | None = None) -> None:
        """A bar for one pass over a file (once per key); baseline_rtfx adds a live speedup over eager."""
        if key in self.tasks:
            return
        short = name if len(name) <= 24 else name[:11] + "…" + name[-12:]
        self.tasks[key] = self.progress.add_task(short, total=duration, windows=0, baseline_rtfx=baseline_rtfx)

    def advance(self, audio_seconds: float, windows: int = 1, key=None) -> None:
        for task_id in (self.tasks.get(key), self.overall):
            if task_id is not None:
                # windows=0 (audio without a decoded window) leaves the count alone: it may come from
                # the scheduler's reading thread while this one counts decoded windows
                fields = {"windows": self.progress.tasks[task_id].fields.get("windows", 0) + windows} if windows else {}
                self.progress.update(task_id, advance=audio_seconds, **fields)

    def finish_file(self, key) -> None:
        task_id = self.tasks.pop(key, None)
        if task_id is not None:
            task = self.progress.tasks[task_id]
            self.progress.update(task_id, total=task.completed)

    def log(self, message: str) -> None:
        """A line above the bars (stderr)."""
        if not self.quiet:
            self.progress.console.print(message, markup=False, highlight=False)
