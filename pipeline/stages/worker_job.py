"""The workers: one Spark Structured Streaming query on ``work``; Kafka partition w IS worker w.

Layer: stages.

The query reads ``work`` with Apache's Kafka source (``kafka.isolation.level=read_committed``,
so records of an aborted grouping-stage transaction are never seen). The source makes one input
partition per topic partition -- no ``minPartitions``, no ``maxRecordsPerPartition``, no
repartitioning by a column (Spark's ``repartition(n, col)`` hashes with Murmur3 and would not
send worker i to partition i; DESIGN.md, "Known pitfalls"). The query coalesces them into T
tasks (``--tasks``; by default one per core, at most W: :func:`default_tasks`), each holding
whole partitions, and runs :class:`PartitionProcessor` on each with ``mapInArrow``: Spark hands
the task Arrow record batches, columns of bytes, not pickled rows. Both are part of the
streaming query, planned once when it starts; each task reads its micro-batch's id from its
task context (:func:`streaming_batch_id`), and ``foreachBatch`` only collects the tasks'
summaries. The task splits its rows by ``partition`` (each must be < W, else the job fails),
so worker w's state only ever sees partition w's records, and for each worker:

1. decodes the 36-byte values at once from the Arrow buffer
   (:func:`pipeline.io.records.decode_work`); values that do not decode, or DATA without a
   key, are skipped and counted (``stats:rejected``) -- the grouping stage dead-letters bad
   input before ``work``, so these only appear if something else writes the topic;
2. waits until the worker's emulated server is done with the batch (the CPU-cost knob,
   ``--cpu-cost-us``; below);
3. counts per (window, key) (:func:`operators.windows.count_per_window_key`) -- and on a
   user's topic with ``--sum``, sums the amount the run's extractor reads from each record's
   own value (:meth:`pipeline.io.extractors.Extractor.amounts`, the spec the grouping stage
   recorded in Redis as ``input``) --, takes each
   source's highest WATERMARK of the batch, bins each record's end-to-end latency (now minus the
   Kafka timestamp of its ``work`` record, measured after the wait: queueing in Kafka plus
   service);
4. applies it all to Redis in one Lua script, idempotently per (worker, batch id)
   (:meth:`pipeline.io.state_store.StateStore.apply`, whose docstring says why that key suffices:
   Spark logs each batch's offset ranges before running it and re-runs a logged batch with the
   same ranges and id after a restart).

Why the CPU cost is a wait, and what it emulates. The PKG paper's Storm experiment emulated load
"by adding a fixed delay to the processing", 0.1 to 1 ms per record, so that an overloaded
worker loses throughput (PKG §V, Q4, Fig. 5a; pkg.md §4.6). Here the W workers share a 2-core
machine: burning CPU would make W workers compete for 2 cores and measure the machine, not the
grouping. A wait costs no CPU. Each worker is emulated as a server that takes ``C`` µs per
record, one after another in arrival order (the Kafka timestamp of the ``work`` record),
continuously, like a Storm bolt: :func:`service_finish_ms` says when it is done with a batch,
from when it was done with the previous one (``busy`` in Redis, written by the apply). The task
waits until then, its lightest workers first, so a task holding several workers takes as long
as the busiest of them, exactly as separate machines would; and Spark's own time between
micro-batches overlaps the workers' service instead of adding to it. A micro-batch ends when
its slowest worker is done, so the hottest worker's backlog sets the job's throughput --
exactly the effect key skew has on a real cluster.

A worker's watermark (``wm:{worker}``) is the minimum over the S grouping sources of the
latest watermark each sent to that partition (S = ``--sources``, by default the partition
count of topic ``keys``: one source per ``keys`` partition); until every source has sent one,
the worker has none. With ``until_end`` the driver stops the query once every worker's
watermark is END_OF_STREAM and the last batch is committed.

Example (the pure part of a task):
    >>> import numpy as np
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

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa

from operators.keys import KeyBatch
from operators.windows import count_per_window_key
from pipeline.io import config, kafka_security, records
from pipeline.io.extractors import Extractor
from pipeline.io.spark_session import is_local
from pipeline.io.state_store import StateStore, WorkerBatch, latency_buckets
from pipeline.stages import user_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery


#: Attempts per task (``local[N,F]``; plain ``local[N]`` never retries). A retry is safe because
#: the apply is idempotent per (worker, batch): a task that failed after applying is skipped.
TASK_ATTEMPTS = 4


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
    #: int64 amount of every row in millionths (runs with ``--sum``; 0 where none), else None.
    amount_micros: np.ndarray | None = None

    @property
    def data_records(self) -> int:
        return int(self.data.sum())


def decode_partition(
    keys: pa.Array | Sequence[bytes | None],
    values: pa.Array | Sequence[bytes | None],
    amounts: Extractor | None = None,
) -> DecodedPartition:
    """Decode a task's columns at once and sort the rows into DATA, markers and rejects; with
    ``amounts`` (a run's ``--sum`` extractor) read each DATA record's amount from the user's
    value after its header, and reject a DATA record without one (the grouping stage
    dead-letters those, so only a foreign writer of ``work`` makes any)."""
    key_column, has_key = records.binary_column(keys)
    decoded, ok = records.decode_work(values)
    kind = decoded["kind"]
    is_data = ok & (kind == records.Kind.DATA)
    data = is_data & has_key
    markers = ok & (kind == records.Kind.WATERMARK)
    switches = ok & (kind == records.Kind.TABLE_SWITCH)
    rejected = int((~ok).sum() + (is_data & ~has_key).sum())
    micros = None
    if amounts is not None:
        micros, has_amount = amounts.amounts(records.work_payloads(values))
        rejected += int((data & ~has_amount).sum())
        data &= has_amount
    return DecodedPartition(key_column, decoded, data, markers, rejected, switches, micros)


def to_worker_batch(
    decoded: DecodedPartition,
    timestamps_ms: np.ndarray,
    *,
    worker: int,
    batch_id: int,
    now_ms: float,
    window_ms: int,
    n_sources: int,
) -> WorkerBatch:
    """What the worker applies for this batch: counts, watermarks, counters, latencies."""
    data = decoded.data
    key_batch = decoded.keys.take(np.flatnonzero(data))
    event_times = decoded.records["event_time_ms"]
    amounts = None if decoded.amount_micros is None else decoded.amount_micros[data]
    counted = count_per_window_key(
        key_batch, records.window_start(event_times[data], window_ms), amounts=amounts
    )

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
        windows=counted.windows,
        keys=counted.keys,
        counts=counted.counts,
        source_watermarks=source_watermarks,
        records=int(data.sum()),
        rejected=decoded.rejected,
        latency=dict(zip(buckets.tolist(), bucket_counts.tolist(), strict=True)),
        source_versions=source_versions,
        sums=counted.sums,
    )


def run_amounts(store: StateStore) -> Extractor | None:
    """The extractor of the amounts to sum, if the run's grouping stage reads a user's topic
    with ``--sum`` (it records how it reads the topic before it routes anything, so a batch
    with records of such a run always finds it, and what it finds then is final)."""
    found = user_topic.recorded(store.client, store.keys.run_id)
    if found is None or found[0].extractor.amount is None:
        return None
    return found[0].extractor


#: StateStore per (Redis URL, run id) in each Python worker process (Spark reuses them).
_STORES: dict[tuple[str, str], StateStore] = {}
#: :func:`run_amounts` per (Redis URL, run id) in each Python worker process, once a task with
#: records has asked (then it is final).
_AMOUNTS: dict[tuple[str, str], Extractor | None] = {}


def _store(redis_url: str, run_id: str) -> StateStore:
    store = _STORES.get((redis_url, run_id))
    if store is None:
        store = _STORES[(redis_url, run_id)] = StateStore.from_url(redis_url, run_id)
    return store


def _amounts(redis_url: str, run_id: str) -> Extractor | None:
    run = (redis_url, run_id)
    if run not in _AMOUNTS:
        _AMOUNTS[run] = run_amounts(_store(redis_url, run_id))
    return _AMOUNTS[run]


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
        pipeline.stages.worker_job.WorkerJobError: a worker task ran outside a streaming ...
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
        amounts = _amounts(self.redis_url, self.run_id)
        table = pa.Table.from_batches(arrived)
        shares = [
            (
                worker,
                decode_partition(part.column("key"), part.column("value"), amounts),
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


def _warm_up_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Load in this Python worker what every task uses (modules, compiled kernels) by running
    a task's pure part on a small made-up batch; yields one row."""
    for _ in batches:
        pass
    inputs, _ = records.decode_input(
        records.encode_input(np.arange(64), np.zeros(64), np.arange(64))
    )
    values = records.encode_work(inputs, source=0, table_version=0)
    decoded = decode_partition([b"%d" % (i % 7) for i in range(64)], values)
    to_worker_batch(
        decoded, np.zeros(64), worker=0, batch_id=0, now_ms=0, window_ms=10, n_sources=1
    ).script_args("warm-up:", 1)
    yield pa.RecordBatch.from_pydict({"ready": [True]})


def warm_up(spark: SparkSession, tasks: int) -> None:
    """Start ``tasks`` Python workers at once and load them before the first micro-batch.

    Spark keeps idle Python workers for reuse (``spark.python.worker.reuse``), so the tasks of
    the first real micro-batch find them ready; without this, that batch paid each worker's
    fork, imports and kernel loading (seconds on 2 cores with W = 8) and its records waited.
    """
    spark.range(tasks, numPartitions=tasks).mapInArrow(_warm_up_task, "ready boolean").collect()


#: How long the broker may hold a fetch of the job's Kafka consumers that finds no new records
#: (Kafka's ``fetch.max.wait.ms``, 500 by default). A task reads known offset ranges, and under
#: read_committed a range ends with the grouping stage's commit marker: fetching it while no
#: newer record has been written waited the whole default, once per partition, one partition
#: after another in a task (4 here). At the end of a stream that was 2 s a batch, and mid-stream
#: up to the next transaction. ``skewer bench latency`` (bench/results/worker_latency.md) runs
#: the job with Kafka's default beside this: p99 4.4x this one's at 14,000 records/s.
FETCH_MAX_WAIT_MS = 10
#: How Spark writes the query's offset and commit logs (``spark.sql.streaming.
#: checkpointFileManagerClass``). Its default, through Hadoop's FileContext, took 3.7x as long
#: for these two small files as Hadoop's FileSystem does, and made the batch cycle 1.4x as long
#: (``skewer bench latency``, as above). Both write a temporary file and rename it into place,
#: and the checkpoint is a local folder, where a rename is atomic: a kill -9 leaves a temporary
#: file, never half a log entry.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
CHECKPOINT_FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"


@dataclass(frozen=True)
class WorkOptions:
    """Everything the job needs (``skewer work``'s flags, resolved)."""

    workers: int
    sources: int
    kafka_bootstrap: str
    redis_url: str
    checkpoint: Path
    work_topic: str
    window_ms: int = 10_000
    cpu_cost_us: float = 0.0
    run_id: str = "default"
    until_end: bool = False
    #: Spark's ``maxOffsetsPerTrigger``: records per micro-batch over all partitions.
    max_records_per_batch: int | None = None
    #: Spark tasks per micro-batch, each holding W / tasks whole partitions (workers); by
    #: default :func:`default_tasks` locally and W on a cluster.
    tasks: int | None = None
    #: ``local`` (threads of this process, one per task) or a cluster's master URL.
    spark_master: str = config.DEFAULT_SPARK_MASTER
    #: Kafka's ``fetch.max.wait.ms`` for the query's consumers (``skewer bench latency``
    #: measures it against Kafka's default).
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
    #: How Spark writes the query's logs; None: Spark's default (as for ``fetch_max_wait_ms``).
    checkpoint_file_manager: str | None = CHECKPOINT_FILE_MANAGER

    @property
    def task_count(self) -> int:
        if self.tasks is not None:
            return self.tasks
        return default_tasks(self.workers) if is_local(self.spark_master) else self.workers

    def validate(self) -> None:
        if self.workers < 1:
            raise WorkerConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.sources < 1:
            raise WorkerConfigError(f"--sources must be >= 1, got {self.sources}")
        if self.window_ms < 1:
            raise WorkerConfigError(f"--window-ms must be >= 1, got {self.window_ms}")
        if self.cpu_cost_us < 0:
            raise WorkerConfigError(f"--cpu-cost-us must be >= 0, got {self.cpu_cost_us}")
        if self.max_records_per_batch is not None and self.max_records_per_batch < 1:
            raise WorkerConfigError("--max-records-per-batch must be >= 1")
        if self.fetch_max_wait_ms < 0:
            raise WorkerConfigError(f"fetch.max.wait.ms must be >= 0, got {self.fetch_max_wait_ms}")
        if self.tasks is not None and not 1 <= self.tasks <= self.workers:
            raise WorkerConfigError(f"--tasks must be in 1..W={self.workers}, got {self.tasks}")
        try:
            config.check_spark_master(self.spark_master, "--spark-master")
        except ValueError as error:
            raise WorkerConfigError(str(error)) from None


def default_tasks(workers: int) -> int:
    """Tasks per micro-batch by default: one per core of this machine, at most W.

    Each Python task costs a fixed slice of CPU per micro-batch, so more tasks than cores
    only queue for a core: an empty ``mapInArrow`` job took 157-194 ms with 8 tasks and
    96-110 ms with 2 on the 2-core machine (PySpark 4.2; 500-570 ms with 8 on PySpark 4.0). The
    CPU-cost knob does not need a task per worker: a task emulates its workers side by side
    (:class:`PartitionProcessor`).
    """
    return max(1, min(workers, os.cpu_count() or 1))


#: Called on the driver after each micro-batch with the tasks' summaries.
BatchCallback = Callable[[int, list[TaskSummary]], None]


@dataclass
class WorkSummary:
    """What a run of the job did (batches counts only this process's batches)."""

    seconds: float = 0.0
    batches: int = 0
    processed: list[int] = field(default_factory=list)
    finished: bool = False
    #: Spark's own account of the last micro-batches (``StreamingQueryProgress.durationMs``:
    #: offsets, planning, the batch itself, the write-ahead and commit logs), per batch.
    progress: list[dict[str, int]] = field(default_factory=list)


def checkpoint_is_fresh(checkpoint: Path) -> bool:
    """True when Spark has never logged a batch in ``checkpoint``."""
    offsets = checkpoint / "offsets"
    return not offsets.is_dir() or not any(offsets.iterdir())


def prepare(options: WorkOptions, store: StateStore) -> None:
    """Refuse a start that would break exactness: a different window length than the run's,
    or a fresh checkpoint for a run whose workers already applied batches (its batch ids would
    restart at 0 and every batch would be skipped as already applied)."""
    options.validate()
    differing = store.claim_config(window_ms=options.window_ms, workers=options.workers)
    if differing:
        name, (recorded, given) = next(iter(differing.items()))
        raise WorkerConfigError(
            f"run {options.run_id!r} uses {name}={recorded}, not {given} (use another --run-id)"
        )
    if checkpoint_is_fresh(options.checkpoint) and store.any_applied(options.workers):
        raise WorkerConfigError(
            f"run {options.run_id!r} already has worker state, but checkpoint "
            f"{options.checkpoint} is new: restart with the run's checkpoint or a new --run-id"
        )


def start_query(
    spark: SparkSession, options: WorkOptions, on_batch: BatchCallback
) -> StreamingQuery:
    """Start the streaming query (returns at once; the query runs in Spark's threads)."""
    from pyspark.sql import functions

    # Read when the query starts; the checkpoint is a local folder (WorkOptions.checkpoint).
    if options.checkpoint_file_manager is None:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER_CONF)
    else:
        spark.conf.set(CHECKPOINT_FILE_MANAGER_CONF, options.checkpoint_file_manager)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", options.kafka_bootstrap)
        .option("subscribe", options.work_topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("kafka.fetch.max.wait.ms", str(options.fetch_max_wait_ms))
        .options(**kafka_security.from_environ().spark_options())
    )
    if options.max_records_per_batch is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_records_per_batch))
    stream = reader.load().select(
        "partition", "key", "value", functions.expr("unix_millis(timestamp)").alias("timestamp_ms")
    )
    processor = PartitionProcessor(
        n_workers=options.workers,
        n_sources=options.sources,
        window_ms=options.window_ms,
        cpu_cost_us=options.cpu_cost_us,
        redis_url=options.redis_url,
        run_id=options.run_id,
    )
    # Part of the query, so planned once: built in foreachBatch, the mapInArrow cost the driver
    # 20-105 ms a micro-batch (p50 45 ms at 14,500 records/s), the Python function pickled and
    # the plan analysed again each time.
    summaries = stream.coalesce(options.task_count).mapInArrow(processor, SUMMARY_SCHEMA)

    def collect_batch(frame: DataFrame, batch_id: int) -> None:
        on_batch(batch_id, [TaskSummary(*row) for row in frame.collect()])

    return (
        summaries.writeStream.queryName(f"skewer-work-{options.run_id}")
        .option("checkpointLocation", str(options.checkpoint))
        .foreachBatch(collect_batch)
        .start()
    )


