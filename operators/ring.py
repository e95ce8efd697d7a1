"""A consistent-hash ring with virtual nodes (Karger et al.), vectorized over batches of keys.

Layer: operators.
Each worker ``w`` owns ``replicas`` points on a 64-bit ring, at
``murmur3_x64_128("w#r", seed)[:64]`` for ``r`` in ``0..replicas-1``. A key sits at its
:meth:`KeyBatch.key_ids` fingerprint and belongs to the first point clockwise (the smallest
point ``>=`` the key, wrapping past the top). Adding a worker therefore takes keys only from
others, never moves keys between existing workers, and gives the newcomer about ``1/N`` of the
keys once ``replicas`` is large (Gedik §4.1 uses 1000; FISH §5 uses virtual nodes likewise).

Lookup is O(1) expected by *bucketing* the ring (Karger et al.; Gedik §5.2): ``2^b >= 2·points``
equal buckets each remember the first point at or after their start, or their owner outright
when no point lies inside (about 60% of them); the index is rebuilt on ``add``/``remove``.

Example:
    >>> import numpy as np
    >>> ring = HashRing(range(4), replicas=100)
    >>> owners = ring.owners(np.array([1, 2**40, -5], dtype=np.int64))
    >>> set(owners.tolist()) <= {0, 1, 2, 3}
    True
    >>> bool(np.all(ring.successors(np.array([7]), 2)[:, 0] == ring.owners(np.array([7]))))
    True
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numba
import numpy as np

from operators.keys import KeyBatch

#: Flipping the sign bit maps signed int64 order onto unsigned order, so the top bits of the
#: flipped value name a bucket and buckets follow ring order.
_SIGN_BIT = np.uint64(1 << 63)


@functools.lru_cache(maxsize=4096)
def _worker_points(worker: int, replicas: int, seed: int) -> np.ndarray:
    """The ring points of one worker; cached because every source builds the same ring."""
    labels = KeyBatch.from_bytes(f"{worker}#{r}".encode() for r in range(replicas))
    points = labels.hash64(seed)
    points.flags.writeable = False
    return points


class HashRing:
    def __init__(self, workers: Iterable[int], *, replicas: int = 100, seed: int = 0) -> None:
        if replicas < 1:
            raise ValueError(f"ring needs >= 1 replica per worker, got {replicas}")
        self.replicas = int(replicas)
        self.seed = int(seed)
        self._workers: list[int] = []
        self.points = np.empty(0, dtype=np.int64)
        self.point_owner = np.empty(0, dtype=np.int32)
        self._bucket_bits = 0
        self._bucket_first = np.zeros(2, dtype=np.int64)
        self._bucket_entry = np.full(2, -1, dtype=np.int32)
        self._insert(list(workers))
        self._index()

    @property
    def workers(self) -> list[int]:
        return list(self._workers)

    def _replica_points(self, workers: list[int]) -> np.ndarray:
        return np.concatenate(
            [_worker_points(int(w), self.replicas, self.seed) for w in workers]
            or [np.empty(0, dtype=np.int64)]
        )

    def _insert(self, workers: list[int]) -> None:
        if len(set(workers)) != len(workers):
            raise ValueError(f"workers {workers} repeat a worker")
        for worker in workers:
            if worker in self._workers:
                raise ValueError(f"worker {worker} is already on the ring")
        self._workers.extend(int(worker) for worker in workers)
        added = np.repeat(np.asarray(workers, dtype=np.int32), self.replicas)
        points = np.concatenate([self.points, self._replica_points(workers)])
        owners = np.concatenate([self.point_owner, added])
        # Ties (a 2^-64 event) break by owner so every source builds the identical ring.
        order = np.lexsort((owners, points))
        self.points, self.point_owner = points[order], owners[order]

    def _index(self) -> None:
        """Rebuild the bucket index.

        ``bucket_first[b]``: the first point at or after bucket ``b``'s start.
        ``bucket_entry[b]``: the owner of every position in ``b`` when no point lies inside
        the bucket (most buckets: one memory access per lookup), else ``-(first + 1)``.
        """
        n_points = self.points.shape[0]
        bits = min(max(1, int(np.ceil(np.log2(max(2 * n_points, 2))))), 32)
        starts = (np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)) ^ _SIGN_BIT
        first = np.searchsorted(self.points, starts.view(np.int64), side="left")
        following = np.append(first[1:], n_points)
        entry = np.full(first.shape[0], -1, dtype=np.int32)
        if n_points:
            pure = first == following
            entry[pure] = self.point_owner[first[pure] % n_points]
            entry[~pure] = -(first[~pure] + 1)
        self._bucket_bits = bits
        self._bucket_first = first.astype(np.int64)
        self._bucket_entry = entry

    def add(self, worker: int) -> None:
        self._insert([int(worker)])
        self._index()

    def remove(self, worker: int) -> None:
        self._workers.remove(worker)
        keep = self.point_owner != worker
        self.points, self.point_owner = self.points[keep], self.point_owner[keep]
        self._index()

    def _positions(self, positions: np.ndarray) -> np.ndarray:
        """``positions`` as the contiguous int64 array the compiled lookups take."""
        if not self._workers:
            raise ValueError("ring has no workers")
        return np.ascontiguousarray(positions, dtype=np.int64)

    def _start_points(self, positions: np.ndarray) -> np.ndarray:
        positions = self._positions(positions)
        return _first_points(self.points, self._bucket_first, self._bucket_bits, positions)

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The worker owning each ring position (e.g. ``KeyBatch.key_ids()``)."""
        positions = self._positions(positions)
        return _owners(
            self.points, self.point_owner, self._bucket_entry, self._bucket_bits, positions
        )

    def successors(self, positions: np.ndarray, count: int) -> np.ndarray:
        """The first ``count`` distinct workers clockwise from each position, shape (n, count).

        Row ``i`` starts with ``owners(positions)[i]``. ``count`` is capped at the number of
        workers on the ring.
        """
        count = min(int(count), len(self._workers))
        start = self._start_points(positions)
        return _walk_distinct(self.point_owner, start, count, max(self._workers) + 1)


