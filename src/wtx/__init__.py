"""wtx: fast long-form transcription with a rewritten, compile-ready OpenAI Whisper."""

__version__ = "0.1.0"
