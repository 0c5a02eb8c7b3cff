"""Atomic file writes: temporary files in the same directory, fsync'd, then renamed.

Temporary files are created exclusively (never through an existing name or link), with hidden
names that fit NAME_MAX. A set of files is published together: every temporary file is written
and synced before the first rename, so a full disk leaves none of them, not some.
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wtx.names import hidden_name

PRIVATE = 0o600


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def public_mode() -> int:
    """The mode a new file gets from open(): 0666 less the umask."""
    return 0o666 & ~_umask()


def _temporary(path: Path) -> Path:
    prefix = hidden_name(path.name, ".", path.parent, reserve=len(".XXXXXXXX.tmp"))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _sync(tmp: Path, mode: int) -> None:
    fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_paths(paths: list[Path], mode: int = PRIVATE) -> Iterator[list[Path]]:
    """Yields one temporary path per target; on success they replace the targets together, on
    failure they are all removed. `mode`: the files' permissions (default 0600)."""
    temporaries: list[Path] = []
    try:
        for path in paths:
            temporaries.append(_temporary(Path(path)))
        yield list(temporaries)
        for tmp in temporaries:
            _sync(tmp, mode)
        for tmp, path in zip(temporaries, paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: Path, mode: int = PRIVATE) -> Iterator[Path]:
    """Yields a temporary path; on success it replaces `path`, on failure it is removed."""
    with atomic_paths([Path(path)], mode) as (tmp,):
        yield tmp


@contextmanager
def atomic_write(path: Path, mode: str = "w", encoding: str | None = "utf-8"):
    """Opens a temporary file for writing; it appears at `path` only when fully written."""
    with atomic_path(path) as tmp:
        if "b" in mode:
            encoding = None
        with open(tmp, mode, encoding=encoding, newline="" if "b" not in mode else None) as f:
            yield f
