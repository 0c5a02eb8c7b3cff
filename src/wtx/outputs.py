"""Where each input's output files go, decided for all inputs before any work starts.

Without `-o` the files go next to their input (stdin: the current folder, as `stdin.*`). With
`-o DIR`, a file named directly goes to `DIR/<stem>.*` and a file found in a named folder keeps
its path below that folder (`DIR/<sub/dir>/<stem>.*`). An output name the file system cannot hold
is a problem of that input, found here.

No output ever replaces an input or a file that is not an earlier output of the same input. The
name `<stem>.<fmt>` is taken for an input when
- an earlier input of this run was given it (two inputs never share outputs);
- it is one of this run's inputs (the same file: `a.txt` given as audio beside `a.flac`);
- something other than a regular file is there (a folder, a symbolic link, a FIFO);
- the file records that wtx wrote it for another input: every output carries its input's real
  path in the extended attribute `user.wtx.source` (where the file system keeps them);
- or, for a file without that record (an older wtx's, or on a file system without extended
  attributes), its first bytes are not what wtx writes in that format: txt, UTF-8 text without
  NUL bytes; srt, empty or `1` and a cue's times; vtt, `WEBVTT`; json, `{` and `"source"`; tsv,
  the header `start<TAB>end<TAB>text`.
An input whose `<stem>.*` is taken, in any of its formats, gets the first of `<stem>-2`,
`<stem>-3`, ... whose files are all free, and a note says so. So a rerun writes over its own
earlier outputs under the same names (what --skip-existing and resuming rely on), and an input
keeps its names from run to run, in whatever order the inputs are given.

Each set of outputs also carries `user.wtx.set`, a token shared by the files written together:
files with different tokens are a set cut short between renames (`complete` says no).
"""

import codecs
import itertools
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wtx.audio import STDIN, is_pipe
from wtx.inputs import Input
from wtx.names import display, fits

SOURCE_ATTR = "user.wtx.source"  # the input's real path ('-' for stdin)
SET_ATTR = "user.wtx.set"  # one token for the files written together
HEAD = 4096  # bytes read to tell whether a file without a record looks like wtx's
_SIGNATURES = {
    "srt": re.compile(rb"\Z|1\r?\n\d+:\d\d:\d\d,\d\d\d --> "),  # empty, or the first cue
    "vtt": re.compile(rb"WEBVTT\r?\n"),
    "json": re.compile(rb'\{\s*"source"\s*:'),
    "tsv": re.compile(rb"start\tend\ttext\r?\n"),
}


@dataclass
class Plan:
    paths: dict[str, dict[str, Path]] = field(default_factory=dict)  # input path -> format -> file
    notes: list[str] = field(default_factory=list)  # renames, for stderr
    problems: dict[str, str] = field(default_factory=dict)  # input path -> why it cannot be written


def _folder(item: Input, output_dir: Path | None) -> Path:
    if output_dir is not None:
        return output_dir / item.relative.parent
    return Path.cwd() if item.path == STDIN else Path(item.path).parent


def output_paths(item: Input, formats: Sequence[str], output_dir: Path | None, stem: str | None = None) -> dict[str, Path]:
    """Each format's file for one input (before collisions are resolved)."""
    folder = _folder(item, output_dir)
    stem = stem or item.relative.name
    return {fmt: folder / f"{stem}.{fmt}" for fmt in formats}


def origin(source: str) -> str:
    """What an output records as its input: the real path, or the name given for a pipe."""
    return source if is_pipe(source) else os.path.realpath(source)


def read_record(path: Path, name: str) -> str | None:
    """An extended attribute of `path` itself (never a link's target), or None without one."""
    try:
        return os.fsdecode(os.getxattr(path, name, follow_symlinks=False))
    except (AttributeError, OSError):  # no such attribute, or none on this system
        return None


