"""Turning what the user named (files, directories, globs, list files) into inputs.

Each input remembers where it came from: a file found in a directory keeps its path below
that directory, so its outputs can mirror the folder layout under `-o`. The same file named
twice (`a.mp3`, `./a.mp3`, a link to it) is one input. Pipes and FIFOs (bash's `<(...)`) are
inputs like stdin.
"""

import errno
import fnmatch
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from wtx.audio import STDIN, is_pipe
from wtx.names import display

MEDIA_EXTENSIONS = frozenset(
    ".mp3 .wav .flac .ogg .oga .opus .m4a .m4b .aac .wma .aiff .aif .amr .webm .mka "
    ".mp4 .m4v .mkv .mov .avi .wmv .flv .mpg .mpeg .ts .3gp".split()
)


@dataclass(frozen=True)
class Input:
    path: str  # what to read: a file, a pipe, or '-' for stdin
    relative: Path  # its outputs' stem below -o: the file's stem, or its path inside a named folder


@dataclass(frozen=True)
class Expanded:
    inputs: list[Input]  # in order, each file once
    problems: list[str]  # one line each: names that gave no input (missing, empty directory)


def _stem(path: Path) -> Path:
    return path.with_name(path.stem)


def _directory(path: Path) -> list[Input]:
    found = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MEDIA_EXTENSIONS]
    return [Input(str(p), _stem(p.relative_to(path))) for p in sorted(found)]


def _component(name: str, pattern: str) -> bool:
    """glob's rule for one part: fnmatch; a name starting with '.' needs a pattern that does."""
    hidden = name.startswith(".") and not pattern.startswith(".")
    return not hidden and fnmatch.fnmatchcase(name, pattern)


def _closure(states, pattern: tuple[str, ...]) -> frozenset[int]:
    """The pattern positions `states` stand for, with each '**' also matching no part."""
    out = set()
    for i in states:
        while i < len(pattern) and pattern[i] == "**":
            out.add(i)
            i += 1
        out.add(i)
    return frozenset(out)


def _step(states: frozenset[int], name: str, pattern: tuple[str, ...]) -> frozenset[int]:
    """The positions after one more part, `name` ('**' takes any part but a hidden one)."""
    after = set()
    for i in states:
        if i < len(pattern) and pattern[i] == "**":
            after.update([i] if not name.startswith(".") else [])
        elif i < len(pattern) and _component(name, pattern[i]):
            after.add(i + 1)
    return _closure(after, pattern)


def _recursive_glob(name: str) -> list[str]:
    """What glob.glob(name, recursive=True) finds for a pattern with a '**' part, less its
    loops: links to folders are followed, but a folder is searched once for each place in the
    pattern it is reached at, so links that lead back up end (glob followed every way round,
    2**40 paths for two links back)."""
    parts = name.split("/")
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    top = "/".join(parts[:fixed]) or ("/" if name.startswith("/") else "")
    pattern = tuple(p for p in parts[fixed:] if p)
    found, seen = [], set()
    stack = [((), _closure({0}, pattern))]
    while stack:
        below, states = stack.pop()
        try:
            info = os.stat(os.path.join(top or ".", *below))
            if (info.st_dev, info.st_ino, states) in seen:
                continue
            seen.add((info.st_dev, info.st_ino, states))
            with os.scandir(os.path.join(top or ".", *below)) as entries:
                listed = [(e.name, e.is_dir()) for e in entries]
        except OSError:  # gone, unreadable, or a link to nowhere: nothing there, as for glob
            continue
        for part, is_dir in sorted(listed, reverse=True):  # popped in order
            after = _step(states, part, pattern)
            if is_dir and after - {len(pattern)}:
                stack.append(((*below, part), after))
            elif not is_dir and len(pattern) in after:
                found.append(os.path.join(top, *below, part))
    return found


def _glob(name: str) -> list[str]:
    """The files a pattern matches, sorted."""
    if "**" in name.split("/"):
        return sorted(p for p in _recursive_glob(name) if Path(p).is_file())
    return sorted(p for p in glob.glob(name) if Path(p).is_file())


def read_list(list_file: str) -> list[str]:
    """One path per line ('-' reads stdin); blank lines and lines starting with # are ignored."""
    if list_file == "-":
        text = sys.stdin.read()
    else:
        text = Path(list_file).read_bytes().decode("utf-8", "surrogateescape")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _identity(source: str) -> str:
    return source if source == STDIN else os.path.realpath(source)


def unusable(name: str) -> str | None:
    """Why `name` cannot name a file at all (a NUL byte; a name longer than the file system
    takes, or a folder on its way that cannot be searched: the system's words), or None."""
    if "\0" in name:
        return "a path cannot hold a NUL byte"
    try:
        os.stat(name)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ENAMETOOLONG, errno.EACCES, errno.ELOOP):
            return e.strerror
    return None


def expand(names: list[str]) -> Expanded:
    """The inputs `names` give, in order, each file once; a name that gives none is one line
    of `problems` (its own failure: the others still run)."""
    inputs: list[Input] = []
    problems: list[str] = []
    for name in names:
        path = Path(name)
        if reason := unusable(name):
            shown = display(name.replace("\0", "\\0"))  # printable
            problems.append(f"{shown}: {reason}")
        elif name == STDIN:
            inputs.append(Input(name, Path("stdin")))
        elif path.is_dir():
            found = _directory(path)
            if not found:
                problems.append(f"{display(name)}: directory holds no audio or video files")
            inputs.extend(found)
        elif path.is_file() or is_pipe(name):
            inputs.append(Input(name, Path(path.stem)))
        elif glob.has_magic(name):
            matches = _glob(name)
            if not matches:
                problems.append(f"{display(name)}: pattern matches no files")
            inputs.extend(Input(p, Path(Path(p).stem)) for p in matches)
        else:
            problems.append(f"{display(name)}: no such file")
    unique: dict[str, Input] = {}
    for item in inputs:
        unique.setdefault(_identity(item.path), item)
    return Expanded(list(unique.values()), problems)
