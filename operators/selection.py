"""Which of the candidates: the least-loaded choice, as Storm's ``BalancedTargetSelector``.

PKG and its generalisations split routing in two (Storm's ``AssignmentCreator`` /
``TargetSelector``): a hash picks each key's *candidates*, and the selector sends the record to
the candidate this source has loaded least so far, ties to the earliest candidate. The loads
are the source's own counts, cumulative and never decayed (PKG paper §III-B, "local load
estimation"); the selector increments the chosen worker's count.

Example:
    >>> import numpy as np
    >>> loads = np.zeros(3, dtype=np.int64)
    >>> least_loaded(np.array([[0, 1], [0, 1], [0, 1]], dtype=np.int32), loads).tolist()
    [0, 1, 0]
    >>> loads.tolist()
    [2, 1, 0]
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, inline="always")
def pick_least_loaded(candidates: np.ndarray, loads: np.ndarray) -> int:
    """The candidate in the 1-D row ``candidates`` with the smallest load, ties to the first.

    Adds 1 to the chosen worker's ``loads`` entry. Schemes whose candidate count varies per
    record (D-Choices, W-Choices) call this once per record on a row of their own.
    """
    best = candidates[0]
    best_load = loads[best]
    for j in range(1, candidates.shape[0]):
        c = candidates[j]
        if loads[c] < best_load:
            best = c
            best_load = loads[c]
    loads[best] += 1
    return best


@numba.njit(cache=True)
def least_loaded(candidates: np.ndarray, loads: np.ndarray) -> np.ndarray:
    """Per row of ``candidates`` (n, d), the candidate with the smallest ``loads`` entry.

    Rows are taken in order and each choice adds 1 to ``loads`` (updated in place), so a batch
    gives exactly the decisions one-record-at-a-time routing would.
    """
    n = candidates.shape[0]
    out = np.empty(n, dtype=np.int32)
    for i in range(n):
        out[i] = pick_least_loaded(candidates[i], loads)
    return out
