"""The resume journal: finished windows of one input, appended and fsync'd next to its outputs.

A rerun of the same command reads it back, skips the journaled windows and writes outputs
identical to an uninterrupted run; the journal is removed once the outputs are written. An
exclusive lock keeps two wtx processes from working on the same input and outputs at once.
"""

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from wtx.errors import WtxError

VERSION = 2  # 2: entries carry the prompt for the next window


class JournalBusy(WtxError):
    pass


@dataclass(frozen=True)
class Entry:
    index: int
    offset: float
    duration: float
    language: str
    segments: list[tuple[float, float, str]]
    prompt: list[int] = field(default_factory=list)  # the next window's previous-text tokens


def source_identity(source: str, config: dict) -> dict:
    stat = os.stat(source)
    key = json.dumps(config, sort_keys=True)
    return {"version": VERSION, "source": os.path.abspath(source), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "config": hashlib.sha256(key.encode()).hexdigest()[:16]}  # fmt: skip


class Journal:
    def __init__(self, path: Path, identity: dict):
        self.path = path
        self.identity = identity
        self.entries: dict[int, Entry] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise JournalBusy(f"{identity['source']}: another wtx process is transcribing it into {path.parent}")
        self._load()

    def _load(self) -> None:
        self._file.seek(0)
        lines = self._file.read().splitlines()
        header = None
        entries = {}
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short by a crash: everything before it stands
            if i == 0:
                header = record
                continue
            entry = Entry(record["index"], record["offset"], record["duration"], record["language"],
                          [tuple(s) for s in record["segments"]], record.get("prompt", []))  # fmt: skip
            entries[entry.index] = entry
        if header != self.identity:  # another file, model or options: start over
            self._file.seek(0)
            self._file.truncate()
            self._write(self.identity)
            entries = {}
        elif lines and not _complete(lines):
            self._rewrite(entries)
        self.entries = entries

    def _rewrite(self, entries: dict[int, "Entry"]) -> None:
        self._file.seek(0)
        self._file.truncate()
        self._write(self.identity)
        for entry in entries.values():
            self._write(_record(entry))

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def append(self, entry: Entry) -> None:
        self._write(_record(entry))
        self.entries[entry.index] = entry

    def close(self, remove: bool = False) -> None:
        if remove:
            self.path.unlink(missing_ok=True)
        self._file.close()


def _record(entry: Entry) -> dict:
    return {"index": entry.index, "offset": entry.offset, "duration": entry.duration,
            "language": entry.language, "segments": [list(s) for s in entry.segments], "prompt": entry.prompt}  # fmt: skip


def _complete(lines: list[str]) -> bool:
    try:
        for line in lines:
            json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def journal_path(output: Path) -> Path:
    """The journal for the outputs whose first file is `output`: a hidden file beside it."""
    return output.parent / f".{output.stem}.wtx-journal"
