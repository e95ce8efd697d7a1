"""The contract's Prometheus series: names, types, labels and help, defined once.

Layer: observe.

One naming scheme, ``skewer_...``, base units (seconds), ``_total`` for counters. Every series
carries ``run`` (run id) and ``scheme`` (grouping scheme); stages add ``worker``, ``source``,
``producer``, ``reason`` or ``outcome``. :data:`SERIES` lists every series exactly once (name,
type, labels, help) and is the single source the metric objects, the collectors, docs/metrics.md's
metrics reference and the dashboard tests use; :class:`RunLabels` is the one place that sets
``run`` and ``scheme``, so no stage can forget them.

Example:
    >>> labels = RunLabels("r1", "pkg")
    >>> labels.of(worker=3)
    {'run': 'r1', 'scheme': 'pkg', 'worker': '3'}
    >>> SERIES_BY_NAME["skewer_grouping_routed_total"].labelnames
    ('run', 'scheme', 'source', 'worker')
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

if TYPE_CHECKING:
    pass

#: ``_created`` series double every counter's series count and no dashboard uses them.
disable_created_metrics()

STAGES = ("produce", "group", "work", "aggregate", "control")
RUN_LABELS = ("run", "scheme")
CONTROLLER_OUTCOMES = ("balanced", "rebalanced", "infeasible", "migrating", "no-statistics")


@dataclass(frozen=True)
class Series:
    """One series of the contract: exposed name, type, labels beyond ``run`` and ``scheme``."""

    name: str
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    stage: str

    @property
    def labelnames(self) -> tuple[str, ...]:
        return (*RUN_LABELS, *self.labels)


#: Every series, grouped by the stage that exports it (docs/metrics.md#series lists them).
# fmt: off
SERIES: tuple[Series, ...] = (
    Series("skewer_producer_records_total", "counter", ("producer",),
           "DATA records the producer sent and Kafka acknowledged", "produce"),
    Series("skewer_grouping_records_total", "counter", ("source",),
           "records the grouping source consumed from topic keys (committed batches)", "group"),
    Series("skewer_grouping_routed_total", "counter", ("source", "worker"),
           "DATA records the grouping source routed to the worker", "group"),
    Series("skewer_grouping_dead_letters_total", "counter", ("source", "reason"),
           "records the grouping source sent to dead-letters, by reason", "group"),
    Series("skewer_grouping_late_records_total", "counter", ("source",),
           "records of a user topic whose window had closed, sent to the late topic", "group"),
    Series("skewer_grouping_filtered_records_total", "counter", ("source",),
           "records of a user topic that the query's WHERE left out", "group"),
    Series("skewer_grouping_batch_seconds", "histogram", ("source",),
           "seconds per batch of the grouping source: route, produce and commit", "group"),
    Series("skewer_routing_table_version", "gauge", ("source",),
           "version of the routing table the source routes with (0: no table)", "group"),
    Series("skewer_routing_table_entries", "gauge", ("source",),
           "entries of the routing table the source routes with (0: no table)", "group"),
    Series("skewer_worker_records_total", "counter", ("worker",),
           "L_i: DATA records the worker applied (Redis stats:records)", "work"),
    Series("skewer_worker_latency_seconds", "histogram", ("worker",),
           "end-to-end latency, grouping stage's write to the worker's apply", "work"),
    Series("skewer_worker_lag_records", "gauge", ("worker",),
           "records of the worker's work partition not yet consumed by the query", "work"),
    Series("skewer_worker_state_entries", "gauge", ("worker",),
           "(key, window) state entries of the worker in open windows", "work"),
    Series("skewer_worker_field_entries", "gauge", ("worker", "field"),
           "(key, window) values of a state field of the worker in open windows, an int64 each",
           "work"),
    Series("skewer_worker_held_records_total", "counter", ("worker",),
           "records held back at the worker while their key's state migrated", "work"),
    Series("skewer_worker_late_records_total", "counter", ("worker",),
           "records of already closed windows (counted, not applied)", "work"),
    Series("skewer_worker_rejected_total", "counter", ("worker",),
           "work records that did not decode or had no key", "work"),
    Series("skewer_worker_batches_total", "counter", ("worker",),
           "micro-batches the worker applied", "work"),
    Series("skewer_imbalance_records", "gauge", (),
           "I = max_i L_i - avg_i L_i of the cumulative worker loads", "work"),
    Series("skewer_imbalance_fraction", "gauge", (),
           "I / sum_i L_i of the cumulative worker loads", "work"),
    Series("skewer_load_max_over_avg", "gauge", (),
           "lambda = max_i L_i / avg_i L_i of the cumulative worker loads", "work"),
    Series("skewer_aggregator_windows_final_total", "counter", (),
           "windows merged and final (Redis stats:windows)", "aggregate"),
    Series("skewer_aggregator_records_final_total", "counter", (),
           "records in final windows (Redis stats:windows)", "aggregate"),
    Series("skewer_replication", "gauge", (),
           "(key, worker) state entries / distinct keys over final windows", "aggregate"),
    Series("skewer_watermark_seconds", "gauge", (),
           "pipeline watermark: min over workers, event time in seconds", "aggregate"),
    Series("skewer_controller_intervals_total", "counter", ("outcome",),
           "controller intervals by outcome", "control"),
    Series("skewer_controller_imbalance", "gauge", (),
           "the scheme's balance measure of the last interval's worker loads: "
           "theta = (max - avg) / avg (Fang et al.) or max / min (Gedik)", "control"),
    Series("skewer_controller_tolerance", "gauge", (),
           "the tolerance of that measure: theta_max (Fang et al.) or alpha (Gedik)",
           "control"),
    Series("skewer_controller_table_version", "gauge", (),
           "version of the routing table the controller published last", "control"),
    Series("skewer_controller_table_entries", "gauge", (),
           "entries of the routing table the controller published last", "control"),
    Series("skewer_planning_seconds", "histogram", (),
           "seconds the controller spent planning a new routing table", "control"),
    Series("skewer_migrations_total", "counter", (), "completed migrations", "control"),
    Series("skewer_migration_in_progress", "gauge", (), "1 while a migration runs", "control"),
    Series("skewer_migration_keys_moved_total", "counter", (),
           "keys moved to another worker by migrations", "control"),
    Series("skewer_migration_state_entries_moved_total", "counter", (),
           "(key, window) state entries moved by migrations", "control"),
    Series("skewer_migration_state_bytes_moved_total", "counter", (),
           "bytes of state moved by migrations", "control"),
    Series("skewer_migration_held_records_total", "counter", (),
           "records held back at their new worker during migrations", "control"),
    Series("skewer_migration_duration_seconds", "histogram", (),
           "seconds from publishing a table to the last state moved", "control"),
    Series("skewer_exporter_errors_total", "counter", ("stage",),
           "scrapes that could not read Redis or Kafka (the series read are still served)",
           "any"),
)
# fmt: on
SERIES_BY_NAME = {series.name: series for series in SERIES}

#: Histogram buckets (seconds) of the in-process histograms.
BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PLANNING_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
MIGRATION_SECONDS_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


def _counter(name: str) -> Counter:
    series = SERIES_BY_NAME[name]
    return Counter(series.name, series.help, series.labelnames)


def _gauge(name: str, multiprocess_mode: str = "all") -> Gauge:
    series = SERIES_BY_NAME[name]
    return Gauge(
        series.name,
        series.help,
        series.labelnames,
        multiprocess_mode=multiprocess_mode,  # type: ignore[arg-type]
    )


def _histogram(name: str, buckets: Sequence[float]) -> Histogram:
    series = SERIES_BY_NAME[name]
    return Histogram(series.name, series.help, series.labelnames, buckets=buckets)


# The in-process metric objects (prometheus-client's default registry). The worker and
# aggregator series are not objects: their collectors read Redis at scrape time.
PRODUCER_RECORDS = _counter("skewer_producer_records_total")
GROUPING_RECORDS = _counter("skewer_grouping_records_total")
GROUPING_ROUTED = _counter("skewer_grouping_routed_total")
GROUPING_DEAD_LETTERS = _counter("skewer_grouping_dead_letters_total")
GROUPING_LATE = _counter("skewer_grouping_late_records_total")
GROUPING_FILTERED = _counter("skewer_grouping_filtered_records_total")
GROUPING_BATCH_SECONDS = _histogram("skewer_grouping_batch_seconds", BATCH_SECONDS_BUCKETS)
ROUTING_TABLE_VERSION = _gauge("skewer_routing_table_version", "mostrecent")
ROUTING_TABLE_ENTRIES = _gauge("skewer_routing_table_entries", "mostrecent")
CONTROLLER_INTERVALS = _counter("skewer_controller_intervals_total")
CONTROLLER_IMBALANCE = _gauge("skewer_controller_imbalance", "mostrecent")
CONTROLLER_TOLERANCE = _gauge("skewer_controller_tolerance", "mostrecent")
CONTROLLER_TABLE_VERSION = _gauge("skewer_controller_table_version", "mostrecent")
CONTROLLER_TABLE_ENTRIES = _gauge("skewer_controller_table_entries", "mostrecent")
PLANNING_SECONDS = _histogram("skewer_planning_seconds", PLANNING_SECONDS_BUCKETS)
MIGRATIONS = _counter("skewer_migrations_total")
MIGRATION_IN_PROGRESS = _gauge("skewer_migration_in_progress", "mostrecent")
MIGRATION_KEYS_MOVED = _counter("skewer_migration_keys_moved_total")
MIGRATION_STATE_ENTRIES_MOVED = _counter("skewer_migration_state_entries_moved_total")
MIGRATION_STATE_BYTES_MOVED = _counter("skewer_migration_state_bytes_moved_total")
MIGRATION_HELD_RECORDS = _counter("skewer_migration_held_records_total")
MIGRATION_DURATION_SECONDS = _histogram(
    "skewer_migration_duration_seconds", MIGRATION_SECONDS_BUCKETS
)
EXPORTER_ERRORS = _counter("skewer_exporter_errors_total")


@dataclass(frozen=True)
class RunLabels:
    """``run`` and ``scheme``: the two labels of every series, set here and nowhere else."""

    run: str
    scheme: str

    def __post_init__(self) -> None:
        if not self.run or not self.scheme:
            raise ValueError(f"metrics need a run and a scheme, got {self.run!r}, {self.scheme!r}")

    def of(self, **extra: object) -> dict[str, str]:
        """The label values of one series: run, scheme and ``extra`` (as strings)."""
        return {"run": self.run, "scheme": self.scheme, **{k: str(v) for k, v in extra.items()}}

    def values(self, *extra: object) -> list[str]:
        """Positional label values (for metric families): run, scheme, then ``extra``."""
        return [self.run, self.scheme, *(str(v) for v in extra)]


def metric_family(name: str, labels: RunLabels) -> Metric:
    series = SERIES_BY_NAME[name]
    families = {
        "counter": CounterMetricFamily,
        "gauge": GaugeMetricFamily,
        "histogram": HistogramMetricFamily,
    }
    return families[series.kind](series.name, series.help, labels=list(series.labelnames))


class ScrapeErrors:
    """Counts a collector's failed reads and says why on stderr, once per distinct reason."""

    def __init__(self, labels: RunLabels, stage: str) -> None:
        self.stage = stage
        self._counter = EXPORTER_ERRORS.labels(**labels.of(stage=stage))
        self._said: set[str] = set()

    def record(self, what: str, error: BaseException) -> None:
        self._counter.inc()
        line = f"skewer {self.stage}: metrics: cannot read {what}: {type(error).__name__}: {error}"
        if line not in self._said:
            self._said.add(line)
            print(line.splitlines()[0], file=sys.stderr)
