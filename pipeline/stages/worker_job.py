"""The workers: one Spark Structured Streaming query on ``work``; Kafka partition w IS worker w.

Layer: stages.

The query reads ``work`` with Apache's Kafka source (``kafka.isolation.level=read_committed``,
so records of an aborted grouping-stage transaction are never seen). The source makes one input
partition per topic partition -- no ``minPartitions``, no ``maxRecordsPerPartition``, no
repartitioning by a column (Spark's ``repartition(n, col)`` hashes with Murmur3 and would not
send worker i to partition i; DESIGN.md, "Known pitfalls") -- so in every micro-batch each
Spark task holds exactly one Kafka partition, i.e. one worker's records. ``foreachBatch`` runs
:class:`PartitionProcessor` over the batch's partitions with ``mapPartitions``; each task checks
that its rows all carry one ``partition`` value and that it is < W (else the job fails: a
worker's state must never mix with another's), then:

1. decodes the 36-byte values in one ``np.frombuffer`` (:func:`pipeline.io.records.decode_work`);
   values that do not decode, or DATA without a key, are skipped and counted
   (``stats:rejected``) -- the grouping stage dead-letters bad input before ``work``, so these
   only appear if something else writes the topic;
2. waits ``C`` microseconds per DATA record (the CPU-cost knob, ``--cpu-cost-us``);
3. counts per (window, key) (:func:`operators.windows.count_per_window_key`), takes each
   source's highest WATERMARK of the batch, bins each record's end-to-end latency (now minus the
   Kafka timestamp of its ``work`` record, measured after the wait: queueing in Kafka plus
   service);
4. applies it all to Redis in one Lua script, idempotently per (worker, batch id)
   (:meth:`pipeline.io.state_store.StateStore.apply`, whose docstring says why that key suffices:
   Spark logs each batch's offset ranges before running it and re-runs a logged batch with the
   same ranges and id after a restart).

Why the CPU cost is a wait and Spark runs ``local[W]``. The PKG paper's Storm experiment
emulated load "by adding a fixed delay to the processing", 0.1 to 1 ms per record, so that an
overloaded worker loses throughput (PKG §V, Q4, Fig. 5a; pkg.md §4.6). Here
the W workers share a 2-core machine: burning CPU would make W workers compete for 2 cores and
measure the machine, not the grouping. A sleep of ``C`` µs per record costs no CPU, and with
``local[max(W, 2)]`` all W tasks of a micro-batch run at once, so each worker behaves like a
machine of its own that serves ``10^6 / C`` records per second. A micro-batch ends when its
slowest task ends, so the hottest worker's backlog sets the job's throughput -- exactly the
effect key skew has on a real cluster.

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
    >>> batch = to_worker_batch(decoded, [b"a", b"a", None], np.array([0, 0, 0]), worker=2,
    ...                         batch_id=7, now_ms=3, window_ms=10_000, n_sources=1)
    >>> batch.windows.tolist(), batch.counts.tolist(), dict(batch.source_watermarks)
    ([0, 10000], [1, 1], {0: 9999})
"""

from __future__ import annotations

import contextlib
import itertools
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.keys import KeyBatch
from operators.windows import count_per_window_key
from pipeline.io import records
from pipeline.io.state_store import StateStore, WorkerBatch, latency_buckets

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

    records: np.ndarray  # WORK_DTYPE, zeroed where a value did not decode
    data: np.ndarray  # bool: valid DATA records with a key
    markers: np.ndarray  # bool: valid WATERMARK markers
    rejected: int  # values that did not decode, and DATA without a key
    #: bool: valid TABLE_SWITCH markers (routing-table schemes;
    #: :mod:`pipeline.stages.control_plane`)
    switches: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def data_records(self) -> int:
        return int(self.data.sum())


def decode_partition(
    keys: Sequence[bytes | None], values: Sequence[bytes | None]
) -> DecodedPartition:
    """Decode a task's values at once and sort them into DATA, markers and rejects."""
    decoded, ok = records.decode_work(values)
    has_key = np.fromiter((key is not None for key in keys), dtype=bool, count=len(keys))
    kind = decoded["kind"]
    is_data = ok & (kind == records.Kind.DATA)
    data = is_data & has_key
    markers = ok & (kind == records.Kind.WATERMARK)
    switches = ok & (kind == records.Kind.TABLE_SWITCH)
    rejected = int((~ok).sum() + (is_data & ~has_key).sum())
    return DecodedPartition(decoded, data, markers, rejected, switches)


def to_worker_batch(
    decoded: DecodedPartition,
    keys: Sequence[bytes | None],
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
    key_batch = KeyBatch.from_bytes(itertools.compress(keys, data.tolist()))
    event_times = decoded.records["event_time_ms"]
    counted = count_per_window_key(key_batch, records.window_start(event_times[data], window_ms))

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
    )


