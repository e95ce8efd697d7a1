"""On-Greedy and Off-Greedy: the PKG paper's key-affine baselines.

Layer: operators. Nasir et al., "The Power of Both Choices", ICDE 2015, §V-B. ``greedy-online``
sends a key's first record to the least loaded of all W workers and keeps it there (true loads,
one shared table: ``global_estimation = True``). ``greedy-offline`` sees the whole stream in
:meth:`OfflineGreedy.prepare` and places keys by decreasing frequency, each on the worker of
smallest placed total (longest-processing-time first). Why LPT and the ties:
docs/schemes.md#on-greedy-and-off-greedy.

Example:
    >>> from operators.keys import KeyBatch
    >>> stream = KeyBatch.from_strings(["d", "a", "a", "a", "a", "a", "b", "b", "b", "c", "c"])
    >>> OnlineGreedy(2).route(stream).tolist()  # d -> 0, a -> 1, b -> 0 (1 < 5), c -> 0 (4 < 5)
    [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    >>> offline = OfflineGreedy(2)
    >>> offline.prepare(stream)  # a: 5 -> 0, b: 3 -> 1, c: 2 -> 1 (3 < 5), d: 1 -> 0 (5 = 5)
    >>> offline.route(stream).tolist()
    [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
"""

from __future__ import annotations

import numba
import numpy as np

from operators.keys import KeyBatch
from operators.schemes.potc import FirstSightAssignment, KeyAssignments


@numba.njit(cache=True)
def longest_first(frequencies: np.ndarray, n_workers: int) -> np.ndarray:
    """LPT: each item, in the given order, goes to the worker with the least total so far
    (ties to the lowest id). Give ``frequencies`` sorted by decreasing value."""
    totals = np.zeros(n_workers, dtype=np.int64)
    out = np.empty(frequencies.shape[0], dtype=np.int32)
    for i in range(frequencies.shape[0]):
        best = 0
        for w in range(1, n_workers):
            if totals[w] < totals[best]:
                best = w
        totals[best] += frequencies[i]
        out[i] = best
    return out


class OnlineGreedy(FirstSightAssignment):
    """On-Greedy: a key's first record picks the least loaded worker of all, for good."""

    name = "greedy-online"

    def route(self, keys: KeyBatch) -> np.ndarray:
        return self.table.route(keys.key_ids(), self.loads)


class OfflineGreedy(OnlineGreedy):
    """Off-Greedy: keys placed by LPT on their whole-stream frequencies (see the module
    docstring); call :meth:`prepare` with the stream before routing it."""

    name = "greedy-offline"

    def prepare(self, keys: KeyBatch) -> None:
        """Plans the table from the whole stream ``keys`` (replacing any earlier plan)."""
        unique, first_seen, counts = np.unique(
            keys.key_ids(), return_index=True, return_counts=True
        )
        order = np.lexsort((first_seen, -counts))
        self.table = KeyAssignments(2 * unique.shape[0])
        self.table.assign(
            unique[order], longest_first(counts[order].astype(np.int64), self.n_workers)
        )
