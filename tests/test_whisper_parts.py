"""openai-whisper's pieces reached without importing its package (wtx.whisper_parts)."""

import ast
import subprocess
import sys

import pytest


@pytest.mark.parametrize("multilingual", [False, True])
def test_tokenizer_and_its_suppressed_tokens_are_whispers(multilingual):
    import whisper.tokenizer

    from wtx.whisper_parts import non_speech_tokens

    theirs = whisper.tokenizer.get_tokenizer(multilingual, num_languages=99, language="en", task="transcribe")
    assert non_speech_tokens(theirs) == theirs.non_speech_tokens
    assert len(theirs.non_speech_tokens) > 80  # the rule's symbols, not an empty tuple


def test_alignment_heads_table_is_whispers():
    import whisper

    from wtx.whisper_parts import alignment_heads_table

    alignment_heads_table.cache_clear()
    assert alignment_heads_table() == whisper._ALIGNMENT_HEADS


def test_the_engine_never_imports_the_whisper_package():
    """Building the tokenizer, the logit filters, the mel filters and the alignment heads of an
    openai-format checkpoint: the `whisper` package (and numba with it) stays unimported, and
    the privately loaded tokenizer gives the package's tokens and alignment heads."""
    # dims by hand: importing whisper.model would run whisper/__init__
    code = """
import sys
from types import SimpleNamespace
from wtx.decode import LogitFilters, get_tokenizer
from wtx.features import log_mel_spectrogram
from wtx.model import alignment_heads
from wtx.options import DecodingOptions
import torch
dims = SimpleNamespace(is_multilingual=False, num_languages=99, n_text_layer=4, n_text_head=6, n_vocab=51864)
tokenizer = get_tokenizer(dims, "en", "transcribe")
filters = LogitFilters(tokenizer, dims.n_vocab, DecodingOptions())
log_mel_spectrogram(torch.zeros(1, 480000))
heads = alignment_heads({"name": "tiny.en.pt"}, dims)
loaded = sorted(m for m in sys.modules if m == "whisper" or m.startswith(("whisper.", "numba")))
print(repr((loaded, tokenizer.encode(" hello world"), int(filters.suppress.sum()), heads)))
"""
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, tokens, suppressed, heads = ast.literal_eval(ours)
    assert loaded == []
    import whisper.tokenizer

    from wtx.decode import LogitFilters
    from wtx.model import alignment_heads
    from wtx.options import DecodingOptions

    theirs = whisper.tokenizer.get_tokenizer(False, num_languages=99, language="en", task="transcribe")
    assert tokens == theirs.encode(" hello world")
    assert suppressed == int(LogitFilters(theirs, 51864, DecodingOptions()).suppress.sum())
    dims = type("Dims", (), {"n_text_layer": 4, "n_text_head": 6})
    assert heads == alignment_heads({"name": "tiny.en.pt"}, dims) != []
