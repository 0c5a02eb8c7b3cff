"""--batch-size auto: the measured choice per model and device, shrunk to fit free memory."""

import subprocess
import sys

import torch

from wtx import autobatch
from wtx.model import ModelDimensions

TINY = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                       n_vocab=51864, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)  # fmt: skip
LARGE = ModelDimensions(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                        n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=32)  # fmt: skip


def test_cpu_takes_the_measured_cpu_batch():
    assert autobatch.pick_batch_size(TINY, torch.device("cpu"), torch.float32) == autobatch.CPU_BATCH
    assert autobatch.pick_batch_size(TINY, torch.device("cpu"), torch.float32, group=5) == autobatch.CPU_GROUPS
    for group in (1, 5):  # windows alone, text only: any window fills any row
        assert autobatch.pick_batch_size(TINY, torch.device("cpu"), torch.float32, group, alone=True) == autobatch.CPU_ALONE


def test_cuda_takes_the_measured_batch_and_shrinks_it_to_fit(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**30, 140 * 2**30))
    assert autobatch.pick_batch_size(TINY, cuda, torch.float16) == 64
    assert autobatch.pick_batch_size(LARGE, cuda, torch.float16) == autobatch.CUDA_UNMEASURED
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (6 * 2**30, 8 * 2**30))
    large = autobatch.pick_batch_size(LARGE, cuda, torch.float16)
    assert large < autobatch.CUDA_UNMEASURED and large * autobatch.row_bytes(LARGE, torch.float16) <= 0.8 * 6 * 2**30
    assert 2 * large * autobatch.row_bytes(LARGE, torch.float16) > 0.8 * 6 * 2**30  # the largest that fits


def test_bad_batch_sizes_are_usage_errors(tmp_path):
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"")
    for value in ("0", "257", "many", "-3"):
        proc = subprocess.run([sys.executable, "-m", "wtx", "transcribe", str(audio), "-b", value],
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 2 and "--batch-size" in proc.stderr, (value, proc.stderr)
