"""FISH against a pure-Python transcription of the algorithm documented in its module."""

from __future__ import annotations

import bisect
import itertools
import math

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import SchemeError
from operators.keys import KeyBatch
from operators.schemes.fish import Fish


class ReferenceFish:
    """Record-at-a-time FISH while the summary never evicts (exact decayed counts)."""

    def __init__(
        self,
        n: int,
        *,
        epoch: int,
        decay: float,
        threshold_t: float,
        virtual_nodes: int,
        speeds: list[float],
    ) -> None:
        self.n, self.epoch, self.decay = n, epoch, decay
        self.theta = 2 / (n * threshold_t)
        ring = sorted(
            (mmh3.hash64(f"{w}#{r}".encode(), 0, signed=True)[0], w)
            for w in range(n)
            for r in range(virtual_nodes)
        )
        self.points = [p for p, _ in ring]
        self.owner = [w for _, w in ring]
        self.counts: dict[bytes, float] = {}
        self.total = 0.0
        self.f_max = 0.0
        self.d_min = 2
        self.position = 0
        self.epochs = 0
        self.workers_of: dict[bytes, int] = {}
        rates = [s / sum(speeds) for s in speeds]
        self.rates = rates
        self.time_per_tuple = [1 / r for r in rates]
        self.backlog = [0.0] * n
        self.last = [0.0] * n
        self.clock = 0.0

    def successors(self, key: bytes) -> list[int]:
        i = bisect.bisect_left(self.points, mmh3.hash64(key, 0, signed=True)[0])
        found: list[int] = []
        while len(found) < self.n:
            w = self.owner[i % len(self.owner)]
            if w not in found:
                found.append(w)
            i += 1
        return found

    def pending(self, w: int, now: float) -> float:
        return max(self.backlog[w] - self.rates[w] * (now - self.last[w]), 0.0)

    def route(self, key: bytes) -> int:
        self.total += 1.0
        self.counts[key] = self.counts.get(key, 0.0) + 1.0
        count = self.counts[key]
        self.f_max = max(self.f_max, count)
        candidates = self.successors(key)[:1]
        if self.epochs > 0 and count > self.theta * self.total:
            d = min(max(math.ceil(self.n * count / self.f_max), self.d_min), self.n)
            self.workers_of[key] = max(self.workers_of.get(key, 0), d)
            candidates = self.successors(key)[: self.workers_of[key]]
        now = self.clock
        self.clock += 1.0
        chosen = min(
            candidates, key=lambda w: (self.pending(w, now) + 1.0) * self.time_per_tuple[w]
        )  # min keeps the first of equal values: ties to the earlier successor
        self.backlog[chosen] = self.pending(chosen, now) + 1.0
        self.last[chosen] = now
        self.position += 1
        if self.position == self.epoch:
            self.position = 0
            self.epochs += 1
            self.counts = {k: c * self.decay for k, c in self.counts.items()}
            self.total *= self.decay
            self.f_max = max(self.counts.values(), default=0.0)
            hot = [c for c in self.counts.values() if c > self.theta * self.total]
            self.d_min = (
                max(2, math.ceil(self.n * (sum(hot) / self.total) / len(hot))) if hot else 2
            )
        return chosen


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(st.integers(min_value=0, max_value=25), min_size=1, max_size=400),
    n=st.integers(min_value=1, max_value=12),
    epoch=st.integers(min_value=1, max_value=60),
    decay=st.sampled_from([0.0, 0.5, 0.8, 1.0]),
    threshold_t=st.sampled_from([1.0, 10.0]),
    fast=st.booleans(),
)
def test_decisions_equal_reference(
    stream: list[int],
    n: int,
    epoch: int,
    decay: float,
    threshold_t: float,
    fast: bool,
) -> None:
    speeds = [2.0 if fast and w % 2 else 1.0 for w in range(n)]
    keys = [str(k).encode() for k in stream]
    fish = Fish(
        n,
        epoch=epoch,
        decay=decay,
        threshold_t=threshold_t,
        virtual_nodes=7,
        worker_speeds=speeds,
    )  # capacity 100 > 26 distinct keys: no eviction, as the reference assumes
    reference = ReferenceFish(
        n, epoch=epoch, decay=decay, threshold_t=threshold_t, virtual_nodes=7, speeds=speeds
    )
    got = fish.route(KeyBatch.from_bytes(keys)).tolist()
    assert got == [reference.route(k) for k in keys]
    ids = KeyBatch.from_bytes(list(reference.workers_of)).key_ids()
    assert fish.workers_of(ids).tolist() == list(reference.workers_of.values())


def test_chk_worker_counts_by_hand() -> None:
    # n = 10, θ = 2/(10·10) = 0.02, epoch 100, no decay. First epoch: A×50, B×10, C×40 (no
    # key is hot yet). Second epoch, first record A: total 101, count 51 > 2.02, f_max 51:
    # d = ⌈10·51/51⌉ = 10. Then B: count 11 of 102, d = ⌈10·11/51⌉ = 3, but d_min from the
    # sweep = max(2, ⌈10·(100/100)/3⌉) = 4, so B gets 4. Then C: ⌈10·41/51⌉ = 9.
    fish = Fish(10, epoch=100, decay=1.0)
    first = ["A"] * 50 + ["B"] * 10 + ["C"] * 40
    fish.route(KeyBatch.from_strings([*first, "A", "B", "C"]))
    ids = KeyBatch.from_strings(["A", "B", "C", "D"]).key_ids()
    assert fish.workers_of(ids).tolist() == [10, 4, 9, 1]


