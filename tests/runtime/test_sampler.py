"""Sampling: llama.cpp's sampler-chain semantics, checked against a plain per-token model, and reproducibility."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kleidipy.errors import KleidipyError
from kleidipy.runtime.sampler import GREEDY, Sampler, SamplingError, SamplingParams, greedy, top_k


def chain_model(logits: list[float], history: list[int], p: SamplingParams) -> list[tuple[int, float]]:
    """Plain-Python statement of llama.cpp's chain (penalties, top-k, top-p, min-p, temperature): the surviving
    (id, logit) pairs, best first, ties by id."""
    f32 = np.float32
    x = [f32(v) for v in logits]
    n = len(history) if p.repeat_last_n == -1 else p.repeat_last_n
    window = history[max(0, len(history) - n) :]
    neutral = p.repeat_penalty == 1 and p.frequency_penalty == 0 and p.presence_penalty == 0
    if not neutral:
        for t in set(window):
            c = window.count(t)
            x[t] = x[t] * f32(p.repeat_penalty) if x[t] <= 0 else x[t] / f32(p.repeat_penalty)
            x[t] = x[t] - (f32(c) * f32(p.frequency_penalty) + f32(p.presence_penalty))
    cur = sorted(enumerate(x), key=lambda it: (-it[1], it[0]))
    if 0 < p.top_k < len(cur):
        cur = cur[: p.top_k]
    if p.top_p < 1:
        e = [f32(math.exp(f32(v - cur[0][1]))) for _, v in cur]
        total = f32(0)
        for v in e:
            total = f32(total + v)
        run = f32(0)
        for i, v in enumerate(e):
            run = f32(run + f32(v / total))
            if run >= f32(p.top_p):
                cur = cur[: i + 1]
                break
    if p.min_p > 0:
        cut = cur[0][1] + f32(math.log(f32(p.min_p)))
        cur = [(i, v) for i, v in cur if v >= f32(cut)]
    if p.temperature > 0:
        cur = [(i, f32(v / f32(p.temperature))) for i, v in cur]
    return cur


params_st = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 0.8, 1.0, 2.0]),
    top_k=st.sampled_from([0, 1, 3, 40, -1]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    repeat_penalty=st.sampled_from([1.0, 1.1, 1.5]),
    repeat_last_n=st.sampled_from([-1, 0, 4, 64]),
    frequency_penalty=st.sampled_from([0.0, 0.5]),
    presence_penalty=st.sampled_from([0.0, 0.25]),
)


@settings(max_examples=200, deadline=None)
@given(
    params=params_st,
    logits=st.lists(
        st.sampled_from([-3.0, -1.0, 0.0, 0.5, 1.0, 2.5, 4.0]) | st.floats(-20, 20, width=32), min_size=1, max_size=60
    ),  # fmt: skip
    data=st.data(),
)
def test_candidates_match_plain_model(params: SamplingParams, logits: list[float], data: st.DataObject) -> None:
    history = data.draw(st.lists(st.integers(0, len(logits) - 1), max_size=12))
    sampler = Sampler(params, seed=1)
    ids, lg = sampler.candidates(np.array(logits, np.float32), history)
    want = chain_model(logits, history, params)
    assert ids.tolist() == [i for i, _ in want]
    np.testing.assert_array_equal(lg, np.array([v for _, v in want], np.float32))
    token = sampler(np.array(logits, np.float32), history)
    if params.greedy:
        assert token == want[0][0]
    else:
        assert token in ids


@pytest.mark.parametrize("seed", range(6))
def test_top_k_is_the_first_k_by_value_then_id(seed: int) -> None:
    """The compiled top-k against a sort by (-value, id), on a 49152-entry vocabulary with many ties and -inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-40, 40, 49152).astype(np.float32) / 4 if seed % 2 else rng.standard_normal(49152, np.float32)
    x[rng.integers(0, x.size, 100)] = -np.inf
    if seed == 4:
        x[:] = -np.inf  # every entry tied
    order = np.lexsort((np.arange(x.size), -x))
    for k in (1, 2, 40, 1000, x.size):
        assert top_k(x, k).tolist() == order[:k].tolist(), k


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = np.array([1.0, 3.0, -2.0, 3.0, 3.0], np.float32)
    assert greedy(logits) == 1
    assert Sampler(GREEDY, seed=5)(logits) == 1
    assert Sampler(SamplingParams(temperature=-1.0, top_k=0, top_p=1.0, min_p=0.0))(logits) == 1
    # a repetition penalty on token 1 moves greedy to the next of the tied tokens
    assert Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.5))(logits, history=[1]) == 3


