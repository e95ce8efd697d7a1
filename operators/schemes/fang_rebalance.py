"""Fang et al.'s planner: the three-phase workflow that rebuilds a bounded routing table.

Layer: operators. Fang et al., "Parallel Stream Processing Against Workload Skewness and
Variance" (2017), §3: Phase I cleans ``n`` entries, Phase II takes keys off every overloaded
worker in the order of a criterion Φ, Phase III places them with LLFD (Algorithm 1).
:func:`rebalance` runs one strategy (``llfd``, ``mintable``, ``minmig``, ``mixed``);
:mod:`operators.schemes.fang` wraps it as schemes. The choices where the paper lost its
formulas (balance, loads, state, γ, ties, stopping rules, R_max): docs/schemes.md#fang.

Example (§2.2 / Fig. 4, keys k1..k6 with costs 7, 4, 5, 2, 1, 1; the hash puts k1, k2, k6 on
worker 0; the old table sends k3 to 0 and k6 to 1):
    >>> import numpy as np
    >>> cost = np.array([7.0, 4, 5, 2, 1, 1])
    >>> hashed = np.array([0, 0, 1, 1, 1, 0])
    >>> current = np.array([0, 0, 0, 1, 1, 1])
    >>> llfd = rebalance(cost, cost, current, hashed, 2, theta_max=0.0, strategy="llfd")
    >>> llfd.assignment.tolist(), llfd.loads.tolist()
    ([1, 0, 0, 1, 0, 1], [10.0, 10.0])
    >>> int(np.sum(llfd.assignment != hashed))  # table size: Fig. 4 says four entries
    4
    >>> mintable = rebalance(cost, cost, current, hashed, 2, theta_max=0.0, strategy="mintable")
    >>> int(np.sum(mintable.assignment != hashed))  # ... and two after MinTable's cleaning
    2
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numba
import numpy as np

Strategy = Literal["llfd", "mintable", "minmig", "mixed"]
STRATEGIES: tuple[str, ...] = ("llfd", "mintable", "minmig", "mixed")

#: Relative slack on the balance bound, so float sums of integral costs do not flip a decision.
BOUND_SLACK = 1e-9
#: Initial slots of a source's per-interval key counter (a power of two; it doubles as needed).


def balance_bound(loads_total: float, n_workers: int, theta_max: float) -> float:
    """The largest load a worker may carry: ``(1 + θ_max)·L̄``, plus float slack (choice 1)."""
    bound = (1.0 + theta_max) * loads_total / n_workers
    return bound + BOUND_SLACK * max(bound, 1.0)


def migration_priority(cost: np.ndarray, state: np.ndarray, beta: float) -> np.ndarray:
    """γ(k) = c(k)^β / S(k, w) (§3.2, choice 4): cost per unit of state, ∞ for stateless keys."""
    cost = np.asarray(cost, dtype=np.float64)
    state = np.asarray(state, dtype=np.float64)
    weighted = np.power(cost, beta)
    gamma = np.full(cost.shape, np.inf)
    np.divide(weighted, state, out=gamma, where=state > 0)
    gamma[(state <= 0) & (cost <= 0)] = 0.0
    return gamma


def _descending(values: np.ndarray) -> np.ndarray:
    """Indices by value, largest first; ties keep index order (choice 5)."""
    return np.argsort(-values, kind="stable").astype(np.int64)


@numba.njit(cache=True)
def _group_by_worker(
    order: np.ndarray, assign: np.ndarray, n_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Keys of ``order`` that sit on a worker, grouped by worker, ``order`` kept within each."""
    start = np.zeros(n_workers + 1, dtype=np.int64)
    for i in range(order.shape[0]):
        worker = assign[order[i]]
        if worker >= 0:
            start[worker + 1] += 1
    for worker in range(n_workers):
        start[worker + 1] += start[worker]
    fill = start[:n_workers].copy()
    members = np.empty(start[n_workers], dtype=np.int64)
    for i in range(order.shape[0]):
        key = order[i]
        worker = assign[key]
        if worker >= 0:
            members[fill[worker]] = key
            fill[worker] += 1
    return members, start


@numba.njit(cache=True)
def _prepare(
    phi_order: np.ndarray, cost: np.ndarray, assign: np.ndarray, loads: np.ndarray, bound: float
) -> np.ndarray:
    """Phase II: disassociate keys in Φ order from each overloaded worker until it fits."""
    overloaded = 0
    for worker in range(loads.shape[0]):
        if loads[worker] > bound:
            overloaded += 1
    taken = np.empty(phi_order.shape[0], dtype=np.int64)
    n_taken = 0
    for i in range(phi_order.shape[0]):
        if overloaded == 0:
            break
        key = phi_order[i]
        worker = assign[key]
        if worker < 0 or cost[key] <= 0.0 or loads[worker] <= bound:
            continue
        loads[worker] -= cost[key]
        assign[key] = -1
        taken[n_taken] = key
        n_taken += 1
        if loads[worker] <= bound:
            overloaded -= 1
    return taken[:n_taken]


