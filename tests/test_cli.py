"""Exit codes, stdout/stderr separation and outputs of `wtx transcribe`, run as a real process."""

import json
import subprocess
import sys

import pytest

from tests.conftest import SAMPLE, make_wav, run_wtx, shared_file
from tests.test_writers import parse_srt


def test_help_does_not_import_torch():
    code = "import sys; from wtx.cli import app; sys.argv=['wtx','--help']\ntry: app()\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().endswith("False")


def test_help_explains_every_transcribe_flag():
    out = run_wtx("transcribe", "--help", env={"COLUMNS": "200"})
    assert out.returncode == 0
    text = out.stdout.decode()
    for flag in ("--model", "--output-dir", "--format", "--language", "--task", "--batch-size",
                 "--device", "--dtype", "--threads", "--quiet"):  # fmt: skip
        assert flag in text
    assert "pip install 'wtx[ray]'" in " ".join(text.replace("│", " ").split())  # not eaten as markup


def test_missing_path_is_a_usage_error(tmp_path):
    out = run_wtx("transcribe", str(tmp_path / "nope.mp3"), "-o", str(tmp_path))
    assert out.returncode == 2
    assert b"nope.mp3" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_format_is_a_usage_error(tmp_path):
    out = run_wtx("transcribe", str(SAMPLE), "-f", "docx", "-o", str(tmp_path))
    assert out.returncode == 2
    assert b"docx" in out.stderr


@pytest.mark.parametrize("option, value, says", [("--beam-size", "0", b"--beam-size"), ("--best-of", "17", b"--best-of"),
                                                ("--patience", "0.05", b"keeps no hypothesis")])  # fmt: skip
def test_bad_beam_options_are_usage_errors(tmp_path, option, value, says):
    out = run_wtx("transcribe", str(SAMPLE), option, value, "-o", str(tmp_path))
    assert out.returncode == 2
    assert says in out.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags", [["--highlight-words"], ["--max-line-width", "30"], ["--max-words-per-line", "3"]])
def test_subtitle_layout_needs_word_timestamps(tmp_path, flags):
    out = run_wtx("transcribe", str(SAMPLE), *flags, "-o", str(tmp_path))
    assert out.returncode == 2
    assert b"needs --word-timestamps" in out.stderr and flags[0].encode() in out.stderr
    assert not list(tmp_path.iterdir())


def test_word_timestamps_into_json_and_tsv(tmp_path):
    """--word-timestamps: the JSON's segments list their words, the TSV has a row per word, and
    the words are the text without --word-timestamps (segment times, and so paragraphs, may move)."""
    common = [str(SAMPLE), "-b", "4", "--beam-size", "1", "--no-vad", "-q"]
    out = run_wtx("transcribe", *common, "--word-timestamps", "-f", "json,tsv,txt", "-o", str(tmp_path / "w"))
    assert out.returncode == 0, out.stderr
    payload = json.loads((tmp_path / "w" / "sample.json").read_text())
    words = [w for s in payload["segments"] for w in s["words"]]
    assert len(words) > 100 and {"word", "start", "end", "probability"} == set(words[0])
    assert all(s["start"] <= s["end"] for s in payload["segments"])
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    tsv = (tmp_path / "w" / "sample.tsv").read_text().splitlines()
    assert len(tsv) == len(words) + 1 and tsv[1].split("\t")[2] == words[0]["word"].strip()
    plain = run_wtx("transcribe", *common, "-o", "-")
    assert plain.returncode == 0
    assert plain.stdout.decode().split() == (tmp_path / "w" / "sample.txt").read_text().split()


def test_text_only_subtitles_follow_the_words_by_default(tmp_path):
    """On a CPU the default is text only, where a window (up to 30 s) is one segment: writing
    .srt turns word timing on, so cues follow the speech; without subtitles it stays off, and
    --no-word-timestamps keeps it off. The text is the same in all three."""
    common = [str(SAMPLE), "--device", "cpu", "--beam-size", "1", "-q"]
    subtitles = run_wtx("transcribe", *common, "-f", "json,srt", "-o", str(tmp_path / "srt"))
    assert subtitles.returncode == 0, subtitles.stderr.decode()[-2000:]
    segments = json.loads((tmp_path / "srt" / "sample.json").read_text())["segments"]
    assert segments and all(s["words"] for s in segments)
    cues = parse_srt((tmp_path / "srt" / "sample.srt").read_text())
    starts = {round(w["start"], 3) for s in segments for w in s["words"]}
    assert len(cues) > len(segments) and all(round(c[1], 3) in starts for c in cues)  # cues start on words
    for flags, name in [([], "plain"), (["--no-word-timestamps", "-f", "json,srt"], "off")]:
        out = run_wtx("transcribe", *common, *(flags or ["-f", "json"]), "-o", str(tmp_path / name))
        assert out.returncode == 0
        plain = json.loads((tmp_path / name / "sample.json").read_text())["segments"]
        assert not any(s.get("words") for s in plain)
        assert [s["text"] for s in plain] == [s["text"] for s in segments]


