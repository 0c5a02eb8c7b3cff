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
    if checkpoint.get("alignment_heads"):  # the bundled models' own (for word timestamps)
        import base64
        import gzip

        mask = np.zeros((dims.n_text_layer, dims.n_text_head), dtype=bool)
        for layer, head in checkpoint["alignment_heads"]:
            mask[layer, head] = True
        model.set_alignment_heads(base64.b85encode(gzip.compress(mask.tobytes())))
    return model.to(device).eval()


def stock_decode(model, windows: Sequence[Window], batch_size: int, fp16: bool = False, language: str | None = "en", **options):
    """`whisper.decode()` (timestamps; greedy unless beam_size or best_of is given) on batches of
    the windows; one DecodingResult each."""
    import whisper

    opts = whisper.DecodingOptions(fp16=fp16, language=language, **options)
    results = []
    device = next(model.parameters()).device
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        samples = torch.from_numpy(np.stack([w.samples for w in batch])).to(device)
        mel = log_mel_spectrogram(samples, model.dims.n_mels)
        with torch.inference_mode():
            if len(batch) > 1 and (opts.beam_size or opts.best_of or 1) > 1:
                results.extend(_grouped_task(model, opts).run(mel))
            else:
                results.extend(whisper.decode(model, mel, opts))
    return results


def _grouped_task(model, options):
    """whisper's DecodingTask with the audio features repeated for each beam (or sample).

    openai-whisper 20250625 repeats only the tokens, so beam search and best-of fail for more
    than one window at a time (openai/whisper#2197, #2389, #2843, not merged); this is those
    pull requests' fix, applied to the reference only. A given language is required (detection
    would run on the repeated features)."""
    from whisper.decoding import DecodingTask

    if options.language is None:
        raise ValueError("the grouped reference decode needs a language")

    class GroupedTask(DecodingTask):
        def _get_audio_features(self, mel):
            return super()._get_audio_features(mel).repeat_interleave(self.n_group, dim=0)

        def _detect_language(self, audio_features, tokens):
            return super()._detect_language(audio_features[:: self.n_group], tokens)

    return GroupedTask(model, options)


def stock_word_timestamps(model, tokenizer, window: Window, segments, last_speech: float) -> list[dict]:
    """openai-whisper's add_word_timestamps on one window's segments (wtx Segments, the tokens
    to align), with the window's own mel as transcribe() passes it: whisper's segment dicts,
    each with its "words"."""
    from whisper.timing import add_word_timestamps

    from wtx.timing import window_frames

    device = next(model.parameters()).device
    mel = log_mel_spectrogram(torch.from_numpy(window.samples).to(device), model.dims.n_mels)
    dicts = [{"seek": window.offset * 100, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens)}
             for s in segments]  # fmt: skip
    add_word_timestamps(segments=dicts, model=model, tokenizer=tokenizer, mel=mel, num_frames=window_frames(window),
                        last_speech_timestamp=last_speech)  # fmt: skip
    return dicts
