"""The vectorized logit filters must mask exactly what openai-whisper's per-row filters mask."""

import random

import pytest
import torch
from whisper.decoding import ApplyTimestampRules, SuppressBlank, SuppressTokens

from wtx.decode import DecodeState, LogitFilters, get_tokenizer, select_tokens, suppress_tokens, uniform_noise
from wtx.options import DecodingOptions
from wtx.segments import split_segments
from wtx.model import ModelDimensions

TINY_EN = ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(TINY_EN, "en", "transcribe")


def stock_filters(tokenizer, sample_begin: int):
    return [
        SuppressBlank(tokenizer, sample_begin),
        SuppressTokens(suppress_tokens(tokenizer)),
        ApplyTimestampRules(tokenizer, sample_begin, max_initial_timestamp_index=50),
    ]


def state_of(sampled: list[int], ts_begin: int) -> tuple:
    last = sampled[-1] if sampled else 0
    penult = sampled[-2] if len(sampled) > 1 else 0
    stamps = [t for t in sampled if t >= ts_begin]
    return last, penult, stamps[-1] if stamps else 0


def random_history(rng: random.Random, ts_begin: int, length: int) -> list[int]:
    """Plausible sampled sequences: text runs between non-decreasing timestamps."""
    seq, ts = [], ts_begin + rng.randint(0, 50)
    for _ in range(length):
        if rng.random() < 0.35:
            ts = min(ts + rng.randint(0, 40), ts_begin + 1500)
            seq.append(ts)
        else:
            seq.append(rng.randint(0, 5000))
    return seq


HAND_MADE = [
    [],  # first step: only timestamps up to 1.0 s
    [50364],  # after the first timestamp: text only
    [50364, 400],  # text then anything, but no timestamp before 0.00 + 1
    [50364, 400, 50400],  # a lone timestamp: closes the pair, no text allowed
    [50364, 400, 50400, 50400],  # a closed pair: text only
    [50364, 400, 401, 50700, 50700, 500],
]


@pytest.mark.parametrize("case", range(len(HAND_MADE) + 60))
def test_rules_match_openai_whisper(tokenizer, case):
    rng = random.Random(case)
    ts_begin = tokenizer.timestamp_begin
    n_vocab = TINY_EN.n_vocab
    batch = 4
    if case < len(HAND_MADE):
        histories = [HAND_MADE[case]] * batch
    else:
        length = rng.randint(0, 12)
        histories = [random_history(rng, ts_begin, length) for _ in range(batch)]
        length = min(len(h) for h in histories)
        histories = [h[:length] for h in histories]
    sample_begin = 1
    tokens = torch.tensor([[tokenizer.sot] + h for h in histories], dtype=torch.long)
    gen = torch.Generator().manual_seed(case)
    logits = torch.randn(batch, n_vocab, generator=gen) * 3
    logits[:, ts_begin:] += torch.randn(batch, 1, generator=gen) * 4  # sometimes favour timestamps

    expected = logits.clone()
    for f in stock_filters(tokenizer, sample_begin):
        f.apply(expected, tokens)

    filters = LogitFilters(tokenizer, n_vocab, DecodingOptions())
    states = [state_of(h, ts_begin) for h in histories]
    last, penult, max_ts = (torch.tensor(x) for x in zip(*states))
    i = torch.tensor(len(histories[0]))
    got, logprobs = filters.filtered(logits.clone(), i, last, penult, max_ts)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[~torch.isinf(got)], expected[~torch.isinf(expected)])
    # computed again for the rows the timestamp rule masked only: a full log_softmax's bits
    assert torch.equal(logprobs, torch.log_softmax(got, dim=-1))


def test_select_tokens_forces_end_of_text_after_finish(tokenizer):
    filters = LogitFilters(tokenizer, TINY_EN.n_vocab, DecodingOptions())
    state = DecodeState.start(2, "cpu")
    state.finished[0] = True
    logits = torch.zeros(2, TINY_EN.n_vocab)
    logits[:, tokenizer.timestamp_begin] = 10.0
    tokens, new = select_tokens(filters, logits, torch.tensor(0), state, torch.zeros(len(logits)), torch.zeros(len(logits), dtype=torch.long))
    assert tokens.tolist() == [tokenizer.eot, tokenizer.timestamp_begin]
    assert new.max_ts.tolist() == [0, tokenizer.timestamp_begin]
    assert new.sum_logprobs[0] == 0  # finished rows stop accumulating


