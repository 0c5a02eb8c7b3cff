"""The wtx cache when it cannot be used: a full disk, a folder this user cannot reach, a folder
another user owns, a damaged bundle; and `--ray` to an address where no cluster listens.

Each failure is one line that names the folder (or address) and the fix, never a traceback."""

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLE
from wtx.errors import UntrustedCache, WtxError

NOBODY = 65534
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 1091136 vs 1091024"


def _bundled_tiny_en() -> None:
    from wtx import weights

    if weights._bundled_sources(weights.BUNDLED["tiny.en"]) is None:
        pytest.skip("the bundled tiny.en weights are not installed")


def test_a_full_disk_during_conversion_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    """torch.save into a full disk raises RuntimeError from its zip writer: the conversion
    reports the folder, the model and the fix, and leaves no partial file in the cache."""
    import torch

    from wtx import weights

    _bundled_tiny_en()
    cache = tmp_path / "cache"
    monkeypatch.setenv("WTX_CACHE_DIR", str(cache))

    def short_write(obj, path):  # what a full disk does: some bytes written, then the error
        Path(path).write_bytes(b"PK\x03\x04 partial")
        raise RuntimeError(TORCH_SHORT_WRITE)

    monkeypatch.setattr(torch, "save", short_write)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)
    )
    with pytest.raises(WtxError) as raised:
        weights.resolve("tiny.en")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{cache / 'models'}: ")
    assert "tiny.en" in message and "free space there" in message and "WTX_CACHE_DIR" in message
    assert list((cache / "models").iterdir()) == []  # no staging folder, no partial checkpoint


@contextlib.contextmanager
def _as_user(uid: int):
    """This process acts as user `uid` (its effective id) for a block; root only."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


def _unreachable_cache(monkeypatch) -> Path:
    """A WTX_CACHE_DIR inside a root-only folder, as `WTX_CACHE_DIR=/root/x` is for a user."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another user")
    locked = Path(tempfile.mkdtemp(prefix="wtx-root-only-"))  # mode 0700, owned by root
    monkeypatch.setenv("WTX_CACHE_DIR", str(locked / "x"))
    return locked / "x"


def _entry_points():
    from wtx import compile_cache, paths, weights

    return {
        "create": lambda: paths.private_dir(paths.cache_dir() / "compiled"),
        "convert": lambda: weights.resolve("tiny.en"),
        "load_bundle": lambda: compile_cache.load_bundle("key"),
        "load_function": lambda: compile_cache.load_function("key", "encoder"),
        "cache_info": compile_cache.entries,
        "cache_clear": lambda: compile_cache.clear(include_models=True),
    }


@pytest.mark.parametrize(
    "entry", ["create", "convert", "load_bundle", "load_function", "cache_info", "cache_clear"]
)
def test_a_cache_folder_you_cannot_reach_is_one_error(entry, monkeypatch):
    """Every way into the cache (creating a folder, the converted weights, the compiled
    artifacts) says which folder it cannot use and that WTX_CACHE_DIR picks another."""
    import torch  # noqa: F401 (imported before acting as a user who cannot read the venv)

    root = _unreachable_cache(monkeypatch)
    call = _entry_points()[entry]
    try:
        with _as_user(NOBODY), pytest.raises(WtxError) as raised:
            call()
    finally:
        shutil.rmtree(root.parent)
    message = str(raised.value)
    assert not isinstance(raised.value, UntrustedCache)
    assert "\n" not in message
    assert message.startswith(f"{root}: cannot ")
    assert (
        "Permission denied" in message and "set WTX_CACHE_DIR to a folder you can write" in message
    )


