"""The control plane of routing-table schemes: statistics, versioned tables, state migration.

Layer: stages.

Fang et al. (seeds/000) and Gedik (seeds/004) rebalance by moving keys, and their window state,
between workers. The papers assume a migration "happens" between intervals; a live pipeline
has records in flight, sources that switch at different moments, and processes that crash.
This module is the protocol that makes a migration exact, and the Redis operations of its
three parties: the grouping sources (:mod:`pipeline.stages.grouping`), the workers
(:mod:`pipeline.io.state_store`'s apply script) and the controller
(:mod:`pipeline.stages.controller`).

Statistics. The controller opens round ``r`` every interval (``ctl:current.round``); each
source, at its next poll, reports what its scheme measured since its previous report
(:meth:`~operators.base.TableScheme.statistics`): per-worker loads, and per key of the K
heaviest (a bounded report: :data:`DEFAULT_REPORT_KEYS`) its frequency, cost and state size,
with the key's bytes (the state in Redis is keyed by bytes, tables by fingerprints), into
``ctl:stats:{r}:{source}``. Reports are advisory: a batch retried after an aborted
transaction is counted twice, and a lost report only delays a rebalance.

Migration of version v -> v+1 (one at a time; the controller plans nothing while one runs)::

    controller            source s (each)            old worker a            new worker b
    ----------            ---------------            ------------            ------------
    plan v+1; one MULTI:
      ctl:table:{v+1}
      ctl:out:{a}  k -> b
      ctl:pending:{b}  k
      ctl:current.version = v+1
                    ----> next poll sees v+1:
                          one Kafka transaction:
                          TABLE_SWITCH(s, v+1) to
                          every work partition, then
                          records routed by v+1,
                          offset + "v": v+1
                                  | k's records   ---------------------> held back while k
                                  | under v+1                            is in ctl:pending:{b}
                                  |                                      (held:{b}:{window})
                                  +-- k's records under v, then the marker -->
                                                   applies them; the marker
                                                   sets wv:{a}[s] = v+1
    every tick: MIGRATE(a): if wv:{a}[s] >= v+1
      for every source s (or s ended): in one Lua script, for every open window, state of k
      moves a -> b, b's held records of k join it, k leaves ctl:pending:{b}
    COMPLETE: all old workers moved -> ctl:migration:{v+1}.phase = done, ctl:rebalances += it

Why each step is exact (DESIGN.md invariants 1 and 2):

- *The switch point.* A source's marker and its first records under v+1 are in one
  transaction, after its records under v (one transactional producer writes each partition in
  order). So when worker a has seen the marker of every source, no record routed under v will
  ever reach it: a is *drained*. An ended source (END_OF_STREAM seen at a) counts as switched.
- *In-flight records.* Records of a moved key k routed under v are still counted at a (they
  precede the markers); those routed under v+1 reach b and are held, not lost and not added to
  state that is still on its way. MIGRATE runs only once a is drained, atomically (one Lua
  script), so nothing of k arrives at a after its state left, and b releases the held records
  onto the moved state in the same step. Counts (and a ``--sum`` run's sums, which move and
  are held beside them) are held as per-(window, key) partial sums -- both aggregates are
  sums of integers; an order-sensitive aggregate would hold the records as a list.
- *Closed windows.* A window the aggregator has closed is never moved: its partials are frozen
  and the aggregator merges a worker's held records with its partial
  (:meth:`~pipeline.io.state_store.StateStore.close_window`), so a window closing during a
  migration loses nothing; records of k for it arriving later count as late, as always.
- *Crashes.* Publication is one MULTI; MIGRATE and COMPLETE are Lua scripts, each atomic and
  guarded (``ctl:done:{v}``, ``phase``), so a controller killed anywhere restarts, reads
  ``ctl:current`` and continues with the old workers not yet moved; nothing is done twice. A
  source restarts at the version its last committed transaction recorded in the offset
  metadata (its markers are in the same transaction); a worker's marker bookkeeping is part of
  its idempotent apply.
- *Intervals during a migration.* Rounds go on (sources keep reporting), but a round that
  closes while a migration runs is not planned (outcome ``migrating``): a plan made against a
  table not yet in force everywhere could move a key twice at once.

How long records wait. A migration lasts (``duration_s``, publication to COMPLETE) as long as
the slowest old worker needs to reach the last source's marker in its partition: the queueing
in ``work`` plus a micro-batch, plus a controller tick. Records are held only from the moment
the first one reaches its new worker, whose partition carries the same switch at the same time
and is as far behind, so the longest any record waits (``longest_hold_s``, the first held
record's apply to COMPLETE) is much shorter: about the skew between the two workers' progress.
Both are measured per migration (``ctl:rebalances``; ``skewer bench migration``).

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
from pipeline.io.state_store import RunKeys

if TYPE_CHECKING:
    import redis as redis_module

#: Keys per source report: the heaviest ones (bounded, like the papers' sketches).
DEFAULT_REPORT_KEYS = 20_000
#: Records of the latest batches a source keeps to name the keys it reports (bytes by
#: fingerprint): about a megabyte of keys.
RECENT_RECORDS = 100_000
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
#: Seconds a round's reports and the published tables are kept.
REPORT_TTL_SECONDS = 3600


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


def compact_report(
    stats: KeyStatistics,
    recent: Sequence[KeyBatch],
    known: Mapping[int, bytes],
    *,
    source: int,
    round_: int,
    table_version: int,
    max_keys: int = DEFAULT_REPORT_KEYS,
) -> StatisticsReport:
    """The report of ``stats``: its ``max_keys`` most frequent keys with their bytes.

    Bytes come from ``known`` (fingerprint -> bytes: the keys of the current table and of the
    last report) or from the ``recent`` batches the source routed (its last
    :data:`RECENT_RECORDS` records or more) -- a heavy key is in almost every batch. Keys named
    by neither are left out of the report; their records still count in ``worker_loads`` and
    in ``unnamed``.
    """
    key_ids = np.asarray(stats.key_ids, dtype=np.int64)
    frequency = np.asarray(stats.frequency, dtype=np.float64)
    if key_ids.shape[0] > max_keys:
        keep = np.sort(np.argpartition(-frequency, max_keys - 1)[:max_keys])
    else:
        keep = np.arange(key_ids.shape[0])
    ids = key_ids[keep]
    names: list[bytes | None] = [known.get(k) for k in ids.tolist()]
    missing = np.flatnonzero(np.fromiter((n is None for n in names), bool, len(names)))
    if missing.shape[0] and recent:
        # One search over every recent batch: the first occurrence of each fingerprint.
        recent_ids = np.concatenate([batch.key_ids() for batch in recent])
        unique, first = np.unique(recent_ids, return_index=True)
        if unique.shape[0]:
            position = np.minimum(np.searchsorted(unique, ids[missing]), unique.shape[0] - 1)
            hit = unique[position] == ids[missing]
            starts = np.cumsum([0] + [len(batch) for batch in recent])
            for slot, at in zip(missing[hit].tolist(), first[position[hit]].tolist(), strict=True):
                which = int(np.searchsorted(starts, at, side="right")) - 1
                names[slot] = recent[which][at - int(starts[which])]
    named = np.fromiter((n is not None for n in names), bool, len(names))
    chosen = keep[named]
    return StatisticsReport(
        source=source,
        round=round_,
        table_version=table_version,
        key_ids=key_ids[chosen],
        frequency=frequency[chosen],
        cost=np.asarray(stats.cost, dtype=np.float64)[chosen],
        state_size=np.asarray(stats.state_size, dtype=np.float64)[chosen],
        worker_loads=np.asarray(stats.worker_loads, dtype=np.int64),
        records=int(stats.records),
        names=[n for n in names if n is not None],
        unnamed=round(float(frequency.sum() - frequency[chosen].sum())),
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


#: ARGV: prefix, old worker a, version, S, END_OF_STREAM. Returns {status, keys, entries,
#: bytes, released, waiting source}; see :class:`MoveResult`.
MIGRATE_SCRIPT = """
local prefix, a, version = ARGV[1], ARGV[2], ARGV[3]
local n_sources, eos = tonumber(ARGV[4]), ARGV[5]
local migration = prefix .. 'ctl:migration:' .. version
if redis.call('HGET', migration, 'phase') ~= 'running' then return {-1, 0, 0, 0, 0, -1} end
local done = prefix .. 'ctl:done:' .. version
if redis.call('SISMEMBER', done, a) == 1 then return {0, 0, 0, 0, 0, -1} end
local versions = {}
local raw = redis.call('HGETALL', prefix .. 'wv:' .. a)
for i = 1, #raw, 2 do versions[raw[i]] = tonumber(raw[i + 1]) end
local ended = {}
raw = redis.call('HGETALL', prefix .. 'wm:' .. a .. ':sources')
for i = 1, #raw, 2 do if raw[i + 1] == eos then ended[raw[i]] = true end end
for s = 0, n_sources - 1 do
  local name = tostring(s)
  if not ended[name] and (versions[name] == nil or versions[name] < tonumber(version)) then
    return {-2, 0, 0, 0, 0, s}
  end
