"""The one cache root users can inspect and clear (`WTX_CACHE_DIR`, default ~/.cache/wtx).

The cache holds code that runs when loaded (compiled artifacts are pickles) and the checkpoints
every run trusts, so it is created private (0700) and checked before anything in it is loaded:
a folder or file that another user owns, or that others can write, is refused.
"""

import errno
import os
import secrets
import stat
import tempfile
from pathlib import Path

from wtx.errors import UntrustedCache, WtxError


def cache_dir() -> Path:
    root = os.environ.get("WTX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wtx"
    )
    return Path(root)


def whisper_cache_dir() -> Path:
    """Where openai-whisper keeps its downloaded checkpoints."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "whisper"


def _owner(uid: int) -> str:
    """`uid` with its user name where the system knows it: "65534 (nobody)"."""
    import pwd

    try:
        return f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return str(uid)


def _refusal(path: Path, st: os.stat_result) -> str | None:
    """Why `path` may hold someone else's code, and the fix that applies; None when it is safe."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link; remove it, or set WTX_CACHE_DIR to a folder of your own"
    if st.st_uid != os.geteuid():
        return (f"{path} is owned by user id {_owner(st.st_uid)}, not by you; use your own "
                f"WTX_CACHE_DIR or remove it")  # fmt: skip
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); fix it with "
                f"'chmod go-w {path}', or set WTX_CACHE_DIR to a folder of your own")  # fmt: skip
    return None


def unusable(folder: Path, error: OSError, doing: str = "use the wtx cache") -> WtxError:
    """The one error for a cache folder this user cannot create, read or write (`doing` says
    what failed): names the folder, the system's reason and the fix that applies."""
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there, or set WTX_CACHE_DIR to a folder on another disk"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "set WTX_CACHE_DIR to a folder you can write (or make this one writable for you)"
    elif error.errno == errno.EIO:
        fix = "check that disk, or set WTX_CACHE_DIR to a folder on another disk"
    else:
        fix = "set WTX_CACHE_DIR to another folder"
    return WtxError(f"{_named(Path(folder))}: cannot {doing} there ({reason}); {fix}")


def _named(folder: Path) -> Path:
    """`folder`, or the cache root when the root itself is out of reach: the folder that
    WTX_CACHE_DIR names is the one to change."""
    root = cache_dir()
    if root in folder.parents:
        try:
            os.lstat(root)
        except PermissionError:
            return root
    return folder


def _lstat(path: Path) -> os.stat_result | None:
    """The entry itself (links not followed); None when missing. A folder on the way that this
    user cannot search is a WtxError naming it."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise unusable(Path(e.filename or path), e, "read the wtx cache") from e


def check_trusted(path: Path) -> None:
    """Raises UntrustedCache unless `path` (a cache folder or file) and every cache folder above
    it are owned by this user and writable by no one else. Links are not followed. A folder this
    user cannot read is a WtxError naming it (a missing `path` is not an error)."""
    path = Path(path)
    root = cache_dir()
    chain = [path]
    if path != root and root in path.parents:
        chain += [p for p in path.parents if p == root or root in p.parents]
    for item in reversed(chain):  # from the top down: the first folder at fault is named
        st = _lstat(item)
        reason = _refusal(item, st) if st else None
        if reason:
            raise UntrustedCache(f"refusing to load from the wtx cache: {reason} (cached files run "
                                 f"as code)")


def private_dir(path: Path) -> Path:
    """Creates a cache folder (and the cache folders above it) with mode 0700 if missing, then
    checks it can be trusted. A folder that cannot be created or read is a WtxError naming it
    and WTX_CACHE_DIR."""
    path = Path(path)
    try:
        missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
        for folder in reversed(missing):  # from the top down, each one private
            folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise unusable(Path(e.filename or path), e, "create the wtx cache") from e
    check_trusted(path)
    return path


def not_private(st: os.stat_result) -> str | None:
    """Why a file of this user's private state (a journal, the journal key) may hold someone
    else's bytes: another owner, or others may read or write it; None when it is private."""
    if st.st_uid != os.getuid():
        return f"it is owned by user id {st.st_uid}, not by you"
    if st.st_mode & 0o077:
        return f"others can read or write it (mode {stat.S_IMODE(st.st_mode):04o}, not 0600)"
    return None


JOURNAL_KEY = "journal.key"


def journal_key() -> bytes:
    """This user's secret for authenticating resume journals (wtx.journal): 32 random bytes in
    the private cache, created once with mode 0600 and published whole (never half-written,
    never through a link). A key file someone else could have written is refused."""
    folder = private_dir(cache_dir())
    path = folder / JOURNAL_KEY
    if not os.path.lexists(path):
        try:
            _publish(path, secrets.token_bytes(32))
        except OSError as e:
            raise unusable(folder, e, "create the journal key") from e
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise WtxError(f"{path}: cannot read the journal key ({e.strerror or e}); remove it "
                       f"(a new one is made)") from e
    try:
        st = os.fstat(fd)
        key = os.read(fd, 64)
    finally:
        os.close(fd)
    reason = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else not_private(st)
    if reason:
        raise UntrustedCache(f"{path}: the journal key is not a private file of yours ({reason}); "
                             f"remove it (a new one is made)")  # fmt: skip
    if len(key) != 32:
        raise WtxError(f"{path}: the journal key is damaged; remove it (a new one is made)")
    return key


def _publish(path: Path, data: bytes) -> None:
    """Writes `data` to a new file of mode 0600 at `path`, whole or not at all; where another
    process published one first, its file stays."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        os.write(fd, data)
        os.fsync(fd)
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.close(fd)
        os.unlink(tmp)
