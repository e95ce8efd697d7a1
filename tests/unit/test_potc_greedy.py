"""Static PoTC, On-Greedy and Off-Greedy against pure-Python models of the PKG paper's text."""

from __future__ import annotations

from collections import Counter

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.keys import KeyBatch
from operators.schemes.greedy import OfflineGreedy, OnlineGreedy, longest_first
from operators.schemes.potc import KeyAssignments, StaticPowerOfTwoChoices


def reference_potc(keys: list[bytes], n_workers: int) -> list[int]:
    loads = [0] * n_workers
    table: dict[bytes, int] = {}
    out = []
    for key in keys:
        if key not in table:
            first = abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers
            second = abs(mmh3.hash64(key, 17, signed=True)[0]) % n_workers
            table[key] = second if loads[second] < loads[first] else first
        loads[table[key]] += 1
        out.append(table[key])
    return out


def reference_online_greedy(keys: list[bytes], n_workers: int) -> list[int]:
    loads = [0] * n_workers
    table: dict[bytes, int] = {}
    out = []
    for key in keys:
        if key not in table:
            table[key] = loads.index(min(loads))  # least loaded, ties to the lowest id
        loads[table[key]] += 1
        out.append(table[key])
    return out


def reference_offline_greedy(keys: list[bytes], n_workers: int) -> list[int]:
    counts = Counter(keys)
    first_seen = {k: keys.index(k) for k in counts}
    totals = [0] * n_workers
    table: dict[bytes, int] = {}
    for key in sorted(counts, key=lambda k: (-counts[k], first_seen[k])):
        worker = totals.index(min(totals))
        table[key] = worker
        totals[worker] += counts[key]
    return [table[k] for k in keys]


