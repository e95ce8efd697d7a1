"""Gedik's partitioning functions: ``scan``, ``redist`` and ``readj``.

Layer: operators. Gedik, "Partitioning Functions for Stateful Data Parallelism in Stream
Processing", VLDB Journal 2014: a function ``<H_p, H_c>`` (§4.1, Alg. 1) is an explicit map
for the keys of frequency ``>= delta`` looked up first, and a consistent hash (1000 replicas
per channel, §5.5) for every other key; :meth:`GedikScheme.plan` rebuilds the map with one of
the three heuristics of §4.2 (kernels in :mod:`operators.schemes.gedik_construction`).
``plan(stats, n_workers=N)`` then ``resize(N, plan.table)`` changes the number of channels.
What a Plan reports and the choices where the paper is ambiguous: docs/schemes.md#gedik.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> scheme = Redist(2, epsilon=0.001, replicas=100)
    >>> keys = KeyBatch.from_ints(np.array([1] * 50 + [2] * 30 + list(range(3, 23)), np.int64))
    >>> _ = scheme.route(keys)
    >>> plan = scheme.plan(scheme.statistics(), n_workers=3)
    >>> len(plan.table), plan.details["n_workers"], plan.feasible
    (22, 3, False)
    >>> scheme.resize(3, plan.table)
    >>> sorted(set(scheme.route(keys).tolist()))
    [0, 1, 2]
"""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar

import numpy as np

from operators.base import KeyStatistics, Plan, RoutingTable, SchemeError, TableScheme
from operators.keys import KeyBatch
from operators.ring import HashRing
from operators.schemes.gedik_construction import (
    UTILITIES,
    Construction,
    readj,
    redist,
    scan,
)
from operators.sketches.lossy_counting import LossyCounter, SlidingLossyCounter

#: Resource functions beta: Constant (1), Linear (x), Quadratic (x^2).
RESOURCE_FUNCTIONS = "CLQ"
#: Ring positions sampled to estimate arc shares (untracked load, its migration on a resize).
_ARC_SAMPLES = 1 << 16


def imbalance_allowance(alpha: float, n_workers: int) -> float:
    """theta_k of Eq. 15: the allowed deviation from the mean load, as a fraction of it."""
    if n_workers <= 1:
        return 0.0
    return (alpha - 1.0) / (1.0 + alpha / (n_workers - 1))


def resource_load(frequency: np.ndarray, kind: str) -> np.ndarray:
    """beta(f) for a resource function ``"C"``, ``"L"`` or ``"Q"`` (§3.1)."""
    frequency = np.asarray(frequency, dtype=np.float64)
    if kind == "C":
        return np.ones_like(frequency)
    if kind == "L":
        return frequency.copy()
    return frequency * frequency


