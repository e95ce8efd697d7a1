"""The controller of routing-table schemes (``skewer control``): measure, plan, publish, migrate.

Layer: stages.

Each interval the controller opens a statistics round (or, with ``every``, the sources open it:
each reports after every :func:`~operators.simulator.source_round` of its records), waits for
every source's report (or ``report_wait`` seconds), merges them and measures the imbalance with
the scheme's own measure against its own tolerance
(:meth:`~operators.base.TableScheme.within_tolerance`). Beyond it, it calls the scheme's pure
``plan`` -- the code the simulator runs -- and publishes the new table with its migration in
one MULTI; between intervals it drives the running migration (MIGRATE
per drained old worker, then COMPLETE: :mod:`pipeline.io.control_store`). Outcomes of an
interval (``ctl:intervals``, ``skewer_controller_intervals_total{outcome}``): ``balanced``,
``rebalanced``, ``infeasible``, ``migrating``, ``no-statistics``. After a crash it reads
``ctl:current`` and goes on; nothing is done twice. See docs/design.md#migration-protocol.

Example (what the controller publishes for a plan: the moves of each old worker):
    >>> import numpy as np
    >>> moves_by_old_worker(np.array([1, 2, 3]), np.array([0, 0, 1]), np.array([2, 1, 1]),
    ...                     {1: b"a", 2: b"b", 3: b"c"})
    {0: {b'a': 2, b'b': 1}}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import registry
from operators.base import KeyStatistics, Plan, SchemeError, TableScheme
from pipeline.io.control_store import ControlPlane, PublishedTable, StatisticsReport, now_ms
from pipeline.io.records import END_OF_STREAM
from pipeline.io.state_store import StateStore

if TYPE_CHECKING:
    import redis as redis_module

    from pipeline.observe.controller import ControllerMetrics

OUTCOMES = ("balanced", "rebalanced", "infeasible", "migrating", "no-statistics")


class ControllerError(Exception):
    """The controller cannot go on; the message is one line for the user."""


@dataclass(frozen=True)
class ControllerOptions:
    scheme: str
    workers: int
    sources: int
    run_id: str
    redis_url: str
    #: Seconds between two statistics rounds.
    interval: float = 5.0
    #: Rounds counted in records instead (the grouping stage's ``control_every``): round r
    #: closes once every source reported it, or ``report_wait`` after its first report.
    every: int | None = None
    #: Seconds a round waits for the last source's report before it is planned without it.
    report_wait: float = 1.0
    #: Seconds between two looks at a running migration.
    tick: float = 0.05
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    until_end: bool = False


def create_planner(options: ControllerOptions) -> TableScheme:
    """The scheme object whose ``plan`` the controller calls; SchemeError if it has no table."""
    scheme = registry.create(
        options.scheme,
        options.workers,
        n_sources=options.sources,
        seed=options.seed,
        **dict(options.params),
    )
    if not isinstance(scheme, TableScheme):
        raise SchemeError(
            f"{options.scheme} routes without a routing table: nothing to control "
            f"(table schemes: {', '.join(table_schemes())})"
        )
    return scheme


def table_schemes() -> list[str]:
    """The registry's routing-table schemes: the ones a controller plans for."""
    return [n for n in registry.names() if issubclass(registry.scheme_class(n), TableScheme)]


def moves_by_old_worker(
    key_ids: np.ndarray, old: np.ndarray, new: np.ndarray, names: Mapping[int, bytes]
) -> dict[int, dict[bytes, int]]:
    """{old worker: {key bytes: new worker}} of the keys whose worker changes."""
    moves: dict[int, dict[bytes, int]] = {}
    for key, source, target in zip(key_ids.tolist(), old.tolist(), new.tolist(), strict=True):
        if source != target:
            moves.setdefault(int(source), {})[names[key]] = int(target)
    return moves


