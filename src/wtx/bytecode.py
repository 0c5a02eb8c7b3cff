"""Python bytecode for torch's modules kept in the wtx cache, where the install keeps none.

Importing torch, Dynamo and Inductor compiles thousands of source files. pip writes their
bytecode at install time, but many images do not: they install without it and set
PYTHONDONTWRITEBYTECODE=1, so every process compiles them again: measured the larger part of
importing torch, Dynamo and Inductor's code cache (docs/benchmarks.md). Such a process writes the
bytecode under the cache (`bytecode/`, private to the user like the rest: bytecode runs as
code) instead of beside the sources, and reads it from there next time. An install that has
its bytecode, a PYTHONPYCACHEPREFIX of the user's own, or WTX_BYTECODE_CACHE=0 is left as it is.
"""

import importlib.util
import os
import sys
from pathlib import Path

OPT_OUT = "WTX_BYTECODE_CACHE"


def _installed_bytecode(package: str) -> bool | None:
    """Whether the package's own bytecode is where Python looks for it (None: not installed)."""
    spec = importlib.util.find_spec(package)  # finds the package without running it
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin)
    compiled = Path(importlib.util.cache_from_source(str(source)))
    if compiled.exists():
        return True
    # Python writes it there itself, unless told not to or the folder is read-only
    return not sys.dont_write_bytecode and os.access(compiled.parent if compiled.parent.exists() else source.parent, os.W_OK)


def keep_bytecode(package: str = "torch") -> None:
    """Before `package` is imported: its bytecode (and every later import's) into the wtx
    cache when its install keeps none."""
    if sys.pycache_prefix is not None or os.environ.get(OPT_OUT) == "0":
        return
    if _installed_bytecode(package) is not False:
        return
    from wtx.errors import WtxError
    from wtx.paths import cache_dir, private_dir

    try:
        folder = private_dir(cache_dir() / "bytecode")
    except WtxError:
        return  # no cache to keep it in: compiled again, as before
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
