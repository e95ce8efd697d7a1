"""Lossy counting (Manku & Motwani, VLDB 2002) and Gedik's sliding emulation of it.

Layer: operators. :class:`LossyCounter` finds the keys whose frequency exceeds a support ``s``
in one pass, with error at most ``epsilon`` (buckets of ``w = ceil(1/epsilon)`` records; entries
``(key, count, error)``, evicted when ``count + error <= b`` at the close of bucket ``b``).
Gedik, "Partitioning Functions for Stateful Data Parallelism in Stream Processing" (VLDB
Journal 2014), §4.1.2, tracks the keys of frequency ``>= delta`` with it.
:class:`SlidingLossyCounter` is that paper's "pragmatic" sliding window (§4.1.2, Fig. 2): ``x``
staggered lossy counters over tumbling windows; the staggering we chose is in
docs/schemes.md#lossy-counting. Both also tally a small integer *label* per record (e.g. the
worker it was routed to). Updates are compiled (an open-addressing table, linear probing).

Example:
    >>> import numpy as np
    >>> counter = LossyCounter(epsilon=0.1)                 # buckets of 10 records
    >>> counter.update(np.array([7] * 6 + list(range(100, 114)), dtype=np.int64))
    >>> counter.records, len(counter)                       # the 14 singletons were evicted
    (20, 1)
    >>> keys, counts = counter.frequent(support=0.25)
    >>> keys.tolist(), counts.tolist()
    ([7], [6])
"""

from __future__ import annotations

import math

import numba
import numpy as np

from operators.keys import probe_slot

# Fibonacci hashing spreads even sequential ids over the table; the constant is 2^64 / phi as a
# signed 64-bit integer (numba multiplies int64 with wrap-around).
_GOLDEN = np.int64(-7046029254386353131)
_INITIAL_CAPACITY = 1024


@numba.njit(cache=True)
def _log2(capacity: int) -> int:
    bits = 0
    while (1 << bits) < capacity:
        bits += 1
    return bits


@numba.njit(inline="always")
def _slot_of(keys: np.ndarray, used: np.ndarray, key: np.int64, shift: int) -> np.int64:
    """The slot holding ``key``, or the free slot where it goes: Fibonacci hashing (``shift`` is
    64 - log2(capacity)), then linear probing."""
    return probe_slot(keys, used, 0, key, ((key * _GOLDEN) >> shift) & (keys.shape[0] - 1))


@numba.njit(cache=True)
def _insert_fresh(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    used: np.ndarray,
    key: np.int64,
    count: np.int64,
    error: np.int64,
) -> None:
    slot = _slot_of(keys, used, key, 64 - _log2(keys.shape[0]))
    used[slot] = 1
    keys[slot] = key
    counts[slot] = count
    errors[slot] = error


@numba.njit(cache=True)
def _evict(
    keys: np.ndarray, counts: np.ndarray, errors: np.ndarray, used: np.ndarray, bucket: int
) -> int:
    """Drops entries with ``count + error <= bucket``; rebuilds the table (no tombstones)."""
    capacity = keys.shape[0]
    kept = 0
    keep_keys = np.empty(capacity, dtype=np.int64)
    keep_counts = np.empty(capacity, dtype=np.int64)
    keep_errors = np.empty(capacity, dtype=np.int64)
    for slot in range(capacity):
        if used[slot] and counts[slot] + errors[slot] > bucket:
            keep_keys[kept] = keys[slot]
            keep_counts[kept] = counts[slot]
            keep_errors[kept] = errors[slot]
            kept += 1
        used[slot] = 0
    for e in range(kept):
        _insert_fresh(keys, counts, errors, used, keep_keys[e], keep_counts[e], keep_errors[e])
    return kept


