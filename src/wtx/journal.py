"""The resume journal: finished windows of one input, appended and fsync'd next to its outputs.

A rerun of the same command reads it back, skips the journaled windows and writes outputs
identical to an uninterrupted run; the journal is removed once the outputs are written. An
exclusive lock keeps two wtx processes from working on the same input and outputs at once.

The journal knows its input by content (a hash of the file's bytes) and the options that change
the text: a journal of other audio or other options is started over. The journal is opened
without following links, as a regular file of mode 0600: a link or other file planted under its
name is refused, never written through, and one that another user owns or others can read or
write is set aside. Every record carries an HMAC, chained over the records before it, under a
key private to the user (wtx.paths.journal_key): records wtx did not write for this user, or
that were edited, make the journal set aside. Its records are ASCII JSON, so any file name (valid
UTF-8 or not) round-trips. A journal that cannot be read back (junk, records without their
fields or their MAC) is set aside under a new name and the input starts afresh; only a last line
cut short by a crash is expected, and dropped.
"""
import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from wtx.atomic import remove_unheld
from wtx.errors import WtxError
from wtx.names import display, hidden_name
from wtx.paths import not_private

VERSION = 5  # 5: inputs known by content, records authenticated (4: chunks of 8 windows)


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


def content_digest(source: str) -> str:
    """A hash of the file's bytes, read in blocks (never whole into memory)."""
    with open(source, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:32]


def source_identity(source: str, config: dict) -> dict:
    """What a journal must have been written for to be resumed: this input's path and content
    (not its time: audio swapped in under the same size and time is other audio) and `config`."""
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": VERSION, "source": os.path.abspath(source), "size": os.stat(source).st_size,
            "content": content_digest(source), "config": key}  # fmt: skip


def _restart_reason(header: dict | None, identity: dict) -> str:
    """Why a readable journal's windows do not belong to this run."""
    if not isinstance(header, dict) or header.get("version") != identity.get("version"):
        return "it was written by another version of wtx"
    if header.get("source") != identity.get("source"):
        return "it was written for another file"
    if header.get("config") != identity.get("config"):
        return "it was written with other options"
    return "the audio changed since it was written"


