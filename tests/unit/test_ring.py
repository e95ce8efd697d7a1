"""HashRing: owners and successors against a pure-Python ring built from the hash definition."""

from __future__ import annotations

import bisect

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.keys import KeyBatch
from operators.ring import HashRing

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def reference_ring(workers: list[int], replicas: int, seed: int) -> list[tuple[int, int]]:
    """Sorted (point, owner) pairs, each point ``murmur3_x64_128("w#r", seed)`` low 64 bits."""
    return sorted(
        (mmh3.hash64(f"{w}#{r}".encode(), seed, signed=True)[0], w)
        for w in workers
        for r in range(replicas)
    )


def reference_owner(ring: list[tuple[int, int]], position: int) -> int:
    points = [p for p, _ in ring]
    i = bisect.bisect_left(points, position)
    return ring[i % len(ring)][1]


def reference_successors(ring: list[tuple[int, int]], position: int, count: int) -> list[int]:
    points = [p for p, _ in ring]
    i = bisect.bisect_left(points, position)
    found: list[int] = []
    while len(found) < count:
        owner = ring[i % len(ring)][1]
        if owner not in found:
            found.append(owner)
        i += 1
    return found


def test_points_are_the_hashes_of_worker_labels() -> None:
    ring = HashRing([3, 1], replicas=5, seed=7)
    expected = reference_ring([3, 1], 5, 7)
    assert ring.points.tolist() == [p for p, _ in expected]
    assert ring.point_owner.tolist() == [w for _, w in expected]


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=12),
    replicas=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
    positions=st.lists(INT64, min_size=1, max_size=50),
)
def test_owners_match_reference(
    workers: int, replicas: int, seed: int, positions: list[int]
) -> None:
    ring = HashRing(range(workers), replicas=replicas, seed=seed)
    reference = reference_ring(list(range(workers)), replicas, seed)
    # Exact ring points and the extremes are the boundary cases of the bucketed lookup.
    probes = positions + [p for p, _ in reference[:5]] + [-(2**63), 2**63 - 1, 0, -1]
    got = ring.owners(np.array(probes, dtype=np.int64)).tolist()
    assert got == [reference_owner(reference, p) for p in probes]


@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=10),
    replicas=st.integers(min_value=1, max_value=20),
    count=st.integers(min_value=1, max_value=12),
    positions=st.lists(INT64, min_size=1, max_size=20),
)
def test_successors_match_reference(
    workers: int, replicas: int, count: int, positions: list[int]
) -> None:
    ring = HashRing(range(workers), replicas=replicas)
    reference = reference_ring(list(range(workers)), replicas, 0)
    got = ring.successors(np.array(positions, dtype=np.int64), count)
    capped = min(count, workers)
    assert got.shape == (len(positions), capped)
    for row, position in zip(got.tolist(), positions, strict=True):
        assert row == reference_successors(reference, position, capped)


def test_adding_a_worker_moves_keys_only_to_it_and_about_one_nth() -> None:
    keys = KeyBatch.from_ints(np.arange(200_000)).key_ids()
    ring = HashRing(range(10), replicas=1000)
    before = ring.owners(keys)
    ring.add(10)
    after = ring.owners(keys)
    moved = before != after
    assert set(after[moved].tolist()) == {10}
    # 1/11 = 0.0909; 1000 virtual nodes keep the newcomer's arc within a few percent of it.
    assert 0.08 < moved.mean() < 0.10


def test_removing_a_worker_moves_only_its_keys() -> None:
    keys = KeyBatch.from_ints(np.arange(50_000)).key_ids()
    ring = HashRing(range(6), replicas=200)
    before = ring.owners(keys)
    ring.remove(2)
    after = ring.owners(keys)
    assert np.array_equal(before != after, before == 2)
    assert 2 not in set(after.tolist())
    assert ring.workers == [0, 1, 3, 4, 5]


def test_add_then_lookup_equals_a_ring_built_at_once() -> None:
    keys = KeyBatch.from_ints(np.arange(10_000)).key_ids()
    grown = HashRing([0, 1], replicas=50, seed=3)
    grown.add(2)
    assert np.array_equal(grown.owners(keys), HashRing([0, 1, 2], replicas=50, seed=3).owners(keys))


def test_seed_changes_the_ring_and_same_seed_repeats_it() -> None:
    keys = KeyBatch.from_ints(np.arange(1000)).key_ids()
    a = HashRing(range(8), replicas=20, seed=1).owners(keys)
    assert np.array_equal(a, HashRing(range(8), replicas=20, seed=1).owners(keys))
    assert not np.array_equal(a, HashRing(range(8), replicas=20, seed=2).owners(keys))


def test_shares_approach_one_nth_with_many_replicas() -> None:
    keys = KeyBatch.from_ints(np.arange(400_000)).key_ids()
    shares = np.bincount(HashRing(range(8), replicas=1000).owners(keys), minlength=8) / 400_000
    assert np.all(np.abs(shares - 1 / 8) < 0.015)


def test_errors() -> None:
    with pytest.raises(ValueError, match="replica"):
        HashRing(range(2), replicas=0)
    with pytest.raises(ValueError, match="repeat"):
        HashRing([1, 1])
    ring = HashRing([0])
    with pytest.raises(ValueError, match="already"):
        ring.add(0)
    ring.remove(0)
    with pytest.raises(ValueError, match="no workers"):
        ring.owners(np.array([1], dtype=np.int64))
