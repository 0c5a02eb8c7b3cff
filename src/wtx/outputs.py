"""Where each input's output files go, decided for all inputs before any work starts.

Without `-o` the files go next to their input (stdin: the current folder, as `stdin.*`). With
`-o DIR`, a file named directly goes to `DIR/<stem>.*` and a file found in a named folder keeps
its path below that folder (`DIR/<sub/dir>/<stem>.*`). Two inputs never share outputs: when a
name is taken, the later input gets `<stem>-2`, `<stem>-3`, ... in the order given, and a note
says so. An output name the file system cannot hold is a problem of that input, found here.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wtx.audio import STDIN
from wtx.inputs import Input
from wtx.names import display, fits


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


def _key(folder: Path, stem: str) -> tuple[str, str]:
    return str(folder.resolve()), stem


def plan_outputs(inputs: list[Input], formats: Sequence[str], output_dir: Path | None) -> Plan:
    plan = Plan()
    taken: dict[tuple[str, str], str] = {}
    for item in inputs:
        folder = _folder(item, output_dir)
        base = item.relative.name
        stem, n = base, 1
        while _key(folder, stem) in taken:
            n += 1
            stem = f"{base}-{n}"
        taken[_key(folder, stem)] = item.path
        paths = output_paths(item, formats, output_dir, stem)
        if stem != base:
            first = taken[_key(folder, base)]
            plan.notes.append(
                f"{display(item.path)} and {display(first)} would both write {display(folder / base)}.*: "
                f"writing {display(folder / stem)}.* for {display(item.path)}"
            )
        too_long = [p.name for p in paths.values() if not fits(p.name, folder)]
        if too_long:
            plan.problems[item.path] = (
                f"{display(item.path)}: the output name {display(too_long[0])} is longer than the file "
                f"system allows; rename the input or choose another -o folder"
            )
        plan.paths[item.path] = paths
    return plan