end
local windows = redis.call('SDIFF', prefix .. 'windows:open', prefix .. 'windows:closed')
if redis.call('HEXISTS', migration, 'state_entries_total') == 0 then
  local total = 0
  for _, window in ipairs(windows) do
    for w = 0, tonumber(redis.call('HGET', migration, 'workers')) - 1 do
      total = total + redis.call('HLEN', prefix .. 'state:' .. w .. ':' .. window)
    end
  end
  redis.call('HSET', migration, 'state_entries_total', total)
end
local out = prefix .. 'ctl:out:' .. a
local moves = redis.call('HGETALL', out)
local keys, entries, bytes, released = 0, 0, 0, 0
for i = 1, #moves, 2 do
  local key, b = moves[i], moves[i + 1]
  for _, window in ipairs(windows) do
    local from = prefix .. 'state:' .. a .. ':' .. window
    local to = prefix .. 'state:' .. b .. ':' .. window
    local count = redis.call('HGET', from, key)
    if count then
      redis.call('HINCRBY', to, key, count)
      redis.call('HDEL', from, key)
      entries = entries + 1
      bytes = bytes + #key + #count
    end
    local held_key = prefix .. 'held:' .. b .. ':' .. window
    local held = redis.call('HGET', held_key, key)
    if held then
      redis.call('HINCRBY', to, key, held)
      redis.call('HDEL', held_key, key)
      released = released + tonumber(held)
    end
    -- A run with --sum keeps the key's sums beside its counts: they travel the same way.
    local sums_to = prefix .. 'sum:' .. b .. ':' .. window
    for _, sums_from in ipairs({prefix .. 'sum:' .. a .. ':' .. window,
                                prefix .. 'heldsum:' .. b .. ':' .. window}) do
      local total = redis.call('HGET', sums_from, key)
      if total then
        redis.call('HINCRBY', sums_to, key, total)
        redis.call('HDEL', sums_from, key)
        bytes = bytes + #total
      end
    end
  end
  redis.call('SREM', prefix .. 'ctl:pending:' .. b, key)
  keys = keys + 1
