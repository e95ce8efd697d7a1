"""The workers' Spark job: one Structured Streaming query on ``work``; partition w IS worker w.

Layer: stages.

The query reads ``work`` with Apache's Kafka source under ``read_committed`` (records of an
aborted grouping transaction are never seen), one input partition per topic partition, never
repartitioned by a column (Spark's Murmur3 would not send worker i to partition i). It
coalesces them into T tasks (``--tasks``; :func:`default_tasks`), each holding whole
partitions, and runs :class:`~pipeline.stages.worker_task.PartitionProcessor` on each with
``mapInArrow``; ``foreachBatch`` only collects the tasks' summaries. A worker's watermark is
the minimum over the S sources of the latest each sent to its partition; with ``until_end``
the driver stops once every worker's watermark is END_OF_STREAM. What a task does:
:mod:`pipeline.stages.worker_task`; why: docs/design.md#worker-stage and
docs/design.md#spark-pitfalls.

Long because the query and the session it runs in on a cluster (cores, heaps, speculation,
the executors' warm-up) are one Spark application, set up and stopped together.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.io import config, kafka_security, records
from pipeline.io.config import MICRO_BATCH, REAL_TIME, TRIGGERS
from pipeline.io.kafka_io import RunNames
from pipeline.io.spark_session import JIT_MODES, ask_the_driver, executor_python, is_local
from pipeline.io.state_store import StateStore
from pipeline.stages import worker_realtime
from pipeline.stages.python_daemon import SPARK_WORKER_MODULE
from pipeline.stages.worker_realtime import RealTimeSettings
from pipeline.stages.worker_task import (
    SUMMARY_SCHEMA,
    PartitionProcessor,
    TaskSummary,
    WorkerConfigError,
    WorkerJobError,
    run_fields,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.streaming import StreamingQuery


#: Attempts per task (``local[N,F]``; plain ``local[N]`` never retries). A retry is safe because
#: the apply is idempotent per (worker, batch): a task that failed after applying is skipped.
TASK_ATTEMPTS = 4


#: How long the broker may hold a fetch of the job's Kafka consumers that finds no new records
#: (Kafka's ``fetch.max.wait.ms``, 500 by default). A task reads known offset ranges, and under
#: read_committed a range ends with the grouping stage's commit marker: fetching it while no
#: newer record has been written waits the whole default, once per partition, one partition
#: after another in a task. The figures: bench/results/worker_latency.md.
FETCH_MAX_WAIT_MS = 10
#: Records one poll of the job's Kafka consumers returns at most (Kafka's ``max.poll.records``,
#: 500 by default). Spark's Kafka reader asks the partition's leader for its earliest and
#: latest offsets (two ListOffsets round trips) after every poll, so at the default a task
#: pays three round trips per 500 records: on a busy cluster, catching up on a backlog was
#: bound by those round trips, not by the records. 10,000 is about one fetch of Kafka's
#: default ``max.partition.fetch.bytes`` (1 MiB) of skewer's records. The figures:
#: bench/results/worker_stage.md.
MAX_POLL_RECORDS = 10_000
#: How Spark writes the query's offset and commit logs (``spark.sql.streaming.
#: checkpointFileManagerClass``). Its default, through Hadoop's FileContext, is slower for these
#: two small files than Hadoop's FileSystem (bench/results/worker_latency.md). Both write a
#: temporary file and rename it into place,
#: and the checkpoint is a local folder, where a rename is atomic: a kill -9 leaves a temporary
#: file, never half a log entry.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
CHECKPOINT_FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
#: The Python daemon Spark forks the tasks' Python workers from: this one loads their modules
#: and kernels before it forks.
PYTHON_DAEMON_MODULE = "pipeline.stages.python_daemon"
#: The executors' warm-up plugin (jvm/executor-warmup): a cluster's executor starts the daemon
#: and a Python worker per core before it takes a task (docs/design.md#spark-pitfalls).
EXECUTOR_WARMUP_PLUGIN = "skewer.warmup.WarmPythonWorkers"
#: What each task of the job hands Spark's daemon as its environment, on top of the session's
#: ``PYTHONHASHSEED`` and the executor's local directories, which the plugin adds: Spark keeps a
#: daemon per environment, and the tasks use the warmed one only when theirs is exactly this.
#: These are Spark's own entries for a ``mapInArrow`` task at its default settings (a core per
#: task: ``OMP_NUM_THREADS``);
#: tests/integration/test_spark_cluster.py checks that each executor runs a single daemon.
PYTHON_TASK_ENVIRONMENT = {
    "OMP_NUM_THREADS": "1",
    "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE": "1",
    "PYTHON_UDF_BATCH_SIZE": "100",
    "SPARK_AUTH_SOCKET_TIMEOUT": "15",
    "SPARK_BUFFER_SIZE": "65536",
    "SPARK_JOB_ARTIFACT_UUID": "default",
    "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    "SPARK_REUSE_WORKER": "1",
    "SPARK_SIMPLIFIED_TRACEBACK": "1",
}


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
    #: Kafka's ``max.poll.records`` for the query's consumers (``skewer bench worker`` measures
    #: it against Kafka's default).
    max_poll_records: int = MAX_POLL_RECORDS
    #: How Spark writes the query's logs; None: Spark's default (as for ``fetch_max_wait_ms``).
    checkpoint_file_manager: str | None = CHECKPOINT_FILE_MANAGER
    #: How the driver JVM compiles (``skewer work --jit``,
    #: :data:`pipeline.io.spark_session.JIT_MODES`): ``peak`` for a backlog, ``quick`` for a
    #: paced stream far below capacity, whose first records then wait no longer than later ones.
    jit: str = "peak"
    #: ``micro-batch`` (Spark's default trigger, a Python task per micro-batch) or ``real-time``
    #: (Spark's Real-Time Mode, a JVM writer per worker: :mod:`pipeline.stages.worker_realtime`).
    trigger: str = MICRO_BATCH
    #: How the real-time writer batches its applies (``trigger`` real-time only).
    realtime: RealTimeSettings = field(default_factory=RealTimeSettings)

    @property
    def task_count(self) -> int:
        if self.trigger == REAL_TIME:
            return self.workers  # Real-Time Mode runs one long task per Kafka partition
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
        if self.max_poll_records < 1:
            raise WorkerConfigError(f"max.poll.records must be >= 1, got {self.max_poll_records}")
        if self.tasks is not None and not 1 <= self.tasks <= self.workers:
            raise WorkerConfigError(f"--tasks must be in 1..W={self.workers}, got {self.tasks}")
        if self.trigger not in TRIGGERS:
            raise WorkerConfigError(
                f"--trigger must be one of {', '.join(TRIGGERS)}, got {self.trigger!r}"
            )
        if self.trigger == REAL_TIME and self.max_records_per_batch is not None:
            raise WorkerConfigError("--max-records-per-batch is for --trigger micro-batch only")
        if self.trigger == REAL_TIME and self.tasks not in (None, self.workers):
            raise WorkerConfigError(
                f"--trigger real-time runs one task per worker: --tasks must be W={self.workers}"
            )
        if self.jit not in JIT_MODES:
            raise WorkerConfigError(
                f"--jit must be one of {', '.join(JIT_MODES)}, got {self.jit!r}"
            )
        try:
            config.check_spark_master(self.spark_master, "--spark-master")
        except ValueError as error:
            raise WorkerConfigError(str(error)) from None


def default_tasks(workers: int) -> int:
    """Tasks per micro-batch by default: one per core of this machine, at most W.

    Each Python task costs a fixed slice of CPU per micro-batch, so more tasks than cores
    only queue for a core. The CPU-cost knob does not need a task per worker: a task emulates
    its workers side by side (:class:`PartitionProcessor`).
    """
    return max(1, min(workers, os.cpu_count() or 1))


#: Called on the driver after each micro-batch with the tasks' summaries.
BatchCallback = Callable[[int, list[TaskSummary]], None]
#: Called with each micro-batch's progress report (Spark's ``StreamingQueryProgress`` as a dict).
ProgressCallback = Callable[[dict], None]


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
    """Refuse a start that would break exactness: a different window length, worker count or
    trigger than the run's, or on the micro-batch path a fresh checkpoint for a run whose
    workers already applied batches (its batch ids would restart at 0 and every batch would be
    skipped as already applied)."""
    options.validate()
    differing = store.claim_config(
        window_ms=options.window_ms,
        workers=options.workers,
        real_time=int(options.trigger == REAL_TIME),
    )
    if differing:
        name, (recorded, given) = next(iter(differing.items()))
        raise WorkerConfigError(
            f"run {options.run_id!r} uses {name}={recorded}, not {given} (use another --run-id)"
        )
    if options.trigger == REAL_TIME:
        refuse_fields_in_real_time(store)
    # Real-time applies are guarded by Kafka offsets, not batch ids: a new checkpoint starts
    # at the earliest offsets and the writers skip what Redis applied (a real-time batch logs
    # its offsets only when it ends, so a driver killed in its first batch leaves none).
    fresh = checkpoint_is_fresh(options.checkpoint) and options.trigger != REAL_TIME
    if fresh and store.any_applied(options.workers):
        raise WorkerConfigError(
            f"run {options.run_id!r} already has worker state, but checkpoint "
            f"{options.checkpoint} is new: restart with the run's checkpoint or a new --run-id"
        )


def refuse_fields_in_real_time(store: StateStore) -> None:
    """:class:`WorkerConfigError` if the run keeps state fields besides its counts (``--sum``,
    a query's aggregates of columns): the real-time writer runs in the JVM, and the extractors
    that read columns from users' values are skewer's compiled Python ones
    (docs/design.md#real-time-mode)."""
    fields = run_fields(store).fields
    if fields:
        raise WorkerConfigError(
            f"--trigger real-time keeps counts only, not {fields[0].name}: the writer in Spark's "
            "JVM does not read users' values; run this run's workers with --trigger micro-batch"
        )


#: How long the driver's Kafka admin client may list a micro-batch's end offsets before Spark
#: asks again with a new one: a listing sent to a dead leader can wait for Kafka's default, a
#: minute, although the partition has a new one within seconds (docs/design.md#spark-pitfalls).
OFFSETS_TIMEOUT_MS = 10_000


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
        .option("kafka.max.poll.records", str(options.max_poll_records))
        # Kafka's clients refuse a request timeout longer than the call's (30 s by default).
        .option("kafka.default.api.timeout.ms", str(OFFSETS_TIMEOUT_MS))
        .option("kafka.request.timeout.ms", str(OFFSETS_TIMEOUT_MS))
        .options(**kafka_security.from_environ().spark_options())
    )
    if options.max_records_per_batch is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_records_per_batch))
    timestamp_ms = functions.expr("unix_millis(timestamp)").alias("timestamp_ms")
    if options.trigger == REAL_TIME:
        java_writer = worker_realtime.writer(
            spark,
            redis_url=options.redis_url,
            run_id=options.run_id,
            workers=options.workers,
            sources=options.sources,
            window_ms=options.window_ms,
            cpu_cost_us=options.cpu_cost_us,
            settings=options.realtime,
        )
        return worker_realtime.start(
            spark,
            reader.load().select("partition", "offset", "key", "value", timestamp_ms),
            java_writer,
            query_name=RunNames(options.run_id).work_query,
            checkpoint=str(options.checkpoint),
            settings=options.realtime,
        )
    stream = reader.load().select("partition", "key", "value", timestamp_ms)
    processor = PartitionProcessor(
        n_workers=options.workers,
        n_sources=options.sources,
        window_ms=options.window_ms,
        cpu_cost_us=options.cpu_cost_us,
        redis_url=options.redis_url,
        run_id=options.run_id,
    )
    # Part of the query, so planned once: built in foreachBatch, the Python function would be
    # pickled and the plan analysed again every micro-batch.
    summaries = stream.coalesce(options.task_count).mapInArrow(processor, SUMMARY_SCHEMA)

    def collect_batch(frame: DataFrame, batch_id: int) -> None:
        on_batch(batch_id, [TaskSummary(*row) for row in collect_in_foreach_batch(frame)])

    return (
        summaries.writeStream.queryName(RunNames(options.run_id).work_query)
        .option("checkpointLocation", str(options.checkpoint))
        .foreachBatch(collect_batch)
        .start()
    )