@numba.njit(cache=True)
def _count(
    ids: np.ndarray,
    start: int,
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    used: np.ndarray,
    size: int,
    records: int,
    width: int,
    limit: int,
) -> tuple[int, int, int]:
    """Counts ``ids[start:]`` until done or the table holds ``limit`` entries (caller grows it).

    Returns (next index, entries, records seen).
    """
    shift = 64 - _log2(keys.shape[0])
    i = start
    n = ids.shape[0]
    while i < n:
        if size >= limit:
            break
        key = ids[i]
        slot = _slot_of(keys, used, key, shift)
        if used[slot]:
            counts[slot] += 1
        else:
            used[slot] = 1
            keys[slot] = key
            counts[slot] = 1
            # current bucket b = ceil((records + 1) / w), so b - 1 = records // w
            errors[slot] = records // width
            size += 1
        records += 1
        if records % width == 0:
            size = _evict(keys, counts, errors, used, records // width)
        i += 1
    return i, size, records


@numba.njit(cache=True)
def _rehash(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    used: np.ndarray,
    new_keys: np.ndarray,
    new_counts: np.ndarray,
    new_errors: np.ndarray,
    new_used: np.ndarray,
) -> None:
    for slot in range(keys.shape[0]):
        if used[slot]:
            _insert_fresh(
                new_keys, new_counts, new_errors, new_used, keys[slot], counts[slot], errors[slot]
            )


class LossyCounter:
    """Manku–Motwani lossy counting over int64 key ids (:meth:`KeyBatch.key_ids`).

    Args:
        epsilon: the error bound, a fraction of the records seen, in (0, 1).
    """

    def __init__(self, epsilon: float) -> None:
        if not 0.0 < float(epsilon) < 1.0:
            raise ValueError(f"lossy counting needs 0 < epsilon < 1, got {epsilon}")
        self.epsilon = float(epsilon)
        #: w = ceil(1/epsilon) records per bucket.
        self.bucket_width = math.ceil(1.0 / self.epsilon)
        self.clear()

    def clear(self) -> None:
        """Forgets everything, as if freshly built."""
        self.records = 0
        self._size = 0
        self._allocate(_INITIAL_CAPACITY)
        #: Records per label (see :meth:`update`) over the same records as the counts.
        self.label_counts = np.zeros(0, dtype=np.int64)

    def _allocate(self, capacity: int) -> None:
        self._keys = np.zeros(capacity, dtype=np.int64)
        self._counts = np.zeros(capacity, dtype=np.int64)
        self._errors = np.zeros(capacity, dtype=np.int64)
        self._used = np.zeros(capacity, dtype=np.uint8)

    def _grow(self) -> None:
        old = (self._keys, self._counts, self._errors, self._used)
        self._allocate(2 * old[0].shape[0])
        _rehash(*old, self._keys, self._counts, self._errors, self._used)

    def __len__(self) -> int:
        return self._size

    def update(self, key_ids: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Counts ``key_ids`` in order and tallies ``labels`` (ints >= 0, one per record)."""
        ids = np.ascontiguousarray(key_ids, dtype=np.int64)
        position = 0
        while position < ids.shape[0]:
            limit = self._keys.shape[0] // 2
            position, self._size, self.records = _count(
                ids,
                position,
                self._keys,
                self._counts,
                self._errors,
                self._used,
                self._size,
                self.records,
                self.bucket_width,
                limit,
            )
            if position < ids.shape[0]:
                self._grow()
        if labels is not None and ids.shape[0]:
            tally = np.bincount(labels, minlength=self.label_counts.shape[0])
            tally[: self.label_counts.shape[0]] += self.label_counts
            self.label_counts = tally.astype(np.int64)

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every entry as (key_ids ascending, counts, errors)."""
        used = self._used.astype(bool)
        keys = self._keys[used]
        order = np.argsort(keys, kind="stable")
        return keys[order], self._counts[used][order], self._errors[used][order]

    def frequent(self, support: float) -> tuple[np.ndarray, np.ndarray]:
        """Keys (ascending) with ``count >= (support - epsilon) * records``, and their counts.

        Contains every key whose true frequency is ``>= support`` (for ``support > epsilon``);
        none below ``support - epsilon``.
        """
        keys, counts, _ = self.entries()
        hit = counts >= (float(support) - self.epsilon) * self.records
        return keys[hit], counts[hit]


class SlidingLossyCounter:
    """Gedik's sliding window over ``counters`` staggered :class:`LossyCounter` (§4.1.2).

    A counter starts every ``stagger = ceil(window / (counters - 1))`` records and is dropped
    after ``window + stagger`` records, so after warm-up :attr:`active` has counted between
    ``window`` and ``window + stagger`` of the most recent records (``[W, 1.5 W)`` for 3).
    ``window`` is rounded up to a multiple of ``counters - 1`` so that the bounds are exact.

    Example:
        >>> import numpy as np
        >>> sliding = SlidingLossyCounter(window=100, epsilon=0.01)
        >>> sliding.update(np.arange(260, dtype=np.int64) % 4)
        >>> sliding.active.records, sliding.active_start    # the counter begun at record 150
        (110, 150)
    """

    def __init__(self, window: int, epsilon: float, counters: int = 3) -> None:
        if int(window) < 1 or int(counters) < 2:
            raise ValueError("sliding lossy counting needs window >= 1 and >= 2 counters")
        self.epsilon = float(epsilon)
        self.stagger = math.ceil(int(window) / (int(counters) - 1))
        #: The window actually emulated: ``window`` rounded up to a multiple of counters - 1.
        self.window = self.stagger * (int(counters) - 1)
        self.lifetime = self.window + self.stagger
        self.records = 0
        #: (first record, counter), oldest first.
        self._counters: list[tuple[int, LossyCounter]] = [(0, LossyCounter(self.epsilon))]

    @property
    def active(self) -> LossyCounter:
        """The counter in use: the oldest alive."""
        return self._counters[0][1]

    @property
    def active_start(self) -> int:
        """Index (in the whole stream) of the first record :attr:`active` has counted."""
        return self._counters[0][0]

    def __len__(self) -> int:
        """Entries held by all counters together (the sketch's memory)."""
        return sum(len(counter) for _, counter in self._counters)

    def update(self, key_ids: np.ndarray, labels: np.ndarray | None = None) -> None:
        ids = np.ascontiguousarray(key_ids, dtype=np.int64)
        position = 0
        while position < ids.shape[0]:
            take = min(ids.shape[0] - position, self.stagger - self.records % self.stagger)
            part = slice(position, position + take)
            for _, counter in self._counters:
                counter.update(ids[part], None if labels is None else labels[part])
            position += take
            self.records += take
            if self.records % self.stagger == 0:
                self._rotate()

    def _rotate(self) -> None:
        alive = [(s, c) for s, c in self._counters if self.records - s < self.lifetime]
        self._counters = [*alive, (self.records, LossyCounter(self.epsilon))]