@dataclass
class ControllerSummary:
    intervals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    published: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Controller:
    """One run's controller; :meth:`step` does whatever is due, :meth:`run` loops over it."""

    def __init__(
        self,
        options: ControllerOptions,
        client: redis_module.Redis,
        telemetry: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.planner = create_planner(options)
        self.plane = ControlPlane(client, options.run_id)
        self.store = StateStore(client, options.run_id)
        self.telemetry = telemetry
        self.clock = clock
        self.summary = ControllerSummary()
        #: Fingerprint -> key bytes of every key the planner may name (table and reports).
        self.names: dict[int, bytes] = {}
        self.migrating: int | None = None
        self._round: int | None = None
        self._round_opened = 0.0
        self._next_round = 0.0
        #: When the first report of the counted round came (None: none yet).
        self._first_report: float | None = None

    def start(self) -> None:
        """Adopt the control plane's state: the table in force, a running migration."""
        current = self.plane.current()
        published = self.plane.table(current.version)
        self.planner.install(published.table)
        self.names = dict(zip(published.table.key_ids.tolist(), published.names, strict=True))
        self.migrating = current.migrating
        self._next_round = self.clock() + self.options.interval
        if self.options.every:
            self._round = current.round + 1
        self._observe_table(published)
        self.plane.mark_started()

    # -- the loop ------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> ControllerSummary:
        began = self.clock()
        self.start()
        while not should_stop():
            self.step()
            if self.options.until_end and self._ended():
                break
            time.sleep(self.options.tick)
        self.summary.seconds = self.clock() - began
        return self.summary

    def _ended(self) -> bool:
        """Every worker has END_OF_STREAM of every source and no migration runs."""
        return (
            self.migrating is None
            and self.store.min_watermark(self.options.workers) == END_OF_STREAM
        )

    def step(self) -> None:
        if self.migrating is not None:
            self.drive_migration()
        if self.options.every:
            self._step_counted()
            return
        now = self.clock()
        if self._round is None:
            if now >= self._next_round:
                self._round = self.plane.open_round()
                self._round_opened = now
                self._next_round = now + self.options.interval
            return
        reports = self.plane.reports(self._round, self.options.sources)
        if len(reports) < self.options.sources and now - self._round_opened < (
            self.options.report_wait
        ):
            return
        round_, self._round = self._round, None
        self.close_round(round_, reports)

    def _step_counted(self) -> None:
        """Close round r, which the sources open by reporting, once all have reported it or
        ``report_wait`` after the first; skip it when reports of r + 1 come and none of r (a
        source restarted past it)."""
        round_ = self._round
        assert round_ is not None
        reports = self.plane.reports(round_, self.options.sources)
        now = self.clock()
        if not reports:
            if self.plane.reports(round_ + 1, self.options.sources):
                self._round, self._first_report = round_ + 1, None
            return
        if self._first_report is None:
            self._first_report = now
        waited = now - self._first_report
        if len(reports) < self.options.sources and waited < self.options.report_wait:
            return
        self._round, self._first_report = round_ + 1, None
        self.plane.close_counted_round(round_)
        self.close_round(round_, reports)

    # -- one interval --------------------------------------------------------------------------

    def close_round(self, round_: int, reports: list[StatisticsReport]) -> str:
        """Measure the round's imbalance; plan and publish when it exceeds the tolerance."""
        planner = self.planner
        record: dict[str, Any] = {
            "round": round_,
            "at_ms": now_ms(),
            "reports": len(reports),
            # Which sources' reports were merged: a late one is left out (``report_wait``).
            "sources": sorted(r.source for r in reports),
            "table_version": planner.table.version,
            "tolerance": planner.tolerance,
        }
        if not reports:
            return self._finish_round(record, "no-statistics")
        # The planner names keys of these reports and of the table in force: keep just those.
        names = {k: self.names[k] for k in planner.table.key_ids.tolist() if k in self.names}
        for report in reports:
            names.update(zip(report.key_ids.tolist(), report.names, strict=True))
        self.names = names
        merged = KeyStatistics.merge([r.statistics() for r in reports])
        imbalance = planner.measured_imbalance(merged.worker_loads)
        record.update(
            records=int(merged.records),
            # Records of keys the reports could not name (beyond the heaviest, or unseen lately).
            unnamed_records=sum(r.unnamed for r in reports),
            worker_loads=merged.worker_loads.tolist(),
            imbalance=imbalance,
            # Versions the sources routed under during the round (a switch inside it: two).
            source_versions=sorted({r.table_version for r in reports}),
        )
        if self.migrating is not None:
            return self._finish_round(record, "migrating")
        if planner.within_tolerance(merged.worker_loads):
            return self._finish_round(record, "balanced")
        plan = planner.plan(merged)
        if self.telemetry is not None:
            self.telemetry.planning(plan.planning_seconds)
        planned = planner.measured_imbalance(plan.details["loads_after"])
        record.update(
            planned_imbalance=planned,
            feasible=bool(plan.feasible),
            moved_keys=len(plan.moved_keys),
            planning_seconds=plan.planning_seconds,
        )
        if len(plan.moved_keys) == 0:
            return self._finish_round(record, "balanced")
        version = self.publish(plan, merged, round_, imbalance, planned)
        record["published_version"] = version
        return self._finish_round(record, "rebalanced" if plan.feasible else "infeasible")

    def _finish_round(self, record: dict[str, Any], outcome: str) -> str:
        record["outcome"] = outcome
        self.plane.record_interval(record)
        self.summary.intervals[outcome] += 1
        if self.telemetry is not None:
            self.telemetry.interval(outcome, record.get("imbalance"), record["tolerance"])
        return outcome

    def publish(
        self, plan: Plan, merged: KeyStatistics, round_: int, imbalance: float, planned: float
    ) -> int:
        """Publish ``plan``'s table as the next version and start its migration."""
        planner = self.planner
        version = planner.table.version + 1
        table = plan.table
        table.version = version
        ids = np.asarray(plan.moved_keys, dtype=np.int64)
        old = planner.workers_of_ids(ids)
        new = table.apply(ids, planner.base_workers_of_ids(ids))
        unnamed = [k for k in ids.tolist() + table.key_ids.tolist() if k not in self.names]
        if unnamed:
            raise ControllerError(
                f"plan names {len(unnamed)} key(s) no source reported the bytes of; "
                "a table entry without its key's bytes could not move its state"
            )
        moves = moves_by_old_worker(ids, old, new, self.names)
        total_state = float(np.sum(merged.state_size))
        published = PublishedTable(table, [self.names[k] for k in table.key_ids.tolist()])
        self.plane.publish(
            published,
            moves,
            {
                "round": round_,
                "workers": self.options.workers,
                "moved_keys": int(ids.shape[0]),
                "feasible": int(bool(plan.feasible)),
                "imbalance_before": imbalance,
                "imbalance_planned": planned,
                "tolerance": planner.tolerance,
                "planning_seconds": plan.planning_seconds,
                "migration_cost": float(plan.migration_cost),
                "total_state": total_state,
                "ideal_fraction": float(plan.migration_cost) / total_state if total_state else 0,
            },
        )
        planner.install(table)
        self.migrating = version
        self.summary.published.append(version)
        self._observe_table(published)
        if self.telemetry is not None:
            self.telemetry.migration_started()
        return version

    # -- the running migration ---------------------------------------------------------------

    def drive_migration(self) -> bool:
        """Move the state of every drained old worker; complete when all have. True if done."""
        version = self.migrating
        assert version is not None
        waiting = False
        for worker in self.plane.old_workers(version, self.options.workers):
            moved = self.plane.migrate(version, worker, self.options.sources)
            waiting |= moved.status < 0  # not drained yet (or not running)
            if moved.status == 1 and self.telemetry is not None:
                self.telemetry.moved(
                    keys=moved.keys,
                    state_entries=moved.state_entries,
                    state_bytes=moved.state_bytes,
                    held_records=moved.released_records,
                )
        if waiting:
            return False
        # Completed now, or by a predecessor killed between COMPLETE and noticing it.
        if self.plane.complete(version) or self.plane.current().migrating is None:
            self.migrating = None
            self.summary.completed.append(version)
            if self.telemetry is not None:
                self.telemetry.migration_completed(
                    float(self.plane.migration(version).get("duration_s", 0.0))
                )
            return True
        return False

    def _observe_table(self, published: PublishedTable) -> None:
        if self.telemetry is not None:
            self.telemetry.table(published.table.version, len(published.table))