class GedikScheme(TableScheme):
    """Consistent hash + explicit map, re-planned by one of Gedik's heuristics (see module doc).

    Args:
        alpha: tolerated max/min load ratio, the same for every resource (§3.1; > 1).
        sigma: share of the allowed imbalance left to untracked keys (§4.1.4; in (0, 1]).
        epsilon: lossy-counting error; default ``delta/10`` at this channel count.
        resources: beta_s, beta_c, beta_n as three letters of ``C``/``L``/``Q``; beta_n is ``L``.
        utility: ``A``, ``APM``, ``APLM``, ``ATM`` or ``ATLM`` (§4.3).
        replicas: ring points per channel (§5.5: 1000).
        window: ``W`` for the 3-counter sliding window, or None for one counter per interval.
        domain_size: ``|D|``, required when a resource is quadratic (Eq. 17).
    """

    keeps_key_on_one_worker = True
    #: Which construction heuristic :meth:`plan` runs.
    algorithm: ClassVar[str]

    def __init__(
        self,
        n_workers: int,
        *,
        alpha: float = 1.2,
        sigma: float = 0.1,
        epsilon: float | None = None,
        resources: str = "LCL",
        utility: str = "APM",
        replicas: int = 1000,
        window: int | None = None,
        domain_size: int | None = None,
        **base: Any,
    ) -> None:
        super().__init__(n_workers, **base)
        self.alpha = float(alpha)
        self.sigma = float(sigma)
        self.resources = str(resources).upper()
        self.utility = str(utility).upper()
        self.replicas = int(replicas)
        self.window = None if window is None else int(window)
        self.domain_size = None if domain_size is None else int(domain_size)
        if not self.alpha > 1.0:
            raise SchemeError(f"{self.name}: alpha must be > 1, got {alpha}")
        if not 0.0 < self.sigma <= 1.0:
            raise SchemeError(f"{self.name}: sigma must be in (0, 1], got {sigma}")
        if (
            len(self.resources) != 3
            or any(r not in RESOURCE_FUNCTIONS for r in self.resources)
            or self.resources[2] != "L"
        ):
            raise SchemeError(
                f"{self.name}: resources must be three of C/L/Q ending in L, got {resources!r}"
            )
        if self.utility not in UTILITIES:
            raise SchemeError(
                f"{self.name}: utility must be one of {', '.join(UTILITIES)}, got {utility!r}"
            )
        if self.replicas < 1:
            raise SchemeError(f"{self.name}: replicas must be >= 1, got {replicas}")
        if self.window is not None and self.window < 2:
            raise SchemeError(f"{self.name}: window must be >= 2 records, got {window}")
        if "Q" in self.resources and (self.domain_size is None or self.domain_size < 1):
            raise SchemeError(f"{self.name}: quadratic resources need domain_size (|D|)")
        if epsilon is None:
            epsilon = self._eq17_delta(max(self.n_workers, 2)) / 10.0
        self.epsilon = float(epsilon)
        if not 0.0 < self.epsilon < 1.0:
            raise SchemeError(f"{self.name}: epsilon must be in (0, 1), got {epsilon}")
        self._rings: dict[int, HashRing] = {}
        self.ring = self._ring_for(self.n_workers)
        self._sketch: LossyCounter | SlidingLossyCounter = (
            LossyCounter(self.epsilon)
            if self.window is None
            else SlidingLossyCounter(self.window, self.epsilon)
        )

    # -- routing ---------------------------------------------------------------------------------

    def _ring_for(self, n_workers: int) -> HashRing:
        ring = self._rings.get(n_workers)
        if ring is None:
            ring = HashRing(range(n_workers), replicas=self.replicas, seed=self.seed)
            if len(self._rings) >= 4:  # keep the current ring and a few planned ones
                for stale in [n for n in self._rings if n != self.n_workers][:1]:
                    del self._rings[stale]
            self._rings[n_workers] = ring
        return ring

    def lookup(self, key_ids: np.ndarray) -> np.ndarray:
        """Algorithm 1: the explicit map's channel if it has the key, else the ring's."""
        return self.workers_of_ids(key_ids)

    def base_workers_of_ids(self, key_ids: np.ndarray) -> np.ndarray:
        return self.ring.owners(np.asarray(key_ids, dtype=np.int64))

    @property
    def tolerance(self) -> float:
        return self.alpha

    def measured_imbalance(self, worker_loads: np.ndarray) -> float:
        """max/min load of the records (the linear resource's ratio of §3.1; inf when a worker
        is idle while another is not, 1 for an idle system)."""
        loads = np.asarray(worker_loads, dtype=np.float64)
        if loads.size == 0 or float(loads.max()) <= 0:
            return 1.0
        high, low = float(loads.max()), float(loads.min())
        return high / low if low > 0 else math.inf

    def route(self, keys: KeyBatch) -> np.ndarray:
        key_ids = keys.key_ids()
        workers = self.lookup(key_ids)
        self._sketch.update(key_ids, workers)
        return workers

    # -- statistics, planning, adoption ----------------------------------------------------------

    @property
    def counter(self) -> LossyCounter:
        """The lossy counter whose counts :meth:`statistics` reports."""
        return self._sketch if isinstance(self._sketch, LossyCounter) else self._sketch.active

    def statistics(self, reset: bool = True) -> KeyStatistics:
        counter = self.counter
        key_ids, counts, _ = counter.entries()
        loads = np.zeros(self.n_workers, dtype=np.int64)
        seen = counter.label_counts[: self.n_workers]
        loads[: seen.shape[0]] = seen
        frequency = counts.astype(np.float64)
        stats = KeyStatistics(
            key_ids=key_ids,
            frequency=frequency,
            cost=frequency.copy(),
            state_size=frequency.copy(),
            worker_loads=loads,
            records=int(counter.records),
        )
        if reset and isinstance(self._sketch, LossyCounter):
            self._sketch.clear()
        return stats

    def install(self, table: RoutingTable) -> None:
        self._check_table(table, self.n_workers)
        self.table = table

    def resize(self, n_workers: int, table: RoutingTable) -> None:
        """Switch to ``n_workers`` channels and the ``table`` planned for them, at once."""
        n_workers = int(n_workers)
        if n_workers < 1:
            raise SchemeError(f"{self.name}: number of workers must be >= 1, got {n_workers}")
        self._check_table(table, n_workers)
        self.ring = self._ring_for(n_workers)
        self.n_workers = n_workers
        self.table = table

    def _check_table(self, table: RoutingTable, n_workers: int) -> None:
        if len(table) and (table.workers.min() < 0 or table.workers.max() >= n_workers):
            raise SchemeError(f"{self.name}: table names a worker outside 0..{n_workers - 1}")

    def _eq17_delta(self, n_workers: int) -> float:
        """delta of Eq. 17 (before the quadratic post-filter)."""
        theta = imbalance_allowance(self.alpha, n_workers)
        deltas = [1.0]
        for kind in self.resources:
            if kind == "L":
                deltas.append(self.sigma * theta / n_workers)
            elif kind == "Q":
                deltas.append(math.sqrt(self.sigma * theta / (self.domain_size * n_workers)))
        return min(deltas)

    def frequency_threshold(self, n_workers: int, frequency: np.ndarray) -> float:
        """delta for ``n_workers`` channels given the tracked relative frequencies (§4.1.3)."""
        delta = self._eq17_delta(n_workers)
        if "Q" not in self.resources:
            return delta
        theta = imbalance_allowance(self.alpha, n_workers)
        tracked = frequency[frequency >= delta - self.epsilon]
        untracked_keys = max(self.domain_size - tracked.shape[0], 0)
        rest = max(1.0 - float(tracked.sum()), 0.0)
        predicted = float(np.sum(tracked * tracked))
        if untracked_keys:
            predicted += untracked_keys * (rest / untracked_keys) ** 2
        deltas = [1.0, self.sigma * theta / n_workers]  # beta_n is linear
        for kind in self.resources[:2]:
            if kind == "L":
                deltas.append(self.sigma * theta / n_workers)
            elif kind == "Q":
                deltas.append(math.sqrt(self.sigma * theta * predicted / n_workers))
        return min(deltas)

    def plan(self, stats: KeyStatistics, *, n_workers: int | None = None) -> Plan:
        """``p^(t+1)`` for ``n_workers`` channels (default: current) from merged ``stats``; pure."""
        started = time.perf_counter()
        n_new = self.n_workers if n_workers is None else int(n_workers)
        if n_new < 1:
            raise SchemeError(f"{self.name}: number of workers must be >= 1, got {n_new}")
        ring_new = self._ring_for(n_new)
        theta = imbalance_allowance(self.alpha, n_new)

        records = float(stats.records)
        measured = np.stack(
            [np.asarray(stats.frequency, np.float64), np.asarray(stats.state_size, np.float64)],
            axis=1,
        )
        named, measured, in_old = _name_keys(
            np.asarray(stats.key_ids, dtype=np.int64), measured, self.table.key_ids
        )
        f = measured[:, 0] / records if records > 0 else np.zeros(named.shape[0])
        old_workers = self.lookup(named)
        new_ring_workers = ring_new.owners(named)

        delta = self.frequency_threshold(n_new, f) if n_new > 1 else math.inf
        tracked = (f >= delta - self.epsilon) & (f > 0)
        state = resource_load(f, self.resources[0])
        dropped = in_old & ~tracked
        m0 = float(np.sum(state[dropped & (old_workers != new_ring_workers)]))
        m_bar = float(np.sum(state[in_old | tracked])) / n_new

        items = np.flatnonzero(tracked)
        items = items[np.lexsort((named[items], -f[items]))]
        active = [kind for kind in self.resources if kind != "C"]
        ell = np.ascontiguousarray(
            np.stack([resource_load(f[items], kind) for kind in active], axis=1)
        )
        home = old_workers[items].astype(np.int32)
        problem = Construction(
            ell, theta, state[items], f[items], home, new_ring_workers[items], m0, m_bar, n_new,
            UTILITIES.index(self.utility),
        )  # fmt: skip
        if ell.shape[0] == 0:
            assign, m_final, rho = np.empty(0, np.int32), m0, 0.0
        else:
            assign, m_final, rho = self._construct(problem)
        table = RoutingTable(named[items], assign, version=self.table.version + 1)

        new_workers = table.apply(named, new_ring_workers)
        moved = new_workers != old_workers
        positions = _arc_positions()
        arc_old = self.ring.owners(positions)
        arc_new = ring_new.owners(positions)
        arc_moved = float(np.mean(arc_old != arc_new))
        arc_share = np.bincount(arc_new, minlength=n_new) / _ARC_SAMPLES
        untracked = {kind: self._untracked_total(kind, f) for kind in RESOURCE_FUNCTIONS}
        # Eq. 9 in the paper's units (beta_s of relative frequencies) for m and gamma ...
        moved_beta = float(np.sum(state[moved])) + untracked[self.resources[0]] * arc_moved
        total_beta = float(np.sum(state)) + untracked[self.resources[0]]
        # ... and in measured state (records) for migration_cost, as every TableScheme reports
        untracked_records = max(records - float(np.sum(measured[:, 0])), 0.0)
        migration = float(np.sum(measured[moved, 1])) + untracked_records * arc_moved
        b_k: dict[str, float] = {}
        loads_after = np.zeros(n_new)
        for label, kind in zip("scn", self.resources, strict=True):
            if kind == "C":
                continue
            loads = np.bincount(new_workers, weights=resource_load(f, kind), minlength=n_new)
            loads = loads + untracked[kind] * arc_share
            low = float(loads.min())
            ratio = float(loads.max()) / low if low > 0 else math.inf
            b_k[label] = ratio / self.alpha
            if label == "n":  # beta_n is the records' (linear) load: the live balance measure
                loads_after = loads * records
        b = float(np.prod(list(b_k.values())) ** (1.0 / len(b_k)))
        return Plan(
            table=table,
            moved_keys=named[moved],
            migration_cost=migration,
            feasible=all(v <= 1.0 for v in b_k.values()),
            planning_seconds=time.perf_counter() - started,
            details={
                "algorithm": self.name,
                "n_workers": n_new,
                "delta": delta,
                "theta": theta,
                "tracked": int(items.shape[0]),
                "rho": float(rho),
                "gamma": m_final / m_bar if m_bar > 0 else 0.0,
                "M": moved_beta,
                "m": moved_beta / (total_beta / n_new) if total_beta > 0 else 0.0,
                "b": b,
                "b_k": b_k,
                "loads_after": loads_after,
            },
        )

    def _untracked_total(self, kind: str, f: np.ndarray) -> float:
        """Estimated total beta(f) of the keys the statistics do not name (§4.1.3's spread)."""
        rest = max(1.0 - float(f.sum()), 0.0)
        if kind == "L":
            return rest
        unnamed = max((self.domain_size or f.shape[0]) - f.shape[0], 0)
        if kind == "C":
            return float(unnamed)
        return unnamed * (rest / unnamed) ** 2 if unnamed else 0.0

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        """The placement of ``problem``'s keys (one or more): (channel per key, M, rho)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "alpha": self.alpha,
            "sigma": self.sigma,
            "epsilon": self.epsilon,
            "resources": self.resources,
            "utility": self.utility,
            "replicas": self.replicas,
            "window": self.window,
            "domain_size": self.domain_size,
        }


def _name_keys(
    stat_ids: np.ndarray, columns: np.ndarray, old_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys a plan can name (statistics' and old table's), ascending, with their ``columns``
    (zero for keys only in the old table) and whether the old table holds them.

    ``old_ids`` is sorted (a RoutingTable's). Avoids ``np.union1d``, whose hash-based unique is
    the slowest step for 10^6 keys; merged statistics usually arrive sorted already.
    """
    in_old_stats = np.zeros(stat_ids.shape[0], dtype=bool)
    extra = old_ids
    if old_ids.shape[0]:
        position = np.minimum(np.searchsorted(old_ids, stat_ids), old_ids.shape[0] - 1)
        in_old_stats = old_ids[position] == stat_ids
        extra = np.setdiff1d(old_ids, stat_ids[in_old_stats], assume_unique=True)
    named = np.concatenate([stat_ids, extra])
    columns = np.concatenate([columns, np.zeros((extra.shape[0], columns.shape[1]))])
    in_old = np.concatenate([in_old_stats, np.ones(extra.shape[0], dtype=bool)])
    if named.shape[0] > 1 and not np.all(named[1:] > named[:-1]):
        order = np.argsort(named, kind="stable")
        named, columns, in_old = named[order], columns[order], in_old[order]
    return named, columns, in_old


