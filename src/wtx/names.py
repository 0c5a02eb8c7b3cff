"""File names wtx derives from an input's name, kept within the file system's NAME_MAX.

Names are measured in bytes as the file system stores them (`os.fsencode`), so names that are
not valid UTF-8 and long non-ASCII names count right.
"""

import hashlib
import os
from pathlib import Path

DEFAULT_NAME_MAX = 255


def name_max(folder: Path) -> int:
    """The longest file name, in bytes, that `folder`'s file system accepts."""
    for candidate in (folder, *folder.parents):
        try:
            return os.pathconf(candidate, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return DEFAULT_NAME_MAX


def fits(name: str, folder: Path) -> bool:
    return len(os.fsencode(name)) <= name_max(folder)


def hidden_name(name: str, suffix: str, folder: Path, reserve: int = 0) -> str:
    """`.NAME<suffix>`, or `.<start of NAME>~<hash><suffix>` when that would not fit in `folder`
    with `reserve` bytes to spare. The same name always gives the same hidden name."""
    full = f".{name}{suffix}"
    limit = name_max(folder) - reserve
    if len(os.fsencode(full)) <= limit:
        return full
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    room = limit - len(os.fsencode(f".~{digest}{suffix}"))
    start = os.fsencode(name)[: max(0, room)].decode("utf-8", "ignore")  # whole characters only
    return f".{start}~{digest}{suffix}"


def display(path: str | Path) -> str:
    """A path as text that can always be printed or written as UTF-8: bytes that are not valid
    UTF-8 (kept by Python as surrogates) are shown as the replacement character."""
    return os.fsencode(str(path)).decode("utf-8", "replace")
