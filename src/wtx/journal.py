"""The resume journal: finished windows of one input, appended and fsync'd next to its outputs.

A rerun of the same command reads it back, skips the journaled windows and writes outputs
identical to an uninterrupted run; the journal is removed once the outputs are written. An
exclusive lock keeps two wtx processes from working on the same input and outputs at once.

The journal is opened without following links, as a regular file of mode 0600: a link or
other file planted under its name is refused, never written through. Its records are ASCII
JSON, so any file name (valid UTF-8 or not) round-trips. A journal that cannot be read back
(junk, or records without their fields) is set aside under a new name and the input starts
afresh; only a last line cut short by a crash is expected, and dropped.
"""

import errno
import fcntl
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from wtx.errors import WtxError
from wtx.names import display, hidden_name

VERSION = 4  # 4: chunks of 8 windows at every batch size (3: the identity holds every engine option that changes the text)


class JournalBusy(WtxError):
    pass


@dataclass(frozen=True)
class Entry:
    index: int
    offset: float
    duration: float
    language: str
    segments: list[tuple]  # (start, end, text, words): words as (word, start, end, probability), or ()
    prompt: list[int] = field(default_factory=list)  # the next window's previous-text tokens
    last_speech: float | None = None  # with word timestamps: where speech ended, for the next window


def source_identity(source: str, config: dict) -> dict:
    stat_ = os.stat(source)
    key = json.dumps(config, sort_keys=True)
    return {"version": VERSION, "source": os.path.abspath(source), "size": stat_.st_size,
            "mtime_ns": stat_.st_mtime_ns, "config": hashlib.sha256(key.encode()).hexdigest()[:16]}  # fmt: skip


def _open_private(path: Path) -> int:
    """A file descriptor for `path`, created 0600; a link or non-regular file is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WtxError(f"{display(path)}: the journal's name is a symbolic link; refusing to "
                           f"follow it (remove the link, or use --no-resume)") from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise WtxError(f"{display(path)}: the journal's name is not a regular file; remove it or use --no-resume")
    return fd


class CorruptJournal(ValueError):
    pass


def _parse(data: bytes) -> tuple[dict | None, dict[int, Entry], bool]:
    """(header, entries, clean) from a journal's bytes; clean is False when a last line cut
    short by a crash was dropped. Raises CorruptJournal for anything else."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    header, entries, clean = None, {}, True
    for i, line in enumerate(lines):
        try:
            record = json.loads(line.decode("ascii"))
            if not isinstance(record, dict):
                raise CorruptJournal(f"line {i + 1} is not a record")
            if i == 0:
                header = record
                continue
            entry = Entry(int(record["index"]), float(record["offset"]), float(record["duration"]),
                          str(record["language"]), [_segment(*s) for s in record["segments"]],
                          [int(t) for t in record.get("prompt", [])],
                          None if record.get("last_speech") is None else float(record["last_speech"]))  # fmt: skip
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if i == len(lines) - 1 and not data.endswith(b"\n"):
                clean = False  # the last write was cut short: everything before it stands
                break
            raise CorruptJournal(f"line {i + 1} is not JSON ({type(e).__name__})") from e
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptJournal(f"line {i + 1} lacks a journal field ({type(e).__name__}: {e})") from e
        entries[entry.index] = entry
    return header, entries, clean


def _segment(start, end, text, words=()) -> tuple:
    words = tuple((str(w), float(a), float(b), float(p)) for w, a, b, p in words)
    return float(start), float(end), str(text), words


class Journal:
    def __init__(self, path: Path, identity: dict):
        self.path = path
        self.identity = identity
        self.entries: dict[int, Entry] = {}
        self.set_aside: Path | None = None  # where a corrupt journal was moved
        self.reason: str | None = None  # why it was
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = _open_private(path)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise JournalBusy(f"{display(identity['source'])}: another wtx process is transcribing it into "
                              f"{display(path.parent)}")  # fmt: skip
        try:
            self._load()
        except BaseException:
            os.close(self._fd)
            raise

    def _read(self) -> bytes:
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)

    def _load(self) -> None:
        data = self._read()
        try:
            header, entries, clean = _parse(data)
        except CorruptJournal as e:
            self._set_aside(str(e))
            header, entries, clean = None, {}, True
        if header != self.identity:  # another file, model or options: start over
            entries = {}
            self._rewrite(entries)
        elif not clean:
            self._rewrite(entries)
        self.entries = entries

    def _set_aside(self, reason: str) -> None:
        """Moves an unreadable journal out of the way (keeping it for inspection), under a lock
        of its own, and starts a new one at the journal's path."""
        corrupt = self.path.with_name(hidden_name(self.path.name.lstrip("."), ".corrupt", self.path.parent))
        os.replace(self.path, corrupt)
        self.set_aside = corrupt
        self.reason = reason
        old = self._fd
        self._fd = _open_private(self.path)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(old)

    def _rewrite(self, entries: dict[int, Entry]) -> None:
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._write(self.identity)
        for entry in entries.values():
            self._write(_record(entry))

    def _write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=True) + "\n").encode("ascii")
        os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def append(self, entry: Entry) -> None:
        self._write(_record(entry))
        self.entries[entry.index] = entry

    def close(self, remove: bool = False) -> None:
        if self._fd < 0:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def _record(entry: Entry) -> dict:
    return {"index": entry.index, "offset": entry.offset, "duration": entry.duration,
            "language": entry.language, "segments": [[a, b, t, [list(w) for w in words]] for a, b, t, words in (_segment(*s) for s in entry.segments)], "prompt": entry.prompt,
            "last_speech": entry.last_speech}  # fmt: skip


JOURNAL_SUFFIX = ".wtx-journal"


def journal_path(output: Path) -> Path:
    """The journal for the outputs whose first file is `output`: a hidden file beside it, named
    to fit the file system's NAME_MAX however long the output's name is."""
    return output.parent / hidden_name(output.stem, JOURNAL_SUFFIX, output.parent)
