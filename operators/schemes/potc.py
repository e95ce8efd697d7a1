"""Static power of two choices ("PoTC"), the PKG paper's baseline without key splitting.

Layer: operators. Nasir et al., "The Power of Both Choices", ICDE 2015, §III-A and §V-B: a
key's first record goes to the less loaded of PKG's two candidates (ties to the first) and
every later record of the key follows it there. Loads are the true loads and the key table is
shared by all sources (``global_estimation = True``): the choices where the paper is silent
are in docs/schemes.md#static-potc. The per-key memory is :class:`KeyAssignments`, a compiled
open-addressing table that :mod:`operators.schemes.greedy` reuses.

Example:
    >>> from operators.keys import KeyBatch
    >>> potc = StaticPowerOfTwoChoices(6)
    >>> potc.route(KeyBatch.from_strings(["key1", "key1", "key1", "test"])).tolist()
    [4, 4, 4, 5]
    >>> len(potc.table)  # keys remembered: one routing-table entry per distinct key
    2
"""

from __future__ import annotations

from typing import Any, ClassVar

import numba
import numpy as np

from operators.base import Scheme
from operators.keys import KeyBatch, abs_mod, mod_constants, probe_slot
from operators.schemes.hashing import FIRST_SEED, SECOND_SEED

_EMPTY = -1  # slot_workers value of a free slot (workers are >= 0)


@numba.njit(cache=True)
def _find_slot(slot_keys: np.ndarray, slot_workers: np.ndarray, key_id: np.int64) -> np.int64:
    """The slot holding ``key_id``, or the free slot where it would go (linear probing).

    Key ids are MurmurHash3 outputs, so their low bits are already uniform slot indices.
    """
    return probe_slot(slot_keys, slot_workers, _EMPTY, key_id, key_id & (slot_keys.shape[0] - 1))


@numba.njit(cache=True)
def _route_remembered(
    key_ids: np.ndarray,
    first_hashes: np.ndarray,
    second_hashes: np.ndarray,
    all_workers: bool,
    loads: np.ndarray,
    slot_keys: np.ndarray,
    slot_workers: np.ndarray,
    size: int,
    size_limit: int,
    start: int,
    out: np.ndarray,
) -> tuple:
    """Routes records ``start..`` and returns ``(stop, size)``; stops early, before a new key,
    once the table holds ``size_limit`` keys (the caller grows it and resumes at ``stop``).

    A new key goes to the least loaded of all workers if ``all_workers`` (On-Greedy), else of
    its two hash choices (static PoTC); ties to the first candidate. Every record adds 1 to its
    worker's load.
    """
    n_workers = loads.shape[0]
    two32_mod, inverse = mod_constants(n_workers)
    for i in range(start, key_ids.shape[0]):
        slot = _find_slot(slot_keys, slot_workers, key_ids[i])
        worker = slot_workers[slot]
        if worker == _EMPTY:
            if size >= size_limit:
                return i, size
            if all_workers:
                worker = 0
                for w in range(1, n_workers):
                    if loads[w] < loads[worker]:
                        worker = w
            else:
                worker = abs_mod(first_hashes[i], n_workers, two32_mod, inverse)
                second = abs_mod(second_hashes[i], n_workers, two32_mod, inverse)
                if loads[second] < loads[worker]:
                    worker = second
            slot_keys[slot] = key_ids[i]
            slot_workers[slot] = worker
            size += 1
        loads[worker] += 1
        out[i] = worker
    return key_ids.shape[0], size


@numba.njit(cache=True)
def _insert_all(
    key_ids: np.ndarray, workers: np.ndarray, slot_keys: np.ndarray, slot_workers: np.ndarray
) -> int:
    """Stores every (key, worker) pair (overwriting); returns how many keys were new."""
    added = 0
    for i in range(key_ids.shape[0]):
        slot = _find_slot(slot_keys, slot_workers, key_ids[i])
        if slot_workers[slot] == _EMPTY:
            added += 1
        slot_keys[slot] = key_ids[i]
        slot_workers[slot] = workers[i]
    return added