end
redis.call('DEL', out)
redis.call('SADD', done, a)
redis.call('HINCRBY', migration, 'keys_moved', keys)
redis.call('HINCRBY', migration, 'state_entries_moved', entries)
redis.call('HINCRBY', migration, 'state_bytes_moved', bytes)
redis.call('HINCRBY', migration, 'released_records', released)
return {1, keys, entries, bytes, released, -1}
"""

#: ARGV: prefix, version, completed_ms, history length. Returns 1 when completed now, 0 when
#: not all old workers have moved yet or the migration is not running.
COMPLETE_SCRIPT = """
local prefix, version = ARGV[1], ARGV[2]
local migration = prefix .. 'ctl:migration:' .. version
if redis.call('HGET', migration, 'phase') ~= 'running' then return 0 end
local needed = tonumber(redis.call('HGET', migration, 'from_workers'))
if redis.call('SCARD', prefix .. 'ctl:done:' .. version) < needed then return 0 end
local published = tonumber(redis.call('HGET', migration, 'published_ms'))
local completed = tonumber(ARGV[3])
local first_held = tonumber(redis.call('HGET', migration, 'first_held_ms') or ARGV[3])
redis.call('HSET', migration, 'phase', 'done', 'completed_ms', ARGV[3],
           'duration_s', (completed - published) / 1000.0,
           'longest_hold_s', math.max(completed - first_held, 0) / 1000.0)
