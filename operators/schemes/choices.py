"""D-Choices and W-Choices: PKG for the tail, more choices for the head.

Layer: operators. Nasir et al., "When Two Choices Are not Enough: Balancing at Scale in
Distributed Stream Processing", ICDE 2016, §III-IV: no two-choice scheme can balance a key
whose probability ``p1`` exceeds ``2/n``, so the few *head* keys (SpaceSaving count above
``θ = 2/(n·T)`` of this source's records) get ``d`` candidates (D-Choices) or all ``n`` workers
(W-Choices), and every other key routes exactly like ``pkg``. We follow the authors' reference
simulator (anisnasir/SLBSimulator); the bounds that pick ``d``, the double hashing of further
candidates and the other choices: docs/schemes.md#d-choices-and-w-choices.

Example:
    >>> from operators.keys import KeyBatch
    >>> scheme = WChoices(4)
    >>> scheme.route(KeyBatch.from_strings(["a"] * 8)).tolist()
    [0, 1, 2, 3, 0, 1, 2, 3]
    >>> choices_from_bounds(p1=0.2, p_head=0.3, n_head=2, n_workers=10, epsilon=0.001)
    3
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numba
import numpy as np

from operators.base import Scheme, SchemeError
from operators.keys import KeyBatch
from operators.schemes.hashing import FIRST_SEED, SECOND_SEED
from operators.selection import pick_least_loaded
from operators.sketches.spacesaving import SpaceSaving, SummaryState, offer

#: The reference simulator's SpaceSaving capacity per source (Constants.STREAM_SUMMARY_CAPACITY).
DEFAULT_CAPACITY = 100
#: T in θ = 2/(n·T): 10 gives θ = 1/(5n).
DEFAULT_THRESHOLD_T = 10.0
#: ε of D-Choices' bounds (the reference simulator's default).
DEFAULT_EPSILON = 0.001
#: Candidate count recorded for a tail key: PKG's pair, even when n <= 2.
TAIL = 0


class BoundTables(NamedTuple):
    """Powers D-Choices' bounds need for one ``n``, so ``d`` costs no ``pow`` per record."""

    #: ``q^j`` for ``j`` in ``0..max_head·n`` (``q = (n-1)/n``).
    q_powers: np.ndarray
    #: ``(1 - q^d)^d`` for ``d`` in ``0..n``.
    covered_powers: np.ndarray


def bound_tables(n_workers: int, max_head: int) -> BoundTables:
    # Scalar ``**`` (libm pow) per entry: numpy's vectorized power may differ in the last bit,
    # and the bounds compare sums that can tie exactly (ε = 0).
    q = (n_workers - 1.0) / n_workers
    q_powers = np.array([q**j for j in range(max_head * n_workers + 1)], dtype=np.float64)
    covered = [(1.0 - q**d) ** d for d in range(n_workers + 1)]
    return BoundTables(q_powers, np.array(covered, dtype=np.float64))


@numba.njit(cache=True)
def _first_d(
    p1: float,
    p_head: float,
    n_head: int,
    epsilon: float,
    q_powers: np.ndarray,
    covered_powers: np.ndarray,
) -> int:
    n_workers = covered_powers.shape[0] - 1
    p_tail = 1.0 - p_head
    d = max(math.floor(p1 * n_workers + 0.5), 0)
    while d < n_workers:
        # Same association as the reference (pTail · pow(b, 2)), so equal sums tie equally.
        covered_by_head = 1.0 - q_powers[n_head * d]
        sum_head = p_head + p_tail * (covered_by_head * covered_by_head)
        covered = 1.0 - q_powers[d]
        sum_top = p1 + (p_head - p1) * covered_powers[d] + p_tail * (covered * covered)
        if sum_head <= covered_by_head + epsilon and sum_top <= covered + epsilon:
            break
        d += 1
    return min(max(d, 2), n_workers)


def choices_from_bounds(
    p1: float, p_head: float, n_head: int, n_workers: int, epsilon: float = DEFAULT_EPSILON
) -> int:
    """D-Choices' ``d``: the first ``d >= round(p1·n)`` meeting both bounds, within [2, n].

    ``n`` means every worker; see the module docstring for the bounds.
    """
    tables = bound_tables(n_workers, max(n_head, 1))
    return int(_first_d(p1, p_head, n_head, epsilon, *tables))


@numba.njit(cache=True, fastmath=True)
def _head_mass(counts: np.ndarray, errors: np.ndarray, bar: float) -> tuple[float, int]:
    """Sum and number of ``count + error`` above ``bar``.

    The terms are whole numbers (no decay here), so the vectorized, reordered sum is exact.
    """
    mass = 0.0
    n_head = 0
    for s in range(counts.shape[0]):
        upper = counts[s] + errors[s]
        is_head = upper > bar
        mass += upper if is_head else 0.0
        n_head += 1 if is_head else 0
    return mass, n_head