@numba.njit(cache=True)
def _llfd(
    candidates: np.ndarray,
    phi_order: np.ndarray,
    cost_order: np.ndarray,
    cost: np.ndarray,
    assign: np.ndarray,
    loads: np.ndarray,
    bound: float,
) -> tuple[int, int]:
    """Phase III, Algorithm 1 (choice 7). Updates ``assign`` and ``loads``; returns
    (keys displaced by Adjust, keys placed by the least-loaded fallback)."""
    n_keys = cost.shape[0]
    n_workers = loads.shape[0]
    phi_rank = np.empty(n_keys, dtype=np.int64)
    for r in range(n_keys):
        phi_rank[phi_order[r]] = r
    # Condition (i): only keys on d when LLFD starts may be displaced, each at most once.
    members, start = _group_by_worker(phi_order, assign, n_workers)
    displaceable = np.zeros(n_keys, dtype=np.bool_)
    for i in range(members.shape[0]):
        displaceable[members[i]] = True
    head = start[:n_workers].copy()
    # Static per-worker totals of cheaper keys: an upper bound that rejects hopeless Adjusts
    # without walking d's keys.
    by_cost, cost_start = _group_by_worker(cost_order, assign, n_workers)
    cost_prefix = np.zeros(by_cost.shape[0] + 1)
    for i in range(by_cost.shape[0]):
        cost_prefix[i + 1] = cost_prefix[i] + cost[by_cost[i]]

    heap = [phi_rank[candidates[i]] for i in range(candidates.shape[0])]
    heapq.heapify(heap)
    tried = np.empty(n_workers, dtype=np.int64)
    exchange = np.empty(n_keys, dtype=np.int64)
    displaced = 0
    fallbacks = 0
    while len(heap) > 0:
        key = phi_order[heapq.heappop(heap)]
        c = cost[key]
        # Workers by (load, index), ascending: insertion sort, n_workers is small.
        for j in range(n_workers):
            w = j
            i = j - 1
            while i >= 0 and loads[tried[i]] > loads[w]:
                tried[i + 1] = tried[i]
                i -= 1
            tried[i + 1] = w
        placed = False
        for j in range(n_workers):
            worker = tried[j]
            if loads[worker] + c <= bound:
                placed = True
            else:
                need = loads[worker] + c - bound
                lo = cost_start[worker]
                hi = cost_start[worker + 1]
                while lo < hi:  # first position whose cost is < c (costs descend)
                    mid = (lo + hi) // 2
                    if cost[by_cost[mid]] < c:
                        hi = mid
                    else:
                        lo = mid + 1
                if cost_prefix[cost_start[worker + 1]] - cost_prefix[lo] < need:
                    continue
                end = start[worker + 1]
                h = head[worker]
                while h < end and not displaceable[members[h]]:
                    h += 1
                head[worker] = h
                found = 0.0
                n_exchange = 0
                while h < end and found < need:
                    other = members[h]
                    if displaceable[other] and 0.0 < cost[other] < c:
                        found += cost[other]
                        exchange[n_exchange] = other
                        n_exchange += 1
                    h += 1
                if found < need:
                    continue
                for i in range(n_exchange):
                    other = exchange[i]
                    displaceable[other] = False
                    assign[other] = -1
                    loads[worker] -= cost[other]
                    heapq.heappush(heap, phi_rank[other])
                displaced += n_exchange
                placed = True
            if placed:
                assign[key] = worker
                loads[worker] += c
                break
        if not placed:
            worker = tried[0]
            assign[key] = worker
            loads[worker] += c
            fallbacks += 1
    return displaced, fallbacks


@dataclass
class Rebalanced:
    """The outcome of :func:`rebalance`: the new assignment F'(k) and how it was found."""

    #: F'(k) per key (int32); the table is every key with ``assignment != hashed``.
    assignment: np.ndarray
    #: Predicted load per worker under ``assignment``.
    loads: np.ndarray
    #: ``(1 + θ_max)·L̄`` plus slack.
    bound: float
    #: No worker above ``bound``.
    feasible: bool
    #: The balance was violated or the table too large, so a new assignment was computed.
    triggered: bool
    #: Mixed's trials as (n entries cleaned, resulting table size); one entry for the others.
    trials: list[tuple[int, int]] = field(default_factory=list)
    #: Mixed fell back to MinTable (choice 8).
    degenerated: bool = False
    #: Entries dropped to respect R_max (choice 9).
    capped: int = 0
    #: Size of the candidate set after Phase II, keys displaced by Adjust, fallback placements.
    candidates: int = 0
    displaced: int = 0
    fallbacks: int = 0


