"""Typed errors. The library raises these; only the CLI turns them into exit codes."""


class WtxError(Exception):
    """Base class: the message says what went wrong and how to fix it."""


class ModelNotFound(WtxError):
    pass


class WeightsMismatch(WtxError):
    pass


class AudioError(WtxError):
    """A file ffmpeg could not decode; the message names the file and ffmpeg's reason."""


class FFmpegMissing(WtxError):
    pass


class UntrustedCache(WtxError):
    """A cache folder or file that someone else could have written: never loaded."""