redis.call('HSET', prefix .. 'ctl:current', 'migrating', '')
local record = {}
local raw = redis.call('HGETALL', migration)
for i = 1, #raw, 2 do record[raw[i]] = tonumber(raw[i + 1]) or raw[i + 1] end
redis.call('RPUSH', prefix .. 'ctl:rebalances', cjson.encode(record))
redis.call('LTRIM', prefix .. 'ctl:rebalances', -tonumber(ARGV[4]), -1)
return 1
"""


class ControlPlane:
    """The run's control-plane state in Redis (``decode_responses`` off: keys are bytes)."""

    def __init__(self, client: redis_module.Redis, run_id: str) -> None:
        self.client = client
        self.keys = RunKeys(run_id)
        self._migrate = client.register_script(MIGRATE_SCRIPT)
        self._complete = client.register_script(COMPLETE_SCRIPT)

    def key(self, name: str) -> str:
        return self.keys.ctl(name)

    # -- everyone ----------------------------------------------------------------------------

    def current(self) -> Current:
        version, round_, migrating = self.client.hmget(
            self.key("current"), ["version", "round", "migrating"]
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
        raw = self.client.hgetall(self.key(f"table:{version}"))
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
        name = self.key(f"stats:{report.round}:{report.source}")
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(name)
        pipe.hset(name, mapping=report.to_fields())
        pipe.expire(name, REPORT_TTL_SECONDS)
        pipe.execute()

    # -- controller --------------------------------------------------------------------------

    def open_round(self) -> int:
        return int(self.client.hincrby(self.key("current"), "round", 1))

    def reports(self, round_: int, n_sources: int) -> list[StatisticsReport]:
        pipe = self.client.pipeline()
        for source in range(n_sources):
            pipe.hgetall(self.key(f"stats:{round_}:{source}"))
        return [StatisticsReport.from_fields(raw) for raw in pipe.execute() if raw]

    def publish(
        self,
        table: PublishedTable,
        moves: Mapping[int, Mapping[bytes, int]],
        migration: Mapping[str, float | int | str],
    ) -> None:
        """Publish ``table`` and start its migration, all in one MULTI (see module docstring).

        ``moves`` maps each old worker to {key bytes: new worker}; ``migration`` is the record
        of the rebalance (plan figures) stored in ``ctl:migration:{version}``.
        """
        version = table.table.version
        data, offsets = join_names(table.names)
        pipe = self.client.pipeline(transaction=True)
        name = self.key(f"table:{version}")
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
                pipe.hset(self.key(f"out:{old}"), mapping=dict(keys))
                for key, new in keys.items():
                    pending.setdefault(int(new), []).append(key)
        for new, keys in pending.items():
            pipe.sadd(self.key(f"pending:{new}"), *keys)
        record = {
            **migration,
            **dict.fromkeys(MIGRATION_COUNTERS, 0),
            "version": version,
            "phase": "running",
            "published_ms": now_ms(),
            "from_workers": sum(1 for keys in moves.values() if keys),
            "table_entries": len(table.table),
        }
        pipe.hset(self.key(f"migration:{version}"), mapping=record)
        pipe.hset(self.key("current"), mapping={"version": version, "migrating": version})
        if version > 2:  # sources need the current and the previous table only
            pipe.expire(self.key(f"table:{version - 2}"), REPORT_TTL_SECONDS)
        pipe.execute()

    def old_workers(self, version: int, n_workers: int) -> list[int]:
        """Old workers of migration ``version`` whose keys have not moved yet."""
        done = {int(w) for w in self.client.smembers(self.key(f"done:{version}"))}
        pipe = self.client.pipeline()
        for worker in range(n_workers):
            pipe.exists(self.key(f"out:{worker}"))
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
        return bool(self._complete(args=[self.keys.prefix, version, now_ms(), HISTORY_LENGTH]))

    def migration(self, version: int) -> dict[str, Any]:
        raw = self.client.hgetall(self.key(f"migration:{version}"))
        return {k.decode(): _number(v.decode()) for k, v in raw.items()}

    def rebalances(self) -> list[dict[str, Any]]:
        """Completed migrations, oldest first (``ctl:rebalances``)."""
        return [json.loads(raw) for raw in self.client.lrange(self.key("rebalances"), 0, -1)]

    def record_interval(self, record: Mapping[str, Any]) -> None:
        """Append one controller interval's record to ``ctl:intervals`` (JSON; the newest
        :data:`HISTORY_LENGTH` are kept, so a long-running stack does not grow Redis)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(self.key("intervals"), json.dumps(record))
        pipe.ltrim(self.key("intervals"), -HISTORY_LENGTH, -1)
        pipe.execute()

    def intervals(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.key("intervals"), 0, -1)]

    # -- checks (tests, verification) --------------------------------------------------------

    def keys_on_several_workers(self, n_workers: int) -> dict[tuple[int, bytes], list[int]] | None:
        """(window, key) -> workers, for every key whose state of an open (not closed) window
        is on more than one worker: empty when invariant 2 holds; None while a migration runs
        (the invariant is about completed migrations). One MULTI: a consistent snapshot."""
        windows = sorted(
            int(w) for w in self.client.sdiff(self.keys.windows_open, self.keys.windows_closed)
        )
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.key("current"), "migrating")
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