@numba.njit(cache=True)
def _classify(
    state: SummaryState,
    top: np.ndarray,
    key_ids: np.ndarray,
    theta: float,
    epsilon: float,
    head_to_all: bool,
    q_powers: np.ndarray,
    covered_powers: np.ndarray,
) -> np.ndarray:
    """Per record: ``TAIL`` or the head key's candidate count; updates the summary.

    ``top[0]`` is the slot with the largest count. Counts only grow (an evicted slot is the
    smallest and comes back larger than every other), so it is kept up to date per record;
    equal counts keep the key that got there first.
    """
    n_workers = covered_powers.shape[0] - 1
    out = np.empty(key_ids.shape[0], dtype=np.int32)
    keys, counts, errors, heap, heap_position, index, meta, total = state
    for i in range(key_ids.shape[0]):
        slot = offer(keys, counts, errors, heap, heap_position, index, meta, total, key_ids[i], 1.0)
        if counts[slot] > counts[top[0]]:
            top[0] = slot
        seen = total[0]
        bar = theta * seen
        if counts[slot] + errors[slot] <= bar:
            out[i] = TAIL
        elif head_to_all:
            out[i] = n_workers
        else:
            head_mass, n_head = _head_mass(counts[: meta[0]], errors, bar)
            p1 = (counts[top[0]] + errors[top[0]]) / seen
            out[i] = _first_d(p1, head_mass / seen, n_head, epsilon, q_powers, covered_powers)
    return out


@numba.njit(inline="always")
def _worker_of(hash_value: np.int64, n_workers: int) -> np.int32:
    """``|h| mod n`` exactly as :func:`operators.keys.choice_from_hash` (|MIN| read as 2^63)."""
    magnitude = np.uint64(-hash_value) if hash_value < 0 else np.uint64(hash_value)
    return np.int32(magnitude % np.uint64(n_workers))


@numba.njit(inline="always")
def _spread(hash_value: np.int64, n_workers: int) -> np.int32:
    """Worker ``⌊(high 32 bits of h) · n / 2^32⌋``: a multiply instead of a division."""
    return np.int32(
        (np.uint64(hash_value) >> np.uint64(32)) * np.uint64(n_workers) >> np.uint64(32)
    )


@numba.njit(cache=True)
def _select(
    n_choices: np.ndarray,
    first_hash: np.ndarray,
    second_hash: np.ndarray,
    loads: np.ndarray,
) -> np.ndarray:
    n_workers = loads.shape[0]
    every_worker = np.arange(n_workers).astype(np.int32)
    row = np.empty(max(n_workers, 2), dtype=np.int32)
    out = np.empty(n_choices.shape[0], dtype=np.int32)
    for i in range(n_choices.shape[0]):
        d = n_choices[i]
        if d >= n_workers:
            out[i] = pick_least_loaded(every_worker, loads)
            continue
        if d == TAIL:
            d = 2
        h1 = first_hash[i]
        h2 = second_hash[i]
        row[0] = _worker_of(h1, n_workers)
        row[1] = _worker_of(h2, n_workers)
        for j in range(2, d):
            row[j] = _spread(h1 + np.int64(j) * h2, n_workers)
        out[i] = pick_least_loaded(row[:d], loads)
    return out


class _HeadTailChoices(Scheme):
    """Shared state and routing of D-Choices and W-Choices (one object per source)."""

    keeps_key_on_one_worker = False
    _head_to_all: bool

    #: Slack of the bounds that size the head keys' choices; only D-Choices takes it as a
    #: parameter (W-Choices gives head keys every worker, bounds or not).
    epsilon: float = DEFAULT_EPSILON

    def __init__(
        self,
        n_workers: int,
        *,
        capacity: int = DEFAULT_CAPACITY,
        threshold_t: float = DEFAULT_THRESHOLD_T,
        **base: Any,
    ) -> None:
        super().__init__(n_workers, **base)
        if int(capacity) < 1:
            raise SchemeError(f"{self.name}: capacity must be >= 1, got {capacity}")
        if not float(threshold_t) > 0:
            raise SchemeError(f"{self.name}: threshold_t must be > 0, got {threshold_t}")
        self.capacity = int(capacity)
        self.threshold_t = float(threshold_t)
        #: θ = 2/(n·T): a key is head when (count + error)/records_seen exceeds it.
        self.theta = 2.0 / (self.n_workers * self.threshold_t)
        self.summary = SpaceSaving(self.capacity)
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        self._top = np.zeros(1, dtype=np.int64)
        self._tables = bound_tables(self.n_workers, self.capacity)

    def route(self, keys: KeyBatch) -> np.ndarray:
        n_choices = _classify(
            self.summary.state,
            self._top,
            keys.key_ids(),
            self.theta,
            self.epsilon,
            self._head_to_all,
            *self._tables,
        )
        return _select(n_choices, keys.hash64(FIRST_SEED), keys.hash64(SECOND_SEED), self.loads)

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "capacity": self.capacity,
            "threshold_t": self.threshold_t,
            "theta": self.theta,
        }


class DChoices(_HeadTailChoices):
    """D-Choices: head keys get ``d`` hashed candidates, ``d`` from the two bounds (§ above).

    Args:
        capacity: SpaceSaving counters per source (100).
        threshold_t: T of θ = 2/(n·T) (10, so θ = 1/(5n)).
        epsilon: slack ε of the bounds (0.001).
    """

    name = "d-choices"
    _head_to_all = False

    def __init__(self, n_workers: int, *, epsilon: float = DEFAULT_EPSILON, **base: Any) -> None:
        super().__init__(n_workers, **base)
        if not float(epsilon) >= 0:
            raise SchemeError(f"{self.name}: epsilon must be >= 0, got {epsilon}")
        self.epsilon = float(epsilon)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "epsilon": self.epsilon}


class WChoices(_HeadTailChoices):
    """W-Choices: head keys may go to any worker (the least loaded, ties to the lowest id).

    Args:
        capacity: SpaceSaving counters per source (100).
        threshold_t: T of θ = 2/(n·T) (10, so θ = 1/(5n)).
    """

    name = "w-choices"
    _head_to_all = True