def looks_like(path: Path, fmt: str) -> bool:
    """Whether the file's first bytes are what wtx writes in `fmt` (see the module's rule)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except OSError:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < HEAD)
    except UnicodeDecodeError:
        return False
    signature = _SIGNATURES.get(fmt)
    return b"\0" not in head and (signature is None or signature.match(head) is not None)


def _taken_by(path: Path, fmt: str, source: str, inputs: dict[tuple[int, int], str]) -> str | None:
    """Why `path` cannot be `source`'s output in `fmt`, or None when it can."""
    try:
        st = os.lstat(path)
    except OSError:  # not there (or a name too long: that input's problem, found below)
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if not stat.S_ISREG(st.st_mode):
        return "something other than a file"
    if (st.st_dev, st.st_ino) in inputs:
        return "the input itself" if inputs[st.st_dev, st.st_ino] == source else "another input"
    recorded = read_record(path, SOURCE_ATTR)
    if recorded is not None:
        return None if recorded == source else f"the output of {display(recorded)}"
    return None if looks_like(path, fmt) else "a file wtx did not write"


def _files(inputs: list[Input]) -> dict[tuple[int, int], str]:
    """The inputs that are files, by device and inode (a name or a link to them is the same):
    their `origin`."""
    files = {}
    for item in inputs:
        try:
            st = os.stat(item.path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.setdefault((st.st_dev, st.st_ino), origin(item.path))
    return files


def _key(folder: Path, stem: str) -> tuple[str, str]:
    return str(folder.resolve()), stem


def _first_free(item: Input, formats: Sequence[str], output_dir: Path | None, taken: dict,
                files: dict) -> tuple[str, dict[str, Path], str | None]:  # fmt: skip
    """The first of `<stem>`, `<stem>-2`, ... whose files are all free for `item`: that stem, its
    files, and why `<stem>` itself was not (None when it was free)."""
    folder, source, base = _folder(item, output_dir), origin(item.path), item.relative.name
    why = None
    for n in itertools.count(1):
        stem = base if n == 1 else f"{base}-{n}"
        if _key(folder, stem) in taken:
            why = why or "given to another input"
            continue
        paths = output_paths(item, formats, output_dir, stem)
        found = ((p, _taken_by(p, fmt, source, files)) for fmt, p in paths.items())
        reason = next((f"{display(p)} is {r}" for p, r in found if r), None)
        if reason is None:
            return stem, paths, why
        why = why or reason


def plan_outputs(inputs: list[Input], formats: Sequence[str], output_dir: Path | None) -> Plan:
    """Every input's output files, by the module's rule, with a note for each renamed input."""
    plan = Plan()
    taken: dict[tuple[str, str], str] = {}  # (folder, stem) -> the input given it
    files = _files(inputs)
    for item in inputs:
        folder, base = _folder(item, output_dir), item.relative.name
        stem, paths, why = _first_free(item, formats, output_dir, taken, files)
        first = taken.get(_key(folder, base))
        taken[_key(folder, stem)] = item.path
        if first is not None:
            plan.notes.append(
                f"{display(item.path)} and {display(first)} would both write "
                f"{display(folder / base)}.*: writing {display(folder / stem)}.* "
                f"for {display(item.path)}"
            )
        elif why is not None:
            plan.notes.append(
                f"{display(item.path)}: {why}: writing {display(folder / stem)}.* instead, "
                f"so that nothing is overwritten"
            )
        too_long = [p.name for p in paths.values() if not fits(p.name, folder)]
        if too_long:
            plan.problems[item.path] = (
                f"{display(item.path)}: the output name {display(too_long[0])} is longer than the file "
                f"system allows; rename the input or choose another -o folder"
            )
        plan.paths[item.path] = paths
    return plan


def complete(paths: dict[str, Path]) -> bool:
    """Whether all of an input's outputs are there as regular files, written together: their
    `user.wtx.set` tokens agree (files without tokens, an older wtx's, count as one set)."""
    if not all(p.is_file() and not p.is_symlink() for p in paths.values()):
        return False
    return len({read_record(p, SET_ATTR) for p in paths.values()}) == 1
