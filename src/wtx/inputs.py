"""Turning what the user named (files, directories, globs, list files) into input paths."""

import glob
import sys
from dataclasses import dataclass
from pathlib import Path

from wtx.audio import STDIN

MEDIA_EXTENSIONS = frozenset(
    ".mp3 .wav .flac .ogg .oga .opus .m4a .m4b .aac .wma .aiff .aif .amr .webm .mka "
    ".mp4 .m4v .mkv .mov .avi .wmv .flv .mpg .mpeg .ts .3gp".split()
)


@dataclass(frozen=True)
class Expanded:
    inputs: list[str]  # files to transcribe, in order, without duplicates
    problems: list[str]  # one line each: names that gave no input (missing, empty directory)


def _directory(path: Path) -> list[str]:
    found = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MEDIA_EXTENSIONS]
    return [str(p) for p in sorted(found)]


def read_list(list_file: str) -> list[str]:
    """One path per line ('-' reads stdin); blank lines and lines starting with # are ignored."""
    text = sys.stdin.read() if list_file == "-" else Path(list_file).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def expand(names: list[str]) -> Expanded:
    inputs: list[str] = []
    problems: list[str] = []
    for name in names:
        if name == STDIN:
            inputs.append(name)
            continue
        path = Path(name)
        if path.is_dir():
            found = _directory(path)
            if not found:
                problems.append(f"{name}: directory holds no audio or video files")
            inputs.extend(found)
        elif path.is_file():
            inputs.append(name)
        elif glob.has_magic(name):
            matches = sorted(p for p in glob.glob(name, recursive=True) if Path(p).is_file())
            if not matches:
                problems.append(f"{name}: pattern matches no files")
            inputs.extend(matches)
        else:
            problems.append(f"{name}: no such file")
    return Expanded(list(dict.fromkeys(inputs)), problems)
