"""Argument validation, shared by the CLI and the Python API: every bad value is one clear line
(a usage error, exit 2, on the command line; wtx.errors.InvalidOption, a ValueError, in the API)
before anything loads, and a bad entry among many inputs fails alone."""

import json
import subprocess

import pytest

from tests.conftest import SAMPLE, run_wtx


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """The bundled sample's first 4 s (a sentence of speech), as 16 kHz WAV."""
    path = tmp_path_factory.mktemp("clip") / "clip.wav"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-i", str(SAMPLE), "-t", "4", "-ar", "16000", str(path)],
        check=True,
    )
    return path


# 11. languages: codes and names, any case ---------------------------------------------------


def test_language_names_and_codes_in_any_case():
    from wtx.options import language_code

    given = ["German", "english", "DE", " en ", "Castilian", "mandarin", None]
    assert [language_code(x) for x in given] == ["de", "en", "de", "en", "es", "zh", None]


def test_an_unknown_language_is_a_usage_error_before_loading(tmp_path):
    out = run_wtx("transcribe", str(SAMPLE), "-l", "klingon", "-o", str(tmp_path))
    err = out.stderr.decode()
    assert out.returncode == 2 and "'klingon' is not a language" in err and "Traceback" not in err
    assert " de," in err  # says what to give
    assert not list(tmp_path.iterdir())  # nothing loaded or journaled


@pytest.mark.slow
def test_an_english_only_model_warns_and_transcribes_english(tmp_path, clip):
    """openai-whisper's rule for .en models: another language (or translate) gives a warning,
    then English."""
    args = ["-l", "German", "--task", "translate", "-b", "1", "--no-vad", "-f", "json"]
    out = run_wtx("transcribe", str(clip), *args, "-o", str(tmp_path))
    err = out.stderr.decode()
    assert out.returncode == 0, err
    assert "tiny.en is an English-only model" in err and "transcribing English" in err
    payload = json.loads((tmp_path / "clip.json").read_text())
    assert payload["language"] == "en" and "Welcome" in payload["text"]


@pytest.mark.slow
def test_a_language_name_decodes_with_a_multilingual_model(clip):
    import wtx

    model = wtx.load_model("base", device="cpu", batch_size=1, vad=False, language="German")
    segments, info = model.transcribe(str(clip))
    assert info.language == "de" and model.options["language"] == "de"
    assert list(segments)  # decoded, no KeyError from the tokenizer


@pytest.mark.slow
def test_a_language_the_model_was_not_trained_on_is_one_clear_error():
    from wtx.engine import Engine, EngineOptions
    from wtx.options import DecodingOptions

    options = EngineOptions(model="base", device="cpu", batch_size=1,
                            decoding=DecodingOptions(language="yue"))  # fmt: skip
    with pytest.raises(ValueError, match="base knows 99 languages, not 'yue'"):
        Engine(options)


# 12, 20. names that cannot be paths: a NUL byte, a name over 255 bytes ------------------------

UNUSABLE = ["bad\0name.wav", "x" * 300 + ".wav"]


def test_names_that_cannot_be_paths_are_problems_not_exceptions():
    from wtx.inputs import expand

    expanded = expand(UNUSABLE)
    assert expanded.inputs == []
    assert [p.split(": ", 1)[1] for p in expanded.problems] == [
        "a path cannot hold a NUL byte",
        "File name too long",
    ]
    assert "\0" not in expanded.problems[0]  # printable


@pytest.mark.slow
def test_a_list_entry_that_cannot_be_a_path_fails_alone(tmp_path, clip):
    """...and the summary names the first few failures, then how many more (a list of half a
    million bad lines printed every name in one line)."""
    missing = [f"missing-{i}.wav" for i in range(10)]
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join([UNUSABLE[0], str(clip), UNUSABLE[1], *missing]) + "\n")
    out = tmp_path / "o"
    run = run_wtx(
        "transcribe",
        "--from-list",
        str(listing),
        "-b",
        "1",
        "--no-vad",
        "-f",
        "txt",
        "-o",
        str(out),
    )
    err = run.stderr.decode()
    assert run.returncode == 1 and "Traceback" not in err
    assert "NUL byte" in err and "File name too long" in err
    assert "Welcome" in (out / "clip.txt").read_text()
    summary = err.splitlines()[-1]
    assert (
        summary.startswith("error: 12 of 13 inputs failed: bad\\0name.wav, x")
        and "missing-9" not in summary
    )
    assert summary.endswith(", missing-2.wav and 7 more"), summary


