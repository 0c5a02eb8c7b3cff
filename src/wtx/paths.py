"""The one cache root users can inspect and clear (`WTX_CACHE_DIR`, default ~/.cache/wtx)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("WTX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wtx"
    )
    return Path(root)


def whisper_cache_dir() -> Path:
    """Where openai-whisper keeps its downloaded checkpoints."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "whisper"
