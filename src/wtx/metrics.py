"""Agreement and accuracy: word error rate and token agreement between two decodings."""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=1)
def _normalizer():
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """whisper's EnglishTextNormalizer: case, punctuation, numbers and spellings made uniform."""
    return _normalizer()(text)


def edit_distance(ref: Sequence, hyp: Sequence) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        current = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class WordErrors:
    errors: int
    words: int  # in the reference

    @property
    def rate(self) -> float:
        if self.words == 0:
            return 0.0 if self.errors == 0 else 1.0
        return self.errors / self.words


def word_errors(reference: str, hypothesis: str, normalized: bool = True) -> WordErrors:
    if normalized:
        reference, hypothesis = normalize(reference), normalize(hypothesis)
    ref, hyp = reference.split(), hypothesis.split()
    return WordErrors(edit_distance(ref, hyp), len(ref))


def wer(reference: str, hypothesis: str, normalized: bool = True) -> float:
    return word_errors(reference, hypothesis, normalized).rate


@dataclass(frozen=True)
class Agreement:
    windows: int
    identical: int  # windows whose token sequences are identical
    wer: float  # between the two texts, normalized

    @property
    def identical_share(self) -> float:
        return self.identical / self.windows if self.windows else 1.0


def agreement(a_tokens: Sequence[Sequence[int]], b_tokens: Sequence[Sequence[int]], a_text: str, b_text: str) -> Agreement:
    """How far decoding `b` is from reference decoding `a`, on the same windows."""
    if len(a_tokens) != len(b_tokens):
        raise ValueError(f"cannot compare {len(a_tokens)} windows with {len(b_tokens)}")
    identical = sum(list(a) == list(b) for a, b in zip(a_tokens, b_tokens))
    return Agreement(len(a_tokens), identical, wer(a_text, b_text))
