"""SpaceSaving heavy hitters (Metwally, Agrawal, El Abbadi, ICDT 2005), compiled, with decay.

Layer: operators. ``capacity`` counters over 64-bit key ids; an untracked key takes over the
smallest counter ``c_min`` (count ``c_min + weight``, error ``c_min``), so ``count - error <=
true frequency <= count`` and every key above ``m / capacity`` is tracked. FISH ("Efficient
Time-Evolving Stream Processing at Scale", §4.1, Alg. 1) multiplies all counters by ``α`` at
every epoch end; why both guarantees survive: docs/schemes.md#spacesaving. The compiled
helpers :func:`offer` and :func:`decay_counters` are what schemes call inside their own loops;
:class:`SpaceSaving` wraps them for whole batches.

Example:
    >>> import numpy as np
    >>> summary = SpaceSaving(capacity=2)
    >>> summary.update(np.array([7, 7, 8, 9, 7], dtype=np.int64))
    >>> keys, counts, errors = summary.top()
    >>> keys.tolist(), counts.tolist(), errors.tolist()
    ([7, 9], [3.0, 2.0], [0.0, 1.0])
    >>> summary.total
    5.0
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

_EMPTY = -1
#: Fibonacci hashing spreads small integer ids as well as hash fingerprints over the index.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: ``meta`` fields: slots in use, index bits.
_SIZE = 0
_BITS = 1


class SummaryState(NamedTuple):
    """The arrays of one summary; compiled code receives them as one tuple."""

    keys: np.ndarray  # int64[capacity]: key id per slot
    counts: np.ndarray  # float64[capacity]
    errors: np.ndarray  # float64[capacity]
    heap: np.ndarray  # int64[capacity]: slots, min-heap by count
    heap_position: np.ndarray  # int64[capacity]: slot -> its place in heap
    index: np.ndarray  # int64[2^bits]: open-addressing key id -> slot, _EMPTY if free
    meta: np.ndarray  # int64[2]: _SIZE, _BITS
    total: np.ndarray  # float64[1]: (decayed) weight offered


def new_state(capacity: int) -> SummaryState:
    if capacity < 1:
        raise ValueError(f"SpaceSaving needs capacity >= 1, got {capacity}")
    bits = max(3, int(np.ceil(np.log2(4 * capacity))))  # index at most a quarter full
    return SummaryState(
        keys=np.zeros(capacity, dtype=np.int64),
        counts=np.zeros(capacity, dtype=np.float64),
        errors=np.zeros(capacity, dtype=np.float64),
        heap=np.zeros(capacity, dtype=np.int64),
        heap_position=np.zeros(capacity, dtype=np.int64),
        index=np.full(1 << bits, _EMPTY, dtype=np.int64),
        meta=np.array([0, bits], dtype=np.int64),
        total=np.zeros(1, dtype=np.float64),
    )


@numba.njit(inline="always")
def _home(key: np.int64, bits: np.int64) -> np.int64:
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(64 - bits))


# The compiled helpers take the state's arrays one by one: numba reference-counts every array
# of a tuple argument on each call, which cost 4x the work of an update in per-record loops.


@numba.njit(inline="always")
def find(keys: np.ndarray, index: np.ndarray, meta: np.ndarray, key: np.int64) -> np.int64:
    """The slot tracking ``key``, or -1."""
    bits = meta[_BITS]
    mask = (1 << bits) - 1
    probe = _home(key, bits)
    slot = index[probe]
    while slot != _EMPTY and keys[slot] != key:
        probe = (probe + 1) & mask
        slot = index[probe]
    return slot


@numba.njit(inline="always")
def _index_insert(
    keys: np.ndarray, index: np.ndarray, meta: np.ndarray, key: np.int64, slot: np.int64
) -> None:
    bits = meta[_BITS]
    mask = (1 << bits) - 1
    probe = _home(key, bits)
    while index[probe] != _EMPTY:
        probe = (probe + 1) & mask
    index[probe] = slot


@numba.njit(inline="always")
def _index_delete(keys: np.ndarray, index: np.ndarray, meta: np.ndarray, key: np.int64) -> None:
    # Backward-shift deletion keeps linear probing tombstone-free.
    bits = meta[_BITS]
    mask = (1 << bits) - 1
    hole = _home(key, bits)
    while keys[index[hole]] != key:
        hole = (hole + 1) & mask
    probe = hole
    while True:
        probe = (probe + 1) & mask
        slot = index[probe]
        if slot == _EMPTY:
            break
        home = _home(keys[slot], bits)
        # Move the entry back into the hole unless its home lies cyclically in (hole, probe].
        if ((probe - home) & mask) >= ((probe - hole) & mask):
            index[hole] = slot
            hole = probe
    index[hole] = _EMPTY


@numba.njit(inline="always")
def _sift_down(
    counts: np.ndarray, heap: np.ndarray, where: np.ndarray, size: np.int64, position: np.int64
) -> None:
    slot = heap[position]
    count = counts[slot]
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        if child + 1 < size and counts[heap[child + 1]] < counts[heap[child]]:
            child += 1
        if counts[heap[child]] >= count:
            break
        heap[position] = heap[child]
        where[heap[position]] = position
        position = child
    heap[position] = slot
    where[slot] = position


@numba.njit(inline="always")
def _sift_up(counts: np.ndarray, heap: np.ndarray, where: np.ndarray, position: np.int64) -> None:
    slot = heap[position]
    count = counts[slot]
    while position > 0:
        parent = (position - 1) // 2
        if counts[heap[parent]] <= count:
            break
        heap[position] = heap[parent]
        where[heap[position]] = position
        position = parent
    heap[position] = slot
    where[slot] = position


@numba.njit(inline="always")
def offer(
    keys: np.ndarray,
    counts: np.ndarray,
    errors: np.ndarray,
    heap: np.ndarray,
    heap_position: np.ndarray,
    index: np.ndarray,
    meta: np.ndarray,
    total: np.ndarray,
    key: np.int64,
    weight: float,
) -> np.int64:
    """Count ``weight`` more for ``key``; returns the slot that now tracks it.

    The arguments are the fields of a :class:`SummaryState`, in order, then the key.
    """
    total[0] += weight
    size = meta[_SIZE]
    slot = find(keys, index, meta, key)
    if slot >= 0:
        counts[slot] += weight
        _sift_down(counts, heap, heap_position, size, heap_position[slot])
    elif size < keys.shape[0]:
        slot = size
        meta[_SIZE] = size + 1
        keys[slot] = key
        counts[slot] = weight
        errors[slot] = 0.0
        heap[slot] = slot
        _index_insert(keys, index, meta, key, slot)
        _sift_up(counts, heap, heap_position, slot)
    else:
        slot = heap[0]
        smallest = counts[slot]
        _index_delete(keys, index, meta, keys[slot])
        keys[slot] = key
        counts[slot] = smallest + weight
        errors[slot] = smallest
        _index_insert(keys, index, meta, key, slot)
        _sift_down(counts, heap, heap_position, size, 0)
    return slot


@numba.njit(inline="always")
def decay_counters(
    counts: np.ndarray, errors: np.ndarray, meta: np.ndarray, total: np.ndarray, factor: float
) -> None:
    """Multiply every counter, error and the total by ``factor`` (FISH's epoch-end decay)."""
    for slot in range(meta[_SIZE]):
        counts[slot] *= factor
        errors[slot] *= factor
    total[0] *= factor


@numba.njit(cache=True)
def _offer_all(state: SummaryState, key_ids: np.ndarray) -> None:
    keys, counts, errors, heap, heap_position, index, meta, total = state
    for i in range(key_ids.shape[0]):
        offer(keys, counts, errors, heap, heap_position, index, meta, total, key_ids[i], 1.0)


@numba.njit(cache=True)
def _decay_all(state: SummaryState, factor: float) -> None:
    decay_counters(state.counts, state.errors, state.meta, state.total, factor)


@numba.njit(cache=True)
def _lookup_all(state: SummaryState, key_ids: np.ndarray) -> np.ndarray:
    keys, index, meta = state.keys, state.index, state.meta
    slots = np.empty(key_ids.shape[0], dtype=np.int64)
    for i in range(key_ids.shape[0]):
        slots[i] = find(keys, index, meta, key_ids[i])
    return slots


class SpaceSaving:
    """A SpaceSaving summary of ``capacity`` counters over int64 key ids.

    Args:
        capacity: the number of counters (the authors' SLBSimulator uses 100 per source).
    """

    def __init__(self, capacity: int = 100) -> None:
        self.capacity = int(capacity)
        self.state = new_state(self.capacity)

    def __len__(self) -> int:
        return int(self.state.meta[_SIZE])

    @property
    def total(self) -> float:
        """Total weight offered (decayed like the counters)."""
        return float(self.state.total[0])

    @property
    def min_count(self) -> float:
        """The smallest counter once full (a bound on any untracked key's frequency), else 0."""
        if len(self) < self.capacity:
            return 0.0
        return float(self.state.counts[self.state.heap[0]])

    def update(self, key_ids: np.ndarray) -> None:
        """Offer every key id of the batch once, in order."""
        _offer_all(self.state, np.ascontiguousarray(key_ids, dtype=np.int64))

    def decay(self, factor: float) -> None:
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"decay factor must be in [0, 1], got {factor}")
        _decay_all(self.state, float(factor))

    def estimate(self, key_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(count, error)`` per key id; ``(0, 0)`` for keys not tracked."""
        slots = _lookup_all(self.state, np.ascontiguousarray(key_ids, dtype=np.int64))
        tracked = slots >= 0
        counts = np.where(tracked, self.state.counts[np.maximum(slots, 0)], 0.0)
        errors = np.where(tracked, self.state.errors[np.maximum(slots, 0)], 0.0)
        return counts, errors

    def top(self, k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` (default all) tracked ``(keys, counts, errors)``, largest count first.

        Equal counts are listed by key id so the order is reproducible.
        """
        size = len(self)
        keys = self.state.keys[:size]
        counts = self.state.counts[:size]
        order = np.lexsort((keys, -counts))[: size if k is None else k]
        return keys[order].copy(), counts[order].copy(), self.state.errors[:size][order].copy()