@numba.njit(cache=True)
def _lookup(key_ids: np.ndarray, slot_keys: np.ndarray, slot_workers: np.ndarray) -> np.ndarray:
    out = np.empty(key_ids.shape[0], dtype=np.int32)
    for i in range(key_ids.shape[0]):
        out[i] = slot_workers[_find_slot(slot_keys, slot_workers, key_ids[i])]
    return out


class KeyAssignments:
    """Key id -> worker, remembered forever: an open-addressing table kept at most half full.

    Example:
        >>> table = KeyAssignments()
        >>> table.assign(np.array([7, -3], dtype=np.int64), np.array([1, 0], dtype=np.int32))
        >>> table.lookup(np.array([-3, 7, 99], dtype=np.int64)).tolist()
        [0, 1, -1]
    """

    def __init__(self, capacity: int = 1024) -> None:
        capacity = 1 << max(4, int(capacity - 1).bit_length())
        self.slot_keys = np.zeros(capacity, dtype=np.int64)
        self.slot_workers = np.full(capacity, _EMPTY, dtype=np.int32)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    @property
    def size_limit(self) -> int:
        return self.slot_keys.shape[0] // 2

    def grow(self, needed: int = 0) -> None:
        """At least doubles the capacity and re-inserts every key (load factor <= 1/2)."""
        used = self.slot_workers != _EMPTY
        keys, workers = self.slot_keys[used], self.slot_workers[used]
        capacity = self.slot_keys.shape[0] * 2
        while capacity // 2 < max(needed, self.size + 1):
            capacity *= 2
        self.slot_keys = np.zeros(capacity, dtype=np.int64)
        self.slot_workers = np.full(capacity, _EMPTY, dtype=np.int32)
        _insert_all(keys, workers, self.slot_keys, self.slot_workers)

    def assign(self, key_ids: np.ndarray, workers: np.ndarray) -> None:
        """Remembers ``key_ids[i] -> workers[i]`` (distinct keys), replacing earlier entries."""
        if self.size + key_ids.shape[0] > self.size_limit:
            self.grow(self.size + key_ids.shape[0])
        self.size += _insert_all(
            np.asarray(key_ids, dtype=np.int64),
            np.asarray(workers, dtype=np.int32),
            self.slot_keys,
            self.slot_workers,
        )

    def lookup(self, key_ids: np.ndarray) -> np.ndarray:
        """Each key's worker, or -1 for a key never assigned."""
        return _lookup(np.asarray(key_ids, dtype=np.int64), self.slot_keys, self.slot_workers)

    def route(
        self,
        key_ids: np.ndarray,
        loads: np.ndarray,
        first_hashes: np.ndarray | None = None,
        second_hashes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Remembered workers; a new key picks the least loaded of its two hash choices, or of
        all workers when no hashes are given. ``loads`` counts every record (in place)."""
        all_workers = first_hashes is None or second_hashes is None
        if all_workers:
            first_hashes = second_hashes = key_ids[:0]
        out = np.empty(key_ids.shape[0], dtype=np.int32)
        start = 0
        while True:
            start, self.size = _route_remembered(
                key_ids,
                first_hashes,
                second_hashes,
                all_workers,
                loads,
                self.slot_keys,
                self.slot_workers,
                self.size,
                self.size_limit,
                start,
                out,
            )
            if start == key_ids.shape[0]:
                return out
            self.grow()


class FirstSightAssignment(Scheme):
    """A scheme that places each key when it first appears and keeps it there (PoTC, greedy).

    Coordinated, as the PKG paper says these baselines must be: the loads and the key table
    are global (see the module docstring).
    """

    keeps_key_on_one_worker = True
    global_estimation: ClassVar[bool] = True

    def __init__(self, n_workers: int, **base: Any) -> None:
        super().__init__(n_workers, **base)
        #: Records routed to each worker so far (by all sources, see the module docstring).
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        #: Key -> worker of every key seen: a routing table with one entry per distinct key.
        self.table = KeyAssignments()


class StaticPowerOfTwoChoices(FirstSightAssignment):
    """Static PoTC: a key's first record picks the less loaded of its two choices for good."""

    name = "potc"

    def route(self, keys: KeyBatch) -> np.ndarray:
        first, second = keys.hash64_pair(FIRST_SEED, SECOND_SEED)
        return self.table.route(keys.key_ids(), self.loads, first, second)
