"""The producer's series, counted in-process once per acknowledged chunk.

Layer: observe.

Example:
    >>> records_per_producer(7, 3)
    [3, 2, 2]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.observe.series import PRODUCER_RECORDS, RunLabels

if TYPE_CHECKING:
    pass


def records_per_producer(records: int, sources: int) -> list[int]:
    """How many of the first ``records`` records of a stream each producer sent (record i is
    producer i mod S's; see producers/kafka_producer.py)."""
    return [len(range(p, max(records, 0), sources)) for p in range(sources)]


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
