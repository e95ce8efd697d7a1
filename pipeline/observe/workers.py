"""The Spark workers' series, read from Redis and Kafka at scrape time by the driver.

Layer: observe.

The Spark tasks export nothing themselves; the driver serves :class:`WorkerCollector`, which
reads at scrape time the run's Redis counters the tasks keep (idempotent per worker and
micro-batch, so a replay is never counted twice and a restarted job continues them) and
Kafka's end offsets of ``work`` against the offsets the query committed. Imbalance comes from
:func:`operators.metrics.imbalance`. The Redis latency histogram (20 buckets per decade) is
served as Prometheus buckets at every 5th Redis edge (:func:`latency_le_buckets`): exact
counts, never interpolated; the ``_sum`` is an estimate. See docs/metrics.md.

Example:
    >>> latency_le_buckets({0: 5, 3: 1, 21: 2, 200: 1})[:3]
    [('0.001', 5), ('0.001779', 6), ('0.003163', 6)]
    >>> latency_le_buckets({0: 5, 3: 1, 21: 2, 200: 1})[-2:]
    [('100.0', 8), ('+Inf', 9)]
    >>> load_figures([30, 10, 10, 10])
    (15.0, 0.25, 2.0)
    >>> lag_per_partition([10, 5, 7], {0: 4, 2: 7})
    [6, 5, 0]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    Metric,
)
from prometheus_client.utils import floatToGoString

from operators.metrics import BUCKETS_PER_DECADE, bucket_upper_ms, load_figures
from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import declared_fields
from pipeline.observe.series import RunLabels, ScrapeErrors, metric_family

if TYPE_CHECKING:
    import redis as redis_module


#: Coarse latency buckets: every 5th Redis bucket edge (4 per decade), 1 ms .. 100 s.
LATENCY_EDGE_STEP = 5
LATENCY_MAX_BUCKET = 5 * BUCKETS_PER_DECADE  # 10^5 ms = 100 s


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
    #: Per state field (its name), the worker's values in open windows.
    field_entries: dict[str, list[int]] = dataclasses.field(default_factory=dict)


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
    fields = declared_fields(client, keys)
    state_entries = [0] * n_workers
    field_entries = {f.name: [0] * n_workers for f in fields}
    if windows:
        pipe = client.pipeline(transaction=False)
        for worker in workers:
            for window in windows:
                pipe.hlen(keys.state(worker, window))
                for index in range(len(fields)):
                    pipe.hlen(keys.field(index, worker, window))
        sizes = iter(pipe.execute())
        for worker in workers:
            for _window in windows:
                state_entries[worker] += next(sizes)
                for declared in fields:
                    field_entries[declared.name][worker] += next(sizes)
    return WorkerStats(
        latency=latency, state_entries=state_entries, field_entries=field_entries, **counters
    )


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
        family = metric_family(name, labels)
        for worker, value in enumerate(values):
            family.add_metric(labels.values(worker), value)
        out.append(family)
    if stats.field_entries:
        family = metric_family("skewer_worker_field_entries", labels)
        for field_name, values in stats.field_entries.items():
            for worker, value in enumerate(values):
                family.add_metric([*labels.values(worker), field_name], value)
        out.append(family)
    latency = metric_family("skewer_worker_latency_seconds", labels)
    for worker, histogram in enumerate(stats.latency):
        latency.add_metric(
            labels.values(worker), latency_le_buckets(histogram), latency_sum_seconds(histogram)
        )
    out.append(latency)
    gauges = load_figures(stats.records)
    for name, value in zip(
        ("skewer_imbalance_records", "skewer_imbalance_fraction", "skewer_load_max_over_avg"),
        gauges,
        strict=True,
    ):
        family = metric_family(name, labels)
        family.add_metric(labels.values(), value)
        out.append(family)
    return out


#: How long the lag reader's first request (its connection) may take.
CONNECT_TIMEOUT_SECONDS = 10.0


class WorkTopicLag:
    """End offsets of topic ``work`` (read_committed: the last stable offset) against the
    offsets the streaming query committed (its checkpoint), or with ``applied`` (Real-Time
    Mode, whose checkpoint logs offsets only at the end of each checkpoint interval) the
    offset after the last one each worker applied."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        n_workers: int,
        checkpoint: Path,
        applied: Callable[[], list[int | None]] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.n_workers = n_workers
        self.checkpoint = checkpoint
        self.applied = applied
        self._consumer: Any = None

    def end_offsets(self) -> list[int]:
        from confluent_kafka import Consumer, TopicPartition

        from pipeline.io import kafka_io

        if self._consumer is None:
            group = f"skewer-metrics-{os.getpid()}"
            consumer = Consumer(kafka_io.consumer_config(self.bootstrap, group))
            try:
                # The first request also connects to the cluster, which can take longer than
                # a scrape's per-partition timeout on a busy machine; later ones are quick.
                consumer.list_topics(self.topic, timeout=CONNECT_TIMEOUT_SECONDS)
            except Exception:
                consumer.close()
                raise
            self._consumer = consumer
        return [
            int(
                self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=0.5, cached=False
                )[1]
            )
            for p in range(self.n_workers)
        ]

    def __call__(self) -> list[int]:
        if self.applied is not None:
            last = self.applied()
            consumed = {p: offset + 1 for p, offset in enumerate(last) if offset is not None}
        else:
            consumed = committed_offsets(self.checkpoint, self.topic)
        return lag_per_partition(self.end_offsets(), consumed)

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
        from pipeline.io.redis_client import connect_redis

        self.labels = labels
        self.n_workers = n_workers
        self.keys = RunKeys(labels.run)
        self.client = connect_redis(redis_url)
        self.lag = lag
        self.errors = ScrapeErrors(labels, "work")
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
