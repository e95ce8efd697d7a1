"""A run's latency over time: whole run, steady state and 5-second windows, from snapshots.

Layer: runs.

The workers' latency histogram (bucket -> records, :mod:`pipeline.io.state_store`) only grows,
so the records applied between two snapshots of it are their difference
(:func:`histogram_difference`), and a snapshot's total is the records applied so far (each
applied DATA record adds one to a bucket). :class:`LatencySampler` snapshots the histogram
summed over the workers about once a second while a run goes, and polls the workers'
processed counters every 0.1 s for the first and the last record applied. From the snapshots,
:func:`steady_cut` finds where the steady state begins (the first snapshot after
:data:`~operators.metrics.STEADY_FROM` of the run's records were applied: the definition of
``skewer bench e2e`` and of advise's model too) and :func:`latency_windows` splits the run
into windows of wall time: arithmetic only.

    >>> histogram_difference({10: 5, 20: 9, 30: 2}, {10: 5, 20: 1})
    {20: 8, 30: 2}
    >>> reached_steady(199, 1000), reached_steady(200, 1000)
    (False, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from operators.metrics import STEADY_FROM, latency_quantile

if TYPE_CHECKING:
    from pipeline.io.state_store import StateStore

#: Seconds of wall time per latency window.
WINDOW_SECONDS = 5.0
#: Seconds between two histogram snapshots, and between two polls of the processed counters.
SNAPSHOT_EVERY = 1.0
POLL_EVERY = 0.1


def histogram_difference(later: Mapping[int, int], earlier: Mapping[int, int]) -> dict[int, int]:
    """The records of ``later`` not in ``earlier`` (two snapshots of one growing histogram),
    bucket by bucket; buckets that did not grow are left out."""
    return {
        bucket: count - earlier.get(bucket, 0)
        for bucket, count in later.items()
        if count > earlier.get(bucket, 0)
    }


def reached_steady(processed: int, records: int) -> bool:
    """Have the workers applied :data:`STEADY_FROM` of the run's ``records``?"""
    return processed >= STEADY_FROM * records


@dataclass(frozen=True)
class Snapshot:
    """The workers' latency histogram (summed) at wall-clock time ``at`` (``time.time()``)."""

    at: float
    histogram: Mapping[int, int]

    @property
    def records(self) -> int:
        return sum(self.histogram.values())


def steady_cut(snapshots: Sequence[Snapshot], records: int) -> Snapshot | None:
    """The first snapshot at which the steady state had begun (None: it never had).

    >>> cut = steady_cut([Snapshot(1.0, {10: 199}), Snapshot(2.0, {10: 200})], 1000)
    >>> cut.at
    2.0
    """
    return next((s for s in snapshots if reached_steady(s.records, records)), None)


def steady_histogram(snapshots: Sequence[Snapshot], records: int) -> dict[int, int]:
    """The histogram of the records applied after the steady state began: the last snapshot
    minus :func:`steady_cut` (empty when the cut is the last snapshot or there is none)."""
    cut = steady_cut(snapshots, records)
    if cut is None:
        return {}
    return histogram_difference(snapshots[-1].histogram, cut.histogram)


@dataclass(frozen=True)
class LatencyWindow:
    """The records applied in ``[start_s, start_s + WINDOW_SECONDS)`` seconds after the
    command, and their latency quantiles (None without records)."""

    start_s: float
    records: int
    p50_ms: float | None
    p99_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "records": self.records,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
        }


def latency_windows(
    snapshots: Sequence[Snapshot], origin: float, width: float = WINDOW_SECONDS
) -> list[LatencyWindow]:
    """Windows of ``width`` seconds of wall time since ``origin``, from the first in which a
    record was applied to the last snapshot's, empty ones included.

    A window's records are its last snapshot minus the previous window's last (nothing is
    applied before the first snapshot): a record counts in the window of the first snapshot
    that holds it, so at most one snapshot interval late, and every record counts once.
    """
    ends: dict[int, Snapshot] = {}
    for snapshot in sorted(snapshots, key=lambda s: s.at):
        ends[math.floor((snapshot.at - origin) / width)] = snapshot
    first = next((k for k in sorted(ends) if ends[k].records > 0), None)
    if first is None:
        return []
    windows = []
    before: Mapping[int, int] = {}
    for k in range(first, max(ends) + 1):
        end = ends.get(k)
        applied = histogram_difference(end.histogram, before) if end is not None else {}
        windows.append(
            LatencyWindow(
                start_s=round(k * width, 3),
                records=sum(applied.values()),
                p50_ms=latency_quantile(applied, 0.5),
                p99_ms=latency_quantile(applied, 0.99),
            )
        )
        before = end.histogram if end is not None else before
    return windows


@dataclass
class LatencySampler:
    """Snapshots of the W workers' latency histogram while a run goes: :meth:`poll` it often
    (the orchestrator's wait loop, every 0.1 s); it snapshots every :data:`SNAPSHOT_EVERY`
    seconds and polls the processed counters every :data:`POLL_EVERY` seconds.

    Why the counters, polled: the workers' Lua apply adds a batch's records to the counters and
    the histogram at once, and nothing in Redis says when; the histogram's buckets say how long
    records waited, not when they were applied. So ``first_applied`` is the end of the first
    poll that saw a record, ``last_applied`` of the last poll that saw the count grow: each at
    most 0.1 s (and a Redis round trip) after the apply. One HGETALL of W counters per poll.
    """

    workers: int
    snapshots: list[Snapshot] = field(default_factory=list)
    #: Wall-clock times of the first poll that found a record applied, and of the last poll
    #: that found more than the one before.
    first_applied: float | None = None
    last_applied: float | None = None
    _processed: int = 0
    _next_snapshot: float = 0.0
    _next_poll: float = 0.0

    def poll(self, store: StateStore) -> None:
        """A poll of the processed counters and a snapshot, if either is due; a Redis that
        fails over meanwhile costs a sample, not the run."""
        from redis.exceptions import RedisError

        now = time.time()
        try:
            if now >= self._next_poll:
                self._next_poll = now + POLL_EVERY
                processed = int(store.processed_per_worker(self.workers).sum())
                if processed > self._processed:
                    self._processed, self.last_applied = processed, time.time()
                    if self.first_applied is None:
                        self.first_applied = self.last_applied
            if now >= self._next_snapshot:
                self._next_snapshot = now + SNAPSHOT_EVERY
                self.snapshot(store)
        except (RedisError, OSError):
            return

    def snapshot(self, store: StateStore) -> Snapshot:
        """Take one snapshot now (the last one when the run ends)."""
        # One MULTI over the W hashes (redis-py's pipeline): the workers at one instant.
        snapshot = Snapshot(time.time(), store.latency_histogram(self.workers))
        self.snapshots.append(snapshot)
        if snapshot.records > self._processed:  # not seen by a poll (none since): as late
            self._processed, self.last_applied = snapshot.records, snapshot.at
            self.first_applied = self.first_applied or snapshot.at
        return snapshot
