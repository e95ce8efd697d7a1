"""Window state of the live pipeline in Redis: the workers' apply, the aggregator's close and
finalize, and the reads of verification and the metrics.

Layer: io.

The workers (:mod:`pipeline.stages.worker_job`) apply each micro-batch with one Lua script,
idempotent per (worker, batch id); the aggregator (:mod:`pipeline.stages.aggregator`) closes a
window in one MULTI and finalizes it with one script guarded by ``windows:final``. Counts and
sums only go through ``HINCRBY`` (int64), never through a Lua number. Why these steps keep the
counts exact: docs/design.md#applying-a-micro-batch and docs/design.md#closing-a-window; the
keys and scripts: :mod:`pipeline.io.redis_layout` and docs/design.md#redis-layout.

Latency: each applied DATA record adds one to a log-spaced bucket of its end-to-end latency,
20 buckets per decade (:func:`operators.metrics.latency_buckets`), so p50/p99 come from
idempotent counters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from operators.aggregates import StateField, merge_maps
from operators.keys import KeyBatch
from operators.windows import merge_partials
from pipeline.io.redis_client import (
    client_from_url,
    register_script,
    replicas_to_wait,
    retry_through_restarts,
)
from pipeline.io.redis_layout import (
    ADD_ONCE_SCRIPT,
    APPLY_SCRIPT,
    FINALIZE_SCRIPT,
    RETIRE_WINDOW_SCRIPT,
    RunKeys,
)

if TYPE_CHECKING:
    import redis as redis_module

#: How long an apply waits for a replica's acknowledgement (``WAIT``) behind Sentinel: longer
#: than Sentinel takes to re-point the other replica at a promoted primary (~1-2 s), so the
#: first apply after a failover does not fail for a replica that is merely re-attaching.
REPLICA_WAIT_MS = 10_000


class NotReplicatedError(Exception):
    """No replica acknowledged an apply within :data:`REPLICA_WAIT_MS`: the task fails, and
    Spark's retry (the apply is idempotent per worker and batch) waits again."""


@dataclass(frozen=True)
class WorkerBatch:
    """What one worker applies for one micro-batch: the unit of idempotence."""

    worker: int
    batch_id: int
    windows: np.ndarray  # int64, one per (window, key) pair
    keys: KeyBatch
    counts: np.ndarray  # int64, records per pair
    #: Highest watermark each source sent in this batch.
    source_watermarks: Mapping[int, int] = field(default_factory=dict)
    #: Valid DATA records of the batch (the worker's load).
    records: int = 0
    #: Values of the batch that did not decode or had no key (skipped, counted).
    rejected: int = 0
    #: Latency histogram of the batch's DATA records (bucket -> records).
    latency: Mapping[int, int] = field(default_factory=dict)
    #: Highest routing-table version each source switched to in this batch (TABLE_SWITCH).
    source_versions: Mapping[int, int] = field(default_factory=dict)
    #: When the worker's emulated server is done with this batch (epoch ms; 0: no CPU cost).
    busy_until_ms: float = 0.0
    #: The state fields the run keeps besides the count (a query's, ``--sum``'s), and per
    #: field its int64 value per pair with the mask of the pairs that have one.
    fields: tuple[StateField, ...] = ()
    values: tuple[np.ndarray, ...] = ()
    present: tuple[np.ndarray, ...] = ()

    def script_args(self, prefix: str, n_sources: int) -> list[bytes | str | int]:
        """ARGV of the apply script (layout in :data:`APPLY_SCRIPT`)."""
        args: list[bytes | str | int] = [prefix, self.worker, self.batch_id, self.batch_id]
        args += (n_sources, declaration(self.fields), len(self.windows))
        columns = [
            [value if has else "" for value, has in zip(v.tolist(), p.tolist(), strict=True)]
            for v, p in zip(self.values, self.present, strict=True)
        ]
        pairs = zip(self.windows.tolist(), self.keys.to_list(), self.counts.tolist(), strict=True)
        for pair, (window, key, count) in enumerate(pairs):
            args += (window, key, count)
            args += [column[pair] for column in columns]
        args.append(len(self.source_watermarks))
        for source in sorted(self.source_watermarks):
            args += (source, int(self.source_watermarks[source]))
        args += (self.records, self.rejected, len(self.latency))
        for bucket in sorted(self.latency):
            args += (bucket, self.latency[bucket])
        args.append(len(self.source_versions))
        for source in sorted(self.source_versions):
            args += (source, int(self.source_versions[source]))
        args.append(repr(float(self.busy_until_ms)))
        return args


