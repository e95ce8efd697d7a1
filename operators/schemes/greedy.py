"""On-Greedy and Off-Greedy: the PKG paper's key-affine baselines (Nasir et al., ICDE 2015, §V-B).

* ``greedy-online`` -- "Online greedy algorithm that picks the least loaded worker to handle a
  new key." A key's first record goes to the least loaded of *all* W workers, and the key stays
  there. Loads are the true loads of every record routed so far and the key table is shared by
  all sources: like PoTC, the paper calls it a technique "that require[s] coordination", so the
  class sets ``global_estimation = True`` and the simulator routes the whole interleaved
  stream through one object. Ties go to the lowest worker id (the paper does not say).
* ``greedy-offline`` -- "Offline greedy sorts the keys by decreasing frequency and executes
  On-Greedy" and "knows the whole distribution of keys". The paper leaves open (pkg.md §1.5,
  §9 item 3) whether "executes On-Greedy" weighs each key by its frequency. We build the
  variant that uses the knowledge it is granted: longest-processing-time first (LPT). In
  :meth:`OfflineGreedy.prepare`, which sees the whole stream before routing starts, keys are
  taken by decreasing frequency (ties: earlier first appearance first) and each is placed on
  the worker with the smallest total frequency placed so far (ties: lowest id). Routing then
  follows that table. Replaying On-Greedy on a frequency-sorted stream instead would decide
  by load counts that, at each new key, still miss every later record of the keys placed
  before it -- a weaker use of the same offline knowledge. A key that ``prepare`` never saw is
  placed as On-Greedy would place it.

  LPT balances the *final* loads (to within the smallest key frequency when keys are many);
  the imbalance *through time*, which Table II averages, still carries the stream's sampling
  noise, so on a random stream Off-Greedy cannot get the near-zero averages PKG gets while
  every record can go to either of two workers.

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
