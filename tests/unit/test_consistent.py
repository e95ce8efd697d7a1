"""Consistent hashing: owners computed independently from the hash definition."""

from __future__ import annotations

import bisect

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import SchemeError
from operators.keys import KeyBatch
from operators.schemes.consistent import ConsistentHashing


def reference_workers(keys: list[bytes], n: int, replicas: int, seed: int) -> list[int]:
    ring = sorted(
        (mmh3.hash64(f"{w}#{r}".encode(), seed, signed=True)[0], w)
        for w in range(n)
        for r in range(replicas)
    )
    points = [p for p, _ in ring]
    out = []
    for key in keys:
        i = bisect.bisect_left(points, mmh3.hash64(key, 0, signed=True)[0])
        out.append(ring[i % len(ring)][1])
    return out


@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(st.binary(max_size=20), min_size=1, max_size=60),
    n=st.integers(min_value=1, max_value=9),
    replicas=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_workers_equal_reference(keys: list[bytes], n: int, replicas: int, seed: int) -> None:
    scheme = registry.create("consistent", n, replicas=replicas, seed=seed)
    got = scheme.route(KeyBatch.from_bytes(keys)).tolist()
    assert got == reference_workers(keys, n, replicas, seed)


def test_fixed_vector() -> None:
    # Worked out with the reference above (mmh3, 3 workers, 2 replicas, seed 0).
    keys = [b"apple", b"pear", b"plum", b"fig", b""]
    expected = reference_workers(keys, 3, 2, 0)
    assert ConsistentHashing(3, replicas=2).route(KeyBatch.from_bytes(keys)).tolist() == expected
    assert len(set(expected)) > 1


def test_one_worker_per_key_across_sources_and_batches() -> None:
    rng = np.random.default_rng(0)
    keys = KeyBatch.from_ints(rng.integers(0, 500, 20_000))
    ids = keys.key_ids()
    sources = [registry.create("consistent", 16, source=s, n_sources=4) for s in range(4)]
    workers = np.concatenate(
        [
            sources[i % 4].route(keys.slice(a, a + 1000))
            for i, a in enumerate(range(0, 20_000, 1000))
        ]
    )
    for key in np.unique(ids):
        assert len(set(workers[ids == key].tolist())) == 1


def test_balanced_shares_with_gedik_replicas() -> None:
    keys = KeyBatch.from_ints(np.arange(300_000))
    shares = np.bincount(ConsistentHashing(10).route(keys), minlength=10) / 300_000
    assert np.all(np.abs(shares - 0.1) < 0.012)


def test_parameters_and_errors() -> None:
    scheme = registry.create("consistent", 5)
    assert scheme.keeps_key_on_one_worker
    assert scheme.params()["replicas"] == 1000
    with pytest.raises(SchemeError, match="replicas"):
        ConsistentHashing(5, replicas=0)
    with pytest.raises(SchemeError, match="workers"):
        registry.create("consistent", 0)
