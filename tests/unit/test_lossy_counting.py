"""Lossy counting: exact agreement with a slow pure-Python Manku–Motwani, its guarantees against
exact counts, and Gedik's 3-counter sliding window (§4.1.2)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.sketches.lossy_counting import LossyCounter, SlidingLossyCounter


def reference_lossy_counting(stream: list[int], epsilon: float) -> dict[int, tuple[int, int]]:
    """Manku & Motwani §4.2, record by record: key -> (count, error)."""
    width = math.ceil(1 / epsilon)
    entries: dict[int, list[int]] = {}
    for n, key in enumerate(stream, start=1):
        bucket = math.ceil(n / width)
        if key in entries:
            entries[key][0] += 1
        else:
            entries[key] = [1, bucket - 1]
        if n % width == 0:
            entries = {k: v for k, v in entries.items() if v[0] + v[1] > bucket}
    return {k: (v[0], v[1]) for k, v in entries.items()}


def as_dict(counter: LossyCounter) -> dict[int, tuple[int, int]]:
    keys, counts, errors = counter.entries()
    return {
        int(k): (int(c), int(e))
        for k, c, e in zip(keys.tolist(), counts.tolist(), errors.tolist(), strict=True)
    }


streams = st.lists(st.integers(min_value=-3, max_value=40), min_size=0, max_size=400)


@settings(max_examples=60, deadline=None)
@given(
    stream=streams, epsilon=st.sampled_from([0.5, 0.2, 0.1, 0.05, 0.013]), cut=st.integers(0, 400)
)
def test_matches_reference_whatever_the_batches(
    stream: list[int], epsilon: float, cut: int
) -> None:
    counter = LossyCounter(epsilon)
    ids = np.array(stream, dtype=np.int64)
    counter.update(ids[:cut])
    counter.update(ids[cut:])
    assert as_dict(counter) == reference_lossy_counting(stream, epsilon)
    assert counter.records == len(stream)
    assert len(counter) == len(reference_lossy_counting(stream, epsilon))


def test_table_growth_keeps_every_entry() -> None:
    # 5000 distinct keys inside one bucket force the 1024-slot table to grow three times.
    rng = np.random.default_rng(3)
    stream = rng.integers(-(2**62), 2**62, size=5000).tolist() * 2
    counter = LossyCounter(epsilon=1e-4)  # w = 10000: no eviction before the end
    counter.update(np.array(stream, dtype=np.int64))
    assert as_dict(counter) == reference_lossy_counting(stream, 1e-4)
    assert len(counter) == 5000
    assert set(as_dict(counter).values()) == {(2, 0)}


@settings(max_examples=25, deadline=None)
@given(
    z=st.floats(0.5, 2.0),
    n=st.integers(100, 3000),
    epsilon=st.sampled_from([0.05, 0.02, 0.01]),
    support=st.floats(0.0501, 0.3),  # the guarantee needs support > epsilon
    seed=st.integers(0, 2**16),
)
def test_guarantees_against_exact_counts(
    z: float, n: int, epsilon: float, support: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    stream = (rng.zipf(1.0 + z, size=n) % 500).astype(np.int64)
    exact = Counter(stream.tolist())
    counter = LossyCounter(epsilon)
    counter.update(stream)
    keys, counts, errors = counter.entries()
    for key, count, error in zip(keys.tolist(), counts.tolist(), errors.tolist(), strict=True):
        assert count <= exact[key] <= count + error
        assert error <= epsilon * n
    for key, true in exact.items():
        # a key absent from the table has true count <= epsilon * n
        if key not in set(keys.tolist()):
            assert true <= epsilon * n
    frequent, _ = counter.frequent(support)
    reported = set(frequent.tolist())
    assert {k for k, c in exact.items() if c >= support * n} <= reported
    assert all(exact[k] >= (support - epsilon) * n for k in reported)
    # Manku–Motwani Theorem 4.2: at most (1/epsilon) log(epsilon n) entries (+ one bucket)
    width = math.ceil(1 / epsilon)
    assert len(counter) <= width * (max(math.log2(epsilon * n), 0) + 1) + width


def test_labels_are_tallied_over_the_counted_records() -> None:
    counter = LossyCounter(0.1)
    counter.update(np.arange(5, dtype=np.int64), np.array([0, 2, 2, 1, 2]))
    counter.update(np.arange(3, dtype=np.int64), np.array([4, 0, 0]))
    assert counter.label_counts.tolist() == [3, 1, 3, 0, 1]
    counter.clear()
    assert (counter.records, len(counter), counter.label_counts.tolist()) == (0, 0, [])


def test_epsilon_must_be_a_fraction() -> None:
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match="epsilon"):
            LossyCounter(bad)


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(2, 60),
    counters=st.integers(2, 5),
    lengths=st.lists(st.integers(0, 90), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_sliding_window_bounds_and_contents(
    window: int, counters: int, lengths: list[int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 12, size=sum(lengths)).astype(np.int64)
    labels = rng.integers(0, 3, size=stream.shape[0])
    sliding = SlidingLossyCounter(window, epsilon=0.05, counters=counters)
    stagger = math.ceil(window / (counters - 1))
    position = 0
    for length in lengths:
        sliding.update(stream[position : position + length], labels[position : position + length])
        position += length
        start = sliding.active_start
        covered = position - start
        assert sliding.active.records == covered
        effective = sliding.window  # W rounded up to a multiple of counters - 1
        assert window <= effective < window + counters - 1
        if position >= effective:  # footnote 2: the lower bound needs W records of history
            assert effective <= covered < effective + stagger
        else:
            assert start == 0
        assert start % stagger == 0
        assert len(sliding._counters) <= counters
        # the counter in use is exactly a lossy counter over its records
        fresh = LossyCounter(0.05)
        fresh.update(stream[start:position], labels[start:position])
        assert as_dict(sliding.active) == as_dict(fresh)
        assert sliding.active.label_counts.tolist() == fresh.label_counts.tolist()


def test_three_counters_cover_between_w_and_one_and_a_half_w() -> None:
    sliding = SlidingLossyCounter(window=100, epsilon=0.01)
    covered = []
    for _ in range(40):
        sliding.update(np.arange(10, dtype=np.int64))
        covered.append(sliding.active.records)
    assert covered[:10] == list(range(10, 101, 10))  # warm-up: everything so far
    assert min(covered[10:]) == 100 and max(covered[10:]) == 140