def _without_root_file_access():
    """In the child: root keeps its id but loses the right to read and search others' folders
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), as any user is; the venv, root's, stays usable."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    for cap in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_the_cli_says_in_one_line_that_the_cache_is_out_of_reach(tmp_path):
    """`WTX_CACHE_DIR=/root/x wtx transcribe ...` as a user: one error line, exit 1."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a folder another user owns")
    locked = tmp_path / "someone-elses"
    locked.mkdir(mode=0o700)
    os.chown(locked, NOBODY, NOBODY)
    env = {**os.environ, "WTX_CACHE_DIR": str(locked / "x"), "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "wtx", "transcribe", str(SAMPLE), "-o", str(tmp_path / "out")]
    try:
        done = subprocess.run(
            [*command, "--no-vad", "-b", "1", "-q"],
            capture_output=True,
            env=env,
            timeout=300,
            check=False,
            preexec_fn=_without_root_file_access,
        )
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot drop root's file access here ({e})")
    errors = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1, done.stderr.decode()
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: {locked / 'x'}: cannot ")
    assert "(Permission denied); set WTX_CACHE_DIR to a folder you can write" in errors[0]
    assert done.stdout == b""


def test_a_cache_another_user_owns_is_refused_with_the_fix_that_applies(tmp_path, monkeypatch):
    """chmod cannot fix a folder someone else owns: the refusal names the owner and says to use
    your own WTX_CACHE_DIR or remove it."""
    from wtx import compile_cache

    if os.geteuid() != 0:
        pytest.skip("needs root, to make a folder another user owns")
    root = tmp_path / "cache"
    (root / "compiled").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    os.chown(root, NOBODY, NOBODY)
    monkeypatch.setenv("WTX_CACHE_DIR", str(root))
    with pytest.raises(UntrustedCache) as raised:
        compile_cache.load_function("key", "encoder")
    message = str(raised.value)
    assert f"{root} is owned by user id {NOBODY} (" in message
    assert "use your own WTX_CACHE_DIR or remove it" in message
    assert "chmod" not in message


def _closed_port() -> int:
    """A local port where nothing listens (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_at_the_ray_address_is_one_error_at_once():
    """`--ray HOST:PORT` where no cluster listens: a line says it is connecting, then one error
    names the address, at once (Ray alone retried silently for minutes)."""
    pytest.importorskip("ray")
    from wtx import cluster

    address = f"127.0.0.1:{_closed_port()}"
    status = []
    started = time.monotonic()
    with pytest.raises(WtxError) as raised:
        cluster.connect(cluster.ClusterOptions(address), on_status=status.append)
    assert time.monotonic() - started < 5
    assert status == [f"connecting to the Ray cluster at {address} ..."]
    message = str(raised.value)
    assert message.startswith(f"--ray {address}: no Ray cluster there (Connection refused); ")
    assert "ray start --head" in message and "\n" not in message


def test_a_ray_head_that_does_not_answer_times_out_in_one_line(tmp_path):
    """A port that accepts connections but never answers as Ray does: wtx gives up after
    WTX_RAY_CONNECT_TIMEOUT seconds with one line and exit 1; no Ray cluster is started."""
    pytest.importorskip("ray")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "WTX_RAY_CONNECT_TIMEOUT": "2"}
        command = [sys.executable, "-m", "wtx", "transcribe", str(SAMPLE), "-o", str(tmp_path)]
        started = time.monotonic()
        done = subprocess.run(
            [*command, "--ray", address], capture_output=True, env=env, timeout=60, check=False
        )
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr.decode()
    error = (
        f"error: --ray {address}: the Ray cluster did not answer within 2 s; check that a Ray "
        f"head runs there, or set WTX_RAY_CONNECT_TIMEOUT to wait longer"
    )
    assert done.stderr.decode().splitlines() == [
        f"connecting to the Ray cluster at {address} ...",
        error,
    ]
    assert done.stdout == b""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("junk", [b"this is not a bundle", b""])
def test_corrupt_bundle_is_removed_and_rebuilt(tmp_path, monkeypatch, junk):
    """A compiled-artifact bundle torch cannot read is removed with a message naming it, and
    the next look finds none, so the engine compiles afresh and saves a new one (the engine's
    side, with a real compile: test_compile.py::test_corrupt_artifacts_are_removed_and_rebuilt)."""
    from wtx import compile_cache

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    compile_cache.private_dir(tmp_path / "compiled")
    for path in (compile_cache.bundle_path("key"), compile_cache.function_path("key", "encoder")):
        path.write_bytes(junk)
        path.chmod(0o600)
    with pytest.raises(compile_cache.CorruptBundle) as bundle:
        compile_cache.load_bundle("key")
    assert str(bundle.value).startswith(
        f"{compile_cache.bundle_path('key')}: corrupt compiled-artifact bundle removed ("
    )
    with pytest.raises(compile_cache.CorruptBundle) as function:
        compile_cache.load_function("key", "encoder")
    assert str(function.value).startswith(
        f"{compile_cache.function_path('key', 'encoder')}: unreadable compiled function removed ("
    )
    assert list((tmp_path / "compiled").iterdir()) == []
    assert compile_cache.load_bundle("key") is False
    assert compile_cache.load_function("key", "encoder") is None
