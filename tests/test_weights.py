import pytest
import torch

from wtx import weights
from wtx.errors import ModelNotFound, WeightsMismatch


def test_bundled_tiny_en_is_converted_once_and_verified():
    path = weights.resolve("tiny.en")
    assert path.is_file()
    stamp = path.with_suffix(".pt.sha256").read_text().strip()
    assert stamp == weights.sha256_of([path])
    mtime = path.stat().st_mtime_ns
    assert weights.resolve("tiny.en") == path and path.stat().st_mtime_ns == mtime  # cached
    checkpoint = weights.load_checkpoint("tiny.en")
    assert checkpoint["dims"]["n_text_layer"] == 4
    assert checkpoint["alignment_heads"][0] == [1, 0]


def test_source_hash_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("WTX_CACHE_DIR", str(tmp_path))
    bad = weights.BundledModel(**{**weights.BUNDLED["tiny.en"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(weights.BUNDLED, "tiny.en", bad)
    with pytest.raises(WeightsMismatch, match="reinstall"):
        weights.resolve("tiny.en")
    assert not (tmp_path / "models" / "tiny.en.pt").exists()


def test_unknown_and_missing_models_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        weights.resolve("nope")
    with pytest.raises(ModelNotFound, match="never downloads"):
        weights.resolve("small")
    with pytest.raises(ModelNotFound, match="not found"):
        weights.resolve(str(tmp_path / "missing.pt"))


def test_openai_cache_and_local_paths_are_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "whisper").mkdir()
    checkpoint = {"dims": {"n_mels": 80}, "model_state_dict": {"x": torch.zeros(1)}}
    torch.save(checkpoint, tmp_path / "whisper" / "small.pt")
    assert weights.resolve("small") == tmp_path / "whisper" / "small.pt"
    local = tmp_path / "mine.pt"
    torch.save(checkpoint, local)
    assert weights.load_checkpoint(str(local))["dims"] == {"n_mels": 80}


def test_checkpoints_load_with_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    path = tmp_path / "evil.pt"
    torch.save({"dims": {}, "model_state_dict": {}, "x": Evil()}, path)
    with pytest.raises(WeightsMismatch, match="not a loadable checkpoint"):
        weights.load_checkpoint(str(path))
