"""wtx: long-form Whisper transcription, as fast as the hardware allows.

    import wtx
    model = wtx.load_model("tiny.en")
    segments, info = model.transcribe("book.mp3")
"""

__version__ = "0.1.0"

__all__ = ["load_model", "Model", "TranscriptionInfo", "Segment", "__version__"]


def __getattr__(name: str):
    # the API loads on first use, so `import wtx` (and `wtx --help`) stays light
    if name in ("load_model", "Model", "TranscriptionInfo"):
        from wtx import api

        return getattr(api, name)
    if name == "Segment":
        from wtx.segments import Segment

        return Segment
    raise AttributeError(f"module 'wtx' has no attribute {name!r}")
