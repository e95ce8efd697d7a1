"""The grouping stage's Redis: its counters, the watermarks its sources forward, its input.

Layer: io.

The grouping sources (:mod:`pipeline.stages.grouping`) count each committed batch here in one
MULTI, guarded by the last offset counted (a batch replayed after a crash is not counted
twice); the orchestrator, the metrics and verification read the totals. Key names:
:mod:`pipeline.io.redis_layout`; what each holds: docs/design.md#redis-layout.

Example:
    >>> counts = SourceBatchCounts(records=5, data=4, offset=9, routed=[3, 1],
    ...     dead_letters={"no_key": 1, "too_large": 0})
    >>> counts.dead_letter_total
    1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.io.redis_layout import RunKeys

if TYPE_CHECKING:
    import redis


@dataclass(frozen=True)
class SourceBatchCounts:
    """What one grouping source adds to the counters for one committed batch."""

    records: int
    data: int
    #: The batch's last input offset: records at or below it are counted.
    offset: int
    #: Data records routed to each worker.
    routed: Sequence[int]
    #: Dead letters per reason.
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    #: Records that came after their window closed (a user's topic).
    late: int = 0
    #: Records a query's WHERE left out (a user's topic).
    filtered: int = 0

    @property
    def dead_letter_total(self) -> int:
        return sum(self.dead_letters.values())


def _int_map(raw: Mapping[bytes, bytes]) -> dict[int, int]:
    return {int(k): int(v) for k, v in raw.items()}


class GroupingStore:
    """The grouping stage's keys of run ``run_id`` (``decode_responses`` off)."""

    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client = client
        self.keys = RunKeys(run_id)

    # -- a source

    def counted_offset(self, source: int) -> int:
        """The last input offset ``source`` counted (-1 for none)."""
        counted = self.client.hget(self.keys.source_stats(source), "offset")
        return int(counted) if counted is not None else -1

    def mark_started(self, source: int, at_ms: int) -> None:
        """Say ``source`` is ready (the orchestrator waits for every source)."""
        self.client.hset(self.keys.source_stats(source), "started_ms", at_ms)

    def count_batch(self, source: int, counts: SourceBatchCounts) -> None:
        """Add one batch's counts, and its last offset, in one MULTI."""
        stats = self.keys.source_stats(source)
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(stats, "records", counts.records)
        pipe.hincrby(stats, "data", counts.data)
        pipe.hincrby(stats, "dead_letters", counts.dead_letter_total)
        pipe.hset(stats, "offset", counts.offset)
        if counts.late:
            pipe.hincrby(stats, "late", counts.late)
            pipe.hincrby(self.keys.stats("late_input"), source, counts.late)
        if counts.filtered:
            pipe.hincrby(stats, "filtered", counts.filtered)
            pipe.hincrby(self.keys.stats("filtered_input"), source, counts.filtered)
        for worker, count in enumerate(counts.routed):
            if count:
                pipe.hincrby(self.keys.stats("routed"), worker, count)
        for reason, count in counts.dead_letters.items():
            if count:
                pipe.hincrby(self.keys.stats("dead_letters"), reason, count)
        pipe.execute()

    def forward_watermark(self, source: int, watermark: int) -> None:
        """Keep the watermark ``source`` forwarded, for an idle source to adopt."""
        self.client.hset(self.keys.sources_watermark, source, watermark)

    def source_watermarks(self) -> dict[int, int]:
        """Source -> the watermark it last forwarded."""
        return _int_map(self.client.hgetall(self.keys.sources_watermark))

    def record_input(self, description: str) -> None:
        """Keep how the run reads a user's topic (JSON, :mod:`pipeline.stages.user_topic`)."""
        self.client.set(self.keys.input, description)

    def recorded_input(self) -> bytes | None:
        return self.client.get(self.keys.input)

    # -- totals

    def sources_started(self, n_sources: int) -> bool:
        """Whether each of the first ``n_sources`` sources has said it is ready."""
        pipe = self.client.pipeline(transaction=False)
        for source in range(n_sources):
            pipe.hexists(self.keys.source_stats(source), "started_ms")
        return all(pipe.execute())

    def source_counts(self, source: int) -> dict[str, int]:
        """The counters of one source (records, data, dead_letters, late, offset, ...)."""
        raw = self.client.hgetall(self.keys.source_stats(source))
        return {k.decode(): int(v) for k, v in raw.items()}

    def routed_per_worker(self) -> dict[int, int]:
        """Worker -> data records the stage routed to it."""
        return _int_map(self.client.hgetall(self.keys.stats("routed")))

    def dead_letters_by_reason(self) -> dict[str, int]:
        raw = self.client.hgetall(self.keys.stats("dead_letters"))
        return {k.decode(): int(v) for k, v in raw.items()}

    def late_per_source(self) -> dict[int, int]:
        """Source -> records of a user's topic that came after their window closed."""
        return _int_map(self.client.hgetall(self.keys.stats("late_input")))

    def filtered_per_source(self) -> dict[int, int]:
        """Source -> records of a user's topic that a query's WHERE left out."""
        return _int_map(self.client.hgetall(self.keys.stats("filtered_input")))