def test_a_command_line_name_too_long_is_a_usage_error(tmp_path):
    out = run_wtx("transcribe", str(tmp_path / UNUSABLE[1]), "-o", str(tmp_path / "o"))
    err = " ".join(out.stderr.decode().replace("│", " ").split())  # the usage box, unwrapped
    assert out.returncode == 2 and "File name too long" in err and "Traceback" not in err


# 16. folders that link back to themselves -------------------------------------------------


@pytest.fixture
def looped(tmp_path):
    """d/a.flac and d/sub/b.flac, with links back up: d/up1 and d/up2 -> d, d/sub/back -> d."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "a.flac").write_bytes(b"")
    (d / "sub" / "b.flac").write_bytes(b"")
    for link in ("up1", "up2", "sub/back"):
        (d / link).symlink_to(d, target_is_directory=True)
    return d


@pytest.mark.parametrize("pattern", ["{d}/**/*.flac", "{d}", "{d}/**"])
def test_links_that_loop_are_walked_once(looped, pattern):
    """Each folder is searched once, however many links lead back to it (the glob followed
    every link, 2 to the 40th paths here), and each file is one input."""
    import sys

    named = pattern.format(d=looped)
    script = (
        f"from wtx.inputs import expand; print(sorted(i.path for i in expand([{named!r}]).inputs))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=False
    )
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == [str(looped / "a.flac"), str(looped / "sub" / "b.flac")]


# 8. the API's arrays: integer PCM scaled, one channel only ----------------------------------


@pytest.fixture(scope="module")
def model():
    import wtx

    return wtx.load_model("tiny.en", device="cpu", batch_size=1, vad=False)


def test_integer_samples_are_scaled_as_pcm():
    import numpy as np

    from wtx.api import as_samples

    pcm = {
        np.int16: ([-32768, 0, 16384], [-1, 0, 0.5]),
        np.int32: ([-(2**31), 0, 2**30], [-1, 0, 0.5]),
        np.uint8: ([0, 128, 192], [-1, 0, 0.5]),
    }
    for dtype, (given, expected) in pcm.items():
        samples = as_samples(np.array(given, dtype=dtype))
        assert samples.dtype == np.float32 and samples.tolist() == expected, dtype
    floats = np.array([0.25, -0.5], dtype=np.float32)
    assert as_samples(floats) is floats  # as given


@pytest.mark.parametrize("shape", [(16000, 2), (2, 16000), (1, 16000)])
def test_audio_that_is_not_one_channel_is_a_clear_error(shape):
    import numpy as np

    from wtx.api import as_samples

    with pytest.raises(
        ValueError, match=r"audio: must be mono, a 1-D array of samples at 16 kHz; got shape"
    ):
        as_samples(np.zeros(shape, dtype=np.float32))


@pytest.mark.slow
def test_int16_samples_give_the_text_of_their_file(model, clip):
    """A WAV's int16 frames (ffmpeg reads them as frames / 32768) give the file's text."""
    import wave

    import numpy as np

    with wave.open(str(clip)) as w:
        frames = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    from_file = [s.text for s in model.transcribe(str(clip))[0]]
    assert "Welcome" in " ".join(from_file)
    assert [s.text for s in model.transcribe(frames)[0]] == from_file


# 9. the API from two threads at once -------------------------------------------------------


@pytest.mark.slow
def test_two_threads_transcribing_at_once_each_get_their_own_text(model, clip):
    """Calls on one model take turns (each call's segments whole), never mixing their batches."""
    import threading

    alone = [s.text for s in model.transcribe(str(clip))[0]]
    start, texts = threading.Barrier(2), {}

    def transcribe(i):
        segments, _ = model.transcribe(str(clip))
        start.wait()
        texts[i] = [s.text for s in segments]

    threads = [threading.Thread(target=transcribe, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert texts == {0: alone, 1: alone}


@pytest.mark.slow
def test_a_second_call_in_the_same_thread_while_the_first_is_read_is_an_error(model, clip):
    """Waiting for itself would hang: it says to finish (or close) the first call's segments."""
    import wtx.errors

    first, _ = model.transcribe(str(clip))
    next(first)
    second, _ = model.transcribe(str(clip))
    with pytest.raises(wtx.errors.WtxError, match="close"):
        next(second)
    first.close()  # its turn ends
    assert "Welcome" in " ".join(s.text for s in model.transcribe(str(clip))[0])


# 10, 19. the API's arguments, checked as the CLI's before anything loads ---------------------

BAD_ARGUMENTS = [
    ("batch_size", 0, "from 1 to 256"),
    ("batch_size", -3, "from 1 to 256"),
    ("batch_size", 257, "from 1 to 256"),
    ("batch_size", 2.5, "whole number"),
    ("beam_size", 0, "from 1 to 16"),
    ("best_of", 0, "from 1 to 16"),
    ("patience", 0.0, "above 0"),
    ("patience", float("inf"), "at most 20"),
    ("patience", float("nan"), "above 0"),
    ("patience", 1e308, "at most 20"),
    ("length_penalty", float("inf"), "from 0 to 2"),
    ("dtype", "fp8", "auto, fp32, fp16 or bf16"),
    ("quantize", "int4", "auto, fp16, int8 or none"),
    ("task", "translat", "transcribe or translate"),
    ("language", "klingon", "not a language"),
    ("device", "gpu", "cpu, cuda or cuda:N"),
]


@pytest.mark.parametrize("argument, value, says", BAD_ARGUMENTS)
def test_bad_api_arguments_raise_before_the_model_loads(monkeypatch, argument, value, says):
    import wtx
    import wtx.engine
    from wtx.errors import InvalidOption

    def loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(wtx.engine, "Engine", loading)
    with pytest.raises(InvalidOption, match=f"^{argument}: .*{says}") as raised:
        wtx.load_model("tiny.en", **{argument: value})
    assert isinstance(raised.value, ValueError) and raised.value.option == argument


def test_an_unavailable_device_is_a_clear_api_error(monkeypatch):
    import torch

    import wtx
    import wtx.engine
    from wtx.errors import InvalidOption

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(wtx.engine, "Engine", None)  # not reached
    with pytest.raises(InvalidOption, match="^device: cuda: .*the available device is cpu"):
        wtx.load_model("tiny.en", device="cuda")


@pytest.mark.parametrize("patience", ["inf", "1e308"])
def test_a_patience_without_bound_is_a_usage_error(tmp_path, patience):
    out = run_wtx("transcribe", str(SAMPLE), "--patience", patience, "-o", str(tmp_path))
    err = out.stderr.decode()
    assert out.returncode == 2 and "at most 20" in err and "Traceback" not in err


def test_decoding_options_refuse_a_patience_without_bound():
    from wtx.options import DecodingOptions

    with pytest.raises(ValueError, match="at most 20"):
        DecodingOptions(beam_size=5, patience=float("inf"))  # was an OverflowError


# a batch on a CPU far above what it needs --------------------------------------------------

TINY = (80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)  # tiny.en's ModelDimensions


def test_a_large_batch_on_a_cpu_warns_of_its_memory():
    """-b 256 on a CPU took 7.6 GB for 11 s of audio (every batch is padded to 256 windows)."""
    import torch

    from wtx.autobatch import cpu_batch_warning
    from wtx.model import ModelDimensions

    dims, gib = ModelDimensions(*TINY), 2**30
    warning = cpu_batch_warning(dims, torch.float32, 5, 256, 24, 16 * gib)
    assert "padded to 256 windows, about 7.9 GiB" in warning and "picks 24" in warning
    assert cpu_batch_warning(dims, torch.float32, 5, 24, 24, 16 * gib) is None  # the automatic size
    assert cpu_batch_warning(dims, torch.float32, 5, 32, 24, 16 * gib) is None  # 1 GiB
    assert (
        cpu_batch_warning(dims, torch.float32, 5, 32, 24, gib) is not None
    )  # half of what is free


@pytest.mark.slow
def test_load_model_warns_of_a_large_cpu_batch():
    import wtx

    with pytest.warns(UserWarning, match="padded to 256 windows"):
        wtx.load_model("tiny.en", device="cpu", batch_size=256, vad=False)
