"""The one small interface every grouping scheme implements, and the registry that names them.

A *scheme object* belongs to one source (one upstream instance). It receives the source's keys
in batches and answers one worker per key, updating whatever state it keeps (local load
estimates, sketches, a ring, a routing table). The same object serves the simulator
(:mod:`operators.simulator`) and the live grouping stage (:mod:`pipeline`), so there is one
implementation of each scheme.

Example:
    >>> from operators import registry
    >>> from operators.keys import KeyBatch
    >>> scheme = registry.create("key", n_workers=4)
    >>> workers = scheme.route(KeyBatch.from_strings(["a", "b", "a"]))
    >>> bool(workers[0] == workers[2])
    True

Routing-table schemes (Gedik's ``scan``/``redist``/``readj``, Fang et al.'s ``llfd``/
``mintable``/``minmig``/``mixed``) additionally implement :class:`TableScheme`: they collect
:class:`KeyStatistics` while routing, and :meth:`TableScheme.plan` turns merged statistics into
a new :class:`RoutingTable`. The live controller calls exactly that method.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from operators.keys import KeyBatch


class SchemeError(ValueError):
    """A scheme was named or parametrised wrongly; the message is meant for the user."""


class Scheme(abc.ABC):
    """Routes batches of keys from one source to ``n_workers`` workers.

    Args:
        n_workers: W, the number of downstream workers (>= 1).
        source: index of the source this object serves (0..n_sources-1).
        n_sources: S, the number of sources routing in parallel.
        seed: seeds any randomness, so a run is reproducible.
    """

    #: Registry name, e.g. ``"pkg"``.
    name: ClassVar[str]
    #: True if every record of a key goes to one worker (between rebalances).
    keeps_key_on_one_worker: ClassVar[bool] = True

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        if int(n_workers) < 1:
            raise SchemeError(f"{self.name}: number of workers must be >= 1, got {n_workers}")
        if int(n_sources) < 1 or not 0 <= int(source) < int(n_sources):
            raise SchemeError(f"{self.name}: source {source} not in 0..{int(n_sources) - 1}")
        self.n_workers = int(n_workers)
        self.source = int(source)
        self.n_sources = int(n_sources)
        self.seed = int(seed)

    @abc.abstractmethod
    def route(self, keys: KeyBatch) -> np.ndarray:
        """One worker (``int32`` in 0..W-1) per key, in order; updates this source's state."""

    def observe_global_loads(self, loads: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Receives the true per-worker loads (PKG's probing variant); most schemes ignore it."""

    def params(self) -> dict[str, Any]:
        """The parameters that define this instance, for reports (``name`` excluded)."""
        return {"n_workers": self.n_workers, "n_sources": self.n_sources, "seed": self.seed}


@dataclass
class RoutingTable:
    """Explicit key -> worker entries that override a base hash; see Fang et al. Eq. (1).

    ``key_ids`` are :meth:`KeyBatch.key_ids` fingerprints, sorted ascending so lookups are a
    vectorized binary search. ``version`` increases by one with every published table.
    """

    key_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    workers: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    version: int = 0

    def __post_init__(self) -> None:
        self.key_ids = np.asarray(self.key_ids, dtype=np.int64)
        self.workers = np.asarray(self.workers, dtype=np.int32)
        if self.key_ids.shape != self.workers.shape:
            raise ValueError("routing table: key_ids and workers differ in length")
        order = np.argsort(self.key_ids, kind="stable")
        self.key_ids = self.key_ids[order]
        self.workers = self.workers[order]
        if self.key_ids.size and np.any(self.key_ids[1:] == self.key_ids[:-1]):
            raise ValueError("routing table: a key appears twice")

    def __len__(self) -> int:
        return int(self.key_ids.shape[0])

    def apply(self, key_ids: np.ndarray, base_workers: np.ndarray) -> np.ndarray:
        """``A(k)`` where ``k`` is in the table, else the base hash's worker."""
        if len(self) == 0:
            return base_workers
        position = np.searchsorted(self.key_ids, key_ids)
        position[position == len(self)] = 0
        hit = self.key_ids[position] == key_ids
        return np.where(hit, self.workers[position], base_workers).astype(np.int32)

    def as_dict(self) -> dict[int, int]:
        return dict(zip(self.key_ids.tolist(), self.workers.tolist(), strict=True))


@dataclass
class KeyStatistics:
    """What sources measured over one interval: the input of :meth:`TableScheme.plan`.

    Per tracked key: ``frequency`` (records, g(k)), ``cost`` (computation, c(k); equal to the
    frequency unless measured otherwise) and ``state_size`` (memory of the key's window state,
    S(k, w)). ``worker_loads`` are the records each worker received in the interval, including
    keys not tracked individually; ``records`` is their sum.
    """

    key_ids: np.ndarray
    frequency: np.ndarray
    cost: np.ndarray
    state_size: np.ndarray
    worker_loads: np.ndarray
    records: int

    @staticmethod
    def merge(parts: list[KeyStatistics]) -> KeyStatistics:
        """Statistics of several sources summed per key (the controller's view)."""
        if not parts:
            raise ValueError("merge needs at least one part")
        key_ids = np.concatenate([p.key_ids for p in parts])
        unique, inverse = np.unique(key_ids, return_inverse=True)

        def summed(values: list[np.ndarray]) -> np.ndarray:
            return np.bincount(inverse, weights=np.concatenate(values), minlength=unique.size)

        return KeyStatistics(
            key_ids=unique,
            frequency=summed([p.frequency for p in parts]),
            cost=summed([p.cost for p in parts]),
            state_size=summed([p.state_size for p in parts]),
            worker_loads=np.sum([p.worker_loads for p in parts], axis=0),
            records=sum(p.records for p in parts),
        )


@dataclass
class Plan:
    """A new routing table and what adopting it costs.

    ``moved_keys`` are the keys whose worker differs between the old and new assignment
    (Δ(F, F') of Fang et al. Eq. 2); ``migration_cost`` is the state they carry (M(F, F'));
    ``feasible`` says whether the algorithm met its balance tolerance within its table budget.
    """

    table: RoutingTable
    moved_keys: np.ndarray
    migration_cost: float
    feasible: bool
    planning_seconds: float
    details: dict[str, Any] = field(default_factory=dict)


class TableScheme(Scheme):
    """A scheme routed by a base hash plus an explicit :class:`RoutingTable` it can re-plan."""

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.table = RoutingTable()

    def base_workers(self, keys: KeyBatch) -> np.ndarray:
        """The base hash's worker per key (the assignment with an empty table)."""
        return self.base_workers_of_ids(keys.key_ids())

    # The live controller (pipeline.stages.controller) also needs the three members below; a
    # scheme that only runs in the simulator may leave them out (and define base_workers instead).

    @property
    def tolerance(self) -> float:
        """The balance tolerance, in the units of :meth:`measured_imbalance`."""
        raise NotImplementedError(f"{self.name} does not define a balance tolerance")

    def base_workers_of_ids(self, key_ids: np.ndarray) -> np.ndarray:
        """The base hash's worker per :meth:`KeyBatch.key_ids` fingerprint."""
        raise NotImplementedError(f"{self.name} does not route by key fingerprints")

    def workers_of_ids(self, key_ids: np.ndarray) -> np.ndarray:
        """The current assignment (table, else base hash) per fingerprint."""
        key_ids = np.asarray(key_ids, dtype=np.int64)
        return self.table.apply(key_ids, self.base_workers_of_ids(key_ids))

    def measured_imbalance(self, worker_loads: np.ndarray) -> float:
        """The paper's balance measure of ``worker_loads``; balanced when <= :attr:`tolerance`."""
        raise NotImplementedError(f"{self.name} does not define a balance measure")

    def within_tolerance(self, worker_loads: np.ndarray) -> bool:
        return self.measured_imbalance(np.asarray(worker_loads, dtype=np.float64)) <= (
            self.tolerance
        )

    @abc.abstractmethod
    def statistics(self, reset: bool = True) -> KeyStatistics:
        """What this source measured since the last call (or since the start)."""

    @abc.abstractmethod
    def plan(self, stats: KeyStatistics) -> Plan:
        """A new table for the merged ``stats``; pure: it does not install the table."""

    def install(self, table: RoutingTable) -> None:
        """Adopt ``table`` for every key routed from now on."""
        self.table = table
