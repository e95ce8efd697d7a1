"""Fang et al.'s mixed routing: consistent hash plus a bounded routing table (``llfd``,
``mintable``, ``minmig``, ``mixed``).

J. Fang, R. Zhang, T. Z. J. Fu, Z. Zhang, A. Zhou, J. Zhu, "Parallel Stream Processing Against
Workload Skewness and Variance" (arXiv 1610.05121), notes in ``shared/notes/mixed.md``.

Routing (§2, Eq. 1): a key goes to ``A(k)`` if the routing table ``A`` holds it, else to its
consistent-hash worker ``h(k)`` (:class:`operators.ring.HashRing`, the paper's base hash in every
experiment). ``A`` only holds keys with ``A(k) != h(k)`` and at most ``R_max`` of them
(``max_table_size``). Each source counts, per interval, how often it saw every key (a compiled
open-addressing table over :meth:`KeyBatch.key_ids`, so statistics cost little more than the
lookup); the controller merges those counts into :class:`KeyStatistics` (frequency ``g``,
cost ``c``, window state ``S(k, w)``) and calls :meth:`FangScheme.plan`, which rebuilds ``A``
by the paper's three-phase workflow (§3):

* Phase I, *cleaning*: virtually move ``n`` table entries back to ``h(k)``.
* Phase II, *preparing*: take keys off every overloaded worker, in the order of a criterion Φ,
  into the candidate set ``C``.
* Phase III, *assigning*: LLFD (Algorithm 1) places ``C``, in Φ order, on the least-loaded
  worker whose ``Adjust`` accepts, which may swap lighter keys (the exchangeable set ``E``)
  back into ``C``.

The four schemes differ only in Phase I and Φ (§3.2, §3.3):

============ =========================================== ===========================
scheme       Phase I (cleaning)                          Φ (Phases II and III)
============ =========================================== ===========================
``llfd``     none (Fig. 4, left: "LLFD directly applied") cost ``c``, largest first
``mintable`` all entries (Algorithm 2)                   cost ``c``, largest first
``minmig``   none (Algorithm 3)                          ``γ``, largest first
``mixed``    ``n`` entries, smallest ``S`` first (Alg. 4) ``γ``, largest first
============ =========================================== ===========================

The extraction of the paper lost every formula; these are the choices made here (each is
tested in ``tests/unit/test_fang.py``):

1. **Balance (§2.1, §5).** θ(d) = (L(d) - L̄) / L̄, one-sided; a worker is *overloaded* iff
   ``L(d) > (1 + θ_max)·L̄`` and a plan is ``feasible`` iff no worker is overloaded, i.e. the
   paper's "workload skewness" max/avg is at most ``1 + θ_max``. (The §5 "max over min" reading
   cannot give θ_max = 0 for absolute balance.) A relative slack of 1e-9 absorbs float rounding.
2. **Loads** are ``L(d) = Σ_{F(k)=d} c(k)`` over the tracked keys (§2.1); our statistics track
   every key, so this equals the records each worker received.
3. **State (§2.1).** ``s_i(k) = g_i(k)``: a key's window state is the tuples it kept in each of
   the last ``w`` intervals (the sliding-window join of §5), so ``S(k, w)`` sums the last ``w``
   interval counts. With ``w = 1`` this gives ``S = c``, which is what makes the §3.2 example's
   "γ(k) = γ(k') = 1 for equal weights" hold.
4. **γ (§3.2).** ``γ(k) = c(k)^β / S(k, w)`` (β = 1.5 default, Table 2): cost per unit of state,
   β > 1 leaning towards cost (larger β, smaller table, App. C). ``S = 0`` gives γ = ∞ (free to
   move) unless ``c = 0`` too (γ = 0).
5. **Orders and ties.** Every order is stable: ties keep the statistics' order (ascending key
   id); workers tie to the lower index, as Fig. 4's "d1 has less total workload" at 9 vs 9.
6. **Phase II stopping rule (§2.1).** Per overloaded worker, remove keys in Φ order until it is
   no longer overloaded (the §2.2 example removes k1 only). Zero-cost keys are never taken.
7. **LLFD (Algorithm 1).** ``C`` is processed in Φ order (§3.3: Φ "applied by LLFD in the last
   phase"); keys ``E`` returns to ``C`` join that order. ``Adjust(k, d)`` accepts at once if
   ``L(d) + c(k) <= bound``; otherwise it walks d's keys in Φ order, taking each with
   ``0 < c(k') < c(k)`` (condition ii) that was on ``d`` when LLFD started and has not been
   displaced since (condition i), until ``L(d) + c(k) - ΣE <= bound`` (condition iii); if the
   walk ends short, ``Adjust`` is FALSE and nothing moves. Keys placed by LLFD are never
   displaced again, which also makes LLFD terminate. If every worker refuses ``k``, ``k`` goes
   to the least-loaded worker (Algorithm 5's rule) and the plan reports the fallback.
8. **Mixed's n (Algorithm 4, Line 10).** Trials start at ``n = 0`` (MinMig) and
   accumulate ``n ← n + (|A'| - R_max)``. When ``n`` would reach the whole table, or after
   ``max_trials`` trials, Mixed *degenerates to MinTable* (§5, App. B) and runs it.
9. **R_max is a hard cap here.** The paper lets LLFD and MinMig, and a degenerate Mixed, exceed
   R_max; the live router cannot, so any plan with ``|A'| > R_max`` keeps the ``R_max`` entries
   of largest cost and sends the rest back to ``h(k)`` (``details["capped"]``). ``feasible`` is
   then judged on the capped assignment.
10. **Trigger (§4 step 2).** If no worker is overloaded and the table fits, ``plan`` keeps the
    current assignment (``details["triggered"] = False``).
11. **Dead entries.** Entries for keys absent from the statistics have no state left in the
    window and no load; they are dropped at no migration cost -- and listed in ``moved_keys``
    (their worker changes back to ``h(k)``), so that a live migration moves whatever state an
    event-time window longer than the interval still holds for them.
12. **No compact representation (§4.1) or discretization (§4.2).** The exact per-key planner
    is compiled (numba) and plans 10^6 keys on 10 workers well under the paper's 0.6 s, so the
    approximation (≤ 1 % load error in Fig. 11b) buys nothing here.

Example (the §2.2 / Fig. 4 worked example, keys k1..k6 with costs 7, 4, 5, 2, 1, 1; hash puts
k1, k2, k6 on worker 0; the old table sends k3 to 0 and k6 to 1):
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
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numba
import numpy as np

from operators.base import KeyStatistics, Plan, RoutingTable, SchemeError, TableScheme
from operators.keys import KeyBatch
from operators.ring import HashRing

Strategy = Literal["llfd", "mintable", "minmig", "mixed"]
STRATEGIES: tuple[str, ...] = ("llfd", "mintable", "minmig", "mixed")

#: Relative slack on the balance bound, so float sums of integral costs do not flip a decision.
BOUND_SLACK = 1e-9
#: Initial slots of a source's per-interval key counter (a power of two; it doubles as needed).
_COUNTER_SLOTS = 1 << 12


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
        pos = key & mask
        while counts[pos] != 0 and slots[pos] != key:
            pos = (pos + 1) & mask
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
