"""Atomic file writes: a temporary file in the same directory, fsync'd, then renamed."""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a temporary path; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_write(path: Path, mode: str = "w", encoding: str | None = "utf-8"):
    """Opens a temporary file for writing; it appears at `path` only when fully written."""
    with atomic_path(path) as tmp:
        if "b" in mode:
            encoding = None
        with open(tmp, mode, encoding=encoding, newline="" if "b" not in mode else None) as f:
            yield f

