"""Bytecode kept in the wtx cache where an install keeps none (PYTHONDONTWRITEBYTECODE=1 images)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import sys
from wtx.bytecode import keep_bytecode
keep_bytecode("fakepkg")
import fakepkg.part
print(sys.pycache_prefix)
"""


@pytest.fixture
def fakepkg(tmp_path) -> Path:
    """A package installed without bytecode, in a folder of its own."""
    site = tmp_path / "site"
    (site / "fakepkg").mkdir(parents=True)
    (site / "fakepkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "fakepkg" / "part.py").write_text("PART = 2\n")
    return site


def run(site: Path, cache: Path, **env) -> str:
    environ = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT / 'src'}", "WTX_CACHE_DIR": str(cache), **env}
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"):
        if name not in env:
            environ.pop(name, None)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=environ, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_an_install_without_bytecode_keeps_it_in_the_private_cache(fakepkg, tmp_path):
    cache = tmp_path / "cache"
    prefix = run(fakepkg, cache, PYTHONDONTWRITEBYTECODE="1")
    folder = cache / "bytecode"
    assert prefix == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    kept = {p.name.split(".")[0] for p in folder.rglob("*.pyc") if "fakepkg" in p.parts}
    assert kept == {"__init__", "part"}
    assert not (fakepkg / "fakepkg" / "__pycache__").exists()  # nothing written beside the sources


def test_an_install_with_bytecode_and_the_opt_out_are_left_alone(fakepkg, tmp_path):
    assert run(fakepkg, tmp_path / "opted", PYTHONDONTWRITEBYTECODE="1", WTX_BYTECODE_CACHE="0") == "None"
    assert not (tmp_path / "opted").exists()
    # Python writes the bytecode beside the sources itself, then finds it there
    assert run(fakepkg, tmp_path / "writable") == "None"
    assert (fakepkg / "fakepkg" / "__pycache__").is_dir()
    assert run(fakepkg, tmp_path / "compiled", PYTHONDONTWRITEBYTECODE="1") == "None"
    assert not (tmp_path / "compiled").exists()