#: The Java exceptions a stop interrupts a micro-batch with (StreamExecution.IO_EXCEPTION_NAMES).
INTERRUPTIONS = frozenset(
    {
        "java.lang.InterruptedException",
        "java.io.InterruptedIOException",
        "java.nio.channels.ClosedByInterruptException",
    }
)


class QueryStoppingError(Exception):
    """``foreachBatch`` was interrupted because the query is being stopped."""


def query_stopping(error: BaseException) -> QueryStoppingError | None:
    """A short stand-in for ``error`` when it is a stop interrupting ``foreachBatch``, else None.

    Spark tells a stop from a failure by matching the Python traceback it gets back against
    ``Py4JJavaError: An error occurred while calling(.|\\n)*InterruptedException``, a regex
    that recurses once per character: on the full Java stack trace it overflows the stream
    thread's stack, the thread dies without marking the query stopped, and the driver's
    ``processAllAvailable`` or ``stop`` waits forever (docs/design.md#spark-pitfalls). The
    stand-in's message still matches, in a few hundred characters.
    """
    from py4j.protocol import Py4JJavaError

    if not isinstance(error, Py4JJavaError):
        return None
    try:
        name = str(error.java_exception.getClass().getName())
    except Exception:
        return None
    if name not in INTERRUPTIONS:
        return None
    called = error.errmsg.strip()
    return QueryStoppingError(f"py4j.protocol.Py4JJavaError: {called}\n: {name}")


