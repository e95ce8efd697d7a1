"""Prometheus metrics of every stage (issue 6): the contract's series and one exporter per process.

Names and labels. One naming scheme, ``skewer_...``, base units (seconds), ``_total`` for
counters. Every series carries ``run`` (run id) and ``scheme`` (grouping scheme); stages add
``worker``, ``source``, ``producer``, ``reason`` or ``outcome``. :data:`SERIES` lists every
series exactly once (name, type, labels, help) and is the single source the metric objects,
the collectors and the tests use; :class:`RunLabels` is the one place that sets ``run`` and
``scheme``, so no stage can forget them.

How each stage's figures get out:

- ``skewer produce`` and ``skewer group`` count in-process with prometheus-client objects,
  updated once per chunk or batch, never per record (:class:`ProducerMetrics`,
  :class:`GroupingMetrics`). These counters are *per process*: a stage restarted after a crash
  starts them at zero again, and Prometheus' ``rate``/``increase`` handle the reset. They count
  what the process did, once: the grouping stage's counters take a batch only once its Kafka
  transaction committed, so a batch the broker aborted and the source read again is counted
  when it commits, not twice. The exact totals of a run are the idempotent Redis counters
  (``stats:*``), which is what the worker and aggregator series are.
- The grouping stage's S sources are child processes: prometheus-client's multiprocess mode.
  ``start_exporter(..., multiprocess=True)`` gives the ``skewer group`` process a fresh
  ``PROMETHEUS_MULTIPROC_DIR`` before the sources are spawned (they inherit it, so their
  metric values live in memory-mapped files there), serves their merged values from one
  endpoint, and deletes the folder when it closes. The routing-table gauges use
  ``multiprocess_mode="mostrecent"``: one source per process, the newest value wins.
- ``skewer work``: the Spark tasks run in Python workers Spark starts and stops as it likes, so
  they export nothing themselves. The driver process serves :class:`WorkerCollector`, a custom
  collector that reads, *at scrape time*, the run's Redis counters the tasks maintain
  (``stats:records|late|rejected|batches|held``, ``stats:latency:{w}``, the open windows'
  ``state:{w}:{window}`` hashes) and Kafka's end offsets of topic ``work`` against the offsets
  the streaming query committed (its checkpoint's offset log: ``offsets/{id}`` of the newest
  ``commits/{id}``, the very file the query restarts from). Because the Redis counters are
  idempotent per (worker, micro-batch) -- a replayed batch is not applied twice -- Prometheus
  sees exactly the records processed, never a replay counted twice, and the counters continue
  (no reset) across a restart of the job. The imbalance gauges are computed from the same
  loads with :func:`pipeline.orchestrator.imbalance` and :func:`~pipeline.orchestrator.max_avg`
  (the one definition of I(t) and lambda).
- ``skewer aggregate``: :class:`AggregatorCollector`, the same way, from ``stats:windows`` and
  the workers' watermarks.
- ``skewer control`` (routing-table schemes): :class:`ControllerMetrics` around the
  controller and migration objects.

Latency histogram. The workers keep a log-bucket histogram in Redis, 20 buckets per decade
(:func:`pipeline.state_store.latency_buckets`); :func:`latency_le_buckets` turns it into
cumulative Prometheus buckets at every 5th Redis edge, i.e. 4 per decade from 1 ms to 100 s
(le = 0.001, 0.001779, 0.003163, 0.005624, 0.01, ... 100 seconds, each Redis edge rounded up
to 4 significant digits, plus +Inf). Every coarse edge is a Redis edge, so each cumulative
count is exactly the Redis count up to that edge, never interpolated. The ``_sum`` is an
estimate (Redis keeps no sum): each record counts at the geometric centre of its Redis bucket
(0.5 ms for the first, <= 1 ms).

The exporter (:func:`start_exporter`): prometheus-client's WSGI app, on a thread-per-request
HTTP server of its own (to tell Prometheus' scrapes from others, below), on
``$SKEWER_METRICS_HOST`` (default 127.0.0.1; compose sets 0.0.0.0) and ``--metrics-port``
(default ``$SKEWER_METRICS_PORT``, else 0 = a free port; -1 = off). For the native Prometheus
it writes a file_sd target file ``{run_dir}/prometheus/targets/{stage}-{run}-{pid}.json``
atomically (rename) and deletes it when it closes -- at the end of the command, at interpreter
exit, and on SIGTERM when the stage has no SIGTERM handler of its own; files left by processes
that died with ``kill -9`` are removed by the next exporter that starts. Before it stops
serving, the exporter waits (up to ``$SKEWER_METRICS_LINGER`` seconds, default 5) for one
scrape by Prometheus (its User-Agent) that began after the stage finished, when a Prometheus
has scraped it or answers at ``$SKEWER_PROMETHEUS_URL``: a stage that ends between two scrapes
-- a producer done in a second, say -- would otherwise never show its final counts.

Example (the pure parts):
    >>> labels = RunLabels("r1", "pkg")
    >>> labels.of(worker=3)
    {'run': 'r1', 'scheme': 'pkg', 'worker': '3'}
    >>> latency_le_buckets({0: 5, 3: 1, 21: 2, 200: 1})[:3]
    [('0.001', 5), ('0.001779', 6), ('0.003163', 6)]
    >>> latency_le_buckets({0: 5, 3: 1, 21: 2, 200: 1})[-2:]
    [('100.0', 8), ('+Inf', 9)]
    >>> imbalance_gauges([30, 10, 10, 10])
    (15.0, 0.25, 2.0)
    >>> records_per_producer(7, 3)
    [3, 2, 2]
    >>> lag_per_partition([10, 5, 7], {0: 4, 2: 7})
    [6, 5, 0]
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.utils import floatToGoString

from pipeline import config, services
from pipeline.state_store import BUCKETS_PER_DECADE, RunKeys, bucket_upper_ms

if TYPE_CHECKING:
    import argparse

    import redis as redis_module

#: ``_created`` series double every counter's series count and no dashboard uses them.
disable_created_metrics()

ENV_METRICS_PORT = "SKEWER_METRICS_PORT"
ENV_METRICS_HOST = "SKEWER_METRICS_HOST"
#: Seconds an exporter waits at the end for a last scrape (0: no wait).
ENV_METRICS_LINGER = "SKEWER_METRICS_LINGER"
#: prometheus-client reads this variable when it is imported (in the grouping stage's sources).
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
UNKNOWN_SCHEME = "unknown"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_LINGER_SECONDS = 5.0
#: The port every skewer service listens on inside its compose container.
COMPOSE_PORT = 9464
DISABLED_PORT = -1
STAGES = ("produce", "group", "work", "aggregate", "control")
RUN_LABELS = ("run", "scheme")
CONTROLLER_OUTCOMES = ("balanced", "rebalanced", "infeasible", "migrating", "no-statistics")
#: Coarse latency buckets: every 5th Redis bucket edge (4 per decade), 1 ms .. 100 s.
LATENCY_EDGE_STEP = 5
LATENCY_MAX_BUCKET = 5 * BUCKETS_PER_DECADE  # 10^5 ms = 100 s


class MetricsError(Exception):
    """The exporter cannot start as asked (bad port, port taken); one line for the user."""


# --- the series ------------------------------------------------------------------------------


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


#: Every series, grouped by the stage that exports it (the metrics reference of the README).
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


# --- command-line wiring --------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, *, scheme: bool) -> None:
    """``--metrics-port`` and, for a command without one, ``--scheme`` (a label only)."""
    from pipeline.commands.group import SCHEME_VARIABLE

    if scheme:
        parser.add_argument(
            "--scheme",
            help=f"grouping scheme of the run, a label of its metrics (default: "
            f"${SCHEME_VARIABLE}, else {UNKNOWN_SCHEME})",
        )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="PORT",
        help=f"Prometheus exporter port (default: ${ENV_METRICS_PORT}, else 0 = a free port; "
        "-1 = off)",
    )


def resolve_scheme(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The ``scheme`` label: the flag, else ``$GROUPING_SCHEME``, else ``unknown``."""
    from pipeline.commands.group import SCHEME_VARIABLE

    env = os.environ if environ is None else environ
    return (flag or "").strip() or env.get(SCHEME_VARIABLE, "").strip() or UNKNOWN_SCHEME


