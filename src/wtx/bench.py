"""Honest timing of decoding passes on the same windows, and the agreement between them.

A pass decodes every window once per repeat, after a warm-up on a full batch. The device is
synchronized before each clock read; the median repeat is quoted. Speedups are only ever
computed between passes that decoded the same windows with the same options: anything else
raises BenchMismatch.
"""

import gc
import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from wtx.audio import Window
from wtx.metrics import agreement, wer

SCHEMA_VERSION = 1


class BenchMismatch(ValueError):
    """Two passes did not decode the same windows with the same options."""


def tokens_text(tokenizer, token_lists: Sequence[Sequence[int]]) -> str:
    """The text of every window's tokens (special and timestamp tokens left out), joined."""
    return " ".join(tokenizer.decode([t for t in tokens if t < tokenizer.eot]) for tokens in token_lists)


def windows_fingerprint(windows: Sequence[Window]) -> str:
    """sha256 over every window's offset and samples: equal iff the passes saw the same audio."""
    digest = hashlib.sha256()
    for w in windows:
        digest.update(np.float64(w.offset).tobytes())
        digest.update(np.ascontiguousarray(w.samples).tobytes())
    return digest.hexdigest()


@dataclass
class PassResult:
    name: str
    kind: str  # "stock", "wtx-eager", "wtx-graphs" (CUDA) or "wtx-compiled"
    batch_size: int
    windows: int
    audio_seconds: float
    fingerprint: str
    options: str  # the decoding options, as text, that must match for a comparison
    times_s: list[float]
    tokens: int
    peak_memory_mib: float | None
    compile: dict | None = None
    token_lists: list[list[int]] = field(default_factory=list, repr=False)
    text: str = field(default="", repr=False)
    agreement: dict | None = None
    reference_wer: float | None = None
    speedup: float | None = None
    quantized: str | None = None  # the logits' packed weights, "fp16" or "int8" (wtx.quantize): not a decoding option; agreement shows its cost

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def summary(self) -> dict:
        """Every raw number, for the JSON report (token lists and text left out)."""
        data = {k: v for k, v in asdict(self).items() if k not in ("token_lists", "text")}
        median = self.median_s
        data.update(
            median_s=median,
            windows_per_s=self.windows / median,
            rtfx=self.audio_seconds / median,
            tokens_per_s=self.tokens / median,
        )
        return data


def check_comparable(baseline: PassResult, other: PassResult) -> None:
    if baseline.fingerprint != other.fingerprint or baseline.windows != other.windows:
        raise BenchMismatch(f"{other.name} decoded different windows than {baseline.name}")
    if baseline.options != other.options:
        raise BenchMismatch(
            f"{other.name} used different decoding options than {baseline.name}: "
            f"{other.options} vs {baseline.options}"
        )


def speedup(baseline: PassResult, other: PassResult) -> float:
    check_comparable(baseline, other)
    return baseline.median_s / other.median_s


def compare(baseline: PassResult, other: PassResult, normalize_text: bool = True) -> dict:
    """Agreement of `other` with `baseline`: identical windows and WER between the texts."""
    check_comparable(baseline, other)
    a = agreement(baseline.token_lists, other.token_lists, baseline.text, other.text)
    return {"baseline": baseline.name, "identical_windows": a.identical, "windows": a.windows,
            "identical_share": a.identical_share, "wer": a.wer}  # fmt: skip


def reference_wer(result: PassResult, reference: str) -> float:
    return wer(reference, result.text)


def run_pass(
    name: str, kind: str, batch_size: int, windows: Sequence[Window], options: str,
    decode: Callable[[Sequence[Window]], list[list[int]]], to_text: Callable[[list[list[int]]], str],
    repeat: int, device, on_window: Callable[[int], None] | None = None,
) -> PassResult:  # fmt: skip
    """Warm-up on one full batch, then `repeat` timed decodes of all windows in batches."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def decode_all():
        out = []
        for start in range(0, len(windows), batch_size):
            out.extend(decode(windows[start : start + batch_size]))
            if on_window:
                on_window(min(batch_size, len(windows) - start))
        return out

    gc.collect()  # every pass starts from the same state, whatever passes ran before it
    if device.type == "cuda":
        torch.cuda.empty_cache()
    decode(windows[:batch_size])  # warm-up: excluded from the timings
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, tokens = [], []
    # what the process holds already is kept out of the garbage collector's scans, so a
    # Python-bound pass does not pay for what the process imported or ran before it (after a
    # compiled engine is built: about 650,000 objects, a slow full collection on a CPU)
    gc.collect()
    gc.freeze()
    try:
        for _ in range(repeat):
            sync()
            started = time.perf_counter()
            tokens = decode_all()
            sync()
            times.append(time.perf_counter() - started)
    finally:
        gc.unfreeze()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process RSS high-water mark
    return PassResult(
        name=name, kind=kind, batch_size=batch_size, windows=len(windows),
        audio_seconds=sum(w.duration for w in windows), fingerprint=windows_fingerprint(windows),
        options=options, times_s=times, tokens=sum(len(t) + 1 for t in tokens), peak_memory_mib=peak,
        token_lists=tokens, text=to_text(tokens),
    )  # fmt: skip
