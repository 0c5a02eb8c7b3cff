"""Atomic file writes: temporary files in the same directory, fsync'd, then renamed.

Temporary files are created exclusively (never through an existing name or link), with hidden
names that fit NAME_MAX (`.NAME.XXXXXXXX.tmp`). A set of files is published together: every
target is checked (none may be a folder) before anything is written, and every temporary file is
written and synced before the first rename, so a full disk leaves none of them, not some. A
writer holds a lock on its temporaries until they are renamed; `sweep` removes those whose
writer died (kill -9 between writing and renaming).
"""

import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wtx.errors import WtxError
from wtx.names import display, hidden_name

PRIVATE = 0o600
GRACE = 2.0  # seconds: a temporary younger than this may be one a writer has not locked yet
_RANDOM = r"[a-z0-9_]{8}"  # what tempfile.mkstemp puts between the prefix and the suffix


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def public_mode() -> int:
    """The mode a new file gets from open(): 0666 less the umask."""
    return 0o666 & ~_umask()


def _prefix(path: Path) -> str:
    return hidden_name(path.name, ".", path.parent, reserve=len(".XXXXXXXX.tmp"))


def _temporary(path: Path) -> tuple[Path, int]:
    """A new temporary file for `path`, and an open descriptor holding its lock."""
    fd, tmp = tempfile.mkstemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks: the sweep's GRACE is all that protects it
    return Path(tmp), fd


def _check_targets(paths: list[Path]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            raise WtxError(f"{display(path)}: is a folder, where this output would go; move it "
                           f"away or choose another -o folder (none of the set was written)")


def remove_unheld(path: Path, min_age: float = 0.0) -> bool:
    """Removes `path` if it is a regular file (never a link) of this user, at least `min_age`
    seconds old, that no process holds locked; True if it did. Anything else leaves it alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # a link, gone, or not ours to read
        return False
    try:
        st = os.fstat(fd)
        young = time.time() - st.st_mtime < min_age
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or young:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.samestat(st, os.lstat(path)):
            return False  # replaced since it was opened
        os.unlink(path)
        return True
    except OSError:  # held by another process, or gone meanwhile
        return False
    finally:
        os.close(fd)


def sweep(paths: list[Path]) -> list[Path]:
    """Removes the temporaries of `paths` that writers killed before renaming them left behind;
    returns them. Temporaries in flight in another process are left alone (`remove_unheld`)."""
    removed = []
    for folder, group in _by_folder(paths).items():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        pattern = re.compile("|".join(re.escape(_prefix(p)) + _RANDOM + r"\.tmp" for p in group))
        ours = [n for n in names if pattern.fullmatch(n)]
        removed += [folder / n for n in ours if remove_unheld(folder / n, GRACE)]
    return removed


def _by_folder(paths: list[Path]) -> dict[Path, list[Path]]:
    folders: dict[Path, list[Path]] = {}
    for path in paths:
        folders.setdefault(Path(path).parent, []).append(Path(path))
    return folders


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
    failure they are all removed. `mode`: the files' permissions (default 0600). A target that
    is a folder fails the set (WtxError) before any temporary is made."""
    _check_targets([Path(p) for p in paths])
    temporaries: list[Path] = []
    locks: list[int] = []
    try:
        for path in paths:
            tmp, fd = _temporary(Path(path))
            temporaries.append(tmp)
            locks.append(fd)
        yield list(temporaries)
        for tmp in temporaries:
            _sync(tmp, mode)
        for tmp, path in zip(temporaries, paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        for fd in locks:
            os.close(fd)


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
