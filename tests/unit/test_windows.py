"""Window counting, closing, merging and top-k (operators/windows.py) against references."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.keys import KeyBatch
from operators.windows import (
    WindowCounts,
    closable_windows,
    count_per_window_key,
    merge_partials,
    state_entries,
    top_k,
)

KEYS = st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=8, unique=True)


def as_triples(counted: WindowCounts) -> list[tuple[int, bytes, int]]:
    return list(
        zip(counted.windows.tolist(), counted.keys.to_list(), counted.counts.tolist(), strict=True)
    )


def test_count_by_hand() -> None:
    keys = KeyBatch.from_strings(["a", "b", "a", "a", "c", "b"])
    windows = np.array([0, 0, 0, 10, 10, 0])
    counted = count_per_window_key(keys, windows)
    # Window 0: a x2, b x2; window 10: a x1, c x1.
    assert sorted(as_triples(counted)) == [(0, b"a", 2), (0, b"b", 2), (10, b"a", 1), (10, b"c", 1)]
    assert counted.records == 6
    assert len(counted) == 4


def test_count_order_is_window_then_fingerprint() -> None:
    keys = KeyBatch.from_strings(["x", "y", "z", "x"])
    counted = count_per_window_key(keys, np.array([5, 0, 5, 0]))
    ids = dict(zip(keys.to_list(), keys.key_ids().tolist(), strict=True))
    expected = sorted([(0, b"x", 1), (0, b"y", 1), (5, b"x", 1), (5, b"z", 1)],
                      key=lambda t: (t[0], ids[t[1]]))  # fmt: skip
    assert as_triples(counted) == expected


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_count_equals_counter_reference(data: st.DataObject) -> None:
    alphabet = data.draw(KEYS)
    n = data.draw(st.integers(1, 200))
    picks = data.draw(st.lists(st.sampled_from(alphabet), min_size=n, max_size=n))
    windows = data.draw(
        st.lists(st.sampled_from([-10_000, 0, 10_000, 20_000]), min_size=n, max_size=n)
    )
    counted = count_per_window_key(KeyBatch.from_bytes(picks), np.array(windows))
    assert Counter({(w, k): c for w, k, c in as_triples(counted)}) == Counter(
        zip(windows, picks, strict=True)
    )
    # Each (window, key) appears once.
    assert len(set(zip(counted.windows.tolist(), counted.keys.to_list(), strict=True))) == len(
        counted
    )


def test_fingerprint_collision_falls_back_to_exact_bytes() -> None:
    keys = KeyBatch.from_strings(["a", "b", "a", "bb"])
    colliding = np.zeros(4, dtype=np.int64)  # every key "collides"
    counted = count_per_window_key(keys, np.array([0, 0, 0, 0]), key_ids=colliding)
    assert as_triples(counted) == [(0, b"a", 2), (0, b"b", 1), (0, b"bb", 1)]


def test_collision_between_same_length_keys_is_caught() -> None:
    # Equal lengths, different bytes: only the byte comparison can tell them apart.
    keys = KeyBatch.from_strings(["ab", "ba", "ab"])
    counted = count_per_window_key(keys, np.array([1, 1, 1]), key_ids=np.array([7, 7, 7]))
    assert as_triples(counted) == [(1, b"ab", 2), (1, b"ba", 1)]


def test_empty_batch_and_shape_check() -> None:
    counted = count_per_window_key(KeyBatch.from_bytes([]), np.zeros(0, dtype=np.int64))
    assert len(counted) == 0 and counted.records == 0 and len(counted.keys) == 0
    with pytest.raises(ValueError, match="one window start per key"):
        count_per_window_key(KeyBatch.from_strings(["a"]), np.array([0, 1]))


def test_closable_at_the_last_millisecond() -> None:
    starts = np.array([10_000, 0, 20_000])
    assert closable_windows(starts, 9_998, 10_000).tolist() == []
    assert closable_windows(starts, 9_999, 10_000).tolist() == [0]
    assert closable_windows(starts, 29_998, 10_000).tolist() == [0, 10_000]
    assert closable_windows(starts, 29_999, 10_000).tolist() == [0, 10_000, 20_000]


def test_closable_with_lateness_and_edges() -> None:
    starts = np.array([0, 10_000])
    assert closable_windows(starts, 10_003, 10_000, lateness_ms=5).tolist() == []
    assert closable_windows(starts, 10_004, 10_000, lateness_ms=5).tolist() == [0]
    assert closable_windows(starts, None, 10_000).tolist() == []
    end_of_stream = int(np.iinfo(np.int64).max)
    assert closable_windows(starts, end_of_stream, 10_000, 10**9).tolist() == [0, 10_000]
    assert closable_windows(np.array([-20_000]), -10_001, 10_000).tolist() == [-20_000]
    assert closable_windows(np.array([0]), int(np.iinfo(np.int64).min), 10).tolist() == []
    with pytest.raises(ValueError):
        closable_windows(starts, 0, 0)
    with pytest.raises(ValueError):
        closable_windows(starts, 0, 10, lateness_ms=-1)


@given(
    st.lists(st.integers(-50, 50), max_size=20),
    st.integers(-600, 600),
    st.integers(1, 30),
    st.integers(0, 20),
)
def test_closable_matches_definition(
    window_indices: list[int], watermark: int, window_ms: int, lateness: int
) -> None:
    starts = [i * window_ms for i in window_indices]
    expected = sorted(s for s in starts if watermark >= s + window_ms - 1 + lateness)
    got = closable_windows(np.array(starts, dtype=np.int64), watermark, window_ms, lateness)
    assert got.tolist() == expected


def test_merge_by_hand() -> None:
    partials = [{b"a": 2, b"b": 1}, {}, {b"a": 5, b"c": 3}]
    assert merge_partials(partials) == {b"a": 7, b"b": 1, b"c": 3}
    assert state_entries(partials) == 4
    assert merge_partials([]) == {}


@given(
    st.lists(st.dictionaries(st.binary(max_size=3), st.integers(1, 100), max_size=6), max_size=5)
)
def test_merge_is_the_sum_per_key(partials: list[dict[bytes, int]]) -> None:
    merged = merge_partials(partials)
    keys = {key for partial in partials for key in partial}
    assert merged == {key: sum(partial.get(key, 0) for partial in partials) for key in keys}
    assert state_entries(partials) == sum(len(p) for p in partials)


def test_top_k_ties_by_key_bytes() -> None:
    counts = {b"b": 5, b"a": 5, b"c": 9, b"d": 1}
    assert top_k(counts, 3) == [(b"c", 9), (b"a", 5), (b"b", 5)]
    assert top_k(counts, 10) == [(b"c", 9), (b"a", 5), (b"b", 5), (b"d", 1)]
    assert top_k(counts, 0) == []
    with pytest.raises(ValueError):
        top_k(counts, -1)


@given(st.dictionaries(st.binary(max_size=3), st.integers(1, 20), max_size=30), st.integers(0, 12))
def test_top_k_is_the_sorted_prefix(counts: dict[bytes, int], k: int) -> None:
    reference = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]
    assert top_k(counts, k) == reference