@numba.njit(inline="always")
def _walk_to(points: np.ndarray, index: np.int64, position: np.int64) -> np.int64:
    """The first point at or after ``index`` that is ``>= position``, wrapping to 0 past the top
    (``index`` is a bucket's first point, so the walk is a few steps at most)."""
    n_points = points.shape[0]
    while index < n_points and points[index] < position:
        index += 1
    return index if index < n_points else 0


@numba.njit(inline="always")
def _first_point(
    points: np.ndarray, bucket_first: np.ndarray, bits: int, position: np.int64
) -> np.int64:
    bucket = (np.uint64(position) ^ _SIGN_BIT) >> np.uint64(64 - bits)
    return _walk_to(points, bucket_first[bucket], position)


@numba.njit(cache=True)
def _first_points(
    points: np.ndarray, bucket_first: np.ndarray, bits: int, positions: np.ndarray
) -> np.ndarray:
    out = np.empty(positions.shape[0], dtype=np.int64)
    for i in range(positions.shape[0]):
        out[i] = _first_point(points, bucket_first, bits, positions[i])
    return out


@numba.njit(cache=True)
def _owners(
    points: np.ndarray,
    point_owner: np.ndarray,
    bucket_entry: np.ndarray,
    bits: int,
    positions: np.ndarray,
) -> np.ndarray:
    out = np.empty(positions.shape[0], dtype=np.int32)
    for i in range(positions.shape[0]):
        position = positions[i]
        entry = bucket_entry[(np.uint64(position) ^ _SIGN_BIT) >> np.uint64(64 - bits)]
        if entry >= 0:
            out[i] = entry
        else:
            out[i] = point_owner[_walk_to(points, -(np.int64(entry) + 1), position)]
    return out


@numba.njit(cache=True)
def _walk_distinct(
    point_owner: np.ndarray, start: np.ndarray, count: int, worker_bound: int
) -> np.ndarray:
    n_points = point_owner.shape[0]
    out = np.empty((start.shape[0], count), dtype=np.int32)
    seen = np.zeros(worker_bound, dtype=np.int64)
    for i in range(start.shape[0]):
        mark = i + 1  # seen[w] == mark means w was taken for row i; no clearing needed
        found = 0
        pos = start[i]
        while found < count:
            if pos >= n_points:
                pos = 0
            w = point_owner[pos]
            if seen[w] != mark:
                seen[w] = mark
                out[i, found] = w
                found += 1
            pos += 1
    return out
