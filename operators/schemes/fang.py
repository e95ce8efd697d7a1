"""Fang et al.'s mixed routing: consistent hash plus a bounded routing table (``llfd``,
``mintable``, ``minmig``, ``mixed``).

Layer: operators. Fang et al., "Parallel Stream Processing Against Workload Skewness and
Variance" (2017), §2, Eq. 1: a key goes to ``A(k)`` if the routing table ``A`` holds it, else to
its consistent-hash worker ``h(k)`` (:class:`operators.ring.HashRing`); ``A`` holds at most
``R_max`` keys (``max_table_size``). Each source counts its keys per interval; the controller
merges the counts into :class:`KeyStatistics` and :meth:`FangScheme.plan` rebuilds ``A`` by the
paper's three-phase workflow (§3, :mod:`operators.schemes.fang_rebalance`). The four schemes
differ only in Phase I (cleaning) and the order Φ (§3.2, §3.3); the table of them and every
choice where the paper lost a formula: docs/schemes.md#fang.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> scheme = Mixed(2, theta_max=0.0, max_table_size=4, replicas=10)
    >>> keys = KeyBatch.from_ints(np.array([1] * 6 + [2] * 3 + [3] * 2 + [4], np.int64))
    >>> _ = scheme.route(keys)
    >>> plan = scheme.plan(scheme.statistics())
    >>> scheme.install(plan.table)
    >>> np.bincount(scheme.route(keys), minlength=2).tolist()
    [6, 6]
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numba
import numpy as np

from operators.base import KeyStatistics, Plan, RoutingTable, SchemeError, TableScheme
from operators.keys import KeyBatch, probe_slot
from operators.ring import HashRing
from operators.schemes.fang_rebalance import (
    BOUND_SLACK,
    STRATEGIES,
    Rebalanced,
    Strategy,
    _imbalance,
    balance_bound,
    migration_priority,
    rebalance,
)

__all__ = [
    "BOUND_SLACK",
    "STRATEGIES",
    "FangScheme",
    "Llfd",
    "MinMig",
    "MinTable",
    "Mixed",
    "Rebalanced",
    "balance_bound",
    "migration_priority",
    "rebalance",
]

_COUNTER_SLOTS = 1 << 12


@numba.njit(cache=True)
def _count_keys(
    slots: np.ndarray,
    counts: np.ndarray,
    n_used: int,
    key_ids: np.ndarray,
    weights: np.ndarray,
    start: int,
) -> tuple[int, int]:
    """Adds ``weights[i]`` (1 if ``weights`` is empty) to ``key_ids[i]``'s count, from ``start``,
    in an open-addressing table (linear probing; ``counts == 0`` marks a free slot). Key ids
    are MurmurHash3 values, so their low bits index the table directly. Stops before the table
    gets half full and returns (next index, slots used) so the caller can grow it."""
    mask = slots.shape[0] - 1
    for i in range(start, key_ids.shape[0]):
        key = key_ids[i]
        pos = probe_slot(slots, counts, 0, key, key & mask)
        if counts[pos] == 0:
            if 2 * (n_used + 1) > slots.shape[0]:
                return i, n_used
            slots[pos] = key
            n_used += 1
        counts[pos] += 1 if weights.shape[0] == 0 else weights[i]
    return key_ids.shape[0], n_used


class _KeyCounter:
    """Records per key id over one interval: the cheap half of a source's statistics."""

    _ONES = np.empty(0, dtype=np.int64)

    def __init__(self, slots: int | None = None) -> None:
        self.slots = np.zeros(slots or _COUNTER_SLOTS, dtype=np.int64)
        self.counts = np.zeros(slots or _COUNTER_SLOTS, dtype=np.int64)
        self.used = 0

    def add(self, key_ids: np.ndarray, weights: np.ndarray = _ONES) -> None:
        done = 0
        while done < key_ids.shape[0]:
            done, self.used = _count_keys(
                self.slots, self.counts, self.used, key_ids, weights, done
            )
            if done < key_ids.shape[0]:
                self._grow()

    def _grow(self) -> None:
        occupied = self.counts != 0
        keys, counts = self.slots[occupied], self.counts[occupied]
        size = 2 * self.slots.shape[0]
        self.slots = np.zeros(size, dtype=np.int64)
        self.counts = np.zeros(size, dtype=np.int64)
        self.used = 0
        self.add(keys, counts)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ascending key ids, counts as float64)."""
        occupied = self.counts != 0
        keys, counts = self.slots[occupied], self.counts[occupied]
        order = np.argsort(keys)
        return keys[order], counts[order].astype(np.float64)


class FangScheme(TableScheme):
    """Consistent hash plus a routing table of at most ``max_table_size`` entries (Eq. 1).

    Args:
        theta_max: θ_max, tolerated relative overload of a worker (choice 1; Table 2: 0.08).
        max_table_size: R_max, the most entries the routing table may hold (Table 2's "310",
            read as 3×10^3); ``None`` leaves it unbounded.
        window: w, intervals of state a key keeps (§2.1; the experiments use 1 and 5).
        replicas: virtual nodes per worker on the consistent-hash ring.
    """

    strategy: ClassVar[Strategy]

    def __init__(
        self,
        n_workers: int,
        *,
        theta_max: float = 0.08,
        max_table_size: int | None = 3000,
        window: int = 1,
        replicas: int = 100,
        **base: Any,
    ) -> None:
        super().__init__(n_workers, **base)
        if not float(theta_max) >= 0.0:
            raise SchemeError(f"{self.name}: theta_max must be >= 0, got {theta_max}")
        if max_table_size is not None and int(max_table_size) < 0:
            raise SchemeError(f"{self.name}: max_table_size must be >= 0, got {max_table_size}")
        if int(window) < 1:
            raise SchemeError(f"{self.name}: window must be >= 1 interval, got {window}")
        if int(replicas) < 1:
            raise SchemeError(f"{self.name}: replicas must be >= 1, got {replicas}")
        self.theta_max = float(theta_max)
        self.max_table_size = None if max_table_size is None else int(max_table_size)
        self.window = int(window)
        self.replicas = int(replicas)
        self.ring = HashRing(range(self.n_workers), replicas=self.replicas, seed=self.seed)
        self._counter = _KeyCounter()
        self._loads = np.zeros(self.n_workers, dtype=np.int64)
        self._records = 0
        # The last w - 1 closed intervals' (key ids, counts), oldest first.
        self._history: list[tuple[np.ndarray, np.ndarray]] = []

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "theta_max": self.theta_max,
            "max_table_size": self.max_table_size,
            "window": self.window,
            "replicas": self.replicas,
        }

    def base_workers_of_ids(self, key_ids: np.ndarray) -> np.ndarray:
        return self.ring.owners(np.asarray(key_ids, dtype=np.int64))

    @property
    def tolerance(self) -> float:
        return self.theta_max

    def measured_imbalance(self, worker_loads: np.ndarray) -> float:
        """θ = (L_max − L̄)/L̄ (choice 1: one-sided; 0 for an idle system)."""
        return _imbalance(np.asarray(worker_loads, dtype=np.float64)) - 1.0

    def within_tolerance(self, worker_loads: np.ndarray) -> bool:
        """L_max <= (1 + θ_max)·L̄, the very test :func:`rebalance` triggers on."""
        loads = np.asarray(worker_loads, dtype=np.float64)
        bound = balance_bound(float(loads.sum()), self.n_workers, self.theta_max)
        return float(loads.max(initial=0.0)) <= bound

    def route(self, keys: KeyBatch) -> np.ndarray:
        key_ids = keys.key_ids()
        workers = self.table.apply(key_ids, self.ring.owners(key_ids))
        self._loads += np.bincount(workers, minlength=self.n_workers)
        self._records += len(keys)
        self._counter.add(key_ids)
        return workers

    def statistics(self, reset: bool = True) -> KeyStatistics:
        """g, c (= g: one cost unit per record) and S(k, w) for every key with window state."""
        ids, counts = self._counter.items()
        key_ids, state = _sum_counts([*self._history, (ids, counts)])
        frequency = np.zeros(key_ids.shape[0])
        frequency[np.searchsorted(key_ids, ids)] = counts
        stats = KeyStatistics(
            key_ids=key_ids,
            frequency=frequency,
            cost=frequency.copy(),
            state_size=state,
            worker_loads=self._loads.copy(),
            records=self._records,
        )
        if reset:
            history = [*self._history, (ids, counts)]
            self._history = history[max(0, len(history) - (self.window - 1)) :]
            # Start the next interval at this one's size: the key population rarely shrinks.
            self._counter = _KeyCounter(self._counter.slots.shape[0])
            self._loads = np.zeros(self.n_workers, dtype=np.int64)
            self._records = 0
        return stats

    def _rebalance_options(self) -> dict[str, Any]:
        return {}

    def plan(self, stats: KeyStatistics) -> Plan:
        """Phases I-III on merged ``stats`` and the current table; pure (installs nothing)."""
        started = time.perf_counter()
        key_ids = np.asarray(stats.key_ids, dtype=np.int64)
        hashed = self.ring.owners(key_ids)
        current = self.table.apply(key_ids, hashed)
        state = np.asarray(stats.state_size, dtype=np.float64)
        result = rebalance(
            np.asarray(stats.cost, dtype=np.float64),
            state,
            current,
            hashed,
            self.n_workers,
            theta_max=self.theta_max,
            strategy=self.strategy,
            max_table_size=self.max_table_size,
            **self._rebalance_options(),
        )
        in_table = result.assignment != hashed
        moved = result.assignment != current
        table = RoutingTable(
            key_ids[in_table], result.assignment[in_table], version=self.table.version + 1
        )
        before = np.bincount(current, weights=stats.cost, minlength=self.n_workers)
        # Dead entries (choice 11) go back to their hash worker: moved, at no cost.
        unseen = np.setdiff1d(self.table.key_ids, key_ids, assume_unique=True)
        return Plan(
            table=table,
            moved_keys=np.concatenate([key_ids[moved], unseen]),
            migration_cost=float(state[moved].sum()),
            feasible=result.feasible,
            planning_seconds=time.perf_counter() - started,
            details={
                "strategy": self.strategy,
                "triggered": result.triggered,
                "bound": result.bound,
                "loads_before": before,
                "loads_after": result.loads,
                "imbalance_before": _imbalance(before),
                "imbalance_after": _imbalance(result.loads),
                "table_entries": len(table),
                "total_state": float(state.sum()),
                "trials": result.trials,
                "degenerated": result.degenerated,
                "capped": result.capped,
                "candidates": result.candidates,
                "displaced": result.displaced,
                "fallbacks": result.fallbacks,
            },
        )


def _sum_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-key sums of several (key ids, counts) pairs, as (sorted unique ids, sums)."""
    parts = [p for p in parts if p[0].shape[0]]
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    if len(parts) == 1:
        return parts[0][0], parts[0][1].astype(np.float64)
    ids, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    sums = np.bincount(inverse, weights=np.concatenate([p[1] for p in parts]), minlength=ids.size)
    return ids, sums