def declaration(fields: Sequence[StateField]) -> str:
    """How a run's state fields are recorded (``config``'s ``fields``, checked by every apply):
    the JSON list of their ``[name, part]``, '' for none.

    >>> declaration([StateField("sums", "sum", None)])
    '[["sums","sum"]]'
    """
    if not fields:
        return ""
    return json.dumps([[f.name, f.part] for f in fields], separators=(",", ":"))


def declared_fields(client: redis_module.Redis, keys: RunKeys) -> tuple[StateField, ...]:
    """The state fields a run's workers declared (:func:`declaration`; none before a first
    apply declares them; a field's column is not recorded)."""
    raw = client.hget(keys.config, "fields")
    return () if raw is None else tuple(StateField(n, p, None) for n, p in json.loads(raw))


def add_once(
    client: redis_module.Redis,
    marker: str,
    increments: Sequence[tuple[str, bytes | str, int]],
    replicas: int = 0,
    attempts: int = 5,
) -> None:
    """Add every ``(key, field, amount)`` (HINCRBY; INCRBY when ``field`` is ``""``) exactly
    once per ``marker``, and with ``replicas`` return only once that many replicas hold it.

    The producers' counts (the truth, records sent) are additions, and a client that retries
    through a lost connection (:func:`~pipeline.io.redis_client.retry_through_restarts`) may run
    one twice; the marker, set in the same script, makes the retry a no-op. Behind Sentinel a
    failover loses what no replica had: ``WAIT`` on the same connection says whether one does,
    and a retry reaches the promoted primary, where the marker is missing if the addition
    was lost, so it is added there. :class:`NotReplicatedError` after ``attempts`` waits."""
    args = [part for key, field, amount in increments for part in (key, field, amount)]
    script = register_script(client, ADD_ONCE_SCRIPT)
    if not replicas:
        script(keys=[marker], args=args)
        return
    for _ in range(attempts):
        pipe = client.pipeline(transaction=False)
        script(keys=[marker], args=args, client=pipe)
        pipe.wait(replicas, REPLICA_WAIT_MS)
        _added, acknowledged = pipe.execute()
        if acknowledged >= replicas:
            return
    raise NotReplicatedError(
        f"{marker}: fewer than {replicas} replica(s) acknowledged within {REPLICA_WAIT_MS} ms, "
        f"{attempts} times"
    )


@dataclass(frozen=True)
class Verification:
    """Final counts against the producers' ground truth."""

    windows: int
    keys: int
    mismatches: list[tuple[int, bytes, int, int]]  # (window, key, truth, result), first few
    mismatch_count: int

    @property
    def exact(self) -> bool:
        return self.mismatch_count == 0 and self.windows > 0


@dataclass(frozen=True)
class CheckedWindows:
    """What the aggregator checked of a run's windows before their results expired
    (``--keep-results``): the totals :func:`pipeline.runs.verify.verify_run` adds to its own."""

    windows: frozenset[int] = frozenset()
    keys: int = 0
    truth_records: int = 0
    result_records: int = 0
    mismatch_count: int = 0
    mismatches: list[tuple[int, bytes, int, int]] = field(default_factory=list)


