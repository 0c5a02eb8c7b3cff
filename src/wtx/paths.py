"""The one cache root users can inspect and clear (`WTX_CACHE_DIR`, default ~/.cache/wtx).

The cache holds code that runs when loaded (compiled artifacts are pickles) and the checkpoints
every run trusts, so it is created private (0700) and checked before anything in it is loaded:
a folder or file that another user owns, or that others can write, is refused.
"""

import os
import stat
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


def _untrusted(path: Path, st: os.stat_result) -> str | None:
    """Why `path` may hold someone else's code, or None."""
    if st.st_uid != os.getuid():
        return f"{path} is owned by user id {st.st_uid}, not by you"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_trusted(path: Path) -> None:
    """Raises UntrustedCache unless `path` (a cache folder or file) and every cache folder above
    it are owned by this user and writable by no one else. Links are not followed."""
    path = Path(path)
    root = cache_dir()
    chain = [path]
    if path != root and root in path.parents:
        chain += [p for p in path.parents if p == root or root in p.parents]
    for item in chain:
        try:
            st = os.lstat(item)
        except FileNotFoundError:
            continue
        reason = "a symbolic link" if stat.S_ISLNK(st.st_mode) else _untrusted(item, st)
        if reason:
            if stat.S_ISLNK(st.st_mode):
                reason = f"{item} is {reason}"
            raise UntrustedCache(
                f"refusing to load from the wtx cache: {reason}. Cached files run as code; "
                f"fix it with 'chmod go-w {item}' if it is yours, or point WTX_CACHE_DIR at a "
                f"folder of your own"
            )


def private_dir(path: Path) -> Path:
    """Creates a cache folder (and the cache folders above it) with mode 0700 if missing, then
    checks it can be trusted. A folder that cannot be created is a WtxError naming it."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        for folder in reversed(missing):  # from the top down, each one private
            folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise WtxError(
            f"{path}: cannot create the wtx cache there ({e.strerror or e}); make it writable "
            f"or set WTX_CACHE_DIR to another folder"
        ) from e
    check_trusted(path)
    return path