def collect_in_foreach_batch(frame: DataFrame) -> list[Row]:
    """``frame.collect()`` inside ``foreachBatch``; when a stop interrupts it, the error raised
    is :func:`query_stopping`'s short one, so that the stop does not kill the stream thread."""
    try:
        return frame.collect()
    except Exception as error:
        stopping = query_stopping(error)
        if stopping is None:
            raise
        raise stopping from None


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
    on_progress: ProgressCallback | None = None,
    poll_seconds: float = 0.25,
) -> WorkSummary:
    """Run the job until END_OF_STREAM (``until_end``) or until interrupted.

    ``on_batch`` gets each micro-batch's task summaries as its ``foreachBatch`` ends;
    ``on_progress`` each batch's progress report once Spark has made it (looked for every
    ``poll_seconds``, so none is missed while the query keeps its recent reports).

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

    started = time.monotonic()
    query = start_query(spark, options, count_batch)
    reported = -1  # the last batch whose progress went to on_progress
    try:
        while ask_the_driver(lambda: query.isActive) and not summary.finished:
            if on_progress is not None:
                reported = report_progress(query, reported, on_progress)
            if options.trigger == REAL_TIME:  # a grouping stage that started after this one
                refuse_fields_in_real_time(store)
            if options.until_end and all(
                mark == records.END_OF_STREAM for mark in store.worker_watermarks(options.workers)
            ):
                # Commit the batch that carried the last END_OF_STREAM before stopping (else a
                # restart would re-run it, harmlessly). A failure shows in query.exception().
                # A real-time batch ends only when its checkpoint interval does, and its writer
                # applied every row the moment END_OF_STREAM showed: nothing to wait for.
                if options.trigger != REAL_TIME:
                    with contextlib.suppress(Exception):
                        query.processAllAvailable()
                summary.finished = ask_the_driver(query.exception) is None
            else:
                time.sleep(poll_seconds)
        if on_progress is not None:  # the batches that ended since the last look
            report_progress(query, reported, on_progress)
        error = ask_the_driver(query.exception)
        if error is not None:
            raise WorkerJobError(f"the streaming query failed: {failure_reason(error)}")
        summary.processed = store.processed_per_worker(options.workers).tolist()
        summary.progress = [
            {"batch": p["batchId"], "rows": p["numInputRows"], **p.get("durationMs", {})}
            for p in ask_the_driver(lambda: query.recentProgress)
        ]
        if options.trigger == REAL_TIME:  # no foreachBatch: Spark's progress counts them
            summary.batches = len({p["batch"] for p in summary.progress})
    finally:
        query.stop()
        if own_session:
            spark.stop()
        store.client.close()
    summary.seconds = time.monotonic() - started
    return summary


#: Heap of the driver and of each executor on a standalone cluster: Spark's default size,
#: fixed and touched at start.
CLUSTER_JVM_HEAP = "1g"
#: Speculative copies of a micro-batch's slow tasks, on a cluster: a batch ends with its
#: slowest task, and an executor that stalls held every batch for as long as it did. Once half
#: of a batch's tasks are done, Spark copies a task that has run three times their median and
#: two seconds at least to another host, and keeps the first to finish; the apply is idempotent
#: per (worker, batch) (docs/design.md#spark-pitfalls). Not in Real-Time Mode, whose tasks run
#: for the whole of a long batch by design.
#:
#: The Kafka source prefers one executor per partition (its consumer is cached there), and a
#: task waits ``spark.locality.wait`` (3 s by default) for its executor to have a free core
#: before it runs elsewhere: while a stalled executor holds its cores, every batch waited that
#: long. Half a second keeps a healthy executor's partitions on it and a stalled one's moving.
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "3",
    "spark.speculation.minTaskRuntime": "2s",
    "spark.locality.wait": "500ms",
}


def warmup_conf(cores: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of the executors' warm-up plugin (:data:`EXECUTOR_WARMUP_PLUGIN`): the
    Python, modules and environment that the job's tasks hand Spark's daemon, and a worker for
    each of an executor's ``cores``.

    >>> conf = warmup_conf(4, {"PYSPARK_PYTHON": "/venv/bin/python"})
    >>> conf["spark.plugins"], conf["spark.skewer.warmup.python"]
    ('skewer.warmup.WarmPythonWorkers', '/venv/bin/python')
    >>> conf["spark.skewer.warmup.workers"], conf["spark.skewer.warmup.env.PYTHONHASHSEED"]
    ('4', '0')
    """
    environ = os.environ if environ is None else environ
    environment = {**PYTHON_TASK_ENVIRONMENT, "PYTHONHASHSEED": environ.get("PYTHONHASHSEED", "0")}
    prefix = "spark.skewer.warmup."
    return {
        "spark.plugins": EXECUTOR_WARMUP_PLUGIN,
        f"{prefix}python": executor_python(environ),
        f"{prefix}workerModule": SPARK_WORKER_MODULE,
        f"{prefix}daemonModule": PYTHON_DAEMON_MODULE,
        f"{prefix}workers": str(cores),
        **{f"{prefix}env.{name}": value for name, value in sorted(environment.items())},
    }