@dataclass
class Differences:
    """The (window, key) values that differ between what was expected and what a run gave:
    how many were compared, how many differ, and the first ``keep`` as ``(window, key,
    expected, got)`` (keys in byte order, so the report is the same on every rerun)."""

    keep: int = 20
    compared: int = 0
    count: int = 0
    first: list[tuple[int, bytes, int, int]] = field(default_factory=list)

    def compare(
        self,
        window: int,
        expected: Mapping[bytes, int],
        got: Mapping[bytes, int],
        missing: int | None = 0,
    ) -> None:
        """Compare one window's values; a key one side lacks reads as ``missing`` there (a
        count's 0; None for a value SQL leaves NULL)."""
        for key in sorted(expected.keys() | got.keys()):
            self.compared += 1
            want, have = expected.get(key, missing), got.get(key, missing)
            if want != have:
                self.count += 1
                if len(self.first) < self.keep:
                    self.first.append((window, key, want, have))  # type: ignore[arg-type]


def mismatch_rows(
    mismatches: Sequence[tuple[int, bytes, int, int]],
    expected: str,
    show: Callable[[int], object] = int,
) -> list[dict[str, object]]:
    """``(window, key, expected, got)`` mismatches as JSON rows, the key as UTF-8 text and
    each value through ``show``.

    >>> mismatch_rows([(0, b"a", 5, 4)], "truth")
    [{'window': 0, 'key': 'a', 'truth': 5, 'result': 4}]
    """
    return [
        {"window": w, "key": k.decode("utf-8", "replace"), expected: show(e), "result": show(g)}
        for w, k, e, g in mismatches
    ]


@dataclass(frozen=True)
class WindowPartials:
    """Every worker's partial counts of one window (index = worker), and of each declared
    state field (``fields[f][worker]``)."""

    counts: list[dict[bytes, int]]
    fields: list[list[dict[bytes, int]]]


def _int_map(raw: Mapping[bytes, bytes]) -> dict[bytes, int]:
    return {key: int(value) for key, value in raw.items()}


def _window_suffix(key: bytes, prefix: bytes) -> int:
    return int(key[len(prefix) :])


