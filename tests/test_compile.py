"""torch.compile on CPU (Inductor's C++ backend) with a random-weight tiny-shaped model."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from wtx.audio import N_SAMPLES, Window
from wtx.engine import Engine, EngineOptions
from wtx.model import ModelDimensions, Whisper, load_model

pytestmark = pytest.mark.slow

TINY = ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
BATCH = 2


def random_model(seed: int = 0) -> Whisper:
    import whisper.model

    torch.manual_seed(seed)
    stock = whisper.model.Whisper(whisper.model.ModelDimensions(**TINY.__dict__))
    # openai-whisper leaves the decoder's positional embedding as torch.empty: fill it, so that
    # two models built with the same seed are the same model
    torch.nn.init.normal_(stock.decoder.positional_embedding, std=0.02)
    return load_model({"dims": TINY.__dict__, "model_state_dict": stock.state_dict()})


def windows(seed: int, n: int = BATCH) -> list[Window]:
    rng = np.random.default_rng(seed)
    return [Window(i, 30.0 * i, 30.0, (0.1 * rng.standard_normal(N_SAMPLES)).astype(np.float32)) for i in range(n)]


@pytest.fixture(scope="module")
def engines():
    torch.set_num_threads(2)
    model = random_model()
    options = dict(model="random-tiny", device="cpu", batch_size=BATCH, quantize="none")  # as the compiled engine
    compiled = Engine(EngineOptions(**options, compile=True, strict=True), model=model)
    eager = Engine(EngineOptions(**options), model=random_model())
    return compiled, eager


def test_compiles_fullgraph_without_fallback(engines):
    compiled, _ = engines
    assert compiled.compile_report.source in ("compiled", "loaded")
    assert compiled.compile_report.warnings == []
    assert compiled.compile_report.ahead_of_time  # aot_compile works here (torch 2.13; 2.11 on the H200)
    assert compiled.batch.owns_caches and compiled.batch.step is not compiled.batch.loop


def test_no_recompilation_across_batches(engines):
    from torch._dynamo.utils import counters

    compiled, _ = engines
    before = dict(counters["stats"])
    for seed in (1, 2, 3):  # three batches of different content and prompts, the last one short (padded)
        n = BATCH if seed < 3 else 1
        prompts = [list(range(100, 100 + 40 * seed * (row + 1))) for row in range(n)]
        temperatures = [0.0, 0.6][:n] if seed == 2 else None  # a sampling row: the step's other variant
        compiled.decode_batch(windows(seed, n=n), prompts=prompts, temperatures=temperatures)
    assert dict(counters["stats"]) == before


@torch.no_grad()
def test_compiled_logits_match_eager(engines):
    compiled, eager = engines
    batch = windows(7)
    for engine in (compiled, eager):
        decoder = engine.batch
        decoder.ensure_loop()
        prefix, pad = decoder.prefix([[100, 200, 300], []], BATCH, fixed=False)  # one row prompted
        temperature, seed = torch.tensor([0.0, 0.7]), torch.tensor([1, 2])  # one row samples
        decoder.prefill(decoder.stack(batch), None, prefix, pad, temperature, seed)
        decoder.loop.sample = True
        for _ in range(5):
            decoder.step()
    torch.testing.assert_close(compiled.batch.loop.logits, eager.batch.loop.logits, rtol=1e-3, atol=1e-3)
    assert torch.equal(compiled.batch.loop.sampled, eager.batch.loop.sampled)


def test_second_process_hits_the_disk_cache(tmp_path):
    script = textwrap.dedent("""
        import json, torch
        torch.set_num_threads(2)
        from torch._dynamo.utils import counters
        from tests.test_compile import random_model, BATCH
        from wtx.compile_cache import loads
        import torch._inductor.config as inductor_config
        from wtx.compiled import CompiledRunner
        from wtx.engine import Engine, EngineOptions
        threads = []
        build = CompiledRunner._build
        def watched(self, *args):
            threads.append(inductor_config.compile_threads)
            return build(self, *args)
        CompiledRunner._build = watched
        e = Engine(EngineOptions(model="random-tiny", device="cpu", batch_size=BATCH, compile=True, strict=True), model=random_model())
        print(json.dumps({"source": e.compile_report.source, "functions": loads["function"], "bundles": loads["bundle"],
                          "traced": counters["stats"]["unique_graphs"], "threads": threads}))
    """)
    env = {"WTX_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["source"] == "compiled"
    assert runs[0]["functions"] == 0 and runs[0]["traced"] == 3  # the encoder and two step variants
    assert runs[1]["source"] == "loaded"
    assert runs[1]["functions"] == 3 and runs[1]["bundles"] == 1
    assert runs[1]["traced"] == 0  # nothing traced again
    assert runs[1]["threads"] == [1]  # loading only: Inductor starts no pool of compile workers
    assert any(tmp_path.joinpath("compiled").iterdir())


def test_corrupt_artifacts_are_removed_and_rebuilt(tmp_path, monkeypatch):
    from wtx import compile_cache

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    options = EngineOptions(model="random-tiny", device="cpu", batch_size=BATCH, compile=True, strict=True)
    status = []
    Engine(options, model=random_model(), on_status=status.append)
    Engine(options, model=random_model(), on_status=status.append)
    assert status == [f"compiling the encoder and decode step for batch {BATCH} (first run only: later runs load it) ...",
                      f"loading the compiled encoder and decode step (batch {BATCH}) ..."]  # fmt: skip
    saved = sorted((tmp_path / "compiled").iterdir())
    bundles = [p for p in saved if p.suffix == ".bin"]
    functions = [p for p in saved if p.suffix == ".fn"]
    assert len(bundles) == 1 and len(functions) == 3
    for path in (bundles[0], functions[0]):
        path.write_bytes(b"this is not a bundle")
    engine = Engine(options, model=random_model())
    assert any("corrupt compiled-artifact bundle removed" in w for w in engine.compile_report.warnings)
    assert any("unreadable compiled function removed" in w for w in engine.compile_report.warnings)
    assert engine.compile_report.source == "compiled"
    assert compile_cache.bundle_path(bundles[0].stem).read_bytes() != b"this is not a bundle"
    assert all(p.is_file() and p.read_bytes() != b"this is not a bundle" for p in functions)


def test_inductor_notes_for_its_developers_are_not_shown():
    import warnings

    from wtx import compile_cache

    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("default")  # what catch_warnings resets: apply wtx's filter again
        compile_cache.configure()
        warnings.warn("\nOnline softmax is disabled on the fly since Inductor decides to\nsplit the reduction.", UserWarning)
        warnings.warn("something a user should see", UserWarning)
    assert [str(w.message) for w in caught] == ["something a user should see"]


def test_just_in_time_when_ahead_of_time_fails(tmp_path, monkeypatch, engines):
    """A torch without a working aot_compile still compiles: just in time, with a warning."""
    import wtx.compiled

    def unavailable(fn, *args):
        raise RuntimeError("aot_compile is not available")

    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(wtx.compiled, "_aot_compile", unavailable)
    options = EngineOptions(model="random-tiny", device="cpu", batch_size=BATCH, compile=True, strict=True)
    engine = Engine(options, model=random_model())
    report = engine.compile_report
    assert report.source == "compiled" and not report.ahead_of_time
    assert any("no ahead-of-time compile" in w and "aot_compile is not available" in w for w in report.warnings)
    assert not list((tmp_path / "compiled").glob("*.fn"))
    batch = windows(11)
    assert [r.tokens for r in engine.decode_batch(batch)] == [r.tokens for r in engines[0].decode_batch(batch)]


@torch.no_grad()
def test_beam_search_step_compiles_fullgraph_and_matches_eager():
    """The beam and best-of step (G rows per window) compiles without a graph break, loads
    without recompiling, and takes the eager step's tokens: one window by beam search, one sampled."""
    from torch._dynamo.utils import counters

    from wtx.options import DecodingOptions

    options = dict(model="random-tiny", device="cpu", batch_size=BATCH, decoding=DecodingOptions(beam_size=3, best_of=2),
                   quantize="none")  # fmt: skip
    compiled = Engine(EngineOptions(**options, compile=True, strict=True), model=random_model())
    eager = Engine(EngineOptions(**options), model=random_model())
    assert compiled.compile_report.warnings == [] and compiled.batch.loop.group == 3
    before = dict(counters["stats"])
    for engine in (compiled, eager):
        decoder = engine.batch
        decoder.ensure_loop()
        prefix, pad = decoder.prefix([[100, 200, 300], []], BATCH)
        temperature, seed = torch.tensor([0.0] * 3 + [0.7] * 3), torch.arange(6)
        decoder.prefill(decoder.stack(windows(7)), None, prefix, pad, temperature, seed)
        decoder.loop.sample = True
        for _ in range(6):
            decoder.step()
    assert dict(counters["stats"]) == before
    ours, theirs = compiled.batch.loop, eager.batch.loop
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-3, atol=1e-3)
    for name in ("sampled", "ended_tokens", "ended_count", "frozen"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    torch.testing.assert_close(ours.sum_logprobs, theirs.sum_logprobs, rtol=1e-4, atol=1e-4)


def test_word_timestamps_leave_the_compiled_functions_alone(engines):
    """The aligning pass after a compiled batch is eager: nothing recompiles, and the words are
    the eager engine's on the same tokens."""
    from torch._dynamo.utils import counters

    before = dict(counters["stats"])
    text = [[440, 1049, 286, 262, 995, 13], [40, 588, 257, 1310, 11, 1310, 3797, 13]]
    aligned = []
    for engine in engines:
        batch = windows(5)
        engine.decode_batch(batch)
        aligned.append(engine.align(text, batch, ["en", "en"]))
    assert dict(counters["stats"]) == before
    (ours, theirs) = aligned
    assert [[w.word for w in a] for a in ours] == [[w.word for w in a] for a in theirs]
    for a, b in zip(ours, theirs):
        assert len(a) > 0
        assert all(abs(x.start - y.start) <= 0.02 and abs(x.end - y.end) <= 0.02 for x, y in zip(a, b))