def job_session(options: WorkOptions) -> SparkSession:
    """The job's own session on ``options.spark_master``, with a core for each task at once
    (the cost model runs a micro-batch's tasks side by side); a session that has too few is
    stopped again before :class:`WorkerConfigError` says so.

    On a standalone master the job asks for those cores, twice as many in micro-batches (spare
    ones on another host for speculation's copies), in executors of a fixed heap
    (:func:`~pipeline.io.spark_session.executor_request`, :data:`CLUSTER_JVM_HEAP`): without
    ``spark.cores.max`` it would take every core of the cluster, and another run's workers
    would wait. ``spark-submit``'s own settings win."""
    from pipeline.io.artifacts import (
        ArtifactError,
        ensure_executor_warmup,
        ensure_realtime_writer,
    )
    from pipeline.io.spark_session import (
        SparkClusterError,
        build_spark_session,
        executor_java_options,
        executor_request,
        require_executor_cores,
        submitted_conf,
    )

    slots = max(options.task_count, 2)
    master = options.spark_master
    if master == config.DEFAULT_SPARK_MASTER:
        master = f"local[{slots},{TASK_ATTEMPTS}]"
    given = submitted_conf()
    heap = given.get("spark.executor.memory", CLUSTER_JVM_HEAP)
    settings = config.load()
    # A real-time writer runs in the JVM: its jar instead of the Python workers' daemon.
    real_time = options.trigger == REAL_TIME
    speculation = {} if real_time or is_local(master) else SPECULATION
    java_options = " ".join(executor_java_options(settings, heap, master))
    standalone = (
        {
            # Spare cores serve speculation only: a real-time task runs for the whole batch.
            **executor_request(options.task_count, spare=bool(speculation)),
            # A fixed heap, touched at start: an executor whose RSS grows has a leak off-heap.
            "spark.executor.memory": heap,
            "spark.executor.extraJavaOptions": java_options,
        }
        if master.startswith("spark://")
        else {}
    )
    standalone = {key: value for key, value in standalone.items() if key not in given}
    daemon = {} if real_time else {"spark.python.daemon.module": PYTHON_DAEMON_MODULE}
    warm = bool(speculation) and master.startswith("spark://")
    try:
        writer_jars = [ensure_realtime_writer()] if real_time else []
        warmup_jars = [ensure_executor_warmup()] if warm else []
    except ArtifactError as error:
        raise WorkerJobError(str(error)) from None
    cores = {**standalone, **given}.get("spark.executor.cores", "1")  # spark-submit's wins
    warmup = warmup_conf(int(cores)) if warm else {}
    spark = build_spark_session(
        RunNames(options.run_id).work_query,
        master=master,
        shuffle_partitions=slots,
        extra_conf={**standalone, **daemon, **speculation, **warmup},
        jit=options.jit,
        extra_jars=[*writer_jars, *warmup_jars],
        driver_heap=CLUSTER_JVM_HEAP if standalone else None,
    )
    try:
        own_master = master == settings.spark_standalone_url
        require_executor_cores(
            spark,
            options.task_count,
            master_web_url=settings.spark_standalone_web_url if own_master else None,
        )
    except SparkClusterError as error:
        spark.stop()
        raise WorkerConfigError(str(error)) from None
    return spark


