"""The grouping stage's series, counted in-process once per committed batch.

Layer: observe.

A batch counts only once its Kafka transaction committed, so a batch the broker aborted and the
source read again is counted when it commits, not twice. Several sources record into the
exporter's multiprocess folder (:mod:`pipeline.observe.exporter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.observe.series import (
    GROUPING_BATCH_SECONDS,
    GROUPING_DEAD_LETTERS,
    GROUPING_FILTERED,
    GROUPING_LATE,
    GROUPING_RECORDS,
    GROUPING_ROUTED,
    ROUTING_TABLE_ENTRIES,
    ROUTING_TABLE_VERSION,
    RunLabels,
)

if TYPE_CHECKING:
    pass


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
        self._late = GROUPING_LATE.labels(**labels.of(source=source))
        self._filtered = GROUPING_FILTERED.labels(**labels.of(source=source))
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
        late: int = 0,
        filtered: int = 0,
    ) -> None:
        """One committed batch: records consumed, DATA records per worker, dead letters per
        reason, its route + produce + commit time, and its late records and those a query's
        WHERE left out (a user topic)."""
        self._records.inc(records)
        if late:
            self._late.inc(late)
        if filtered:
            self._filtered.inc(filtered)
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
        """The routing table gauges of a scheme object: a routing-table scheme's version and
        entries; version 0 and the entries of a key memory that has no versions (static
        PoTC's key -> choice table); 0, 0 for schemes without a table."""
        table = getattr(scheme, "table", None)
        if table is None:
            self.table(0, 0)
        else:
            self.table(int(getattr(table, "version", 0)), len(table))
