"""Untrusted audio: inputs that would read other files, samples out of range, many short inputs,
FIFOs without a writer, many channels, several audio tracks. Both readers (the ffmpeg binary and
PyAV) get every case."""

import os
import subprocess

import numpy as np
import pytest

from wtx import audio
from wtx.audio import SAMPLE_RATE, probe_duration, stream_samples
from wtx.errors import AudioError

READERS = ["ffmpeg", "pyav"]
FFMPEG = audio.ffmpeg_binary()  # for making test files, whichever reader is tested


@pytest.fixture(params=READERS)
def reader(request, monkeypatch):
    """Which decoder reads: the ffmpeg binary, or PyAV (as on a machine without the binary)."""
    if request.param == "pyav":
        pytest.importorskip("av")
        monkeypatch.setattr(audio, "ffmpeg_binary", lambda: None)
    elif FFMPEG is None:
        pytest.skip("no ffmpeg binary")
    return request.param


def _ffmpeg(*args: str) -> None:
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def _tone(path, seconds: float = 3.0, freq: int = 440):
    _ffmpeg(
        "-f", "lavfi", "-i", f"sine=frequency={freq}:duration={seconds}", "-ar", "16000", str(path)
    )
    return path


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    """A recording in another folder that no input names."""
    folder = tmp_path_factory.mktemp("secret")
    return _tone(folder / "lj.flac")


PLAYLISTS = {
    # the red team's playlist under a media name, as an absolute and a relative path, and a real .m3u8
    "abs.mp3": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{abs}\n#EXT-X-ENDLIST\n",
    "plain.mp3": "#EXTM3U\n#EXTINF:200.0,\n{abs}\n#EXT-X-ENDLIST\n",
    "rel.mp3": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{rel}\n#EXT-X-ENDLIST\n",
    "list.m3u8": "#EXTM3U\n#EXT-X-TARGETDURATION:200\n#EXTINF:200.0,\n{rel}\n#EXT-X-ENDLIST\n",
    "concat.wav": "ffconcat version 1.0\nfile '{abs}'\n",
}


@pytest.mark.parametrize("name", list(PLAYLISTS))
def test_a_playlist_never_reads_other_files(tmp_path, secret, reader, name):
    """A playlist (whatever its name says) fails alone, naming itself; the file it lists is never
    decoded, nor probed for its duration."""
    folder = tmp_path / "in"
    folder.mkdir()
    playlist = folder / name
    rel = "../../" + secret.parent.name + "/" + secret.name
    playlist.write_text(PLAYLISTS[name].format(abs=secret, rel=rel))
    assert (folder / rel).resolve() == secret.resolve()
    with pytest.raises(AudioError) as error:
        list(stream_samples(str(playlist)))
    message = str(error.value)
    assert message.startswith(f"{playlist}: ") and "\n" not in message
    if name.endswith(".m3u8") or name == "concat.wav":
        assert "a playlist" in message and "would read other files" in message
    assert probe_duration(str(playlist)) is None


def test_a_playlist_on_stdin_never_reads_other_files(secret, reader):
    """Through a pipe as well: the playlist is refused, nothing of the listed file comes out."""
    text = PLAYLISTS["list.m3u8"].format(rel=secret, abs=secret).encode()
    read, write = os.pipe()
    os.write(write, text)
    os.close(write)
    fifo = f"/dev/fd/{read}"
    try:
        with pytest.raises(AudioError, match="other files|cannot decode"):
            list(stream_samples(fifo))
    finally:
        os.close(read)


def test_ordinary_formats_still_decode(tmp_path, reader):
    """The formats people transcribe pass the list of formats wtx reads."""
    source = _tone(tmp_path / "tone.wav", seconds=1.0)
    for suffix in ["mp3", "flac", "ogg", "m4a", "mkv", "mp4", "webm", "aiff", "opus"]:
        out = tmp_path / f"tone.{suffix}"
        _ffmpeg("-i", str(source), *(["-c:a", "libopus"] if suffix == "webm" else []), str(out))
        samples = np.concatenate(list(stream_samples(str(out))))
        assert abs(len(samples) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE, suffix
        assert probe_duration(str(out)) == pytest.approx(1.0, abs=0.1), suffix