def report_progress(query: StreamingQuery, reported: int, on_progress: ProgressCallback) -> int:
    """Hand ``on_progress`` the progress reports of the batches after ``reported``, oldest
    first; the last batch reported. The last report is one small call; the query's recent
    ones (up to a hundred) are read only when batches ended since the last look."""
    last = ask_the_driver(lambda: query.lastProgress)
    if not last or last["batchId"] <= reported:
        return reported
    news = (
        [last]
        if last["batchId"] == reported + 1
        else [p for p in ask_the_driver(lambda: query.recentProgress) if p["batchId"] > reported]
    )
    for progress in news:
        on_progress(progress)
    return max(reported, *(p["batchId"] for p in news))


def log_progress(progress: dict) -> None:
    """A line per micro-batch's progress report on standard error (``skewer work --verbose``):
    where its time went, Spark's ``durationMs`` parts (``latestOffset`` asks the brokers for the
    end offsets, ``addBatch`` runs the tasks, ``walCommit`` and ``commitOffsets`` write the
    checkpoint, ``triggerExecution`` is the whole)."""
    durations = progress.get("durationMs", {})
    parts = ", ".join(f"{name} {ms}" for name, ms in sorted(durations.items()))
    print(
        f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} progress {progress['batchId']}: "
        f"{progress.get('numInputRows', 0)} rows, ms: {parts}",
        file=sys.stderr,
    )


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
        f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} batch {batch_id}: "
        f"records per worker {dict(sorted(loads.items()))}{parts}"
        + (f", {skipped} replayed (skipped)" if skipped else ""),
        file=sys.stderr,
    )