def failure_reason(error: BaseException) -> str:
    """One line saying why the query failed: our own error's message if a task raised one
    (Spark wraps it in Java and Python tracebacks), else the last ``...Error: message`` line."""
    text = str(error)
    ours = re.findall(rf"{WorkerJobError.__name__}: (.+)", text)
    if ours:
        return ours[-1].strip()
    raised = re.findall(r"(?m)^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text)
    if raised:
        return raised[-1].strip()
    lines = text.strip().splitlines()
    return lines[0] if lines else type(error).__name__


def run(
    options: WorkOptions,
    spark: SparkSession | None = None,
    *,
    on_batch: BatchCallback | None = None,
    poll_seconds: float = 0.25,
) -> WorkSummary:
    """Run the job until END_OF_STREAM (``until_end``) or until interrupted.

    ``spark`` defaults to a new session (stopped at the end) on ``options.spark_master``:
    ``local`` is ``local[max(T, 2), 4]`` for T tasks; on a cluster, its executors must offer a
    core per task (:func:`~pipeline.io.spark_session.require_executor_cores`), else
    :class:`WorkerConfigError`. A given session is left
    running (tests reuse one).
    """
    store = StateStore.from_url(options.redis_url, options.run_id)
    prepare(options, store)
    own_session = spark is None
    if spark is None:
        spark = job_session(options)
    summary = WorkSummary()

    def count_batch(batch_id: int, summaries: list[TaskSummary]) -> None:
        summary.batches += 1
        if on_batch is not None:
            on_batch(batch_id, summaries)

    warm_up(spark, options.task_count)
    started = time.monotonic()
    query = start_query(spark, options, count_batch)
    try:
        while query.isActive and not summary.finished:
            if options.until_end and all(
                mark == records.END_OF_STREAM for mark in store.worker_watermarks(options.workers)
            ):
                # Commit the batch that carried the last END_OF_STREAM before stopping (else a
                # restart would re-run it, harmlessly). A failure shows in query.exception().
                with contextlib.suppress(Exception):
                    query.processAllAvailable()
                summary.finished = query.exception() is None
            else:
                time.sleep(poll_seconds)
        error = query.exception()
        if error is not None:
            raise WorkerJobError(f"the streaming query failed: {failure_reason(error)}")
        summary.processed = store.processed_per_worker(options.workers).tolist()
        summary.progress = [
            {"batch": p["batchId"], "rows": p["numInputRows"], **p["durationMs"]}
            for p in query.recentProgress
        ]
    finally:
        query.stop()
        if own_session:
            spark.stop()
        store.client.close()
    summary.seconds = time.monotonic() - started
    return summary


def job_session(options: WorkOptions) -> SparkSession:
    """The job's own session on ``options.spark_master``, with a core for each task at once
    (the cost model runs a micro-batch's tasks side by side); a session that has too few is
    stopped again before :class:`WorkerConfigError` says so.

    On a standalone master the job asks for exactly those cores (``spark.cores.max``): an
    application without it takes every core of the cluster, although a micro-batch never
    runs more than its tasks at once, and other jobs (another run's workers) would wait."""
    from pipeline.io.spark_session import (
        SparkClusterError,
        build_spark_session,
        require_executor_cores,
    )

    slots = max(options.task_count, 2)
    master = options.spark_master
    if master == config.DEFAULT_SPARK_MASTER:
        master = f"local[{slots},{TASK_ATTEMPTS}]"
    standalone = (
        {"spark.cores.max": str(options.task_count)} if master.startswith("spark://") else {}
    )
    spark = build_spark_session(
        f"skewer-work-{options.run_id}",
        master=master,
        shuffle_partitions=slots,
        extra_conf=standalone,
    )
    try:
        require_executor_cores(spark, options.task_count)
    except SparkClusterError as error:
        spark.stop()
        raise WorkerConfigError(str(error)) from None
    return spark


def log_batch(batch_id: int, summaries: list[TaskSummary]) -> None:
    """A progress line per micro-batch on standard error (``skewer work --verbose``)."""
    loads = {task.worker: task.records for task in summaries}
    skipped = sum(1 for task in summaries if not task.applied)
    slowest = max(summaries, key=lambda task: task.seconds, default=None)
    parts = (
        ""
        if slowest is None
        else f", slowest task {slowest.seconds:.3f} s (read {slowest.read_seconds:.3f}, "
        f"decode {slowest.decode_seconds:.3f}, wait {slowest.wait_seconds:.3f}, "
        f"count {slowest.count_seconds:.3f}, apply {slowest.apply_seconds:.3f})"
    )
    print(
        f"batch {batch_id}: records per worker {dict(sorted(loads.items()))}{parts}"
        + (f", {skipped} replayed (skipped)" if skipped else ""),
        file=sys.stderr,
    )