def zipf_keys(seed: int, n: int, n_keys: int = 300, z: float = 1.0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    weights = np.arange(1, n_keys + 1, dtype=np.float64) ** -z
    return [b"k%d" % r for r in rng.choice(n_keys, size=n, p=weights / weights.sum())]


def route_in_batches(scheme: object, keys: list[bytes], batch: int) -> list[int]:
    out: list[int] = []
    for start in range(0, len(keys), batch):
        out += scheme.route(KeyBatch.from_bytes(keys[start : start + batch])).tolist()
    return out


def test_potc_by_hand() -> None:
    """W=6: key1 -> {4, 1}, test -> {4, 5}. key1 first -> 4 (tie); test: 4 has 1 > 0 -> 5, and
    both stay, whatever the loads do next."""
    potc = StaticPowerOfTwoChoices(6)
    keys = ["key1", "test", "key1", "key1", "test", "key1"]
    assert potc.route(KeyBatch.from_strings(keys)).tolist() == [4, 5, 4, 4, 5, 4]
    assert potc.loads.tolist() == [0, 0, 0, 0, 4, 2]
    assert len(potc.table) == 2


@pytest.mark.parametrize("n_workers", [1, 2, 5, 10, 100])
@pytest.mark.parametrize("batch", [1, 37, 10_000])
def test_potc_equals_the_independent_model(n_workers: int, batch: int) -> None:
    keys = zipf_keys(n_workers, 4000)
    got = route_in_batches(StaticPowerOfTwoChoices(n_workers), keys, batch)
    assert got == reference_potc(keys, n_workers)


@pytest.mark.parametrize("n_workers", [1, 3, 10, 100])
@pytest.mark.parametrize("batch", [1, 101, 10_000])
def test_online_greedy_equals_the_independent_model(n_workers: int, batch: int) -> None:
    keys = zipf_keys(n_workers + 1, 4000)
    got = route_in_batches(OnlineGreedy(n_workers), keys, batch)
    assert got == reference_online_greedy(keys, n_workers)


def test_online_greedy_by_hand() -> None:
    """W=3, stream a b a c d: a -> 0; b -> 1 (loads 1,0,0); c -> 2 (2,1,0); d -> 1 (2,1,1)."""
    scheme = OnlineGreedy(3)
    assert scheme.route(KeyBatch.from_strings(list("abacd"))).tolist() == [0, 1, 0, 2, 1]
    assert scheme.loads.tolist() == [2, 2, 1]


def test_offline_greedy_by_hand() -> None:
    """LPT on frequencies a:5 b:3 c:2 d:2 e:1, W=2, taken in that order (c before d: seen
    first): a -> 0 (0,0 tie); b -> 1; c -> 1 (3 < 5); d -> 0 (5 = 5, tie to lowest); e -> 1
    (7 > 5). Final loads 7 and 6."""
    stream = list("eccddbbbaaaaa")
    scheme = OfflineGreedy(2)
    scheme.prepare(KeyBatch.from_strings(stream))
    assert len(scheme.table) == 5
    workers = scheme.route(KeyBatch.from_strings(stream)).tolist()
    placement = dict(zip(stream, workers, strict=True))
    assert placement == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    assert scheme.loads.tolist() == [7, 6]


@pytest.mark.parametrize("n_workers", [1, 4, 10, 50])
def test_offline_greedy_equals_the_independent_model(n_workers: int) -> None:
    keys = zipf_keys(n_workers + 2, 5000)
    scheme = OfflineGreedy(n_workers)
    scheme.prepare(KeyBatch.from_bytes(keys))
    assert route_in_batches(scheme, keys, 333) == reference_offline_greedy(keys, n_workers)


def test_offline_greedy_places_unseen_keys_like_online_greedy() -> None:
    scheme = OfflineGreedy(3)
    scheme.prepare(KeyBatch.from_strings(["a", "a", "b"]))  # a -> 0, b -> 1
    # routing: a -> 0, b -> 1, then unseen z -> least loaded now (2), unseen y -> 0 (1,1,1 tie)
    got = scheme.route(KeyBatch.from_strings(["a", "b", "z", "y", "z"])).tolist()
    assert got == [0, 1, 2, 0, 2]


def test_offline_greedy_without_prepare_is_online_greedy() -> None:
    keys = zipf_keys(9, 1000)
    got = route_in_batches(OfflineGreedy(7), keys, 100)
    assert got == reference_online_greedy(keys, 7)


def test_longest_first_kernel() -> None:
    frequencies = np.array([10, 7, 5, 5, 3, 1], dtype=np.int64)
    # totals: 10|0|0 -> 10|7|0 -> 10|7|5 -> 10|7|10 -> 10|10|10 -> 11|10|10
    assert longest_first(frequencies, 3).tolist() == [0, 1, 2, 2, 1, 0]


@given(
    st.lists(st.integers(0, 60), max_size=300),
    st.integers(1, 12),
    st.sampled_from(["potc", "greedy-online", "greedy-offline"]),
    st.integers(1, 50),
)
@settings(max_examples=60, deadline=None)
def test_exactly_one_worker_per_key(ints: list[int], n_workers: int, name: str, batch: int) -> None:
    keys = [str(i).encode() for i in ints]
    scheme = registry.create(name, n_workers)
    if name == "greedy-offline":
        scheme.prepare(KeyBatch.from_bytes(keys))
    workers = route_in_batches(scheme, keys, batch)
    placement: dict[bytes, set[int]] = {}
    for key, worker in zip(keys, workers, strict=True):
        placement.setdefault(key, set()).add(worker)
    assert all(len(used) == 1 for used in placement.values())
    assert len(scheme.table) == len(placement)
    assert scheme.loads.sum() == len(keys)
    assert scheme.loads.tolist() == np.bincount(workers, minlength=n_workers).tolist()


@pytest.mark.parametrize("name", ["potc", "greedy-online", "greedy-offline"])
def test_deterministic_and_coordinated(name: str) -> None:
    cls = registry.scheme_class(name)
    assert cls.keeps_key_on_one_worker is True
    assert cls.global_estimation is True
    keys = KeyBatch.from_bytes(zipf_keys(11, 3000))
    runs = []
    for seed in (0, 0, 5):
        scheme = registry.create(name, 9, seed=seed)
        if name == "greedy-offline":
            scheme.prepare(keys)
        runs.append(scheme.route(keys).tolist())
    assert runs[0] == runs[1] == runs[2]


def test_key_assignments_grow_and_remember_many_keys() -> None:
    """Far more keys than the initial 1024 slots: growth must keep every earlier entry."""
    rng = np.random.default_rng(0)
    key_ids = np.unique(rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64))
    workers = rng.integers(0, 7, key_ids.shape[0]).astype(np.int32)
    table = KeyAssignments()
    for start in range(0, key_ids.shape[0], 5000):
        table.assign(key_ids[start : start + 5000], workers[start : start + 5000])
    assert len(table) == key_ids.shape[0]
    assert table.lookup(key_ids).tolist() == workers.tolist()
    absent = np.setdiff1d(np.arange(5, dtype=np.int64), key_ids)
    assert absent.size == 5 and table.lookup(absent).tolist() == [-1] * 5
    table.assign(key_ids[:3], np.array([6, 6, 6], dtype=np.int32))
    assert len(table) == key_ids.shape[0]
    assert table.lookup(key_ids[:3]).tolist() == [6, 6, 6]


def test_potc_with_many_distinct_keys_grows_its_table() -> None:
    keys = [b"u%d" % i for i in range(5000)] + [b"u%d" % i for i in range(0, 5000, 7)]
    assert route_in_batches(StaticPowerOfTwoChoices(13), keys, 2048) == reference_potc(keys, 13)
