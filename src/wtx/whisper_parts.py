"""openai-whisper's tokenizer, assets and alignment-head table, reached without importing the
`whisper` package: its `__init__` imports the stock model and `whisper.timing`, and with it
numba and llvmlite (about a second of every start, for code wtx does not run).

Nothing here runs code the package would not run itself: `whisper/tokenizer.py` imports only the
standard library and tiktoken, and the alignment-head table is read as a literal.
"""

import ast
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def package_dir() -> Path:
    """Where the installed `whisper` package lives (found, not imported)."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("openai-whisper is not installed (pip install openai-whisper)")
    return Path(next(iter(spec.submodule_search_locations)))


def asset(name: str) -> Path:
    """A file of whisper/assets: mel_filters.npz, gpt2.tiktoken, multilingual.tiktoken."""
    return package_dir() / "assets" / name


@lru_cache(maxsize=None)
def tokenizer_module():
    """whisper.tokenizer: the package's own module where the package is imported already (the
    stock model is in use), else the same file loaded on its own under a private name."""
    if "whisper" in sys.modules:
        import whisper.tokenizer

        return whisper.tokenizer
    spec = importlib.util.spec_from_file_location("wtx._whisper_tokenizer", package_dir() / "tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its assets are found next to its __file__, as in the package
    return module


@lru_cache(maxsize=None)
def alignment_heads_table() -> dict[str, bytes]:
    """whisper._ALIGNMENT_HEADS (model name -> base85 mask), read from the package's source."""
    if "whisper" in sys.modules:
        from whisper import _ALIGNMENT_HEADS

        return dict(_ALIGNMENT_HEADS)
    tree = ast.parse((package_dir() / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_ALIGNMENT_HEADS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def non_speech_tokens(tokenizer) -> tuple[int, ...]:
    """whisper's Tokenizer.non_speech_tokens, by its own rule, without tiktoken's check for special
    tokens in the text: that check compiles a pattern of every special token (half a second),
    and the rule's symbols hold none, so plain encoding gives the same tokens."""

    class Ordinary:
        encode = staticmethod(tokenizer.encoding.encode_ordinary)

    shim = type(tokenizer).__new__(type(tokenizer))
    shim.__dict__.update({k: v for k, v in vars(tokenizer).items() if k != "non_speech_tokens"})
    shim.encoding = Ordinary()
    return type(tokenizer).non_speech_tokens.func(shim)