def test_penalties_follow_llama_cpp() -> None:
    p = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=3)
    logits = np.array([4.0, -4.0, 1.0, 0.0, 2.0], np.float32)
    out = Sampler(p).penalize(logits, history=[4, 0, 1, 0])  # window [0, 1, 0]: token 4 has left it
    np.testing.assert_array_equal(out, np.array([4 / 2 - 2 * 0.5 - 0.25, -4 * 2 - 0.5 - 0.25, 1, 0, 2], np.float32))
    assert np.array_equal(Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=0)).penalize(logits, [0]), logits)
    everything = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1)).penalize(logits, [4] + [3] * 100)
    np.testing.assert_array_equal(everything, np.array([4.0, -4.0, 1.0, 0.0, 1.0], np.float32))


def test_top_k_top_p_min_p() -> None:
    probs = np.array([0.05, 0.5, 0.15, 0.3], np.float64)
    logits = np.log(probs).astype(np.float32)
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    cands = lambda **kw: Sampler(SamplingParams(**{**base, **kw})).candidates(logits)[0].tolist()  # noqa: E731
    assert cands() == [1, 3, 2, 0]
    assert cands(top_k=2) == [1, 3]
    assert cands(top_p=0.75) == [1, 3]
    assert cands(top_p=0.85) == [1, 3, 2]
    assert cands(min_p=0.31) == [1, 3]
    assert cands(min_p=0.29) == [1, 3, 2]
    assert cands(top_p=0.75, temperature=50.0) == [1, 3]  # top-p sees the logits before temperature
    tied = np.array([2.0, 1.0, 2.0, 2.0], np.float32)
    assert Sampler(SamplingParams(top_k=2)).candidates(tied)[0].tolist() == [0, 2]


def test_sampling_distribution_and_seed() -> None:
    logits = np.array([0.0, 1.0, 2.0, -1.0], np.float32)
    params = SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
    draws = [Sampler(params, seed=s)(logits) for s in range(4)]
    s = Sampler(params, seed=123)
    seq = [s(logits) for _ in range(20000)]
    again = Sampler(params, seed=123)
    assert [again(logits) for _ in range(20000)] == seq
    freq = np.bincount(seq, minlength=4) / len(seq)
    want = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    np.testing.assert_allclose(freq, want, atol=0.015)
    assert all(d in range(4) for d in draws)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Sampler()(np.array([1.0, np.nan], np.float32)),
        lambda: Sampler()(np.zeros((2, 3), np.float32)),
        lambda: Sampler()(np.array([], np.float32)),
        lambda: Sampler(GREEDY)(np.array([1.0, np.nan], np.float32)),
        lambda: Sampler(SamplingParams(repeat_penalty=1.1))(np.zeros(3, np.float32), history=[3]),
        lambda: SamplingParams(temperature=float("nan")),
        lambda: SamplingParams(repeat_penalty=0.0),
        lambda: SamplingParams(repeat_last_n=-2),
    ],
)
def test_bad_inputs(bad) -> None:
    with pytest.raises(SamplingError) as info:
        bad()
    assert isinstance(info.value, KleidipyError) and "\n" not in str(info.value)
