"""Drives grouping schemes over a key stream without Kafka, and measures the papers' metrics.

Layer: operators. The simulated DAG is the one every paper uses (PKG §V-A, FISH §6.1): ``S``
sources take the stream round-robin (or as a per-record source array says), each with its own
scheme object, routing to ``W`` workers; batches give the decisions of record-at-a-time
routing. :class:`Router` runs the hooks a scheme may offer (``global_estimation``,
``probe_interval``, ``prepare``, ``worker_speeds``, a TableScheme's controller round every
``rebalance_interval`` records); :func:`simulate` adds the metrics of
:mod:`operators.metrics`. The hooks and the metrics: docs/schemes.md#the-simulator.

Example:
    >>> from operators.keys import KeyBatch
    >>> import numpy as np
    >>> keys = KeyBatch.from_ints(np.array([1, 1, 1, 1, 2, 3]))
    >>> result = simulate("key", keys, n_workers=2, checkpoints=2)
    >>> result.final_loads.tolist(), result.checkpoint_records.tolist()
    ([5, 1], [3, 6])
    >>> result.imbalance_series.tolist(), result.imbalance_final
    ([1.5, 2.0], 0.3333333333333333)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators import metrics, registry
from operators.base import KeyStatistics, Scheme, SchemeError, TableScheme
from operators.keys import KeyBatch


def _accepts(cls: type[Scheme], parameter: str) -> bool:
    return parameter in registry.parameters(cls)


def source_round(every: int, n_sources: int) -> int:
    """Records of one source between two of its statistics reports when a round comes every
    ``every`` records of S sources: ``max(1, round(every / S))``, the live grouping stage's
    (``--control-every``) and the model's.

    >>> source_round(30_000, 2), source_round(5, 8)
    (15000, 1)
    """
    return max(1, round(int(every) / int(n_sources)))


class Router:
    """The S source objects of one scheme, routing one interleaved stream chunk by chunk.

    ``route`` may be called with consecutive chunks of any sizes; the result is the same as
    routing the whole stream at once. The simulator and ``skewer route`` both use this class,
    so the hooks mean the same thing in both.

    Args:
        scheme: registry name.
        n_workers: W.
        n_sources: S; record ``i`` of the stream goes to source ``i mod S`` unless ``route``
            is given each record's source.
        params: the scheme's keyword parameters (``registry.create`` validates them).
        seed: passed to every source object.
        worker_speeds: relative service rates, passed to schemes that take ``worker_speeds``.
        rebalance_interval: records between controller rounds of a TableScheme (None: never).
        per_source: as the live grouping stage runs a scheme: one object per source even for a
            ``global_estimation`` scheme, and a TableScheme's rounds counted per source (each
            source reports after every :func:`source_round` of its own records; a round is
            planned and installed once every source reported it). The default shares one object
            and holds a round every ``rebalance_interval`` records of the stream (the papers'
            model).
    """

    def __init__(
        self,
        scheme: str,
        n_workers: int,
        n_sources: int = 1,
        *,
        params: dict[str, Any] | None = None,
        seed: int = 0,
        worker_speeds: np.ndarray | None = None,
        rebalance_interval: int | None = None,
        per_source: bool = False,
    ) -> None:
        if int(n_sources) < 1:
            raise SchemeError(f"{scheme}: number of sources must be >= 1, got {n_sources}")
        if rebalance_interval is not None and int(rebalance_interval) < 1:
            raise SchemeError(f"rebalance interval must be >= 1, got {rebalance_interval}")
        cls = registry.scheme_class(scheme)
        params = dict(params or {})
        if worker_speeds is not None and _accepts(cls, "worker_speeds"):
            params.setdefault("worker_speeds", np.asarray(worker_speeds, dtype=np.float64))
        self.scheme = scheme
        self.n_workers = int(n_workers)
        self.n_sources = int(n_sources)
        #: True if ONE object routes the whole interleaved stream for all sources.
        self.global_estimation = bool(getattr(cls, "global_estimation", False)) and not per_source
        count = 1 if self.global_estimation else self.n_sources
        # The arguments of the live grouping stage's create_scheme (pipeline/stages/grouping.py).
        self.objects: list[Scheme] = [
            registry.create(
                scheme, n_workers, source=s, n_sources=self.n_sources, seed=seed, **params
            )
            for s in range(count)
        ]
        probe = getattr(self.objects[0], "probe_interval", None)
        self.probe_interval = int(probe) if probe else None
        self.is_table_scheme = isinstance(self.objects[0], TableScheme)
        self.rebalance_interval = (
            int(rebalance_interval) if rebalance_interval and self.is_table_scheme else None
        )
        #: Records routed so far, and the true per-worker loads they made.
        self.records = 0
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        #: One dict per controller round (see :meth:`_rebalance`).
        self.migrations: list[dict[str, Any]] = []
        self.planning_seconds = 0.0
        self._hooks_ran_at = 0
        #: Rounds counted per source (``per_source``): each source's records, and the reports
        #: it made that wait for the others' of the same round.
        self.source_round = (
            source_round(self.rebalance_interval, self.n_sources)
            if per_source and self.rebalance_interval
            else None
        )
        self._source_records = np.zeros(self.n_sources, dtype=np.int64)
        self._waiting: list[list[KeyStatistics]] = [[] for _ in range(self.n_sources)]

    @property
    def needs_whole_stream(self) -> bool:
        """True if the scheme wants :meth:`prepare` (offline knowledge) before routing."""
        return callable(getattr(self.objects[0], "prepare", None))

    def prepare(self, keys: KeyBatch, sources: np.ndarray | None = None) -> None:
        """Give each source object its whole sub-stream of ``keys`` (the entire stream;
        ``sources`` as for :meth:`route`)."""
        if not self.needs_whole_stream:
            return
        if len(self.objects) == 1:
            self.objects[0].prepare(keys)  # type: ignore[attr-defined]
            return
        if sources is not None:
            sources = self._checked_sources(sources, len(keys))
        for s, obj in enumerate(self.objects):
            if sources is None:
                index = np.arange(s, len(keys), self.n_sources)
            else:
                index = np.flatnonzero(sources == s)
            obj.prepare(keys.take(index))

    def _checked_sources(self, sources: np.ndarray, n: int) -> np.ndarray:
        sources = np.asarray(sources)
        if sources.shape != (n,):
            raise SchemeError(f"{self.scheme}: {sources.shape[0]} sources for {n} records")
        if n and (sources.min() < 0 or sources.max() >= self.n_sources):
            raise SchemeError(f"{self.scheme}: sources must lie in 0..{self.n_sources - 1}")
        return sources

    def route(self, keys: KeyBatch, sources: np.ndarray | None = None) -> np.ndarray:
        """Workers (``int32``) of the next ``len(keys)`` records of the stream.

        ``sources`` (optional, one per record, 0..S-1) says which source reads each record:
        each source object then routes its own records in their stream order, which is how a
        stream interleaved from S partitions by arrival time reaches the live sources. Without
        it record ``i`` of the whole stream goes to source ``i mod S``.

        Probes and controller rounds happen just before the record at each multiple of their
        interval is routed (so none happens after the stream's last record).
        """
        n = len(keys)
        if self.source_round is not None:
            if sources is None:
                sources = (self.records + np.arange(n)) % self.n_sources
            return self._route_counting_rounds(keys, self._checked_sources(sources, n))
        if sources is not None:
            sources = self._checked_sources(sources, n)
        out = np.empty(n, dtype=np.int32)
        start = 0
        while start < n:
            if self.records > 0 and self.records != self._hooks_ran_at:
                self._hooks_ran_at = self.records
                if self.probe_interval and self.records % self.probe_interval == 0:
                    for obj in self.objects:
                        obj.observe_global_loads(self.loads.copy())
                if self.rebalance_interval and self.records % self.rebalance_interval == 0:
                    self._rebalance()
            stop = n
            for interval in (self.probe_interval, self.rebalance_interval):
                if interval:
                    stop = min(stop, start + interval - (self.records % interval))
            segment = None if sources is None else sources[start:stop]
            out[start:stop] = self._route_segment(keys.slice(start, stop), segment)
            start = stop
        return out

    def _route_segment(self, keys: KeyBatch, sources: np.ndarray | None) -> np.ndarray:
        n = len(keys)
        if len(self.objects) == 1:
            workers = np.asarray(self.objects[0].route(keys), dtype=np.int32)
        elif sources is not None:
            workers = np.empty(n, dtype=np.int32)
            for s, obj in enumerate(self.objects):
                index = np.flatnonzero(sources == s)
                if index.shape[0]:
                    workers[index] = obj.route(keys.take(index))
        else:
            workers = np.empty(n, dtype=np.int32)
            for s, obj in enumerate(self.objects):
                first = (s - self.records) % self.n_sources
                if first < n:
                    index = np.arange(first, n, self.n_sources)
                    workers[first :: self.n_sources] = obj.route(keys.take(index))
        # bincount doubles as the range check: it rejects negatives and grows past W.
        try:
            counts = np.bincount(workers, minlength=self.n_workers)
        except ValueError:
            counts = None
        if counts is None or counts.shape[0] != self.n_workers or workers.shape != (n,):
            raise SchemeError(f"{self.scheme}: route returned workers outside 0..W-1")
        self.loads += counts
        self.records += n
        return workers

    def _route_counting_rounds(self, keys: KeyBatch, sources: np.ndarray) -> np.ndarray:
        """``route`` with rounds counted per source: source s reports right after each of its
        own records numbered a multiple of :attr:`source_round`; a round is planned once every
        source has reported it, its table installed at once."""
        every = int(self.source_round)  # type: ignore[arg-type]
        reports: list[tuple[int, int]] = []  # (position the report follows, source)
        for s in range(self.n_sources):
            index = np.flatnonzero(sources == s)
            numbers = self._source_records[s] + 1 + np.arange(index.shape[0])
            reports.extend((int(p) + 1, s) for p in index[numbers % every == 0].tolist())
            self._source_records[s] += index.shape[0]
        reports.sort()
        out = np.empty(len(keys), dtype=np.int32)
        start = 0
        for position, s in reports:
            if position > start:
                out[start:position] = self._route_segment(
                    keys.slice(start, position), sources[start:position]
                )
                start = position
            self._waiting[s].append(self.objects[s].statistics(reset=True))  # type: ignore[attr-defined]
            if all(self._waiting):
                self._rebalance([waiting.pop(0) for waiting in self._waiting])
        if start < len(keys):
            out[start:] = self._route_segment(keys.slice(start, len(keys)), sources[start:])
        return out

    def _rebalance(self, reports: list[KeyStatistics] | None = None) -> None:
        """One controller round on ``reports`` (default: every source's statistics now)."""
        objects: list[TableScheme] = self.objects  # type: ignore[assignment]
        if reports is None:
            reports = [obj.statistics(reset=True) for obj in objects]
        merged = KeyStatistics.merge(reports)
        began = time.perf_counter()
        plan = objects[0].plan(merged)
        self.planning_seconds += time.perf_counter() - began
        plan.table.version = objects[0].table.version + 1
        for obj in objects:
            obj.install(plan.table)
        self.migrations.append(
            {
                "at_record": self.records,
                "moved_keys": len(plan.moved_keys),
                "migrated_state": float(plan.migration_cost),
                "total_state": float(np.sum(merged.state_size)),
                "feasible": bool(plan.feasible),
                "planning_seconds": float(plan.planning_seconds),
                "table_entries": len(plan.table),
                "version": int(plan.table.version),
            }
        )

    def table_entries(self) -> int:
        """Explicit routing entries a source holds (a TableScheme's table, or a ``table`` any
        other scheme keeps, e.g. static PoTC's key -> choice memory); the largest source's."""
        sizes = [len(t) for t in (getattr(o, "table", None) for o in self.objects) if t is not None]
        return max(sizes, default=0)


@dataclass
class SimulationResult:
    """Everything :func:`simulate` measured. Fractions are of ``records`` (m)."""

    scheme: str
    n_workers: int
    n_sources: int
    params: dict[str, Any]
    records: int
    distinct_keys: int
    #: I(m) / m.
    imbalance_final: float
    #: mean of I(t) over the checkpoints / m (PKG's "fraction of average imbalance", Fig. 2).
    imbalance_avg_fraction: float
    #: mean of I(t) over the checkpoints, in records (PKG Table II's unit).
    imbalance_avg: float
    #: λ = max / avg of the final loads.
    max_avg_ratio: float
    #: distinct (key, worker) pairs / distinct keys.
    replication: float
    table_entries: int
    #: Σ migrated state / Σ state at the rebalances (0 without rebalances).
    migrated_fraction: float
    #: queue-model makespans of the scheme and of shuffle grouping, and their ratio.
    exec_time: float
    exec_time_shuffle: float
    exec_time_vs_shuffle: float
    #: wall time of routing (planning excluded) and records per second of it.
    routing_seconds: float
    routing_rate: float
    checkpoint_records: np.ndarray
    #: I(t) (records) at each checkpoint, and the loads behind it (checkpoints × W).
    imbalance_series: np.ndarray
    checkpoint_loads: np.ndarray
    final_loads: np.ndarray
    #: The worker of every record, in stream order.
    workers: np.ndarray
    migrations: list[dict[str, Any]] = field(default_factory=list)
    planning_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The scalar fields (JSON-ready): what ``skewer sim --json`` prints."""
        return {
            "scheme": self.scheme,
            "workers": self.n_workers,
            "sources": self.n_sources,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "records": self.records,
            "distinct_keys": self.distinct_keys,
            "imbalance_final": self.imbalance_final,
            "imbalance_avg_fraction": self.imbalance_avg_fraction,
            "imbalance_avg": self.imbalance_avg,
            "max_avg_ratio": self.max_avg_ratio,
            "replication": self.replication,
            "table_entries": self.table_entries,
            "migrated_fraction": self.migrated_fraction,
            "rebalances": len(self.migrations),
            "planning_seconds": self.planning_seconds,
            "exec_time": self.exec_time,
            "exec_time_shuffle": self.exec_time_shuffle,
            "exec_time_vs_shuffle": self.exec_time_vs_shuffle,
            "routing_seconds": self.routing_seconds,
            "routing_rate": self.routing_rate,
            "checkpoints": int(self.checkpoint_records.shape[0]),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _shuffle_workers(
    records: int, n_workers: int, n_sources: int, sources: np.ndarray | None = None
) -> np.ndarray:
    """Shuffle grouping's routing of a stream of ``records`` records from ``n_sources`` sources
    (record i from source ``sources[i]``, else ``i mod S``).

    Shuffle's objects ignore key contents and a batch routes like its records one at a time,
    so each source's object routes its whole sub-stream at once, given empty keys (no hashing,
    no copying).
    """
    workers = np.empty(records, dtype=np.int32)
    for s in range(n_sources):
        index = (
            np.arange(s, records, n_sources) if sources is None else np.flatnonzero(sources == s)
        )
        count = index.shape[0]
        empty = KeyBatch(np.empty(0, dtype=np.uint8), np.zeros(count + 1, dtype=np.int64))
        shuffle = registry.create("shuffle", n_workers, source=s, n_sources=n_sources)
        workers[index] = shuffle.route(empty)
    return workers


def simulate(
    scheme: str,
    keys: KeyBatch,
    n_workers: int,
    n_sources: int = 1,
    *,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    checkpoints: int = 100,
    worker_speeds: np.ndarray | None = None,
    rebalance_interval: int | None = None,
    batch_size: int = 65536,
    sources: np.ndarray | None = None,
    per_source: bool = False,
) -> SimulationResult:
    """Route ``keys`` (the whole stream, in arrival order) with ``scheme`` and measure it.

    Args:
        scheme: registry name (``operators.registry.names()``).
        keys: the stream.
        n_workers: W. n_sources: S (record i goes to source i mod S).
        params: the scheme's keyword parameters.
        seed: seeds every source object.
        checkpoints: evenly spaced positions where I(t) is sampled (fewer if m is smaller).
        worker_speeds: relative service rates of the queue model (default all 1); also given
            to schemes that accept ``worker_speeds``.
        rebalance_interval: records between controller rounds (TableScheme only; None: never).
        batch_size: records per routing call (the result does not depend on it).
        sources: each record's source (0..S-1; :meth:`Router.route`), else ``i mod S``.
        per_source: one object per source even for a ``global_estimation`` scheme (:class:`Router`).
    """
    m = len(keys)
    if m < 1:
        raise SchemeError("the stream holds no records")
    if int(checkpoints) < 1:
        raise SchemeError(f"checkpoints must be >= 1, got {checkpoints}")
    if int(batch_size) < 1:
        raise SchemeError(f"batch size must be >= 1, got {batch_size}")
    speeds = None
    if worker_speeds is not None:
        speeds = np.asarray(worker_speeds, dtype=np.float64)
        if speeds.shape != (int(n_workers),) or not np.all(np.isfinite(speeds) & (speeds > 0)):
            raise SchemeError(f"worker speeds must be {n_workers} positive numbers")
    router = Router(
        scheme,
        n_workers,
        n_sources,
        params=params,
        seed=seed,
        worker_speeds=speeds,
        rebalance_interval=rebalance_interval,
        per_source=per_source,
    )
    W = router.n_workers
    marks = metrics.checkpoint_positions(m, int(checkpoints))
    stops = np.union1d(marks, np.arange(int(batch_size), m, int(batch_size), dtype=np.int64))
    checkpoint_loads = np.empty((marks.shape[0], W), dtype=np.int64)
    workers = np.empty(m, dtype=np.int32)

    began = time.perf_counter()
    if sources is not None:
        sources = router._checked_sources(sources, m)
    router.prepare(keys, sources)
    start, mark = 0, 0
    for stop in stops.tolist():
        segment = None if sources is None else sources[start:stop]
        workers[start:stop] = router.route(keys.slice(start, stop), segment)
        if mark < marks.shape[0] and stop == marks[mark]:
            checkpoint_loads[mark] = router.loads
            mark += 1
        start = stop
    routing_seconds = max(time.perf_counter() - began - router.planning_seconds, 1e-9)

    # Fingerprints after routing, so that schemes that never look at them (most) do not pay
    # for copying them into every source's batch.
    key_ids = keys.key_ids()
    series = np.asarray(metrics.imbalance(checkpoint_loads), dtype=np.float64)
    final = router.loads.copy()
    exec_time = metrics.execution_time(workers, speeds, n_workers=W)
    exec_shuffle = metrics.execution_time(
        _shuffle_workers(m, W, router.n_sources, sources), speeds, n_workers=W
    )
    total_state = sum(r["total_state"] for r in router.migrations)
    moved_state = sum(r["migrated_state"] for r in router.migrations)
    distinct_keys, pairs = metrics.key_worker_counts(key_ids, workers, W)
    return SimulationResult(
        scheme=scheme,
        n_workers=W,
        n_sources=router.n_sources,
        params=dict(params or {}),
        records=m,
        distinct_keys=distinct_keys,
        imbalance_final=float(metrics.imbalance(final)) / m,
        imbalance_avg_fraction=float(series.mean()) / m,
        imbalance_avg=float(series.mean()),
        max_avg_ratio=float(metrics.max_avg_ratio(final)),
        replication=pairs / distinct_keys,
        table_entries=router.table_entries(),
        migrated_fraction=moved_state / total_state if total_state > 0 else 0.0,
        exec_time=exec_time,
        exec_time_shuffle=exec_shuffle,
        exec_time_vs_shuffle=exec_time / exec_shuffle,
        routing_seconds=routing_seconds,
        routing_rate=m / routing_seconds,
        checkpoint_records=marks,
        imbalance_series=series,
        checkpoint_loads=checkpoint_loads,
        final_loads=final,
        workers=workers,
        migrations=router.migrations,
        planning_seconds=router.planning_seconds,
    )
