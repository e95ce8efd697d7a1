"""A consistent-hash ring with virtual nodes (Karger et al.), vectorized over batches of keys.

Each worker ``w`` owns ``replicas`` points on a 64-bit ring, at
``murmur3_x64_128("w#r", seed)[:64]`` for ``r`` in ``0..replicas-1``. A key sits at its
:meth:`KeyBatch.key_ids` fingerprint and belongs to the first point clockwise (the smallest
point ``>=`` the key, wrapping past the top). Adding a worker therefore takes keys only from
others, never moves keys between existing workers, and gives the newcomer about ``1/N`` of the
keys once ``replicas`` is large (Gedik §4.1 uses 1000; FISH §5 uses virtual nodes likewise).

Lookup is a binary search over the sorted points: ``O(log(N·replicas))`` per key, all keys of a
batch at once in numpy.

Example:
    >>> import numpy as np
    >>> ring = HashRing(range(4), replicas=100)
    >>> owners = ring.owners(np.array([1, 2**40, -5], dtype=np.int64))
    >>> set(owners.tolist()) <= {0, 1, 2, 3}
    True
"""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np

from operators.keys import KeyBatch


class HashRing:
    def __init__(self, workers: Iterable[int], *, replicas: int = 100, seed: int = 0) -> None:
        if replicas < 1:
            raise ValueError(f"ring needs >= 1 replica per worker, got {replicas}")
        self.replicas = int(replicas)
        self.seed = int(seed)
        self._workers: list[int] = []
        self.points = np.empty(0, dtype=np.int64)
        self.point_owner = np.empty(0, dtype=np.int32)
        for worker in workers:
            self.add(worker)

    @property
    def workers(self) -> list[int]:
        return list(self._workers)

    def _replica_points(self, worker: int) -> np.ndarray:
        labels = KeyBatch.from_bytes(f"{worker}#{r}".encode() for r in range(self.replicas))
        return labels.hash64(self.seed)

    def add(self, worker: int) -> None:
        if worker in self._workers:
            raise ValueError(f"worker {worker} is already on the ring")
        self._workers.append(int(worker))
        points = np.concatenate([self.points, self._replica_points(worker)])
        owners = np.concatenate([self.point_owner, np.full(self.replicas, worker, np.int32)])
        # Ties (a 2^-64 event) break by owner so every source builds the identical ring.
        order = np.lexsort((owners, points))
        self.points, self.point_owner = points[order], owners[order]

    def remove(self, worker: int) -> None:
        self._workers.remove(worker)
        keep = self.point_owner != worker
        self.points, self.point_owner = self.points[keep], self.point_owner[keep]

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The worker owning each ring position (e.g. ``KeyBatch.key_ids()``)."""
        if not self._workers:
            raise ValueError("ring has no workers")
        index = np.searchsorted(self.points, positions, side="left")
        index[index == self.points.shape[0]] = 0
        return self.point_owner[index]

    def successors(self, positions: np.ndarray, count: int) -> np.ndarray:
        """The first ``count`` distinct workers clockwise from each position, shape (n, count).

        Row ``i`` starts with ``owners(positions)[i]``. ``count`` is capped at the number of
        workers on the ring.
        """
        count = min(int(count), len(self._workers))
        start = np.searchsorted(self.points, positions, side="left")
        return _walk_distinct(self.point_owner, start, count, max(self._workers) + 1)


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
