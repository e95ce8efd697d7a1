"""Key grouping and shuffle grouping, against their definitions (PKG paper §II/§III)."""

from __future__ import annotations

import mmh3
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.keys import KeyBatch
from operators.schemes.hashing import FIRST_SEED, SECOND_SEED, KeyGrouping, ShuffleGrouping


def test_seeds_are_storms() -> None:
    assert (FIRST_SEED, SECOND_SEED) == (13, 17)


def test_key_grouping_is_abs_murmur13_mod_w() -> None:
    keys = [b"apple", b"pear", b"", b"key1", b"x" * 100, "日本".encode()]
    for n_workers in (1, 2, 6, 10, 97):
        expected = [abs(mmh3.hash64(k, 13, signed=True)[0]) % n_workers for k in keys]
        got = KeyGrouping(n_workers).route(KeyBatch.from_bytes(keys))
        assert got.tolist() == expected


def test_key_grouping_fixed_values() -> None:
    # Computed by hand from mmh3: |h13(b"key1")| mod 6 = 4, |h13(b"test")| mod 6 = 4.
    assert KeyGrouping(6).route(KeyBatch.from_strings(["key1", "test"])).tolist() == [4, 4]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=300), st.integers(1, 20))
@settings(max_examples=50, deadline=None)
def test_key_grouping_keeps_each_key_on_one_worker(ints: list[int], n_workers: int) -> None:
    workers = KeyGrouping(n_workers).route(KeyBatch.from_ints(np.array(ints)))
    placement: dict[int, set[int]] = {}
    for key, worker in zip(ints, workers.tolist(), strict=True):
        placement.setdefault(key, set()).add(worker)
    assert all(len(w) == 1 for w in placement.values())
    assert workers.min() >= 0 and workers.max() < n_workers


def test_shuffle_is_round_robin_from_the_source_offset() -> None:
    scheme = ShuffleGrouping(3, source=1, n_sources=2)
    keys = KeyBatch.from_strings(["a"] * 4)
    assert scheme.route(keys).tolist() == [1, 2, 0, 1]
    assert scheme.route(keys).tolist() == [2, 0, 1, 2]


@given(
    st.integers(1, 12),
    st.integers(1, 8),
    st.integers(0, 400),
    st.lists(st.integers(1, 50), min_size=1, max_size=10),
)
@settings(max_examples=100, deadline=None)
def test_shuffle_imbalance_is_at_most_one_record_per_source(
    n_workers: int, n_sources: int, records: int, batch_sizes: list[int]
) -> None:
    """Record i goes to source i mod S; each source routes its records in arbitrary batches."""
    schemes = [ShuffleGrouping(n_workers, source=s, n_sources=n_sources) for s in range(n_sources)]
    loads = np.zeros(n_workers, dtype=np.int64)
    for s, scheme in enumerate(schemes):
        own = len(range(s, records, n_sources))
        routed: list[int] = []
        position = 0
        step = 0
        while position < own:
            size = min(batch_sizes[step % len(batch_sizes)], own - position)
            routed += scheme.route(KeyBatch.from_ints(np.zeros(size, dtype=np.int64))).tolist()
            position += size
            step += 1
        assert routed == [(s + i) % n_workers for i in range(own)]
        local = np.bincount(np.array(routed, dtype=np.int64), minlength=n_workers)
        assert local.max() - local.min() <= 1
        loads += local
    assert loads.sum() == records
    assert loads.max() - loads.mean() <= n_sources
    assert loads.max() - loads.min() <= n_sources
