"""Stock openai-whisper on the same windows: the reference the engine must agree with."""

from collections.abc import Sequence

import numpy as np
import torch

from wtx.audio import Window
from wtx.features import log_mel_spectrogram


def load_stock_model(checkpoint: dict, device: str | torch.device = "cpu"):
    """openai-whisper's own model class, built from the same checkpoint dict as the engine."""
    import whisper.model

    dims = whisper.model.ModelDimensions(**checkpoint["dims"])
    model = whisper.model.Whisper(dims)
    model.load_state_dict(checkpoint["model_state_dict"])
    return model.to(device).eval()


def stock_decode(model, windows: Sequence[Window], batch_size: int, fp16: bool = False, language: str | None = "en", **options):
    """`whisper.decode()` (greedy, timestamps) on batches of the windows; one DecodingResult each."""
    import whisper

    opts = whisper.DecodingOptions(fp16=fp16, language=language, **options)
    results = []
    device = next(model.parameters()).device
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        samples = torch.from_numpy(np.stack([w.samples for w in batch])).to(device)
        mel = log_mel_spectrogram(samples, model.dims.n_mels)
        with torch.inference_mode():
            results.extend(whisper.decode(model, mel, opts))
    return results