def _trial(
    n_clean: int,
    clean_order: np.ndarray,
    phi_order: np.ndarray,
    cost_order: np.ndarray,
    cost: np.ndarray,
    current: np.ndarray,
    hashed: np.ndarray,
    n_workers: int,
    bound: float,
) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """One pass of Phases I-III; returns (assignment, loads, |C|, displaced, fallbacks)."""
    assign = current.astype(np.int64)
    cleaned = clean_order[:n_clean]
    assign[cleaned] = hashed[cleaned]
    loads = np.bincount(assign, weights=cost, minlength=n_workers).astype(np.float64)
    candidates = _prepare(phi_order, cost, assign, loads, bound)
    displaced, fallbacks = _llfd(candidates, phi_order, cost_order, cost, assign, loads, bound)
    return assign, loads, int(candidates.shape[0]), int(displaced), int(fallbacks)


def rebalance(
    cost: np.ndarray,
    state: np.ndarray,
    current: np.ndarray,
    hashed: np.ndarray,
    n_workers: int,
    *,
    theta_max: float,
    strategy: Strategy,
    max_table_size: int | None = None,
    beta: float = 1.5,
    max_trials: int = 10,
) -> Rebalanced:
    """A new assignment for keys with costs ``cost`` and window state ``state``.

    ``current`` is F(k) (the worker each key is on now) and ``hashed`` is h(k); the routing
    table is implied: every key with ``current != hashed``. Pure: the inputs are not modified.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    state = np.ascontiguousarray(state, dtype=np.float64)
    current = np.ascontiguousarray(current, dtype=np.int64)
    hashed = np.ascontiguousarray(hashed, dtype=np.int64)
    loads = np.bincount(current, weights=cost, minlength=n_workers).astype(np.float64)
    bound = balance_bound(float(cost.sum()), n_workers, theta_max)
    entries = np.flatnonzero(current != hashed)
    fits = max_table_size is None or entries.shape[0] <= max_table_size
    if loads.max(initial=0.0) <= bound and fits:
        return Rebalanced(current.astype(np.int32), loads, bound, True, False)

    cost_order = _descending(cost)
    phi_order = cost_order
    if strategy in ("minmig", "mixed"):
        phi_order = _descending(migration_priority(cost, state, beta))
    # Phase I order: Mixed moves back the entries of smallest state first (Φ1).
    clean_order = entries[np.argsort(state[entries], kind="stable")]

    def run(n_clean: int, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        return _trial(
            n_clean, clean_order, order, cost_order, cost, current, hashed, n_workers, bound
        )

    degenerated = False
    trials: list[tuple[int, int]] = []
    if strategy == "mintable":
        n_clean = entries.shape[0]
        result = run(n_clean, phi_order)
        trials.append((n_clean, int(np.sum(result[0] != hashed))))
    elif strategy != "mixed" or max_table_size is None:
        result = run(0, phi_order)
        trials.append((0, int(np.sum(result[0] != hashed))))
    else:
        n_clean = 0
        while True:
            result = run(n_clean, phi_order)
            size = int(np.sum(result[0] != hashed))
            trials.append((n_clean, size))
            if size <= max_table_size:
                break
            n_clean += size - max_table_size
            if n_clean >= entries.shape[0] or len(trials) >= max_trials:
                degenerated = True
                result = run(entries.shape[0], cost_order)
                trials.append((int(entries.shape[0]), int(np.sum(result[0] != hashed))))
                break

    assign, loads, n_candidates, displaced, fallbacks = result
    capped = 0
    if max_table_size is not None:
        table_keys = np.flatnonzero(assign != hashed)
        if table_keys.shape[0] > max_table_size:
            keep_order = table_keys[np.argsort(-cost[table_keys], kind="stable")]
            dropped = keep_order[max_table_size:]
            assign[dropped] = hashed[dropped]
            capped = int(dropped.shape[0])
            loads = np.bincount(assign, weights=cost, minlength=n_workers).astype(np.float64)
    return Rebalanced(
        assignment=assign.astype(np.int32),
        loads=loads,
        bound=bound,
        feasible=bool(loads.max(initial=0.0) <= bound),
        triggered=True,
        trials=trials,
        degenerated=degenerated,
        capped=capped,
        candidates=n_candidates,
        displaced=displaced,
        fallbacks=fallbacks,
    )


def _imbalance(loads: np.ndarray) -> float:
    """max/avg (the paper's "workload skewness", §5); 1.0 for an idle system."""
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0
