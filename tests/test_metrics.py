import pytest

from wtx.metrics import agreement, edit_distance, wer, word_errors


def test_identical_sequences_agree():
    a = agreement([[1, 2, 3], [4]], [[1, 2, 3], [4]], "the cat sat", "the cat sat")
    assert (a.identical, a.windows, a.wer) == (2, 2, 0.0)
    assert a.identical_share == 1.0


def test_one_substitution():
    a = agreement([[1, 2, 3], [4]], [[1, 9, 3], [4]], "the cat sat down", "the dog sat down")
    assert a.identical == 1
    assert a.wer == pytest.approx(0.25)


def test_an_empty_side():
    assert wer("", "") == 0.0
    assert wer("", "surprise words") == 1.0
    assert wer("three words here", "") == 1.0
    assert agreement([[]], [[5]], "", "hello").identical == 0


def test_mismatched_window_counts_are_an_error():
    with pytest.raises(ValueError, match="cannot compare"):
        agreement([[1]], [[1], [2]], "a", "a b")


def test_edit_distance_counts_insertions_and_deletions():
    assert edit_distance("kitten".split(), "kitten".split()) == 0
    assert edit_distance(list("abc"), list("abxc")) == 1
    assert edit_distance(list("abc"), list("ac")) == 1
    assert word_errors("One two, three!", "one Two three").errors == 0  # normalized