@pytest.mark.slow
def test_bad_file_fails_alone_and_others_complete(tmp_path):
    bad = tmp_path / "broken.mp3"
    bad.write_text("not audio at all")
    out_dir = tmp_path / "out"
    out = run_wtx("transcribe", str(bad), str(SAMPLE), "-o", str(out_dir), "-f", "srt,txt")
    assert out.returncode == 1
    stderr = out.stderr.decode()
    assert "broken.mp3" in stderr and "ffmpeg" in stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["sample.srt", "sample.txt"]
    assert out.stdout == b""  # nothing but data on stdout, and there was no data asked for


@pytest.mark.slow
def test_two_inputs_give_valid_srt_inside_each_duration(tmp_path):
    lj = shared_file("audio/lj001_0001-0032_concat.flac")
    out_dir = tmp_path / "out"
    out = run_wtx("transcribe", str(SAMPLE), str(lj), "-f", "srt,txt", "-o", str(out_dir))
    assert out.returncode == 0, out.stderr.decode()
    for stem, duration in (("sample", 61.7), ("lj001_0001-0032_concat", 231.4)):
        cues = parse_srt((out_dir / f"{stem}.srt").read_text())
        assert len(cues) > 5
        assert [c[0] for c in cues] == list(range(1, len(cues) + 1))
        times = [t for c in cues for t in (c[1], c[2])]
        assert times == sorted(times)
        assert times[-1] <= duration
        assert (out_dir / f"{stem}.txt").read_text().strip()


@pytest.mark.slow
def test_stdin_to_stdout_pipeline():
    out = run_wtx("transcribe", "-", "-o", "-", stdin=SAMPLE.read_bytes())
    assert out.returncode == 0, out.stderr.decode()
    words = out.stdout.decode().split()
    assert len(words) > 60
    assert "lighthouse" in out.stdout.decode().lower().replace(" ", "")
    assert b"transcribed" in out.stderr  # the summary goes to stderr, not stdout
    assert b"transcribed" not in out.stdout


@pytest.mark.slow
def test_quiet_prints_nothing_on_success(tmp_path):
    out = run_wtx("transcribe", str(make_wav(tmp_path / "tone.wav", 3.0)), "-q", "-o", str(tmp_path))
    assert out.returncode == 0
    assert out.stderr == b""
    assert (tmp_path / "tone.srt").exists()


@pytest.mark.slow
def test_compile_on_a_cpu_says_it_runs_eager(tmp_path):
    out = run_wtx("transcribe", str(make_wav(tmp_path / "tone.wav", 3.0)), "--compile", "--device", "cpu",
                  "-o", str(tmp_path), env={"WTX_CPU_COMPILE": ""})  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    stderr = out.stderr.decode()
    assert "--compile: not used on a CPU" in stderr and "eager; ready in" in stderr
    assert "compiling" not in stderr and "loading the compiled" not in stderr