def test_uniform_noise_depends_only_on_row_seed_step_and_token():
    vocab = torch.arange(TINY_EN.n_vocab)
    a = uniform_noise(torch.tensor([5, 9]), torch.tensor(3), vocab)
    b = uniform_noise(torch.tensor([9]), torch.tensor(3), vocab)
    assert torch.equal(a[1], b[0])  # the same in any batch
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[1], uniform_noise(torch.tensor([9]), torch.tensor(4), vocab)[0])
    assert (a > 0).all() and (a < 1).all()
    assert abs(a.mean().item() - 0.5) < 0.01 and abs(a.var().item() - 1 / 12) < 0.005


def test_sampling_at_a_temperature_follows_the_softmax(tokenizer):
    filters = LogitFilters(tokenizer, TINY_EN.n_vocab, DecodingOptions())
    rows = 1000  # the same seeds every run: deterministic shares
    hello, world, there = (tokenizer.encode(w)[0] for w in (" hello", " world", " there"))
    logits = torch.full((rows, TINY_EN.n_vocab), -1e4)
    logits[:, [hello, world, there]] = torch.tensor([0.5, 0.3, 0.2]).log()
    state = DecodeState.start(rows, "cpu")
    state.last.fill_(hello)  # step 1 after a text token: text and later timestamps allowed
    seeds = torch.arange(rows)
    greedy, _ = select_tokens(filters, logits, torch.tensor(1), state, torch.zeros(rows), seeds)
    assert (greedy == hello).all()
    sampled, _ = select_tokens(filters, logits, torch.tensor(1), state, torch.ones(rows), seeds)
    shares = [(sampled == t).float().mean().item() for t in (hello, world, there)]
    assert shares == pytest.approx([0.5, 0.3, 0.2], abs=0.03)
    hot, _ = select_tokens(filters, logits, torch.tensor(1), state, torch.full((rows,), 2.0), seeds)
    assert (hot == hello).float().mean().item() < shares[0] - 0.05  # hotter is flatter


def test_split_segments_pairs_and_offsets(tokenizer):
    ts = tokenizer.timestamp_begin
    hello = tokenizer.encode(" hello")
    world = tokenizer.encode(" world")
    tokens = [ts, *hello, ts + 100, ts + 100, *world, ts + 250]
    segments = split_segments(tokens, tokenizer, offset=60.0, duration=30.0)
    assert [(s.start, s.end, s.text) for s in segments] == [(60.0, 62.0, "hello"), (62.0, 65.0, "world")]


def test_split_segments_trailing_text_runs_to_window_end(tokenizer):
    ts = tokenizer.timestamp_begin
    tokens = [ts, *tokenizer.encode(" a"), ts + 50, ts + 50, *tokenizer.encode(" unfinished")]
    segments = split_segments(tokens, tokenizer, offset=30.0, duration=12.0)
    assert [(s.start, s.end, s.text) for s in segments] == [(30.0, 31.0, "a"), (31.0, 42.0, "unfinished")]


def test_split_segments_empty(tokenizer):
    assert split_segments([], tokenizer, 0.0, 30.0) == []
    ts = tokenizer.timestamp_begin
    assert split_segments([ts, ts + 10], tokenizer, 0.0, 30.0) == []


@pytest.mark.parametrize("case", range(8))
def test_rules_without_timestamps_match_openai_whisper(tokenizer, case):
    """Text only (without_timestamps): openai-whisper applies SuppressBlank and SuppressTokens and
    no timestamp rule, so every timestamp stays possible and <|notimestamps|> is not suppressed."""
    rng = random.Random(case)
    batch, n_vocab = 4, TINY_EN.n_vocab
    length = rng.randint(0, 6)
    histories = [[rng.randint(0, 5000) for _ in range(length)] for _ in range(batch)]
    sample_begin = 1
    tokens = torch.tensor([[tokenizer.sot] + h for h in histories], dtype=torch.long)
    logits = torch.randn(batch, n_vocab, generator=torch.Generator().manual_seed(case)) * 3
    expected = logits.clone()
    for f in stock_filters(tokenizer, sample_begin)[:2]:
        f.apply(expected, tokens)

    filters = LogitFilters(tokenizer, n_vocab, DecodingOptions(without_timestamps=True))
    last, penult = (torch.tensor([h[-k] if len(h) >= k else 0 for h in histories]) for k in (1, 2))
    no_timestamp = torch.zeros(batch, dtype=torch.long)
    got, logprobs = filters.filtered(logits.clone(), torch.tensor(length), last, penult, no_timestamp)
    assert torch.equal(got, expected)
    assert torch.equal(logprobs, torch.log_softmax(got, dim=-1))
    assert not torch.isinf(got[:, tokenizer.timestamp_begin :]).any()