#: StateStore per (Redis URL, run id) in each Python worker process (Spark reuses them).
_STORES: dict[tuple[str, str], StateStore] = {}


def _store(redis_url: str, run_id: str) -> StateStore:
    store = _STORES.get((redis_url, run_id))
    if store is None:
        store = _STORES[(redis_url, run_id)] = StateStore.from_url(redis_url, run_id)
    return store


@dataclass(frozen=True)
class PartitionProcessor:
    """The function each Spark task runs on its partition (= one worker) of a micro-batch.

    Rows are ``(partition, key, value, timestamp_ms)``. Yields one summary
    ``(worker, batch_id, records, applied, seconds)`` per non-empty partition.
    """

    batch_id: int
    n_workers: int
    n_sources: int
    window_ms: int
    cpu_cost_us: float
    redis_url: str
    run_id: str

    def __call__(self, rows: Iterable[Any]) -> Iterator[tuple[int, int, int, bool, float]]:
        started = time.monotonic()
        columns = list(zip(*rows, strict=True))
        if not columns:
            return
        partitions, keys, values, timestamps = columns
        workers = np.unique(np.asarray(partitions, dtype=np.int64))
        if workers.size != 1 or not 0 <= int(workers[0]) < self.n_workers:
            raise WorkerJobError(
                f"a task got Kafka partitions {workers.tolist()}: each task must hold exactly "
                f"one partition < W={self.n_workers} (partition w is worker w)"
            )
        worker = int(workers[0])
        decoded = decode_partition(keys, values)
        time.sleep(decoded.data_records * self.cpu_cost_us / 1e6)
        batch = to_worker_batch(
            decoded,
            keys,
            np.asarray(timestamps, dtype=np.int64),
            worker=worker,
            batch_id=self.batch_id,
            now_ms=time.time() * 1000.0,
            window_ms=self.window_ms,
            n_sources=self.n_sources,
        )
        applied = _store(self.redis_url, self.run_id).apply(batch, self.n_sources)
        yield worker, self.batch_id, batch.records, applied, time.monotonic() - started


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


#: Called on the driver after each micro-batch with the tasks' summaries.
BatchCallback = Callable[[int, list[tuple[int, int, int, bool, float]]], None]


@dataclass
class WorkSummary:
    """What a run of the job did (batches counts only this process's batches)."""

    seconds: float = 0.0
    batches: int = 0
    processed: list[int] = field(default_factory=list)
    finished: bool = False


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

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", options.kafka_bootstrap)
        .option("subscribe", options.work_topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
    )
    if options.max_records_per_batch is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_records_per_batch))
    stream = reader.load().select(
        "partition", "key", "value", functions.expr("unix_millis(timestamp)").alias("timestamp_ms")
    )

    def process_batch(frame: DataFrame, batch_id: int) -> None:
        processor = PartitionProcessor(
            batch_id=batch_id,
            n_workers=options.workers,
            n_sources=options.sources,
            window_ms=options.window_ms,
            cpu_cost_us=options.cpu_cost_us,
            redis_url=options.redis_url,
            run_id=options.run_id,
        )
        on_batch(batch_id, frame.rdd.mapPartitions(processor).collect())

    return (
        stream.writeStream.queryName(f"skewer-work-{options.run_id}")
        .option("checkpointLocation", str(options.checkpoint))
        .foreachBatch(process_batch)
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

    ``spark`` defaults to a new ``local[max(W, 2), 4]`` session (stopped at the end); a given
    session is left running (tests reuse one).
    """
    store = StateStore.from_url(options.redis_url, options.run_id)
    prepare(options, store)
    own_session = spark is None
    if spark is None:
        from pipeline.io.spark_session import build_spark_session

        slots = max(options.workers, 2)
        spark = build_spark_session(
            f"skewer-work-{options.run_id}",
            master=f"local[{slots},{TASK_ATTEMPTS}]",
            shuffle_partitions=slots,
        )
    summary = WorkSummary()

    def count_batch(batch_id: int, summaries: list[tuple[int, int, int, bool, float]]) -> None:
        summary.batches += 1
        if on_batch is not None:
            on_batch(batch_id, summaries)

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
    finally:
        query.stop()
        if own_session:
            spark.stop()
        store.client.close()
    summary.seconds = time.monotonic() - started
    return summary


def log_batch(batch_id: int, summaries: list[tuple[int, int, int, bool, float]]) -> None:
    """A progress line per micro-batch on standard error (``skewer work --verbose``)."""
    loads = {worker: count for worker, _, count, _, _ in summaries}
    skipped = sum(1 for *_, applied, _ in summaries if not applied)
    slowest = max((seconds for *_, seconds in summaries), default=0.0)
    print(
        f"batch {batch_id}: records per worker {dict(sorted(loads.items()))}, "
        f"slowest task {slowest:.2f} s" + (f", {skipped} replayed (skipped)" if skipped else ""),
        file=sys.stderr,
    )