@pytest.mark.slow
def test_quantize_says_what_ran_and_refuses_what_cannot(tmp_path):
    tone = str(make_wav(tmp_path / "tone.wav", 3.0))
    greedy = run_wtx("transcribe", tone, "--beam-size", "1", "--device", "cpu", "-o", str(tmp_path / "greedy"))
    assert greedy.returncode == 0, greedy.stderr.decode()[-2000:]
    from wtx.engine import native_bf16
    from wtx.quantize import has_vnni

    encoder = ", bf16 encoder" if native_bf16() else ""  # --dtype auto on a CPU with native bf16
    cross = ", bf16 cross-attention" if native_bf16() else ""  # with int8 beside a bf16 encoder
    auto = f"int8 logits{cross}" if has_vnni() else "fp16 decoder weights"  # --quantize auto
    assert f"(float32{encoder}, {auto}), text only, each window alone, batch 24 (auto)" in greedy.stderr.decode()
    beams = run_wtx("transcribe", tone, "--quantize", "int8", "--device", "cpu", "-o", str(tmp_path / "beams"))
    assert beams.returncode == 0 and f"(float32{encoder}, int8 logits{cross}), " in beams.stderr.decode()  # asked for
    fp16 = run_wtx("transcribe", tone, "--quantize", "fp16", "--timestamps", "--device", "cpu", "-o", str(tmp_path / "fp16"))
    assert fp16.returncode == 0
    assert f"(float32{encoder}, fp16 decoder weights), timestamps, each window prompted with the text before it, batch 8 (auto)" in fp16.stderr.decode()
    plain = run_wtx("transcribe", tone, "--quantize", "none", "--device", "cpu", "-o", str(tmp_path / "plain"))
    assert plain.returncode == 0 and f"(float32{encoder}), " in plain.stderr.decode()
    refused = run_wtx("transcribe", tone, "--quantize", "int8", "--dtype", "bf16", "--device", "cpu", "-o", str(tmp_path))
    assert refused.returncode == 1
    assert "--quantize int8 runs on a CPU in fp32, eager; not on cpu in bfloat16" in refused.stderr.decode()
    assert not (tmp_path / "tone.txt").exists()


@pytest.mark.slow
def test_fixed_windows_decode_timestamps_by_default(tmp_path):
    """--split fixed cuts windows mid-speech, where text only ends them early: the automatic
    mode is timestamps with prompts there; --without-timestamps still gets text only."""
    tone = str(make_wav(tmp_path / "tone.wav", 3.0))
    fixed = run_wtx("transcribe", tone, "--split", "fixed", "--device", "cpu", "-o", str(tmp_path / "a"))
    assert fixed.returncode == 0, fixed.stderr.decode()[-2000:]
    assert "timestamps, each window prompted with the text before it, batch 8 (auto)" in fixed.stderr.decode()
    asked = run_wtx("transcribe", tone, "--split", "fixed", "--without-timestamps", "--device", "cpu", "-o", str(tmp_path / "b"))
    assert asked.returncode == 0 and "text only, each window alone, batch 24 (auto)" in asked.stderr.decode()


@pytest.mark.slow
def test_compare_eager_reports_the_speedup(tmp_path):
    out = run_wtx("transcribe", str(SAMPLE), "--compare-eager", "-o", str(tmp_path), "-f", "txt")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    stderr = out.stderr.decode()
    assert "eager openai-whisper baseline" in stderr and "wtx speedup" in stderr
    assert (tmp_path / "sample.txt").read_text().strip()


@pytest.mark.slow
def test_multilingual_model_detects_the_language_once_per_file(tmp_path):
    german = shared_file("audio/aeneas_librivox/de_simplicissimus.mp3")
    out = run_wtx("transcribe", str(german), str(SAMPLE), "-m", "base", "-f", "json", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    import json

    de = json.loads((tmp_path / "de_simplicissimus.json").read_text())
    en = json.loads((tmp_path / "sample.json").read_text())
    assert (de["language"], en["language"]) == ("de", "en")
    assert "abenteuerliche" in de["text"].lower()


def test_the_process_exits_as_python_would_less_its_teardown():
    """wtx's entry point ends with os._exit: the code SystemExit gives, every byte of stdout,
    atexit callbacks run and other threads finished first."""
    code = """
import atexit, sys, threading, time
from wtx.cli import _leave
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stderr.write("thread finished\\n"))).start()
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(2)  # kept: its idle workers stop at exit, as they do in Python's own
pool.submit(time.sleep, 0.01)
sys.stdout.write("x" * 1_000_000)
_leave(3)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "x" * 1_000_000
    assert proc.stderr.splitlines() == ["thread finished", "atexit ran"]
    failed = subprocess.run([sys.executable, "-c", "from wtx.cli import _leave; _leave('error: it broke')"],
                            capture_output=True, text=True)  # fmt: skip
    assert (failed.returncode, failed.stderr) == (1, "error: it broke\n")


def test_a_profiled_process_keeps_its_profile(tmp_path):
    """cProfile writes its file after the program returns: wtx's fast exit must not skip it."""
    out = tmp_path / "wtx.prof"
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "wtx", "cache", "info"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