class StateStore:
    """The run's Redis state, one client (``decode_responses`` must be off: keys are bytes)."""

    def __init__(self, client: redis_module.Redis, run_id: str, replicas: int = 0) -> None:
        self.client = client
        self.keys = RunKeys(run_id)
        #: Replicas each apply waits for (``WAIT``); 0 (a lone Redis): no wait, no round trip.
        self.replicas = replicas
        self._apply = register_script(client, APPLY_SCRIPT)
        self._finalize = register_script(client, FINALIZE_SCRIPT)
        self._retire = register_script(client, RETIRE_WINDOW_SCRIPT)
        self._fields: tuple[StateField, ...] = ()

    @classmethod
    def from_url(cls, url: str, run_id: str) -> StateStore:
        """The store of a stage: its client rides out a Redis restart or a Sentinel failover
        (a worker's apply, the aggregator's finalize are guarded scripts, so a retry never
        counts twice); behind Sentinel each apply waits for a replica (:meth:`apply`)."""
        return cls(retry_through_restarts(client_from_url(url)), run_id, replicas_to_wait(url))

    # -- workers ---------------------------------------------------------------------------

    def apply(self, batch: WorkerBatch, n_sources: int) -> bool:
        """Apply a worker's micro-batch once: True if applied now, False if applied before.

        With replicas (Sentinel), the script and ``WAIT replicas REPLICA_WAIT_MS`` go in one
        round trip on one connection, and :class:`NotReplicatedError` fails the task unless
        enough replicas acknowledged: only then may Spark commit the batch, so a failover,
        which promotes a replica, loses no batch Spark committed.
        """
        args = batch.script_args(self.keys.prefix, n_sources)
        if not self.replicas:
            return bool(self._apply(args=args))
        pipe = self.client.pipeline(transaction=False)
        self._apply(args=args, client=pipe)
        pipe.wait(self.replicas, REPLICA_WAIT_MS)
        applied, acknowledged = pipe.execute()
        if acknowledged < self.replicas:
            raise NotReplicatedError(
                f"worker {batch.worker} batch {batch.batch_id}: {acknowledged} of "
                f"{self.replicas} replica(s) acknowledged within {REPLICA_WAIT_MS} ms"
            )
        return bool(applied)

    def busy_until(self, workers: Sequence[int]) -> dict[int, float]:
        """When each worker's emulated server finished its last applied batch (epoch ms; 0
        for none): the CPU-cost knob's memory across micro-batches."""
        values = self.client.hmget(self.keys.busy, list(workers)) if workers else []
        return {w: float(v) if v else 0.0 for w, v in zip(workers, values, strict=True)}

    def claim_config(self, **values: int) -> dict[str, tuple[int, int]]:
        """Record the run's settings on first use; return {name: (recorded, given)} that differ
        (a worker and an aggregator with different window lengths would merge nonsense)."""
        pipe = self.client.pipeline()
        for name, value in values.items():
            pipe.hsetnx(self.keys.config, name, value)
        pipe.hgetall(self.keys.config)
        # Only the settings asked about: ``fields`` is JSON (:func:`declaration`).
        recorded = {k.decode(): v for k, v in pipe.execute()[-1].items()}
        return {
            name: (int(recorded[name]), value)
            for name, value in values.items()
            if name in recorded and int(recorded[name]) != value
        }

    def any_applied(self, n_workers: int) -> bool:
        return bool(self.client.exists(*(self.keys.applied(w) for w in range(n_workers))))

    def applied_batches(self, n_workers: int) -> list[int | None]:
        values = self.client.mget([self.keys.applied(w) for w in range(n_workers)])
        return [None if v is None else int(v) for v in values]

    def worker_watermarks(self, n_workers: int) -> list[int | None]:
        values = self.client.mget([self.keys.wm(w) for w in range(n_workers)])
        return [None if v is None else int(v) for v in values]

    def min_watermark(self, n_workers: int) -> int | None:
        """The pipeline's watermark: min over workers; None while any worker has none."""
        marks = self.worker_watermarks(n_workers)
        return None if any(m is None for m in marks) else min(marks)  # type: ignore[type-var]

    # -- aggregator ------------------------------------------------------------------------

    def open_windows(self) -> list[int]:
        return sorted(int(w) for w in self.client.smembers(self.keys.windows_open))

    def declared_fields(self) -> tuple[StateField, ...]:
        """:func:`declared_fields`, read once they are recorded: no apply may change them."""
        if not self._fields:
            self._fields = declared_fields(self.client, self.keys)
        return self._fields

    def close_window(self, window: int, n_workers: int) -> WindowPartials:
        """Freeze a window (later records of it count as late) and read every worker's partial
        counts and fields, in one MULTI.

        A worker's partial includes what it holds back for keys migrating to it (``held``):
        those records are counted, only not yet merged with the state that is on its way; a
        migration never moves the state of a closed window, so the two are merged here.
        """
        fields = self.declared_fields()
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.windows_closed, window)
        for worker in range(n_workers):
            pipe.hgetall(self.keys.state(worker, window))
            pipe.hgetall(self.keys.held(worker, window))
            for index in range(len(fields)):
                pipe.hgetall(self.keys.field(index, worker, window))
                pipe.hgetall(self.keys.held_field(index, worker, window))
        replies = iter(_int_map(reply) for reply in pipe.execute()[1:])
        counts: list[dict[bytes, int]] = []
        partials: list[list[dict[bytes, int]]] = [[] for _ in fields]
        for _worker in range(n_workers):
            counts.append(merge_partials([next(replies), next(replies)]))
            for declared, per_worker in zip(fields, partials, strict=True):
                per_worker.append(merge_maps(declared.merge, [next(replies), next(replies)]))
        return WindowPartials(counts=counts, fields=partials)

    def finalize_window(
        self,
        window: int,
        n_workers: int,
        counts: Mapping[bytes, int],
        top: Sequence[tuple[bytes, int]],
        state_entries: int,
        fields: Sequence[Mapping[bytes, int]] = (),
    ) -> bool:
        """Write the result, each declared field's (``fields``, in declaration order) and the
        top-k, free the partials, mark final: all or nothing, once."""
        args: list[bytes | str | int] = [
            self.keys.prefix,
            window,
            n_workers,
            json.dumps([[key_text(key), count] for key, count in top]),
            sum(counts.values()),
            state_entries,
            len(counts),
        ]
        for key, count in counts.items():
            args += (key, count)
        for values in fields:
            args.append(len(values))
            for key, value in values.items():
                args += (key, value)
        return bool(self._finalize(args=args))

    def final_windows(self) -> list[int]:
        return sorted(int(w) for w in self.client.smembers(self.keys.windows_final))

    def final_window_count(self) -> int:
        return int(self.client.scard(self.keys.windows_final))

    def unpublished_windows(self) -> list[int]:
        """Final windows whose result record is not yet acknowledged by Kafka."""
        return self._windows_in_but_not(self.keys.windows_final, self.keys.windows_published)

    def mark_published(self, window: int) -> None:
        self.client.sadd(self.keys.windows_published, window)

    def unchecked_windows(self) -> list[int]:
        """Published windows not yet checked against the truth (``--keep-results``)."""
        return self._windows_in_but_not(self.keys.windows_published, self.keys.windows_checked)

    def _windows_in_but_not(self, windows: str, done: str) -> list[int]:
        """The windows of set ``windows`` that set ``done`` lacks, in order."""
        return sorted(int(w) for w in self.client.sdiff(windows, done))

    def retire_window(self, window: int, keep_seconds: int, keep_mismatches: int = 20) -> bool:
        """Check published ``window`` against the truth, add the outcome to the run's checked
        totals, and let its result, fields, top-k and truth expire in ``keep_seconds``: once
        (False if it was already). A result is final once published, so checking it now is
        checking it at the end."""
        truth, result = self.truth(window), self.result(window)
        differences = Differences(keep_mismatches)
        differences.compare(window, truth, result)
        rows = [json.dumps([w, key_text(k), e, g]) for w, k, e, g in differences.first]
        args = [self.keys.prefix, window, keep_seconds, len(truth), sum(truth.values())]
        args += [sum(result.values()), differences.count, keep_mismatches, *rows]
        return bool(self._retire(args=args))

    def checked_windows(self) -> CheckedWindows:
        """The totals of the windows :meth:`retire_window` checked."""
        pipe = self.client.pipeline()
        pipe.smembers(self.keys.windows_checked)
        pipe.hgetall(self.keys.checked)
        pipe.lrange(self.keys.checked_mismatches, 0, -1)
        windows, totals, rows = pipe.execute()
        number = {k.decode(): int(v) for k, v in totals.items()}
        return CheckedWindows(
            windows=frozenset(int(w) for w in windows),
            keys=number.get("keys", 0),
            truth_records=number.get("truth_records", 0),
            result_records=number.get("result_records", 0),
            mismatch_count=number.get("mismatches", 0),
            mismatches=[(w, key_bytes(k), e, g) for w, k, e, g in map(json.loads, rows)],
        )

    # -- reads (verification, summaries) ---------------------------------------------------

    def result(self, window: int) -> dict[bytes, int]:
        return _int_map(self.client.hgetall(self.keys.result(window)))

    def result_fields(self, window: int) -> list[dict[bytes, int]]:
        """Each declared field's final value per key (a key without one has none: NULL)."""
        pipe = self.client.pipeline(transaction=False)
        for index in range(len(self.declared_fields())):
            pipe.hgetall(self.keys.result_field(index, window))
        return [_int_map(reply) for reply in pipe.execute()]

    def topk(self, window: int) -> list[tuple[bytes, int]]:
        raw = self.client.get(self.keys.topk(window))
        return [] if raw is None else [(key_bytes(k), int(c)) for k, c in json.loads(raw)]

    def partial(self, worker: int, window: int) -> dict[bytes, int]:
        return _int_map(self.client.hgetall(self.keys.state(worker, window)))

    def truth(self, window: int) -> dict[bytes, int]:
        return _int_map(self.client.hgetall(self.keys.truth(window)))

    def truth_windows(self) -> list[int]:
        prefix = self.keys.truth(0)[:-1].encode()
        found = self.client.scan_iter(match=prefix + b"*", count=1000)
        return sorted(_window_suffix(key, prefix) for key in found)

    def run_exists(self) -> bool:
        """Whether any key of the run is in Redis."""
        return next(self.client.scan_iter(match=self.keys.pattern), None) is not None

    def delete_run(self) -> None:
        """Delete every Redis key of the run (its prefix), a thousand at a time."""
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.keys.pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self.client.delete(*batch)
                batch = []
        if batch:
            self.client.delete(*batch)

    def state_keys(self) -> list[bytes]:
        """Every partial-state or held-back key still in Redis (empty once all windows are
        final)."""
        found = []
        for kind in ("state", "held", "field", "heldfield"):
            found += self.client.scan_iter(match=self.keys.state_family(kind), count=1000)
        return sorted(found)

    def per_worker(self, name: str, n_workers: int) -> np.ndarray:
        """A ``stats:{name}`` hash as an int64 array indexed by worker (0 where absent)."""
        values = self.client.hmget(self.keys.stats(name), list(range(n_workers)))
        return np.array([0 if v is None else int(v) for v in values], dtype=np.int64)

    def per_worker_total(self, name: str) -> int:
        """The sum of a ``stats:{name}`` hash over every worker in it."""
        return sum(int(v) for v in self.client.hvals(self.keys.stats(name)))

    def produced_records(self) -> int:
        """Records the producers of the run acknowledged (sum of ``producer:{p}:sent``)."""
        # Run ids hold no glob characters (RunKeys refuses them), so the prefix matches literally.
        keys = sorted(self.client.scan_iter(match=self.keys.producer_sent("*")))
        if not keys:
            return 0
        return sum(int(value) for value in self.client.mget(keys) if value is not None)

    def processed_per_worker(self, n_workers: int) -> np.ndarray:
        """Valid DATA records each worker applied (they add up:
        docs/design.md#exactness-invariants)."""
        return self.per_worker("records", n_workers)

    def window_totals(self) -> dict[str, int]:
        """Aggregator totals: windows, records, state_entries, distinct_keys (summed over
        windows; replication = state_entries / distinct_keys)."""
        return {
            k.decode(): int(v) for k, v in self.client.hgetall(self.keys.stats("windows")).items()
        }

    def latency_histogram(self, n_workers: int, worker: int | None = None) -> dict[int, int]:
        """Latency histogram of one worker, or of all workers summed."""
        workers = range(n_workers) if worker is None else [worker]
        pipe = self.client.pipeline()
        for w in workers:
            pipe.hgetall(self.keys.latency(w))
        total: dict[int, int] = {}
        for raw in pipe.execute():
            for bucket, count in raw.items():
                total[int(bucket)] = total.get(int(bucket), 0) + int(count)
        return total

    def verify(self, max_mismatches: int = 20, skip: Collection[int] = ()) -> Verification:
        """Every (key, window) of the ground truth against the final result, both ways, but
        for the windows in ``skip`` (checked already: :meth:`retire_window`)."""
        windows = sorted((set(self.truth_windows()) | set(self.final_windows())) - set(skip))
        differences = Differences(max_mismatches)
        keys = 0
        for window in windows:
            truth = self.truth(window)
            keys += len(truth)
            differences.compare(window, truth, self.result(window))
        return Verification(len(windows), keys, differences.first, differences.count)


def key_text(key: bytes) -> str:
    """A key as JSON text: UTF-8, with undecodable bytes kept as surrogates (reversible)."""
    return key.decode("utf-8", "surrogateescape")


def key_bytes(text: str) -> bytes:
    """Inverse of :func:`key_text`."""
    return text.encode("utf-8", "surrogateescape")
