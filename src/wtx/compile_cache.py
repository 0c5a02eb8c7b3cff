"""The on-disk compile cache: the one module that touches Inductor's configuration.

Inductor's FX-graph and AOTAutograd caches and Triton's kernel cache live under
`<wtx cache>/inductor` and `<wtx cache>/triton`. On top of them the engine saves, per
configuration (keyed by torch and triton versions, device name, model shape, dtype, batch size
and the source of the compiled modules):
- a `torch.compiler.save_cache_artifacts()` bundle, loaded into those caches by the next process;
- each compiled function ahead of time (`torch.compile(...).aot_compile()`), Dynamo's output
  included, so the next process loads it without tracing the model again.
"""

import hashlib
import json
import os
import shutil
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from wtx import __version__
from wtx.atomic import atomic_path
from wtx.paths import cache_dir, check_trusted, private_dir, unusable

SUBDIRS = ("compiled", "inductor", "triton")

loads: Counter = Counter()  # what this process loaded from disk: "bundle", "function"


def configure() -> None:
    """Points Inductor and Triton at the wtx cache (unless the user chose their own dirs).

    The folders are created private and checked first: Inductor's caches and ours hold code
    that runs when loaded, so a cache others can write is refused (UntrustedCache)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    root = cache_dir()
    for name in SUBDIRS:
        private_dir(root / name)
    # torch fills TORCHINDUCTOR_CACHE_DIR with its default on first use; only a user's own choice stays
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    use_triton_cache()
    import torch._inductor.config as inductor_config

    # a note to PyTorch's developers about its own kernel choice, printed twice per cold compile
    warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled", category=UserWarning)
    inductor_config.fx_graph_cache = True
    if hasattr(inductor_config, "deterministic"):
        # no kernel choices by timing: a cold compile and a process that loads its artifacts run
        # the same kernels (without it they wrote different fp16 text on the H200 at batch 32)
        inductor_config.deterministic = True
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "enable_aot_compile"):  # off by default in some releases
        dynamo_config.enable_aot_compile = True
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = True
    except (ImportError, AttributeError):
        pass


def use_triton_cache() -> None:
    """Points Triton's kernel cache at `<wtx cache>/triton`, created private (unless the user
    chose their own): Inductor's kernels and wtx's own (wtx.dtw_kernel) alike."""
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = str(private_dir(cache_dir() / "triton"))


@contextmanager
def in_process(enabled: bool = True):
    """Inductor works in this process for a block: no pool of compile workers.

    Loading saved artifacts compiles nothing, yet Inductor's asynchronous compiler would start a
    pool of worker processes (one per core, where Triton is installed) that compete with the job
    for the CPU while it starts. Were a saved function rejected, its recompile would run here on
    one thread: slower, but only then."""
    import torch._inductor.config as inductor_config

    before = inductor_config.compile_threads
    if enabled:
        inductor_config.compile_threads = 1
    try:
        yield
    finally:
        inductor_config.compile_threads = before


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


def _code_digest(sources) -> str:
    """The bytes of the source files whose code ends up in the compiled graphs (named by the caller)."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:16]


def bundle_key(dims, device, dtype, batch_size: int, mode: str, sources=()) -> str:
    import torch

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    fields = {
        "wtx": __version__,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "device": device_name,
        "dims": dims.__dict__,
        "dtype": str(dtype),
        "batch_size": batch_size,
        "mode": mode,
        "code": _code_digest(sources),
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"{device.type}-b{batch_size}-{str(dtype).removeprefix('torch.')}-{digest}"


def bundle_path(key: str) -> Path:
    return cache_dir() / "compiled" / f"{key}.bin"


class CorruptBundle(Exception):
    pass


def load_bundle(key: str) -> bool:
    """Loads a saved bundle into torch's caches; False when there is none.

    A bundle torch cannot read is removed and CorruptBundle raised, so the caller can warn
    and compile from scratch."""
    import torch

    path = bundle_path(key)
    check_trusted(path)  # first: a cache folder this user cannot search is a WtxError naming it
    if not path.is_file():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as e:
        path.unlink(missing_ok=True)
        raise CorruptBundle(f"{path}: corrupt compiled-artifact bundle removed ({e})") from e
    if info is None:  # torch logs the checksum mismatch and returns None
        path.unlink(missing_ok=True)
        raise CorruptBundle(f"{path}: corrupt compiled-artifact bundle removed (torch could not read it)")
    loads["bundle"] += 1
    return True


def save_bundle(key: str) -> Path | None:
    """Saves what torch compiled in this process as one bundle, atomically; None when there is
    nothing to save. A write that fails is a WtxError naming the folder and the fix."""
    import torch

    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return None
    data, _ = result
    path = bundle_path(key)
    private_dir(path.parent)
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    except OSError as e:
        raise unusable(path.parent, e, "save compiled artifacts") from e
    return path


def function_path(key: str, name: str) -> Path:
    return cache_dir() / "compiled" / f"{key}.{name}.fn"


def save_function(key: str, name: str, compiled) -> Path:
    """Saves an ahead-of-time compiled function (the result of `.aot_compile()`), atomically.
    A write that fails is a WtxError naming the folder and the fix."""
    path = function_path(key, name)
    private_dir(path.parent)
    try:
        with atomic_path(path) as tmp:
            compiled.save_compiled_function(str(tmp))
    except OSError as e:
        raise unusable(path.parent, e, "save a compiled function") from e
    return path


def load_function(key: str, name: str):
    """The saved function, or None when there is none. One torch cannot read is removed and
    CorruptBundle raised."""
    import torch

    path = function_path(key, name)
    check_trusted(path)  # first: a cache folder this user cannot search is a WtxError naming it
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            function = torch.compiler.load_compiled_function(f)
    except Exception as e:
        path.unlink(missing_ok=True)
        raise CorruptBundle(f"{path}: unreadable compiled function removed ({type(e).__name__}: {e})") from e
    loads["function"] += 1
    return function


def remove_functions(key: str, names) -> None:
    for name in names:
        function_path(key, name).unlink(missing_ok=True)


@dataclass(frozen=True)
class Entry:
    path: Path
    files: int
    bytes: int


def entries() -> list[Entry]:
    """What the cache holds: converted models, compiled bundles, Inductor and Triton caches. A
    cache this user cannot read is a WtxError naming the folder."""
    root = cache_dir()
    found = []
    try:
        for name in ("models", *SUBDIRS):
            folder = root / name
            if folder.is_dir():
                files = [p for p in folder.rglob("*") if p.is_file()]
                found.append(Entry(folder, len(files), sum(p.stat().st_size for p in files)))
    except OSError as e:
        raise unusable(Path(e.filename or root), e, "read the wtx cache") from e
    return found


def clear(include_models: bool = False) -> list[Path]:
    """Removes the compiled artifacts (and the converted models); the folders removed. One that
    cannot be removed is a WtxError naming it."""
    root = cache_dir()
    removed = []
    try:
        for name in (*SUBDIRS, *(("models",) if include_models else ())):
            folder = root / name
            if folder.is_dir():
                shutil.rmtree(folder)
                removed.append(folder)
    except OSError as e:
        raise unusable(Path(e.filename or root), e, "clear the wtx cache") from e
    return removed