PORT_RULE = "-1 (off), 0 (a free port) or 1..65535"


def _port(text: str) -> int | None:
    """``text`` as an exporter port, None if it is none."""
    try:
        port = int(text)
    except ValueError:
        return None
    return port if DISABLED_PORT <= port <= 65535 else None


def port_number(text: str) -> int:
    """argparse type of ``--metrics-port``: a bad value is a usage error at once."""
    import argparse

    port = _port(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"must be {PORT_RULE}, got {text!r}")
    return port


def resolve_port(flag: int | None, environ: Mapping[str, str] | None = None) -> int:
    """The exporter port: the flag, else ``$SKEWER_METRICS_PORT``, else 0; -1 means off."""
    if flag is not None:
        if _port(str(flag)) is None:
            raise MetricsError(f"--metrics-port must be {PORT_RULE}, got {flag}")
        return flag
    env = os.environ if environ is None else environ
    text = env.get(ENV_METRICS_PORT, "").strip()
    if not text:
        return 0
    port = _port(text)
    if port is None:
        raise MetricsError(f"{ENV_METRICS_PORT} must be {PORT_RULE}, got {text!r}")
    return port


def linger_seconds(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    text = env.get(ENV_METRICS_LINGER, "").strip()
    try:
        return max(0.0, float(text)) if text else DEFAULT_LINGER_SECONDS
    except ValueError:
        raise MetricsError(f"{ENV_METRICS_LINGER}={text!r} is not a number of seconds") from None


# --- pure helpers ---------------------------------------------------------------------------


def records_per_producer(records: int, sources: int) -> list[int]:
    """How many of the first ``records`` records of a stream each producer sent (record i is
    producer i mod S's; see producers/kafka_producer.py)."""
    return [len(range(p, max(records, 0), sources)) for p in range(sources)]


def _round_up(value: float, digits: int = 4) -> float:
    """``value`` rounded up to ``digits`` significant digits (an edge never moves down)."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    rounded = math.ceil(value * scale - 1e-9) / scale
    return float(f"{rounded:.{digits}g}")


#: (Redis bucket, upper edge in seconds) of the exported latency buckets.
LATENCY_EDGES: tuple[tuple[int, float], ...] = tuple(
    (b, _round_up(bucket_upper_ms(b) / 1000.0))
    for b in range(0, LATENCY_MAX_BUCKET + 1, LATENCY_EDGE_STEP)
)


def latency_le_buckets(histogram: Mapping[int, int]) -> list[tuple[str, int]]:
    """Cumulative ``(le, count)`` Prometheus buckets of a Redis latency histogram (bucket ->
    records): exact, since every ``le`` is a Redis bucket edge; see the module docstring."""
    counts = [0] * (len(LATENCY_EDGES) + 1)
    for bucket, count in histogram.items():
        # A Redis bucket b holds latencies in (edge(b-1), edge(b)]: its coarse bucket is the
        # first coarse edge at or above edge(b).
        index = -(-max(int(bucket), 0) // LATENCY_EDGE_STEP)
        counts[min(index, len(LATENCY_EDGES))] += int(count)
    out = []
    total = 0
    for (_, edge), count in zip(LATENCY_EDGES, counts, strict=False):
        total += count
        out.append((floatToGoString(edge), total))
    out.append(("+Inf", total + counts[-1]))
    return out


def latency_sum_seconds(histogram: Mapping[int, int]) -> float:
    """Estimated sum of the latencies (seconds): each record at its Redis bucket's geometric
    centre, 0.5 ms for bucket 0 (<= 1 ms)."""
    total_ms = 0.0
    for bucket, count in histogram.items():
        b = int(bucket)
        centre = 0.5 if b <= 0 else math.sqrt(bucket_upper_ms(b - 1) * bucket_upper_ms(b))
        total_ms += centre * int(count)
    return total_ms / 1000.0


def imbalance_gauges(loads: Sequence[int]) -> tuple[float, float, float]:
    """(I, I / sum, lambda) of cumulative loads, with the orchestrator's one definition."""
    from pipeline.orchestrator import imbalance, max_avg

    loads = [int(x) for x in loads]
    total = sum(loads)
    value = float(imbalance(loads))
    return value, (value / total if total else 0.0), float(max_avg(loads))


def lag_per_partition(end_offsets: Sequence[int], consumed: Mapping[int, int]) -> list[int]:
    """Records per partition between what the query consumed (0 if nothing yet) and the end."""
    return [max(0, int(end) - int(consumed.get(p, 0))) for p, end in enumerate(end_offsets)]


def parse_offset_log(text: str, topic: str) -> dict[int, int]:
    """Partition -> offset of ``topic`` from one Spark offset-log file (``offsets/{batch}``:
    a version line, the batch metadata, then one JSON object per source)."""
    for line in text.splitlines()[2:]:
        with contextlib.suppress(ValueError):
            offsets = json.loads(line)
            if isinstance(offsets, dict) and topic in offsets:
                return {int(p): int(o) for p, o in offsets[topic].items()}
    return {}


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """The offsets of ``topic`` the query has consumed and committed: the offset log of the
    newest batch in ``{checkpoint}/commits`` (empty before the first commit)."""
    try:
        batches = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    except OSError:
        return {}
    for batch in sorted(batches, reverse=True)[:2]:  # Spark may be purging the oldest
        try:
            return parse_offset_log((checkpoint / "offsets" / str(batch)).read_text(), topic)
        except OSError:
            continue
    return {}


def target_document(host: str, port: int, stage: str) -> list[dict[str, Any]]:
    """The file_sd content of one exporter: where Prometheus scrapes it, and its stage."""
    scrape_host = DEFAULT_HOST if host in ("", "0.0.0.0", "::") else host
    if ":" in scrape_host:  # an IPv6 address
        scrape_host = f"[{scrape_host}]"
    return [{"targets": [f"{scrape_host}:{port}"], "labels": {"stage": stage}}]


def target_path(targets_dir: Path, stage: str, run_id: str, pid: int) -> Path:
    return targets_dir / f"{stage}-{run_id}-{pid}.json"


_TARGET_PID = re.compile(r"-(\d+)\.json$")


def remove_stale_targets(targets_dir: Path) -> list[Path]:
    """Delete target files of processes that no longer run (a stage killed with -9)."""
    removed = []
    for path in targets_dir.glob("*.json"):
        match = _TARGET_PID.search(path.name)
        if match and not services.process_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# --- stage metrics --------------------------------------------------------------------------


class ProducerMetrics:
    """``skewer_producer_records_total`` per producer, fed with the acknowledged count."""

    def __init__(self, labels: RunLabels, sources: int) -> None:
        self.sources = sources
        self._records = [PRODUCER_RECORDS.labels(**labels.of(producer=p)) for p in range(sources)]
        self._acked = [0] * sources

    def acked(self, records: int) -> None:
        """At least the first ``records`` DATA records of the stream are acknowledged (never
        goes down: a smaller figure changes nothing). O(S)."""
        for p, count in enumerate(records_per_producer(records, self.sources)):
            if count > self._acked[p]:
                self._records[p].inc(count - self._acked[p])
                self._acked[p] = count


class GroupingMetrics:
    """One grouping source's series; :meth:`batch` once per committed batch, O(W)."""

    def __init__(
        self, labels: RunLabels, source: int, n_workers: int, reasons: Sequence[str] = ()
    ) -> None:
        self.labels = labels
        self.source = source
        self._records = GROUPING_RECORDS.labels(**labels.of(source=source))
        self._routed = [
            GROUPING_ROUTED.labels(**labels.of(source=source, worker=w)) for w in range(n_workers)
        ]
        self._dead_letters = {reason: self._dead_letter_child(reason) for reason in reasons}
        self._batch_seconds = GROUPING_BATCH_SECONDS.labels(**labels.of(source=source))
        self._table_version = ROUTING_TABLE_VERSION.labels(**labels.of(source=source))
        self._table_entries = ROUTING_TABLE_ENTRIES.labels(**labels.of(source=source))
        self.table(0, 0)

    def _dead_letter_child(self, reason: str) -> Any:
        return GROUPING_DEAD_LETTERS.labels(**self.labels.of(source=self.source, reason=reason))

    def batch(
        self,
        records: int,
        routed: Sequence[int],
        dead_letters: Mapping[str, int],
        seconds: float,
    ) -> None:
        """One committed batch: records consumed, DATA records per worker, dead letters per
        reason, and its route + produce + commit time."""
        self._records.inc(records)
        for child, count in zip(self._routed, routed, strict=True):
            if count:
                child.inc(count)
        for reason, count in dead_letters.items():
            if count:
                child = self._dead_letters.get(reason)
                if child is None:
                    child = self._dead_letters[reason] = self._dead_letter_child(reason)
                child.inc(count)
        self._batch_seconds.observe(seconds)

    def table(self, version: int, entries: int) -> None:
        self._table_version.set(version)
        self._table_entries.set(entries)

    def table_of(self, scheme: Any) -> None:
        """The routing table gauges of a scheme object (0, 0 for schemes without a table)."""
        table = getattr(scheme, "table", None)
        if table is None:
            self.table(0, 0)
        else:
            self.table(int(table.version), len(table))


class ControllerMetrics:
    """The controller's and migrations' series for one run (``skewer control``)."""

    def __init__(self, labels: RunLabels) -> None:
        of = labels.of()
        self._intervals = {
            outcome: CONTROLLER_INTERVALS.labels(**of, outcome=outcome)
            for outcome in CONTROLLER_OUTCOMES
        }
        self._imbalance = CONTROLLER_IMBALANCE.labels(**of)
        self._tolerance = CONTROLLER_TOLERANCE.labels(**of)
        self._table_version = CONTROLLER_TABLE_VERSION.labels(**of)
        self._table_entries = CONTROLLER_TABLE_ENTRIES.labels(**of)
        self._planning = PLANNING_SECONDS.labels(**of)
        self._migrations = MIGRATIONS.labels(**of)
        self._in_progress = MIGRATION_IN_PROGRESS.labels(**of)
        self._keys = MIGRATION_KEYS_MOVED.labels(**of)
        self._entries = MIGRATION_STATE_ENTRIES_MOVED.labels(**of)
        self._bytes = MIGRATION_STATE_BYTES_MOVED.labels(**of)
        self._held = MIGRATION_HELD_RECORDS.labels(**of)
        self._duration = MIGRATION_DURATION_SECONDS.labels(**of)
        self._in_progress.set(0)

    def interval(
        self, outcome: str, imbalance: float | None = None, tolerance: float | None = None
    ) -> None:
        """One controller interval: its outcome, and theta / theta_max when measured."""
        child = self._intervals.get(outcome)
        if child is None:
            raise ValueError(
                f"controller outcome {outcome!r} is not one of {', '.join(CONTROLLER_OUTCOMES)}"
            )
        child.inc()
        if imbalance is not None:
            self._imbalance.set(imbalance)
        if tolerance is not None:
            self._tolerance.set(tolerance)

    def table(self, version: int, entries: int) -> None:
        """The routing table the controller published last."""
        self._table_version.set(version)
        self._table_entries.set(entries)

    def planning(self, seconds: float) -> None:
        self._planning.observe(seconds)

    @contextlib.contextmanager
    def time_planning(self) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.planning(time.perf_counter() - began)

    def migration_started(self) -> None:
        self._in_progress.set(1)

    def moved(
        self, *, keys: int = 0, state_entries: int = 0, state_bytes: int = 0, held_records: int = 0
    ) -> None:
        """What a migration moved (call as it goes or once at its end; the counters add)."""
        for child, amount in (
            (self._keys, keys),
            (self._entries, state_entries),
            (self._bytes, state_bytes),
            (self._held, held_records),
        ):
            if amount:
                child.inc(amount)

    def migration_completed(self, seconds: float) -> None:
        """A migration finished: publish -> last state moved took ``seconds``."""
        self._migrations.inc()
        self._duration.observe(seconds)
        self._in_progress.set(0)


# --- collectors reading Redis and Kafka at scrape time --------------------------------------


@dataclass(frozen=True)
class WorkerStats:
    """The workers' Redis counters at one moment, indexed by worker."""

    records: list[int]
    late: list[int]
    rejected: list[int]
    batches: list[int]
    held: list[int]
    latency: list[dict[int, int]]
    state_entries: list[int]


def read_worker_stats(client: redis_module.Redis, keys: RunKeys, n_workers: int) -> WorkerStats:
    """Two pipelined round trips: the counters and open windows, then the state sizes."""
    workers = list(range(n_workers))
    names = ("records", "late", "rejected", "batches", "held")
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(keys.stats(name), workers)
    for worker in workers:
        pipe.hgetall(keys.latency(worker))
    pipe.smembers(keys.windows_open)
    replies = pipe.execute()
    counters = {
        name: [0 if v is None else int(v) for v in reply]
        for name, reply in zip(names, replies, strict=False)
    }
    latency = [
        {int(b): int(c) for b, c in raw.items()}
        for raw in replies[len(names) : len(names) + n_workers]
    ]
    windows = sorted(int(w) for w in replies[-1])
    state_entries = [0] * n_workers
    if windows:
        pipe = client.pipeline(transaction=False)
        for worker in workers:
            for window in windows:
                pipe.hlen(keys.state(worker, window))
        sizes = pipe.execute()
        for worker in workers:
            state_entries[worker] = sum(sizes[worker * len(windows) : (worker + 1) * len(windows)])
    return WorkerStats(latency=latency, state_entries=state_entries, **counters)


def _family(name: str, labels: RunLabels) -> Metric:
    series = SERIES_BY_NAME[name]
    families = {
        "counter": CounterMetricFamily,
        "gauge": GaugeMetricFamily,
        "histogram": HistogramMetricFamily,
    }
    return families[series.kind](series.name, series.help, labels=list(series.labelnames))


def worker_families(
    labels: RunLabels, stats: WorkerStats, lag: Sequence[int] | None
) -> list[Metric]:
    """The worker series of one scrape (pure: ``stats`` and ``lag`` were read before)."""
    per_worker = {
        "skewer_worker_records_total": stats.records,
        "skewer_worker_held_records_total": stats.held,
        "skewer_worker_late_records_total": stats.late,
        "skewer_worker_rejected_total": stats.rejected,
        "skewer_worker_batches_total": stats.batches,
        "skewer_worker_state_entries": stats.state_entries,
    }
    if lag is not None:
        per_worker["skewer_worker_lag_records"] = list(lag)
    out = []
    for name, values in per_worker.items():
        family = _family(name, labels)
        for worker, value in enumerate(values):
            family.add_metric(labels.values(worker), value)
        out.append(family)
    latency = _family("skewer_worker_latency_seconds", labels)
    for worker, histogram in enumerate(stats.latency):
        latency.add_metric(
            labels.values(worker), latency_le_buckets(histogram), latency_sum_seconds(histogram)
        )
    out.append(latency)
    gauges = imbalance_gauges(stats.records)
    for name, value in zip(
        ("skewer_imbalance_records", "skewer_imbalance_fraction", "skewer_load_max_over_avg"),
        gauges,
        strict=True,
    ):
        family = _family(name, labels)
        family.add_metric(labels.values(), value)
        out.append(family)
    return out


class _ScrapeErrors:
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


class WorkTopicLag:
    """End offsets of topic ``work`` (read_committed: the last stable offset) against the
    offsets the streaming query committed (its checkpoint)."""

    def __init__(self, bootstrap: str, topic: str, n_workers: int, checkpoint: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.n_workers = n_workers
        self.checkpoint = checkpoint
        self._consumer: Any = None

    def end_offsets(self) -> list[int]:
        from confluent_kafka import Consumer, TopicPartition

        from pipeline import kafka_io

        if self._consumer is None:
            group = f"skewer-metrics-{os.getpid()}"
            self._consumer = Consumer(kafka_io.consumer_config(self.bootstrap, group))
        return [
            int(
                self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=0.5, cached=False
                )[1]
            )
            for p in range(self.n_workers)
        ]

    def __call__(self) -> list[int]:
        return lag_per_partition(self.end_offsets(), committed_offsets(self.checkpoint, self.topic))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class WorkerCollector:
    """The worker series, read from Redis (and Kafka for lag) at every scrape; see module."""

    def __init__(
        self,
        labels: RunLabels,
        n_workers: int,
        redis_url: str,
        lag: Callable[[], list[int]] | None = None,
    ) -> None:
        from pipeline import kafka_io

        self.labels = labels
        self.n_workers = n_workers
        self.keys = RunKeys(labels.run)
        self.client = kafka_io.connect_redis(redis_url)
        self.lag = lag
        self.errors = _ScrapeErrors(labels, "work")
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # registering must not read Redis

    def collect(self) -> Iterable[Metric]:
        import redis as redis_module

        with self._lock:  # two scrapes at once would only read the same thing twice
            try:
                stats = read_worker_stats(self.client, self.keys, self.n_workers)
            except redis_module.RedisError as error:
                self.errors.record("the workers' Redis counters", error)
                return []
            lag = None
            if self.lag is not None:
                try:
                    lag = self.lag()
                except Exception as error:  # Kafka errors have many types; the rest is served
                    self.errors.record("the work topic's offsets", error)
            return worker_families(self.labels, stats, lag)

    def close(self) -> None:
        closer = getattr(self.lag, "close", None)
        if closer is not None:
            closer()
        self.client.close()


def aggregator_families(
    labels: RunLabels, totals: Mapping[str, int], watermark_ms: int | None
) -> list[Metric]:
    """The aggregator series from ``stats:windows`` and the pipeline watermark (ms, or None
    when there is none to show)."""
    out = []
    for name, field in (
        ("skewer_aggregator_windows_final_total", "windows"),
        ("skewer_aggregator_records_final_total", "records"),
    ):
        family = _family(name, labels)
        family.add_metric(labels.values(), totals.get(field, 0))
        out.append(family)
    distinct = totals.get("distinct_keys", 0)
    if distinct:
        family = _family("skewer_replication", labels)
        family.add_metric(labels.values(), totals.get("state_entries", 0) / distinct)
        out.append(family)
    if watermark_ms is not None:
        family = _family("skewer_watermark_seconds", labels)
        family.add_metric(labels.values(), watermark_ms / 1000.0)
        out.append(family)
    return out


class AggregatorCollector:
    """The aggregator series, read from Redis at every scrape (exact across restarts).

    The watermark shown is the last one below END_OF_STREAM: at the end of a stream the
    workers' watermark jumps to END_OF_STREAM (int64 max), which is no time to plot.
    """

    def __init__(self, labels: RunLabels, n_workers: int, redis_url: str) -> None:
        from pipeline import kafka_io
        from pipeline.state_store import StateStore

        self.labels = labels
        self.n_workers = n_workers
        self.store = StateStore(kafka_io.connect_redis(redis_url), labels.run)
        self.errors = _ScrapeErrors(labels, "aggregate")
        self._watermark_ms: int | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        import redis as redis_module

        from pipeline.records import END_OF_STREAM

        try:
            totals = self.store.window_totals()
            watermark = self.store.min_watermark(self.n_workers)
        except redis_module.RedisError as error:
            self.errors.record("the aggregator's Redis counters", error)
            return []
        if watermark is not None and watermark < END_OF_STREAM:
            self._watermark_ms = watermark
        return aggregator_families(self.labels, totals, self._watermark_ms)

    def close(self) -> None:
        self.store.client.close()


# --- the exporter ---------------------------------------------------------------------------


class _PrometheusScrapes:
    """When the latest complete scrape *by Prometheus* began (its User-Agent says so; a test or
    a curl reading the endpoint does not count)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.count = 0
        self._latest_began = -math.inf

    def note(self, began: float) -> None:
        with self._condition:
            self.count += 1
            self._latest_began = max(self._latest_began, began)
            self._condition.notify_all()

    def wait_for_one_after(self, moment: float, timeout: float) -> bool:
        """Until a scrape that began at or after ``moment`` has read everything."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._latest_began < moment:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._condition.wait(remaining)
        return True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        """No line per scrape on the stage's stderr."""


def _serve(host: str, port: int, registry: CollectorRegistry, scrapes: _PrometheusScrapes) -> Any:
    """prometheus-client's WSGI app on a thread-per-request server (as its
    ``start_http_server``), noting each Prometheus scrape once its response is ready."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    metrics_app = make_wsgi_app(registry)

    class Server(ThreadingWSGIServer):
        address_family = family[0][0]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        began = time.monotonic()
        body = metrics_app(environ, start_response)
        if str(environ.get("HTTP_USER_AGENT", "")).startswith("Prometheus/"):
            scrapes.note(began)
        return body  # type: ignore[no-any-return]

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="skewer-metrics", daemon=True).start()
    return server


class _Delegate:
    """Serves another registry (the process's default one) inside a served registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


class Exporter:
    """One stage process's metrics endpoint (see :func:`start_exporter`); a context manager."""

    def __init__(
        self,
        stage: str,
        labels: RunLabels,
        *,
        settings: config.Settings,
        server: Any = None,
        host: str = DEFAULT_HOST,
        registry: CollectorRegistry | None = None,
        scrapes: _PrometheusScrapes | None = None,
        multiprocess_dir: Path | None = None,
    ) -> None:
        self.stage = stage
        self.labels = labels
        self.settings = settings
        self.server = server
        self.host = host
        self.registry = registry or CollectorRegistry()
        self.scrapes = scrapes or _PrometheusScrapes()
        self.multiprocess_dir = multiprocess_dir
        self.target_path: Path | None = None
        self._collectors: list[Any] = []
        self._closed = False
        # Reentrant: the SIGTERM handler may interrupt a close() of the same thread.
        self._close_lock = threading.RLock()

    @property
    def enabled(self) -> bool:
        return self.server is not None

    @property
    def port(self) -> int | None:
        return int(self.server.server_port) if self.server is not None else None

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        return f"http://{target_document(self.host, self.port or 0, self.stage)[0]['targets'][0]}"

    def register(self, collector: Any) -> None:
        """Serve ``collector`` too (closed with the exporter, if it has ``close``)."""
        self._collectors.append(collector)
        if self.enabled:
            self.registry.register(collector)

    def write_target(self) -> Path:
        """The file_sd target file, written atomically; stale ones of dead processes go."""
        from pipeline.services import prometheus_targets_dir

        directory = prometheus_targets_dir(self.settings)
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_targets(directory)
        path = target_path(directory, self.stage, self.labels.run, os.getpid())
        temporary = directory / f".{path.name}.tmp"
        document = target_document(self.host, self.port or 0, self.stage)
        temporary.write_text(json.dumps(document) + "\n")
        temporary.replace(path)
        self.target_path = path
        return path

    def close(self, linger: float | None = None) -> None:
        """Stop serving, after one last scrape (see the module docstring); idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.server is not None:
                wait = linger_seconds() if linger is None else linger
                watched = wait > 0 and (self.scrapes.count > 0 or self._prometheus_is_up())
                if watched and self.scrapes.wait_for_one_after(time.monotonic(), wait):
                    time.sleep(0.1)  # the scrape's response is still being written
        finally:
            if self.target_path is not None:
                self.target_path.unlink(missing_ok=True)
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()
            for collector in self._collectors:
                closer = getattr(collector, "close", None)
                if closer is not None:
                    with contextlib.suppress(Exception):
                        closer()
            if self.multiprocess_dir is not None:
                if os.environ.get(MULTIPROC_VARIABLE) == str(self.multiprocess_dir):
                    del os.environ[MULTIPROC_VARIABLE]
                shutil.rmtree(self.multiprocess_dir, ignore_errors=True)

    def _prometheus_is_up(self) -> bool:
        from pipeline.services import prometheus_answers

        return prometheus_answers(self.settings.prometheus_url, timeout=0.5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def start_exporter(
    stage: str,
    run_id: str,
    scheme: str,
    port: int | None = None,
    *,
    multiprocess: bool = False,
    settings: config.Settings | None = None,
) -> Exporter:
    """Serve this process's metrics for ``stage`` of run ``run_id`` (see the module docstring).

    ``port`` None reads ``$SKEWER_METRICS_PORT`` (else 0, a free port); -1 returns a disabled
    exporter (nothing served, nothing written; its methods still work). ``multiprocess``: the
    metrics are recorded by child processes started after this call (the grouping stage's
    sources). Raises :class:`MetricsError` for a bad or busy port.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    labels = RunLabels(run_id, scheme)
    settings = settings or config.load()
    port = resolve_port(port)
    if port == DISABLED_PORT:
        return Exporter(stage, labels, settings=settings)
    host = os.environ.get(ENV_METRICS_HOST, "").strip() or DEFAULT_HOST
    registry = CollectorRegistry()
    scrapes = _PrometheusScrapes()
    directory = None
    if multiprocess:
        from prometheus_client.multiprocess import MultiProcessCollector

        directory = Path(tempfile.mkdtemp(prefix=f"skewer-metrics-{stage}-"))
        os.environ[MULTIPROC_VARIABLE] = str(directory)
        MultiProcessCollector(registry, path=str(directory))
    else:
        registry.register(_Delegate(REGISTRY))  # type: ignore[arg-type]
    try:
        server = _serve(host, port, registry, scrapes)
    except OSError as error:
        if directory is not None:
            del os.environ[MULTIPROC_VARIABLE]
            shutil.rmtree(directory, ignore_errors=True)
        raise MetricsError(
            f"cannot serve metrics on {host}:{port}: {error.strerror or error}"
        ) from None
    exporter = Exporter(
        stage,
        labels,
        settings=settings,
        server=server,
        host=host,
        registry=registry,
        scrapes=scrapes,
        multiprocess_dir=directory,
    )
    try:
        exporter.write_target()
    except OSError as error:
        exporter.close(linger=0)
        raise MetricsError(f"cannot write the Prometheus target file: {error}") from None
    atexit.register(exporter.close, 0.0)
    _close_on_sigterm(exporter)
    return exporter


def _close_on_sigterm(exporter: Exporter) -> None:
    """A stage without a SIGTERM handler of its own dies at SIGTERM without running atexit:
    close the exporter (target file, multiprocess folder) first, then die the same way."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the stage handles SIGTERM and leaves through its finally blocks

    def close_and_die(signum: int, _frame: Any) -> None:
        exporter.close(linger=0)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, close_and_die)