def _open_private(path: Path, exclusive: bool = False) -> int:
    """A file descriptor for `path`, created 0600 (with `exclusive`, only created); a link or
    non-regular file is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_EXCL if exclusive else 0
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WtxError(f"{display(path)}: the journal's name is a symbolic link; refusing to "
                           f"follow it (remove the link, or use --no-resume)") from e
        raise WtxError(f"{display(path)}: cannot open the journal ({e.strerror or e}); "
                       f"remove it, or use --no-resume") from e  # fmt: skip
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise WtxError(f"{display(path)}: the journal's name is not a regular file; remove it or use --no-resume")
    return fd


MAC_PREFIX = b'{"mac": "'
MAC_LENGTH = 64  # hex digits of an HMAC-SHA256


def _mac(key: bytes, previous: str, text: bytes) -> str:
    """A record's MAC: over its JSON text and the MAC of the record before it ("" before
    the header)."""
    return hmac.new(key, previous.encode("ascii") + b"\n" + text, hashlib.sha256).hexdigest()


def _line(key: bytes, previous: str, record: dict) -> tuple[bytes, str]:
    """A record as its journal line, `{"mac": MAC, ...the record's fields}`, and its MAC."""
    text = json.dumps(record, ensure_ascii=True).encode("ascii")
    mac = _mac(key, previous, text)
    return MAC_PREFIX + mac.encode("ascii") + b'", ' + text[1:] + b"\n", mac


def _authentic(key: bytes, previous: str, line: bytes) -> tuple[bytes, str] | None:
    """(the record's JSON text, its MAC) where `line` carries the right MAC, else None."""
    start = len(MAC_PREFIX)
    mac, rest = line[start : start + MAC_LENGTH], line[start + MAC_LENGTH :]
    if not line.startswith(MAC_PREFIX) or not rest.startswith(b'", '):
        return None
    text = b"{" + rest[3:]
    expected = _mac(key, previous, text)
    return (text, expected) if hmac.compare_digest(mac, expected.encode("ascii")) else None


class CorruptJournal(ValueError):
    pass


def _parse(data: bytes, key: bytes) -> tuple[dict | None, dict[int, Entry], bool, str]:
    """(header, entries, clean, the last record's MAC) from a journal's bytes; clean is False
    when a last line cut short by a crash was dropped. Raises CorruptJournal for anything else."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    header, entries, clean, mac = None, {}, True, ""
    for i, line in enumerate(lines):
        try:
            authentic = _authentic(key, mac, line)
            if authentic is None:
                raise CorruptJournal(f"line {i + 1} fails its authentication check: wtx did not "
                                     f"write it for you, or it was edited")  # fmt: skip
            text, next_mac = authentic
            record = json.loads(text.decode("ascii"))
            if not isinstance(record, dict):
                raise CorruptJournal(f"line {i + 1} is not a record")
            if i == 0:
                header, mac = record, next_mac
                continue
            entry = Entry(int(record["index"]), float(record["offset"]), float(record["duration"]),
                          str(record["language"]), [_segment(*s) for s in record["segments"]],
                          [int(t) for t in record.get("prompt", [])],
                          None if record.get("last_speech") is None else float(record["last_speech"]))  # fmt: skip
        except (UnicodeDecodeError, json.JSONDecodeError, CorruptJournal) as e:
            if i == len(lines) - 1 and not data.endswith(b"\n"):
                clean = False  # the last write was cut short: everything before it stands
                break
            if isinstance(e, CorruptJournal):
                raise
            raise CorruptJournal(f"line {i + 1} is not JSON ({type(e).__name__})") from e
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptJournal(f"line {i + 1} lacks a journal field ({type(e).__name__}: {e})") from e
        entries[entry.index] = entry
        mac = next_mac
    return header, entries, clean, mac


def _segment(start, end, text, words=()) -> tuple:
    words = tuple((str(w), float(a), float(b), float(p)) for w, a, b, p in words)
    return float(start), float(end), str(text), words


class Journal:
    def __init__(self, path: Path, identity: dict, key: bytes | None = None):
        """Opens (or creates) the journal at `path` for an input of `identity`, locked; `key`:
        the MAC key (default: this user's, wtx.paths.journal_key). Raises JournalBusy while
        another process holds it, WtxError where it cannot be opened."""
        from wtx.paths import journal_key

        self.path = path
        self.identity = identity
        self.key = journal_key() if key is None else key
        self.entries: dict[int, Entry] = {}
        self.set_aside: Path | None = None  # where a corrupt or untrusted journal was moved
        self.reason: str | None = None  # why it was
        self.restarted: str | None = None  # why journaled windows were started over
        self._mac = ""  # the last record's
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            # never opened, locked or read
            if stat.S_ISREG(st.st_mode) and (reason := not_private(st)):
                self._move_aside(reason)
        self._fd = _open_private(path, exclusive=self.set_aside is not None)
        if reason := not_private(os.fstat(self._fd)):  # planted between the two looks
            os.close(self._fd)
            raise WtxError(f"{display(path)}: the journal is not used ({reason}); remove it, "
                           f"or use --no-resume")
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
            header, entries, clean, self._mac = _parse(data, self.key)
        except CorruptJournal as e:
            self._set_aside(str(e))
            header, entries, clean = None, {}, True
        if header != self.identity:  # another file, model or options: start over
            if entries:
                self.restarted = _restart_reason(header, self.identity)
            entries = {}
            self._rewrite(entries)
        elif not clean:
            self._rewrite(entries)
        self.entries = entries

    def _move_aside(self, reason: str) -> None:
        """Renames the journal out of the way, kept for inspection."""
        name = hidden_name(self.path.name.lstrip("."), ".corrupt", self.path.parent)
        aside = self.path.with_name(name)
        try:
            os.replace(self.path, aside)
        except OSError as e:
            raise WtxError(f"{display(self.path)}: the journal is not used ({reason}) and "
                           f"cannot be moved aside ({e.strerror or e}); have its owner remove "
                           f"it, or use --no-resume or another -o folder") from e  # fmt: skip
        self.set_aside = aside
        self.reason = reason

    def _set_aside(self, reason: str) -> None:
        """Moves an unreadable journal out of the way, under a lock of its own, and starts a new
        one at the journal's path."""
        self._move_aside(reason)
        old = self._fd
        self._fd = _open_private(self.path)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(old)

    def _rewrite(self, entries: dict[int, Entry]) -> None:
        os.ftruncate(self._fd, 0)
        self._mac = ""
        self._write(self.identity)
        for entry in entries.values():
            self._write(_record(entry))

    def _write(self, record: dict) -> None:
        data, mac = _line(self.key, self._mac, record)
        os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)
        self._mac = mac

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


def remove_leftover(path: Path) -> bool:
    """Removes the journal at `path` where it is a file of this user's that no process holds
    (outputs finished by a run killed before it removed its journal); True if it did."""
    return remove_unheld(path)


def _record(entry: Entry) -> dict:
    return {"index": entry.index, "offset": entry.offset, "duration": entry.duration,
            "language": entry.language, "segments": [[a, b, t, [list(w) for w in words]] for a, b, t, words in (_segment(*s) for s in entry.segments)], "prompt": entry.prompt,
            "last_speech": entry.last_speech}  # fmt: skip


JOURNAL_SUFFIX = ".wtx-journal"


def journal_path(output: Path) -> Path:
    """The journal for the outputs whose first file is `output`: a hidden file beside it, named
    to fit the file system's NAME_MAX however long the output's name is."""
    return output.parent / hidden_name(output.stem, JOURNAL_SUFFIX, output.parent)
