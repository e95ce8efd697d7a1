"""The aggregator's series, read from Redis at scrape time: final windows, replication, watermark.

Layer: observe.

Read the same way as the workers' (:mod:`pipeline.observe.workers`), from ``stats:windows`` and
the workers' watermarks, so a restarted aggregator continues its counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import (
    Metric,
)

from pipeline.observe.series import RunLabels, ScrapeErrors, metric_family

if TYPE_CHECKING:
    pass


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
        family = metric_family(name, labels)
        family.add_metric(labels.values(), totals.get(field, 0))
        out.append(family)
    distinct = totals.get("distinct_keys", 0)
    if distinct:
        family = metric_family("skewer_replication", labels)
        family.add_metric(labels.values(), totals.get("state_entries", 0) / distinct)
        out.append(family)
    if watermark_ms is not None:
        family = metric_family("skewer_watermark_seconds", labels)
        family.add_metric(labels.values(), watermark_ms / 1000.0)
        out.append(family)
    return out


class AggregatorCollector:
    """The aggregator series, read from Redis at every scrape (exact across restarts).

    The watermark shown is the last one below END_OF_STREAM: at the end of a stream the
    workers' watermark jumps to END_OF_STREAM (int64 max), which is no time to plot.
    """

    def __init__(self, labels: RunLabels, n_workers: int, redis_url: str) -> None:
        from pipeline.io.redis_client import connect_redis
        from pipeline.io.state_store import StateStore

        self.labels = labels
        self.n_workers = n_workers
        self.store = StateStore(connect_redis(redis_url), labels.run)
        self.errors = ScrapeErrors(labels, "aggregate")
        self._watermark_ms: int | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        import redis as redis_module

        from pipeline.io.records import END_OF_STREAM

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