def _arc_positions() -> np.ndarray:
    """Evenly spaced positions around the 64-bit ring."""
    step = np.uint64((1 << 64) // _ARC_SAMPLES)
    return (np.arange(_ARC_SAMPLES, dtype=np.uint64) * step).view(np.int64)


class Scan(GedikScheme):
    """Algorithm 2: keys by decreasing frequency, each on its channel of lowest utility."""

    name = "scan"
    algorithm = "scan"

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        return scan(problem)


class Redist(GedikScheme):
    """Algorithm 3: the (key, channel) of lowest utility per unit of frequency, step by step."""

    name = "redist"
    algorithm = "redist"

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        return redist(problem)


class Readj(GedikScheme):
    """Algorithm 4: keep the old placement, then apply balance-improving moves and swaps.

    Args:
        move_limit: how many times one key may move (``c`` of §4.2.4).
    """

    name = "readj"
    algorithm = "readj"

    def __init__(self, n_workers: int, *, move_limit: int = 5, **base: Any) -> None:
        super().__init__(n_workers, **base)
        self.move_limit = int(move_limit)
        if self.move_limit < 0:
            raise SchemeError(f"readj: move_limit must be >= 0, got {move_limit}")

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        p = problem
        # Keys new to the table start on their ring owner (their home is past the channels).
        start = np.where(p.home < p.n_workers, p.home, p.ring_owner).astype(np.int32)
        return readj(p, start, self.move_limit)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "move_limit": self.move_limit}
