"""Typed errors. The library raises these; only the CLI turns them into exit codes."""


class WtxError(Exception):
    """Base class: the message says what went wrong and how to fix it."""


class InvalidOption(WtxError, ValueError):
    """An option's value that cannot run, raised before anything loads. `option` names it as
    the API spells it (batch_size); the CLI reports it as its flag (--batch-size)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option
        self.reason = message


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
