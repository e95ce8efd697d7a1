"""The controller's series (routing-table schemes): rounds, tables, planning and migrations.

Layer: observe.

Counted in-process around the controller and its migrations, per process: a restarted
controller starts them at zero and Prometheus' ``rate``/``increase`` handle the reset.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pipeline.observe.series import (
    CONTROLLER_IMBALANCE,
    CONTROLLER_INTERVALS,
    CONTROLLER_OUTCOMES,
    CONTROLLER_TABLE_ENTRIES,
    CONTROLLER_TABLE_VERSION,
    CONTROLLER_TOLERANCE,
    MIGRATION_DURATION_SECONDS,
    MIGRATION_HELD_RECORDS,
    MIGRATION_IN_PROGRESS,
    MIGRATION_KEYS_MOVED,
    MIGRATION_STATE_BYTES_MOVED,
    MIGRATION_STATE_ENTRIES_MOVED,
    MIGRATIONS,
    PLANNING_SECONDS,
    RunLabels,
)

if TYPE_CHECKING:
    pass


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
