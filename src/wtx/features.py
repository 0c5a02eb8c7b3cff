"""Log-mel features for a batch of windows, on the model's device.

The same computation as openai-whisper's `log_mel_spectrogram`, with one difference that
matters for batching: the dynamic-range clamp (max - 8 dB) is taken per window, so a
window's features do not depend on the other windows in its batch.
"""

from functools import lru_cache

import numpy as np
import torch

from wtx.audio import HOP_LENGTH

N_FFT = 400


@lru_cache(maxsize=None)
def _mel_filters_cpu(n_mels: int) -> torch.Tensor:
    from wtx.whisper_parts import asset

    with np.load(asset("mel_filters.npz"), allow_pickle=False) as f:
        return torch.from_numpy(f[f"mel_{n_mels}"])


@lru_cache(maxsize=None)
def _constants(n_mels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hann window and mel filterbank, made once per device (so CUDA graphs can capture use)."""
    return torch.hann_window(N_FFT, device=device), _mel_filters_cpu(n_mels).to(device)


def log_mel_spectrogram(samples: torch.Tensor, n_mels: int = 80) -> torch.Tensor:
    # samples: [B, N_SAMPLES] float32 -> [B, n_mels, N_FRAMES] float32
    window, filters = _constants(n_mels, samples.device)
    stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_spec = filters @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    peak = log_spec.amax(dim=(-2, -1), keepdim=True)
    log_spec = torch.maximum(log_spec, peak - 8.0)
    return (log_spec + 4.0) / 4.0
