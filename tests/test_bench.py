"""wtx bench: the JSON schema, the PNG, and refusing to compare passes that differ."""

import json
import struct

import pytest

from tests.conftest import run_wtx
from wtx.bench import BenchMismatch, PassResult, compare, speedup

PASS_KEYS = {
    "name", "kind", "batch_size", "windows", "audio_seconds", "fingerprint", "options", "times_s",
    "tokens", "peak_memory_mib", "compile", "agreement", "reference_wer", "speedup", "median_s",
    "windows_per_s", "rtfx", "tokens_per_s", "quantized",
}  # fmt: skip
TOP_KEYS = {
    "schema", "date", "versions", "device", "model", "dtype", "batch_size", "repeat", "inputs",
    "windows", "audio_seconds", "options", "baseline", "compile", "passes",
}  # fmt: skip


def make_pass(name, fingerprint="abc", options="greedy", times=(2.0,), tokens=([1, 2, 3],), text="a b c"):
    return PassResult(name, "stock", 1, len(tokens), 30.0, fingerprint, options, list(times),
                      sum(len(t) + 1 for t in tokens), None, token_lists=[list(t) for t in tokens], text=text)  # fmt: skip


def test_speedup_and_agreement_of_matching_passes():
    base = make_pass("base", times=(4.0, 2.0, 3.0))
    fast = make_pass("fast", times=(1.0, 1.0, 2.0), tokens=([1, 9, 3],), text="a x c")
    assert speedup(base, fast) == pytest.approx(3.0)
    agreement = compare(base, fast)
    assert agreement["identical_windows"] == 0
    assert agreement["wer"] == pytest.approx(1 / 3)


def test_mismatched_windows_are_refused():
    with pytest.raises(BenchMismatch, match="different windows"):
        speedup(make_pass("a"), make_pass("b", fingerprint="other"))


def test_mismatched_options_are_refused():
    with pytest.raises(BenchMismatch, match="different decoding options"):
        compare(make_pass("a"), make_pass("b", options="beam 5"))


@pytest.mark.slow
def test_bench_compare_eager_writes_schema_json_and_png(tmp_path):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    result = run_wtx("bench", "--compare-eager", "--json", str(out_json), "--plot", str(out_png), "--repeat", "1",
                     "--quantize", "none", "--beam-size", "1",  # stock's arithmetic, to the bit; greedy: shorter
                     "--no-compile")  # no assertion is about the compiled pass: it cost most of the time
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout == b""
    report = json.loads(out_json.read_text())
    assert TOP_KEYS <= report.keys()
    assert report["schema"] == 1 and report["model"] == "tiny.en"
    names = [p["name"] for p in report["passes"]]
    assert names[:3] == ["stock eager b1", f"stock eager b{report['batch_size']}", f"wtx eager b{report['batch_size']}"]
    for p in report["passes"]:
        assert PASS_KEYS <= p.keys()
        assert p["fingerprint"] == report["passes"][0]["fingerprint"]
        assert p["rtfx"] > 0 and p["median_s"] > 0
    assert report["passes"][2]["agreement"]["identical_share"] == 1.0  # fp32 CPU: token-identical
    assert not any(p["quantized"] for p in report["passes"])
    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 100 and height > 100
    import matplotlib.image

    assert matplotlib.image.imread(str(out_png)).shape[:2] == (height, width)
