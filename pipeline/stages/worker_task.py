"""What one Spark task of the workers does: decode its partitions, wait, count, apply.

Layer: stages.

Partition w of ``work`` is worker w. :class:`PartitionProcessor` runs in each task (through
``mapInArrow``, on whole partitions) and for each worker decodes the values
(:func:`decode_partition`; bad ones skipped and counted), waits until the worker's emulated
server is done (the CPU-cost knob: :func:`service_finish_ms`), counts (and sums) per (window,
key), takes each source's highest watermark, bins latencies (:func:`to_worker_batch`), and
applies it all in one Lua script, idempotent per (worker, batch id)
(:meth:`pipeline.io.state_store.StateStore.apply`). The driver: :mod:`pipeline.stages.worker_job`.
Why: docs/design.md#worker-stage and docs/design.md#applying-a-micro-batch.

Example (the pure part of a task):
    >>> from pipeline.io import records
    >>> inputs, _ = records.decode_input(records.encode_input(
    ...     event_time_ms=np.array([5, 10_001]), producer=np.array([0, 0]), seq=np.array([0, 1])))
    >>> values = records.encode_work(inputs, source=0, table_version=0)
    >>> values.append(records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=9_999))
    >>> decoded = decode_partition([b"a", b"a", None], values)
    >>> batch = to_worker_batch(decoded, np.array([0, 0, 0]), worker=2, batch_id=7, now_ms=3,
    ...                         window_ms=10_000, n_sources=1)
    >>> batch.windows.tolist(), batch.counts.tolist(), dict(batch.source_watermarks)
    ([0, 10000], [1, 1], {0: 9999})
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from operators.aggregates import StateField, field_values, group_rows, scalar_partials
from operators.keys import KeyBatch
from operators.metrics import latency_buckets
from operators.windows import count_per_window_key
from pipeline.io import records
from pipeline.io.extractors import Extractor, Values
from pipeline.io.state_store import StateStore, WorkerBatch
from pipeline.stages import user_topic


class WorkerJobError(Exception):
    """The job cannot start or failed; the message is one line for the user."""


class WorkerConfigError(WorkerJobError):
    """The job's settings contradict the run's (a usage error: exit 2)."""


@dataclass(frozen=True)
class DecodedPartition:
    """One worker's rows of one micro-batch, decoded and classified."""

    keys: KeyBatch  # every row's key bytes (empty where the key is null)
    records: np.ndarray  # WORK_DTYPE, zeroed where a value did not decode
    data: np.ndarray  # bool: valid DATA records with a key
    markers: np.ndarray  # bool: valid WATERMARK markers
    rejected: int  # values that did not decode, and DATA without a key
    #: bool: valid TABLE_SWITCH markers (routing-table schemes;
    #: :mod:`pipeline.stages.control_plane`)
    switches: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: Per column the run's state fields read (None: ``--sum``'s amount), every row's int64
    #: value and whether it has one (:meth:`RunFields.read`).
    columns: dict[str | None, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def data_records(self) -> int:
        return int(self.data.sum())


@dataclass(frozen=True)
class RunFields:
    """The state fields a run's workers keep besides the count (:attr:`pipeline.io.query.job.
    Job.state_fields`, or ``--sum``'s one), and the extractor that reads their columns."""

    fields: tuple[StateField, ...] = ()
    extractor: Extractor | None = None

    def read(self, payloads: Values) -> dict[str | None, tuple[np.ndarray, np.ndarray]]:
        """Every column the fields read, from the users' values: each row's int64 value and
        whether it has one."""
        if not self.fields or self.extractor is None:
            return {}
        columns: dict[str | None, tuple[np.ndarray, np.ndarray]] = {}
        if self.extractor.amount is not None:
            columns[None] = self.extractor.amounts(payloads)
        if self.extractor.aggregated:
            columns.update(self.extractor.aggregated_values(payloads))
        return columns


def decode_partition(
    keys: pa.Array | Sequence[bytes | None],
    values: pa.Array | Sequence[bytes | None],
    fields: RunFields = RunFields(),
) -> DecodedPartition:
    """Decode a task's columns at once and sort the rows into DATA, markers and rejects, and
    read the columns of the run's state ``fields`` from each DATA record's value after its
    header. A DATA record without ``--sum``'s amount is rejected (the grouping stage
    dead-letters those, so only a foreign writer of ``work`` makes any); a query's column
    without a value is NULL, which its aggregates skip."""
    key_column, has_key = records.binary_column(keys)
    decoded, ok = records.decode_work(values)
    kind = decoded["kind"]
    is_data = ok & (kind == records.Kind.DATA)
    data = is_data & has_key
    markers = ok & (kind == records.Kind.WATERMARK)
    switches = ok & (kind == records.Kind.TABLE_SWITCH)
    rejected = int((~ok).sum() + (is_data & ~has_key).sum())
    columns = fields.read(records.work_payloads(values)) if fields.fields else {}
    if None in columns:
        has_amount = columns[None][1]
        rejected += int((data & ~has_amount).sum())
        data &= has_amount
    return DecodedPartition(key_column, decoded, data, markers, rejected, switches, columns)


def to_worker_batch(
    decoded: DecodedPartition,
    timestamps_ms: np.ndarray,
    *,
    worker: int,
    batch_id: int,
    now_ms: float,
    window_ms: int,
    n_sources: int,
    fields: RunFields = RunFields(),
) -> WorkerBatch:
    """What the worker applies for this batch: counts (and the run's state ``fields``, from
    the columns :func:`decode_partition` read), watermarks, counters, latencies."""
    data = decoded.data
    key_batch = decoded.keys.take(np.flatnonzero(data))
    event_times = decoded.records["event_time_ms"]
    window_starts = records.window_start(event_times[data], window_ms)
    if fields.fields:
        groups = group_rows(key_batch, window_starts)
        sizes = np.diff(np.append(groups.starts, groups.order.shape[0]))
        windows, keys, counts = groups.windows, groups.keys, sizes.astype(np.int64)
        partials = {
            column: scalar_partials(groups, values[data], present[data])
            for column, (values, present) in decoded.columns.items()
        }
        kept = [field_values(f, partials[f.column]) for f in fields.fields]
    else:
        counted = count_per_window_key(key_batch, window_starts)
        windows, keys, counts, kept = counted.windows, counted.keys, counted.counts, []

    sources = decoded.records["source"][decoded.markers].astype(np.int64)
    if sources.size and int(sources.max()) >= n_sources:
        raise WorkerJobError(
            f"worker {worker} got a watermark of source {int(sources.max())}, "
            f"but the job counts {n_sources} source(s): pass the right --sources"
        )
    marks = event_times[decoded.markers]
    source_watermarks = {int(s): int(marks[sources == s].max()) for s in np.unique(sources)}
    source_versions: dict[int, int] = {}
    if decoded.switches.any():
        switched = decoded.records[decoded.switches]
        for source, version in zip(
            switched["source"].tolist(), switched["table_version"].tolist(), strict=True
        ):
            source_versions[int(source)] = max(source_versions.get(int(source), 0), int(version))

    latency_ms = now_ms - np.asarray(timestamps_ms, dtype=np.float64)[data]
    buckets, bucket_counts = np.unique(latency_buckets(latency_ms), return_counts=True)
    return WorkerBatch(
        worker=worker,
        batch_id=batch_id,
        windows=windows,
        keys=keys,
        counts=counts,
        source_watermarks=source_watermarks,
        records=int(data.sum()),
        rejected=decoded.rejected,
        latency=dict(zip(buckets.tolist(), bucket_counts.tolist(), strict=True)),
        source_versions=source_versions,
        fields=fields.fields,
        values=tuple(values for values, _ in kept),
        present=tuple(present for _, present in kept),
    )


def run_fields(store: StateStore) -> RunFields:
    """The state fields of the run, if its grouping stage reads a user's topic with a query
    that aggregates columns or with ``--sum`` (it records how it reads the topic before it
    routes anything, so a batch with records of such a run always finds it, and what it finds
    then is final)."""
    found = user_topic.recorded(store.client, store.keys.run_id)
    if found is None or not found[0].state_fields:
        return RunFields()
    return RunFields(found[0].state_fields, found[0].extractor)


#: StateStore per (Redis URL, run id) in each Python worker process (Spark reuses them).
_STORES: dict[tuple[str, str], StateStore] = {}
#: :func:`run_fields` per (Redis URL, run id) in each Python worker process, once a task with
#: records has asked (then it is final).
_FIELDS: dict[tuple[str, str], RunFields] = {}


def _store(redis_url: str, run_id: str) -> StateStore:
    store = _STORES.get((redis_url, run_id))
    if store is None:
        store = _STORES[(redis_url, run_id)] = StateStore.from_url(redis_url, run_id)
    return store


def _fields(redis_url: str, run_id: str) -> RunFields:
    run = (redis_url, run_id)
    if run not in _FIELDS:
        _FIELDS[run] = run_fields(_store(redis_url, run_id))
    return _FIELDS[run]


#: The local property Spark's micro-batch execution sets to the batch id on the jobs it runs
#: (``MicroBatchExecution.BATCH_ID_KEY``); tasks inherit their job's local properties.
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def streaming_batch_id() -> int:
    """The id of the micro-batch the calling Spark task belongs to.

    It is the id ``foreachBatch`` is called with, the one Spark logs with the batch's offset
    ranges before running it and re-runs a logged batch with after a restart: what the apply's
    idempotency rests on (:meth:`pipeline.io.state_store.StateStore.apply`). Anywhere else
    there is no batch to apply under:

        >>> streaming_batch_id()
        Traceback (most recent call last):
        ...
        pipeline.stages.worker_task.WorkerJobError: a worker task ran outside a streaming ...
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    batch_id = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
    if batch_id is None:
        raise WorkerJobError(
            "a worker task ran outside a streaming micro-batch (no batch id in its context)"
        )
    return int(batch_id)


def service_finish_ms(arrivals_ms: np.ndarray, cost_ms: float, busy_until_ms: float) -> float:
    """When a server that takes ``cost_ms`` per record, one record after another in arrival
    order, and is busy until ``busy_until_ms``, finishes the records arriving at
    ``arrivals_ms``.

    This is Lindley's recursion f_n = max(f_{n-1}, t_n) + C with f_{-1} = busy-until, in closed
    form over the sorted arrivals t_0 <= ... <= t_{N-1}:

        f_{N-1} = max(busy_until, max_k (t_k - k C)) + N C

    It is how the CPU-cost knob emulates a worker that serves records as they arrive (as a
    Storm bolt does in the PKG paper's experiment), not only while Spark runs its task: Spark's
    own time between micro-batches overlaps the worker's service, so a worker below its
    capacity keeps up, and a worker above it falls behind by exactly its excess.

    Example:
        >>> service_finish_ms(np.array([0.0, 0.0, 10.0]), cost_ms=2.0, busy_until_ms=0.0)
        12.0
        >>> service_finish_ms(np.array([0.0, 1.0]), cost_ms=2.0, busy_until_ms=50.0)
        54.0
    """
    n = arrivals_ms.shape[0]
    if n == 0:
        return busy_until_ms
    arrivals = np.sort(np.asarray(arrivals_ms, dtype=np.float64))
    start = max(busy_until_ms, float(np.max(arrivals - np.arange(n) * cost_ms)))
    return start + n * cost_ms


class TaskSummary(NamedTuple):
    """What one task (one worker, one micro-batch) did, and where its time went."""

    worker: int
    batch_id: int
    records: int
    applied: bool
    #: The whole task on the Python side, then its parts: draining Spark's Arrow batches (the
    #: Kafka fetch and the JVM-to-Python hand-over), decoding, the CPU-cost wait, counting,
    #: and the Redis apply.
    seconds: float
    read_seconds: float
    decode_seconds: float
    wait_seconds: float
    count_seconds: float
    apply_seconds: float


#: :class:`TaskSummary` as the Spark schema of :meth:`PartitionProcessor.__call__`'s output.
SUMMARY_SCHEMA = (
    "worker int, batch_id long, records long, applied boolean, seconds double, "
    "read_seconds double, decode_seconds double, wait_seconds double, count_seconds double, "
    "apply_seconds double"
)

#: The columns each task receives, in this order.
TASK_COLUMNS = ("partition", "key", "value", "timestamp_ms")


@dataclass(frozen=True)
class PartitionProcessor:
    """The function each Spark task runs on its share of a micro-batch: one or more whole
    Kafka partitions, i.e. one or more workers.

    Spark hands the task its rows as Arrow record batches of :data:`TASK_COLUMNS`
    (``mapInArrow``): columns of bytes, not one pickled Python row per record. The rows are
    split by partition, so worker w's state only ever sees partition w's records, and each
    worker's batch is applied on its own, idempotently per (worker, batch id). The CPU-cost
    wait emulates workers that run side by side: worker w's batch is applied
    ``records_w * C`` after the task has its rows, the lightest first, so a task holding
    several workers takes as long as its heaviest one, exactly as separate machines would.
    Yields one :class:`TaskSummary` row (as an Arrow batch) per worker with records.

    It is built once, with the query: each call reads its micro-batch's id from the Spark task
    that makes it (:func:`streaming_batch_id`).
    """

    n_workers: int
    n_sources: int
    window_ms: int
    cpu_cost_us: float
    redis_url: str
    run_id: str

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        clock = _PhaseClock()
        arrived = [batch for batch in batches if batch.num_rows]
        read_seconds = clock.lap()
        if not arrived:
            return
        batch_id = streaming_batch_id()
        store = _store(self.redis_url, self.run_id)
        fields = _fields(self.redis_url, self.run_id)
        table = pa.Table.from_batches(arrived)
        shares = [
            (
                worker,
                decode_partition(part.column("key"), part.column("value"), fields),
                part.column("timestamp_ms").to_numpy(),
            )
            for worker, part in self._split_by_worker(table)
        ]
        decode_seconds = clock.lap()
        finishes = self._service_finishes(store, shares)
        shares.sort(key=lambda share: finishes[share[0]])
        wait_seconds = count_seconds = apply_seconds = 0.0
        done: list[tuple[int, int, bool]] = []
        for worker, decoded, timestamps_ms in shares:
            time.sleep(max(0.0, finishes[worker] / 1000.0 - time.time()))
            wait_seconds += clock.lap()
            batch = to_worker_batch(
                decoded,
                timestamps_ms,
                worker=worker,
                batch_id=batch_id,
                now_ms=time.time() * 1000.0,
                window_ms=self.window_ms,
                n_sources=self.n_sources,
                fields=fields,
            )
            if self.cpu_cost_us > 0:
                batch = replace(batch, busy_until_ms=finishes[worker])
            count_seconds += clock.lap()
            done.append((worker, batch.records, store.apply(batch, self.n_sources)))
            apply_seconds += clock.lap()
        phases = (clock.total(), read_seconds, decode_seconds, wait_seconds, count_seconds)
        rows = [
            TaskSummary(worker, batch_id, records, applied, *phases, apply_seconds)._asdict()
            for worker, records, applied in done
        ]
        yield pa.RecordBatch.from_pylist(rows, schema=_summary_arrow_schema())

    def _service_finishes(
        self, store: StateStore, shares: list[tuple[int, DecodedPartition, np.ndarray]]
    ) -> dict[int, float]:
        """When each worker's emulated server is done with its share (epoch ms): 0 without a
        CPU cost, else :func:`service_finish_ms` from the worker's last finish."""
        if self.cpu_cost_us <= 0:
            return {worker: 0.0 for worker, _, _ in shares}
        busy = store.busy_until([worker for worker, _, _ in shares])
        return {
            worker: service_finish_ms(
                timestamps_ms[decoded.data], self.cpu_cost_us / 1000.0, busy[worker]
            )
            for worker, decoded, timestamps_ms in shares
        }

    def _split_by_worker(self, table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
        """The task's rows per Kafka partition (= worker), each checked to be < W."""
        partitions = table.column("partition").combine_chunks().to_numpy()
        workers = np.unique(partitions)
        if int(workers[0]) < 0 or int(workers[-1]) >= self.n_workers:
            raise WorkerJobError(
                f"a task got Kafka partitions {workers.tolist()}: partition w is worker w, "
                f"so every partition must be < W={self.n_workers}"
            )
        if workers.size == 1:
            yield int(workers[0]), table.combine_chunks()
            return
        order = np.argsort(partitions, kind="stable")
        ordered = table.take(order).combine_chunks()
        bounds = np.searchsorted(partitions[order], workers, side="left").tolist()
        for worker, start, stop in zip(
            workers.tolist(), bounds, [*bounds[1:], table.num_rows], strict=True
        ):
            yield int(worker), ordered.slice(start, stop - start)


class _PhaseClock:
    """Seconds since the last lap, and since the start."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        return seconds

    def total(self) -> float:
        return time.perf_counter() - self.started


def _summary_arrow_schema() -> pa.Schema:
    types = {"worker": pa.int32(), "batch_id": pa.int64(), "records": pa.int64()}
    return pa.schema(
        (name, types.get(name, pa.bool_() if name == "applied" else pa.float64()))
        for name in TaskSummary._fields
    )


def load_kernels() -> WorkerBatch:
    """Load what every task uses (modules, compiled kernels) by running a task's pure part on
    a small made-up batch (the workers' Python daemon does, before it forks them); the batch,
    counted, its apply's arguments made."""
    inputs, _ = records.decode_input(
        records.encode_input(np.arange(64), np.zeros(64), np.arange(64))
    )
    values = records.encode_work(inputs, source=0, table_version=0)
    decoded = decode_partition([b"%d" % (i % 7) for i in range(64)], values)
    batch = to_worker_batch(
        decoded, np.zeros(64), worker=0, batch_id=0, now_ms=0, window_ms=10, n_sources=1
    )
    batch.script_args("warm-up:", 1)
    return batch