class Llfd(FangScheme):
    """LLFD applied directly (Algorithm 1, Fig. 4 left): no cleaning, cost order."""

    name = "llfd"
    strategy = "llfd"


class MinTable(FangScheme):
    """MinTable (Algorithm 2): move every entry back, then rebalance by cost."""

    name = "mintable"
    strategy = "mintable"


class _PriorityScheme(FangScheme):
    """Schemes ordered by γ = c^β / S (§3.2); adds ``beta``."""

    def __init__(self, n_workers: int, *, beta: float = 1.5, **base: Any) -> None:
        super().__init__(n_workers, **base)
        if not float(beta) >= 0.0:
            raise SchemeError(f"{self.name}: beta must be >= 0, got {beta}")
        self.beta = float(beta)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "beta": self.beta}

    def _rebalance_options(self) -> dict[str, Any]:
        return {"beta": self.beta}


class MinMig(_PriorityScheme):
    """MinMig (Algorithm 3): no cleaning, largest γ first."""

    name = "minmig"
    strategy = "minmig"


class Mixed(_PriorityScheme):
    """Mixed (Algorithm 4): clean the ``n`` smallest-state entries, n grown by each trial's
    overrun of R_max (choice 8), then MinMig's Phases II-III."""

    name = "mixed"
    strategy = "mixed"

    def __init__(self, n_workers: int, *, max_trials: int = 10, **base: Any) -> None:
        super().__init__(n_workers, **base)
        if int(max_trials) < 1:
            raise SchemeError(f"{self.name}: max_trials must be >= 1, got {max_trials}")
        self.max_trials = int(max_trials)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "max_trials": self.max_trials}

    def _rebalance_options(self) -> dict[str, Any]:
        return {"beta": self.beta, "max_trials": self.max_trials}
