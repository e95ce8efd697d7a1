"""The control plane's Redis operations: statistics reports, versioned tables, migrations.

Layer: io.

The grouping sources report statistics and read published tables, the controller
(:mod:`pipeline.stages.controller`) opens rounds, publishes a table and its migration in one
MULTI, and moves each old worker's keys and state with one guarded Lua script
(:data:`~pipeline.io.redis_layout.MIGRATE_SCRIPT`); the workers' side is their apply script.
Why each step is exact: docs/design.md#migration-protocol; the keys:
docs/design.md#redis-layout.

Example (a report's round trip through its Redis fields):
    >>> import numpy as np
    >>> report = StatisticsReport(source=1, round=3, table_version=2,
    ...     key_ids=np.array([7, 9]), frequency=np.array([5.0, 2.0]), cost=np.array([5.0, 2.0]),
    ...     state_size=np.array([5.0, 2.0]), worker_loads=np.array([4, 3]), records=7,
    ...     names=[b"k7", b"k9"], unnamed=0)
    >>> back = StatisticsReport.from_fields(report.to_fields())
    >>> back.names, back.key_ids.tolist(), back.worker_loads.tolist(), back.round
    ([b'k7', b'k9'], [7, 9], [4, 3], 3)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.base import KeyStatistics, RoutingTable
from operators.keys import KeyBatch
from pipeline.io.records import END_OF_STREAM
from pipeline.io.redis_client import register_script
from pipeline.io.redis_layout import COMPLETE_SCRIPT, MIGRATE_SCRIPT, RunKeys

if TYPE_CHECKING:
    import redis as redis_module

#: Counters of ``ctl:migration:{version}`` the scripts add to (0 when nothing happened).
MIGRATION_COUNTERS = (
    "keys_moved",
    "state_entries_moved",
    "state_bytes_moved",
    "released_records",
    "held_records",
)
#: Records kept in ``ctl:intervals`` and ``ctl:rebalances`` (the newest).
HISTORY_LENGTH = 10_000
#: Seconds the control plane keeps its past: a round's reports, a table two versions old, a
#: completed migration's record and its done set. Long enough to inspect a run just ended;
#: short enough that Redis stays flat under a stack that runs for days (the history that
#: outlives them is the bounded ``ctl:rebalances`` and ``ctl:intervals``).
HISTORY_SECONDS = 300


def now_ms() -> int:
    return int(time.time() * 1000)


def _array(raw: bytes | None, dtype: str) -> np.ndarray:
    return np.frombuffer(raw or b"", dtype=dtype).copy()


def join_names(names: Sequence[bytes]) -> tuple[bytes, bytes]:
    """Key bytes as one buffer and int64 offsets (the :class:`KeyBatch` layout)."""
    batch = KeyBatch.from_bytes(names)
    return batch.data.tobytes(), batch.offsets.astype("<i8").tobytes()


def split_names(data: bytes | None, offsets: bytes | None) -> list[bytes]:
    bounds = _array(offsets, "<i8")
    buffer = data or b""
    return [buffer[bounds[i] : bounds[i + 1]] for i in range(max(bounds.shape[0] - 1, 0))]


@dataclass
class StatisticsReport:
    """One source's statistics for one round (the fields of :class:`KeyStatistics`, plus the
    bytes of every reported key; ``unnamed`` counts records of keys whose bytes were unknown)."""

    source: int
    round: int
    table_version: int
    key_ids: np.ndarray
    frequency: np.ndarray
    cost: np.ndarray
    state_size: np.ndarray
    worker_loads: np.ndarray
    records: int
    names: list[bytes]
    unnamed: int = 0

    def to_fields(self) -> dict[str, bytes | int]:
        data, offsets = join_names(self.names)
        return {
            "source": self.source,
            "round": self.round,
            "table_version": self.table_version,
            "records": self.records,
            "unnamed": self.unnamed,
            "key_ids": np.asarray(self.key_ids, "<i8").tobytes(),
            "frequency": np.asarray(self.frequency, "<f8").tobytes(),
            "cost": np.asarray(self.cost, "<f8").tobytes(),
            "state_size": np.asarray(self.state_size, "<f8").tobytes(),
            "worker_loads": np.asarray(self.worker_loads, "<i8").tobytes(),
            "name_bytes": data,
            "name_offsets": offsets,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> StatisticsReport:
        raw = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}

        def number(name: str) -> int:
            return int(raw[name])

        return cls(
            source=number("source"),
            round=number("round"),
            table_version=number("table_version"),
            key_ids=_array(raw["key_ids"], "<i8"),
            frequency=_array(raw["frequency"], "<f8"),
            cost=_array(raw["cost"], "<f8"),
            state_size=_array(raw["state_size"], "<f8"),
            worker_loads=_array(raw["worker_loads"], "<i8"),
            records=number("records"),
            names=split_names(raw["name_bytes"], raw["name_offsets"]),
            unnamed=number("unnamed"),
        )

    def statistics(self) -> KeyStatistics:
        return KeyStatistics(
            key_ids=self.key_ids,
            frequency=self.frequency,
            cost=self.cost,
            state_size=self.state_size,
            worker_loads=self.worker_loads,
            records=self.records,
        )


@dataclass(frozen=True)
class Current:
    """``ctl:current``: the newest published version, the open round, the running migration."""

    version: int
    round: int
    migrating: int | None


@dataclass(frozen=True)
class PublishedTable:
    table: RoutingTable
    #: Bytes of each entry's key, in ``table.key_ids`` order.
    names: list[bytes]


@dataclass(frozen=True)
class MoveResult:
    """What one MIGRATE call did for old worker ``worker``."""

    worker: int
    #: 1 moved now, 0 moved before, -1 no such migration, -2 not drained yet.
    status: int
    keys: int = 0
    state_entries: int = 0
    state_bytes: int = 0
    released_records: int = 0
    #: When not drained: the first source whose marker worker has not seen.
    waiting_for_source: int | None = None


class ControlPlane:
    """The run's control-plane state in Redis (``decode_responses`` off: keys are bytes)."""

    def __init__(self, client: redis_module.Redis, run_id: str) -> None:
        self.client = client
        self.keys = RunKeys(run_id)
        self._migrate = register_script(client, MIGRATE_SCRIPT)
        self._complete = register_script(client, COMPLETE_SCRIPT)

    # -- everyone ----------------------------------------------------------------------------

    def current(self) -> Current:
        version, round_, migrating = self.client.hmget(
            self.keys.ctl_current, ["version", "round", "migrating"]
        )
        return Current(
            version=int(version or 0),
            round=int(round_ or 0),
            migrating=int(migrating) if migrating else None,
        )

    def table(self, version: int) -> PublishedTable:
        """Published table ``version`` (version 0 is the empty table every run starts with)."""
        if version == 0:
            return PublishedTable(RoutingTable(), [])
        raw = self.client.hgetall(self.keys.ctl_table(version))
        if not raw:
            raise LookupError(f"routing table version {version} is not in Redis")
        ids = _array(raw[b"key_ids"], "<i8")
        workers = _array(raw[b"workers"], "<i4")
        names = split_names(raw[b"name_bytes"], raw[b"name_offsets"])
        order = np.argsort(ids, kind="stable")
        return PublishedTable(
            RoutingTable(ids, workers, version=version), [names[i] for i in order.tolist()]
        )

    # -- sources -----------------------------------------------------------------------------

    def report(self, report: StatisticsReport) -> None:
        name = self.keys.ctl_report(report.round, report.source)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(name)
        pipe.hset(name, mapping=report.to_fields())
        pipe.expire(name, HISTORY_SECONDS)
        pipe.execute()

    # -- controller --------------------------------------------------------------------------

    def mark_started(self) -> None:
        """Say a controller is up: the run's producers wait for it (the orchestrator)."""
        self.client.hset(self.keys.ctl_current, "started_ms", int(time.time() * 1000))

    def controller_started(self) -> bool:
        return bool(self.client.hexists(self.keys.ctl_current, "started_ms"))

    def open_round(self) -> int:
        return int(self.client.hincrby(self.keys.ctl_current, "round", 1))

    def close_counted_round(self, round_: int) -> None:
        """Keep ``round_`` as the last round closed when the sources open rounds (counted in
        records): a restarted controller goes on from the next."""
        self.client.hset(self.keys.ctl_current, "round", round_)

    def reports(self, round_: int, n_sources: int) -> list[StatisticsReport]:
        pipe = self.client.pipeline()
        for source in range(n_sources):
            pipe.hgetall(self.keys.ctl_report(round_, source))
        return [StatisticsReport.from_fields(raw) for raw in pipe.execute() if raw]

    def publish(
        self,
        table: PublishedTable,
        moves: Mapping[int, Mapping[bytes, int]],
        migration: Mapping[str, float | int | str],
    ) -> None:
        """Publish ``table`` and start its migration, all in one MULTI
        (docs/design.md#migration-protocol).

        ``moves`` maps each old worker to {key bytes: new worker}; ``migration`` is the record
        of the rebalance (plan figures) stored in ``ctl:migration:{version}``.
        """
        version = table.table.version
        data, offsets = join_names(table.names)
        pipe = self.client.pipeline(transaction=True)
        name = self.keys.ctl_table(version)
        pipe.hset(
            name,
            mapping={
                "key_ids": table.table.key_ids.astype("<i8").tobytes(),
                "workers": table.table.workers.astype("<i4").tobytes(),
                "name_bytes": data,
                "name_offsets": offsets,
                "published_ms": now_ms(),
            },
        )
        pending: dict[int, list[bytes]] = {}
        for old, keys in moves.items():
            if keys:
                pipe.hset(self.keys.ctl_out(old), mapping=dict(keys))
                for key, new in keys.items():
                    pending.setdefault(int(new), []).append(key)
        for new, keys in pending.items():
            pipe.sadd(self.keys.ctl_pending(new), *keys)
        record = {
            **migration,
            **dict.fromkeys(MIGRATION_COUNTERS, 0),
            "version": version,
            "phase": "running",
            "published_ms": now_ms(),
            "from_workers": sum(1 for keys in moves.values() if keys),
            "table_entries": len(table.table),
        }
        pipe.hset(self.keys.ctl_migration(version), mapping=record)
        pipe.hset(self.keys.ctl_current, mapping={"version": version, "migrating": version})
        if version > 2:  # sources need the current and the previous table only
            pipe.expire(self.keys.ctl_table(version - 2), HISTORY_SECONDS)
        pipe.execute()

    def old_workers(self, version: int, n_workers: int) -> list[int]:
        """Old workers of migration ``version`` whose keys have not moved yet."""
        done = {int(w) for w in self.client.smembers(self.keys.ctl_done(version))}
        pipe = self.client.pipeline()
        for worker in range(n_workers):
            pipe.exists(self.keys.ctl_out(worker))
        return [w for w, has in enumerate(pipe.execute()) if has and w not in done]

    def migrate(self, version: int, worker: int, n_sources: int) -> MoveResult:
        status, keys, entries, size, released, waiting = self._migrate(
            args=[self.keys.prefix, worker, version, n_sources, str(END_OF_STREAM)]
        )
        return MoveResult(
            worker=worker,
            status=int(status),
            keys=int(keys),
            state_entries=int(entries),
            state_bytes=int(size),
            released_records=int(released),
            waiting_for_source=None if int(waiting) < 0 else int(waiting),
        )

    def complete(self, version: int) -> bool:
        return bool(
            self._complete(
                args=[self.keys.prefix, version, now_ms(), HISTORY_LENGTH, HISTORY_SECONDS]
            )
        )

    def migration(self, version: int) -> dict[str, Any]:
        raw = self.client.hgetall(self.keys.ctl_migration(version))
        return {k.decode(): _number(v.decode()) for k, v in raw.items()}

    def rebalances(self) -> list[dict[str, Any]]:
        """Completed migrations, oldest first (``ctl:rebalances``)."""
        return [json.loads(raw) for raw in self.client.lrange(self.keys.ctl_rebalances, 0, -1)]

    def record_interval(self, record: Mapping[str, Any]) -> None:
        """Append one controller interval's record to ``ctl:intervals`` (JSON; the newest
        :data:`HISTORY_LENGTH` are kept, so a long-running stack does not grow Redis)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(self.keys.ctl_intervals, json.dumps(record))
        pipe.ltrim(self.keys.ctl_intervals, -HISTORY_LENGTH, -1)
        pipe.execute()

    def intervals(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.keys.ctl_intervals, 0, -1)]

    # -- checks (tests, verification) --------------------------------------------------------

    def keys_on_several_workers(self, n_workers: int) -> dict[tuple[int, bytes], list[int]] | None:
        """(window, key) -> workers, for every key whose state of an open (not closed) window
        is on more than one worker: empty when invariant 2 holds; None while a migration runs
        (the invariant is about completed migrations). One MULTI: a consistent snapshot."""
        windows = sorted(
            int(w) for w in self.client.sdiff(self.keys.windows_open, self.keys.windows_closed)
        )
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.ctl_current, "migrating")
        for window in windows:
            for worker in range(n_workers):
                pipe.hkeys(self.keys.state(worker, window))
        migrating, *replies = pipe.execute()
        if migrating:
            return None
        found: dict[tuple[int, bytes], list[int]] = {}
        for index, keys in enumerate(replies):
            window, worker = windows[index // n_workers], index % n_workers
            for key in keys:
                found.setdefault((window, key), []).append(worker)
        return {where: workers for where, workers in found.items() if len(workers) > 1}


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