def test_workers_per_hot_key_never_shrink() -> None:
    fish = Fish(16, epoch=100, decay=0.5)
    rng = np.random.default_rng(0)
    hot_then_cold = np.where(rng.random(3000) < 0.5, 0, rng.integers(1, 10**6, 3000))
    fish.route(KeyBatch.from_ints(hot_then_cold[:1000]))
    key = KeyBatch.from_ints(np.array([0])).key_ids()
    peak = int(fish.workers_of(key)[0])
    assert peak == 16
    cold = fish.route(KeyBatch.from_ints(rng.integers(1, 10**6, 5000)))  # key 0 cools down
    assert len(cold) == 5000
    assert int(fish.workers_of(key)[0]) == peak


def test_cold_keys_use_exactly_their_ring_owner() -> None:
    rng = np.random.default_rng(1)
    keys = KeyBatch.from_ints(rng.integers(0, 10**6, 20_000))  # nothing near θ = 1/(5n)
    fish = Fish(20)
    workers = fish.route(keys)
    assert np.array_equal(workers, fish.ring.owners(keys.key_ids()))
    assert len(fish.hot_keys) == 0


def test_hot_key_stays_within_its_first_m_successors() -> None:
    rng = np.random.default_rng(2)
    p = np.arange(1, 5001, dtype=np.float64) ** -1.2
    stream = np.searchsorted(np.cumsum(p) / p.sum(), rng.random(50_000))
    keys = KeyBatch.from_ints(stream)
    fish = Fish(24, epoch=500)
    workers = fish.route(keys)
    ids = keys.key_ids()
    for key in np.unique(ids):
        used = set(workers[ids == key].tolist())
        m = int(fish.workers_of(np.array([key]))[0])
        allowed = set(fish.ring.successors(np.array([key]), m)[0].tolist())
        assert used <= allowed
        assert len(used) <= m
    top = KeyBatch.from_ints(np.array([0])).key_ids()
    assert int(fish.workers_of(top)[0]) == 24  # the hottest key may use every worker


def test_faster_workers_take_more_of_a_hot_key() -> None:
    # One key, all 4 workers as candidates after the first epoch: the waiting-time estimate
    # sends twice as many records to the workers that are twice as fast (§6.4, Fig. 16).
    # The first epoch's 10 records queue on the key's ring owner (worker 2) and are worked
    # off; in the end every worker's share matches its speed share (1/6, 2/6) within one record.
    fish = Fish(4, epoch=10, worker_speeds="1,2,1,2")
    workers = fish.route(KeyBatch.from_strings(["k"] * 6010))
    assert np.bincount(workers[:10], minlength=4).tolist() == [0, 0, 10, 0]
    share = 6010 * np.array([1, 2, 1, 2]) / 6  # 1001.7, 2003.3
    assert np.abs(np.bincount(workers, minlength=4) - share).max() < 1.5


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=6000), max_size=6))
def test_batch_boundaries_do_not_change_decisions(cuts: list[int]) -> None:
    rng = np.random.default_rng(3)
    p = np.arange(1, 3001, dtype=np.float64) ** -1.1
    keys = KeyBatch.from_ints(np.searchsorted(np.cumsum(p) / p.sum(), rng.random(6000)))
    whole = Fish(10, epoch=250).route(keys)
    fish = Fish(10, epoch=250)
    bounds = [0, *sorted(cuts), len(keys)]
    parts = [fish.route(keys.slice(a, b)) for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(np.concatenate(parts), whole)


def test_deterministic_for_a_seed_and_seed_moves_the_ring() -> None:
    keys = KeyBatch.from_ints(np.arange(3000) % 97)
    a = registry.create("fish", 8, seed=4).route(keys)
    assert np.array_equal(a, registry.create("fish", 8, seed=4).route(keys))
    assert not np.array_equal(a, registry.create("fish", 8, seed=5).route(keys))


def test_parameters_and_errors() -> None:
    fish = registry.create("fish", 4, worker_speeds=[1, 1, 2, 2], epoch=10)
    assert fish.params()["worker_speeds"] == [1.0, 1.0, 2.0, 2.0]
    assert fish.params()["theta"] == pytest.approx(2 / 40)
    with pytest.raises(SchemeError, match="worker_speeds needs 4"):
        Fish(4, worker_speeds=[1, 2])
    with pytest.raises(SchemeError, match="worker_speeds needs 4"):
        Fish(4, worker_speeds=[1, 2, 0, 1])
    with pytest.raises(SchemeError, match="numbers"):
        Fish(4, worker_speeds="1,x,1,1")
    with pytest.raises(SchemeError, match="decay"):
        Fish(4, decay=1.5)
    with pytest.raises(SchemeError, match="epoch"):
        Fish(4, epoch=0)
    with pytest.raises(SchemeError, match="unknown parameter"):
        registry.create("fish", 4, alpha=0.5)
