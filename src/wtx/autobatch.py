"""`--batch-size auto`: the batch size that measured fastest for the model, within free memory.

Measured with scripts/throughput.py (docs/benchmarks.md, "Batch size"): on the H200, fp16,
compiled, three books four times over (3:07 of audio), batch 64 decoded tiny.en and base
fastest of 16, 32, 64 and 128. Shapes not measured take 32. On a CPU every batch is padded to
its size, so a small batch wastes the least on short inputs; CPU_BATCH measured fastest there
greedy, and CPU_GROUPS with 5 beams. With beam search computing only the windows still
decoding (wtx.model.LiveWindows) and a step taking the live windows' rows only (fp16 weights),
8 windows ran a long book faster than 4, to the same text, and a short sample a little slower:
CPU_GROUPS is 8.
Windows decoded alone and text only (the default: engine.resolve_modes) keep every row
busy whatever the file, and CPU_ALONE measured fastest of 8, 16, 24 and 32 windows at beam 5
with int8 logits, to the same text (each row is computed on its own).
"""

import os

import torch

MEASURED_CUDA = {(384, 4): 64, (512, 6): 64}  # (n_text_state, n_text_layer): tiny(.en), base
CUDA_UNMEASURED = 32
CUDA_GROUPS = 32  # windows per batch with several rows each (beam search): 32 x 5 rows
CPU_BATCH = 8
CPU_GROUPS = 8  # windows per batch on a CPU with beam search: 8 x 5 rows
CPU_ALONE = 24  # windows per batch on a CPU, text only, each window alone (any beam size)
MEMORY_SHARE = 0.8  # of the device's free memory


def row_bytes(dims, dtype: torch.dtype, group: int = 1) -> int:
    """A generous estimate of one window's device memory: its rows' self-attention caches, its
    cross-attention caches, the encoder's activations and its rows' logits, twice over (measured
    peaks on the H200 were 1.4 to 1.5 times the sum). group: decoder rows per window."""
    size = torch.tensor([], dtype=dtype).element_size()
    caches = dims.n_text_layer * 2 * (group * dims.n_text_ctx + dims.n_audio_ctx) * dims.n_text_state
    encoder = dims.n_audio_ctx * 8 * dims.n_audio_state
    return 2 * (size * (caches + encoder) + group * 4 * 2 * dims.n_vocab)


def pick_batch_size(dims, device: torch.device, dtype: torch.dtype, group: int = 1, alone: bool = False) -> int:
    """The automatic batch size (windows) for a model on a device, with `group` rows per window;
    `alone`: text only, every window on its own (EngineOptions.windows_alone)."""
    if device.type != "cuda":
        return CPU_ALONE if alone else CPU_BATCH if group == 1 else CPU_GROUPS
    batch = MEASURED_CUDA.get((dims.n_text_state, dims.n_text_layer), CUDA_UNMEASURED) if group == 1 else CUDA_GROUPS
    free, _ = torch.cuda.mem_get_info(device)
    while batch > 1 and batch * row_bytes(dims, dtype, group) > MEMORY_SHARE * free:
        batch //= 2
    return batch


# of row_bytes: a window's share of the peak on a CPU (tiny.en, beam 5, text only: 27.7 MB a
# window between -b 8 and -b 40, the peak resident memory of whole runs on a 4 s clip, 2026-12-07;
# at -b 256 a run took 7.6 GB)
CPU_ROW_SHARE = 0.25
CPU_NOTED = 4 * 2**30  # a batch's memory worth a warning on a CPU (or half the memory available)


def available_memory() -> int:
    """Bytes of memory available to start new work (Linux's MemAvailable; else free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_batch_warning(dims, dtype: torch.dtype, group: int, batch: int, auto: int,
                      available: int) -> str | None:  # fmt: skip
    """A warning for a batch size given on a CPU above `auto` (the automatic pick) whose memory
    is large (CPU_NOTED, or half of `available`): every batch is padded to its size, so it takes
    that memory whatever the input's length. None otherwise."""
    needed = batch * CPU_ROW_SHARE * row_bytes(dims, dtype, group)
    if batch <= auto or needed < min(CPU_NOTED, available / 2):
        return None
    memory = f"about {needed / 2**30:.1f} GiB of memory whatever the input's length"
    return (f"batch size {batch} on a CPU: every batch is padded to {batch} windows, {memory} "
            f"({available / 2**30:.1f} GiB available); auto (the default) picks {auto} here, "
            f"which measured fastest")  # fmt: skip


def engine_batch_warning(engine) -> str | None:
    """cpu_batch_warning for an engine on a CPU, whose batch size was given."""
    if engine.device.type != "cpu":
        return None
    group = engine.options.decoding.group
    dims, dtype, batch = engine.dims, engine.dtype, engine.options.batch_size
    auto = pick_batch_size(dims, engine.device, dtype, group, engine.options.windows_alone)
    return cpu_batch_warning(dims, dtype, group, batch, auto, available_memory())
