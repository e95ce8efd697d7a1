"""SpaceSaving: Metwally et al.'s guarantees against exact counts, with and without decay."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.sketches.spacesaving import SpaceSaving

streams = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=400)


def test_hand_computed_small_stream() -> None:
    # capacity 2: 7 (7:1) 7 (7:2) 8 (7:2, 8:1) 9 evicts 8 (count 1): 9 gets count 2, error 1;
    # 7 (7:3). Total 5.
    summary = SpaceSaving(capacity=2)
    summary.update(np.array([7, 7, 8, 9, 7], dtype=np.int64))
    keys, counts, errors = summary.top()
    assert keys.tolist() == [7, 9]
    assert counts.tolist() == [3.0, 2.0]
    assert errors.tolist() == [0.0, 1.0]
    assert summary.total == 5.0
    assert summary.min_count == 2.0
    counts_of, errors_of = summary.estimate(np.array([9, 8, 7], dtype=np.int64))
    assert counts_of.tolist() == [2.0, 0.0, 3.0]
    assert errors_of.tolist() == [1.0, 0.0, 0.0]


@settings(max_examples=150, deadline=None)
@given(stream=streams, capacity=st.integers(min_value=1, max_value=30))
def test_guarantees_against_exact_counts(stream: list[int], capacity: int) -> None:
    summary = SpaceSaving(capacity)
    summary.update(np.array(stream, dtype=np.int64) * 1_000_003 - 17)
    true = Counter(k * 1_000_003 - 17 for k in stream)
    keys, counts, errors = summary.top()
    m = len(stream)
    assert len(set(keys.tolist())) == len(keys) == min(capacity, len(true))
    for key, count, error in zip(keys.tolist(), counts.tolist(), errors.tolist(), strict=True):
        assert count - error <= true[key] <= count
    tracked = set(keys.tolist())
    for key, frequency in true.items():
        if frequency > m / capacity:
            assert key in tracked
    assert summary.min_count <= m / capacity
    if len(true) <= capacity:  # never full: exact
        assert dict(zip(keys.tolist(), counts.tolist(), strict=True)) == true
        assert not errors.any()
    else:  # full: the counters always sum to the stream length
        assert counts.sum() == m


@settings(max_examples=60, deadline=None)
@given(stream=streams, capacity=st.integers(min_value=1, max_value=8), cut=st.integers(0, 400))
def test_batches_equal_one_update(stream: list[int], capacity: int, cut: int) -> None:
    whole = SpaceSaving(capacity)
    whole.update(np.array(stream, dtype=np.int64))
    parts = SpaceSaving(capacity)
    parts.update(np.array(stream[:cut], dtype=np.int64))
    parts.update(np.array(stream[cut:], dtype=np.int64))
    for a, b in zip(whole.top(), parts.top(), strict=True):
        assert np.array_equal(a, b)


@settings(max_examples=100, deadline=None)
@given(
    stream=streams,
    capacity=st.integers(min_value=1, max_value=20),
    epoch=st.integers(min_value=1, max_value=50),
    factor=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]),
)
def test_decayed_guarantees(stream: list[int], capacity: int, epoch: int, factor: float) -> None:
    # FISH §4.1: counters decay by `factor` after every epoch; the guarantees hold for the
    # decayed frequencies sum_t factor^(epochs since t) and the decayed total.
    summary = SpaceSaving(capacity)
    decayed: dict[int, float] = {}
    total = 0.0
    for start in range(0, len(stream), epoch):
        chunk = stream[start : start + epoch]
        summary.update(np.array(chunk, dtype=np.int64))
        for key in chunk:
            decayed[key] = decayed.get(key, 0.0) + 1.0
        total += len(chunk)
        if len(chunk) == epoch:
            summary.decay(factor)
            decayed = {k: v * factor for k, v in decayed.items()}
            total *= factor
    assert summary.total == pytest.approx(total, abs=1e-9)
    keys, counts, errors = summary.top()
    for key, count, error in zip(keys.tolist(), counts.tolist(), errors.tolist(), strict=True):
        assert count - error - 1e-9 <= decayed[key] <= count + 1e-9
    tracked = set(keys.tolist())
    for key, frequency in decayed.items():
        if frequency > total / capacity + 1e-9:
            assert key in tracked


def test_index_survives_heavy_churn() -> None:
    # Every key after the first `capacity` evicts one: backward-shift deletion must keep all
    # tracked keys findable and forget the evicted ones.
    rng = np.random.default_rng(5)
    stream = rng.integers(0, 5000, size=20_000)
    summary = SpaceSaving(7)
    summary.update(stream)
    keys, counts, _ = summary.top()
    found_counts, _ = summary.estimate(keys)
    assert np.array_equal(found_counts, counts)
    untracked = np.setdiff1d(np.arange(5000), keys)
    assert not summary.estimate(untracked)[0].any()


def test_top_orders_by_count_then_key() -> None:
    summary = SpaceSaving(4)
    summary.update(np.array([5, 3, 3, 9, 5, 1], dtype=np.int64))
    keys, counts, _ = summary.top()
    assert keys.tolist() == [3, 5, 1, 9]
    assert counts.tolist() == [2.0, 2.0, 1.0, 1.0]
    assert summary.top(2)[0].tolist() == [3, 5]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SpaceSaving(0)
    with pytest.raises(ValueError, match="decay"):
        SpaceSaving(3).decay(1.5)
