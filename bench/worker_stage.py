"""The worker stage against what a Spark user would write instead, in one run on one topic.

What it measures and how: :data:`METHOD`, the prose of bench/results/worker_stage.md.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.experiment import ExperimentResult, method_markdown
from operators import registry
from operators.keys import KeyBatch
from operators.windows import count_per_window_key
from pipeline.io import config, kafka_io, records
from pipeline.io.state_store import StateStore
from pipeline.stages import worker_job
from producers import workloads

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: What the benchmark measures and how: the prose of bench/results/worker_stage.md.
METHOD = """\
``skewer bench worker`` writes ``bench/results/worker_stage.md`` (and ``.json``), headed by
the command and the machine. Needs a running broker and Redis (``skewer services up``).

What is compared. One ``work`` topic of W = 8 partitions is filled once with ``--records``
records of ``zipf:z=1.2,keys=100000`` routed by PKG (DATA values in skewer's 36-byte format,
event times spread over 60 s, so 6 windows of 10 s), followed by END_OF_STREAM on every
partition. One warm SparkSession (``local[T]``, T = the worker job's default task count) then
reads the whole topic, from the first offset to the last, with:

- **Spark**: Structured Streaming ``groupBy(window(event_time, "10 seconds"), key).count()``,
  the event time decoded from the value in Spark SQL (bytes 5-12, little-endian), DATA records
  only, Spark's own state store, ``trigger(availableNow=True)``, update mode, ``noop`` sink,
  and the settings skewer's job has: the Kafka consumer's (read_committed, ``fetch.max.wait.ms``
  of :data:`pipeline.stages.worker_job.FETCH_MAX_WAIT_MS`, ``max.poll.records`` of
  :data:`pipeline.stages.worker_job.MAX_POLL_RECORDS`) and the checkpoint's log writer
  (:data:`pipeline.stages.worker_job.CHECKPOINT_FILE_MANAGER`), which speed Spark's query as
  much as skewer's;
- **skewer**: :func:`pipeline.stages.worker_job.run` with ``until_end``, zero CPU cost, a
  fresh run id and checkpoint each time: the same job ``skewer work`` runs, state in Redis;
- **skewer at 500 a poll**: the same job with Kafka's default ``max.poll.records`` (500).
  Spark's reader asks for the partition's earliest and latest offsets after every poll, two
  round trips to the broker, so this column is what those round trips cost on an idle broker;
  on a busy cluster each costs more.

Each query first runs once to warm the session (JIT-compiled kernels, Python workers, Kafka
consumers); then ``--rounds`` rounds of the three, the order turning from one round to the
next, and each ratio divides skewer's rate by its own round's Spark rate. Rate = records /
wall time from the query's start to its end. After every skewer run, every (window, key)
count in Redis (summed over the workers' partial state) must equal the count computed from the
records written.

Where skewer's time goes comes from two sources: each Spark task's own clock
(:class:`pipeline.stages.worker_job.TaskSummary`: reading Spark's Arrow batches, decoding,
counting, the Redis apply) and Spark's progress reports of the same query
(``StreamingQueryProgress.durationMs``: offsets, planning, the batch, the logs).
"""

WORKERS = 8
WINDOW_MS = 10_000
#: Event times of the records spread evenly over this span (6 windows of 10 s).
EVENT_SPAN_MS = 60_000
EVENT_START_MS = 1_700_000_000_000
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"
TARGET_RATIO = 1.0


#: Records written per (window start, key): what every run's counts must equal.
Expected = dict[tuple[int, bytes], int]


def routed_keys(n: int) -> tuple[KeyBatch, np.ndarray]:
    """The first ``n`` keys of :data:`WORKLOAD` and the worker PKG routes each to."""
    keys = workloads.parse(f"{WORKLOAD},n={n}").keys()
    return keys, registry.create("pkg", WORKERS).route(keys)


def work_values(event_time_ms: np.ndarray, first_seq: int = 0) -> list[bytes]:
    """skewer's 36-byte DATA values (producer and source 0) with these event times: a DATA
    value without a payload is its header."""
    seqs = first_seq + np.arange(event_time_ms.shape[0])
    return records.work_headers(event_time_ms, 0, seqs, source=0, table_version=0)


def end_of_stream() -> bytes:
    """The END_OF_STREAM marker of the only source, written to every partition at the end."""
    return records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=records.END_OF_STREAM)


def expected_counts(keys: KeyBatch, event_time_ms: np.ndarray) -> Expected:
    counted = count_per_window_key(keys, records.window_start(event_time_ms, WINDOW_MS))
    return dict(
        zip(
            zip(counted.windows.tolist(), counted.keys.to_list(), strict=True),
            counted.counts.tolist(),
            strict=True,
        )
    )


def prefill(bootstrap: str, topic: str, n: int) -> Expected:
    """Write ``n`` PKG-routed DATA records and END_OF_STREAM on every partition of ``topic``."""
    from confluent_kafka import Producer

    keys, destinations = routed_keys(n)
    event_times = EVENT_START_MS + np.arange(n) * EVENT_SPAN_MS // n
    values = work_values(event_times)
    kafka_io.ensure_topic(bootstrap, topic, WORKERS)
    producer = Producer(kafka_io.producer_config(bootstrap))
    for key, value, worker in zip(keys.to_list(), values, destinations.tolist(), strict=True):
        kafka_io.produce_blocking(producer, topic, value, key, worker)
    for worker in range(WORKERS):
        kafka_io.produce_blocking(producer, topic, end_of_stream(), b"", worker)
    producer.flush()
    return expected_counts(keys, event_times)


def spark_group_by_count(spark: SparkSession, bootstrap: str, topic: str) -> float:
    """Seconds Spark's own windowed count takes over the whole topic (availableNow)."""
    from pyspark.sql import functions

    # Like for like: the checkpoint's log writer skewer's job sets (worker_job.start_query).
    spark.conf.set(worker_job.CHECKPOINT_FILE_MANAGER_CONF, worker_job.CHECKPOINT_FILE_MANAGER)
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        # The consumer setting skewer's job runs with (worker_job.FETCH_MAX_WAIT_MS): without it
        # each partition's trailing commit marker holds a fetch for Kafka's default 500 ms.
        .option("kafka.fetch.max.wait.ms", str(worker_job.FETCH_MAX_WAIT_MS))
        .option("kafka.max.poll.records", str(worker_job.MAX_POLL_RECORDS))
        .load()
    )
    # The value's bytes 5-12 are the event time, little-endian: hex, byte order reversed.
    hex_time = functions.hex(functions.substring("value", 5, 8))
    big_endian = functions.concat(*(functions.substring(hex_time, 15 - 2 * i, 2) for i in range(8)))
    event_time = functions.timestamp_millis(functions.conv(big_endian, 16, 10).cast("long"))
    counts = (
        frame.where(functions.substring("value", 4, 1) == functions.lit(bytes([records.Kind.DATA])))
        .select(event_time.alias("event_time"), "key")
        .groupBy(functions.window("event_time", f"{WINDOW_MS // 1000} seconds"), "key")
        .count()
    )
    began = time.perf_counter()
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="skewer-bench-spark-"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - began


@dataclass
class SkewerRun:
    """One run of the worker job over the whole topic, checked against what was written."""

    seconds: float
    tasks: list[worker_job.TaskSummary]
    #: Spark's progress reports of the run (``WorkSummary.progress``).
    progress: list[dict[str, int]]
    exact: bool


def skewer_job(
    spark: SparkSession,
    settings: config.Settings,
    topic: str,
    expected: Expected,
    max_poll_records: int = worker_job.MAX_POLL_RECORDS,
) -> SkewerRun:
    """Run ``worker_job.run`` over the whole topic under a fresh run id, check its counts,
    then delete the run's Redis keys."""
    run_id = f"bench-worker-{uuid.uuid4().hex[:8]}"
    tasks: list[worker_job.TaskSummary] = []
    options = worker_job.WorkOptions(
        workers=WORKERS,
        sources=1,
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        checkpoint=Path(tempfile.mkdtemp(prefix="skewer-bench-work-")) / "checkpoint",
        work_topic=topic,
        window_ms=WINDOW_MS,
        run_id=run_id,
        until_end=True,
        max_poll_records=max_poll_records,
    )
    began = time.perf_counter()
    summary = worker_job.run(
        options, spark, on_batch=lambda _, rows: tasks.extend(rows), poll_seconds=0.02
    )
    seconds = time.perf_counter() - began
    store = StateStore.from_url(settings.redis_url, run_id)
    try:
        exact = counts_exact(store, expected)
        store.delete_run()
    finally:
        store.client.close()
    return SkewerRun(seconds, tasks, summary.progress, exact)


def counts_exact(store: StateStore, expected: Expected) -> bool:
    """Every (window, key) count of the run's worker state, summed over the workers' partial
    state, equals what was written."""
    merged: Expected = {}
    for window in sorted({window for window, _ in expected}):
        for worker in range(WORKERS):
            for key, count in store.partial(worker, window).items():
                merged[(window, key)] = merged.get((window, key), 0) + count
    return merged == expected


def table(rows: list[dict[str, Any]]) -> str:
    """The results table, plain markdown.

    Example (the table is plain markdown):
        >>> print(table([{"round": 1, "spark": 2e5, "skewer": 2.2e5, "skewer_500": 1.5e5,
        ...               "exact": True}]))
        | round | Spark groupBy().count() records/s | skewer records/s | skewer / Spark | skewer at 500 a poll records/s | exact |
        |---|---:|---:|---:|---:|---|
        | 1 | 200,000 | 220,000 | 1.10 | 150,000 | yes |
    """  # noqa: E501
    lines = [
        "| round | Spark groupBy().count() records/s | skewer records/s | skewer / Spark "
        "| skewer at 500 a poll records/s | exact |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['round']} | {row['spark']:,.0f} | {row['skewer']:,.0f} | "
            f"{row['skewer'] / row['spark']:.2f} | {row['skewer_500']:,.0f} | "
            f"{'yes' if row['exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def profile_table(run: SkewerRun) -> str:
    """Where one skewer run's time went: tasks' own clocks, then Spark's progress reports."""
    task_parts = {
        "read_seconds": "read Spark's Arrow batches (Kafka fetch, JVM-to-Python hand-over)",
        "decode_seconds": "decode and split by worker",
        "count_seconds": "count per (window, key), watermarks, latencies",
        "apply_seconds": "Redis apply (one script per worker and batch)",
        "seconds": "the whole task, Python side",
    }
    # A task reports once per worker it holds; its clocks are the task's, so count them once.
    tasks = {(t.batch_id, t.seconds, t.read_seconds): t for t in run.tasks}.values()
    lines = ["| part of the tasks | seconds, summed over tasks |", "|---|---:|"]
    for phase, label in task_parts.items():
        lines.append(f"| {label} | {sum(getattr(t, phase) for t in tasks):.2f} |")
    spark_parts = {
        "latestOffset": "latest offsets from Kafka",
        "queryPlanning": "query planning",
        "walCommit": "offset log (write-ahead)",
        "addBatch": "the batch itself (tasks, scheduling, the driver's callback)",
        "commitOffsets": "commit log",
    }
    lines += ["", "| part of the micro-batches (Spark's progress) | ms, summed over batches |"]
    lines.append("|---|---:|")
    for part, label in spark_parts.items():
        lines.append(f"| {label} | {sum(p.get(part, 0) for p in run.progress):,} |")
    total = sum(p.get("triggerExecution", 0) for p in run.progress)
    lines.append(f"| all of it (triggerExecution) | {total:,} |")
    lines.append("")
    lines.append(
        f"{len(run.progress)} micro-batch(es), {len(tasks)} task(s); wall time of the run "
        f"{run.seconds:.2f} s (includes warming the Python workers and starting the query)."
    )
    return "\n".join(lines)


def run(
    *,
    records_count: int = 1_000_000,
    rounds: int = 3,
    jit: str = "peak",
    log: Callable[[str], None] = lambda _line: None,
) -> ExperimentResult:
    """Prefill, warm up, then ``rounds`` alternating pairs; the services must answer. ``jit``
    is the session's (``skewer work --jit``): ``quick`` writes ``worker_stage_quick``."""
    from pipeline.io.spark_session import build_spark_session

    settings = config.load()
    kafka_io.require_kafka(settings.kafka_bootstrap)
    topic = f"bench-worker-{uuid.uuid4().hex[:8]}-work"
    tasks = worker_job.default_tasks(WORKERS)
    spark = build_spark_session(
        "skewer-bench-worker",
        master=f"local[{max(tasks, 2)},{worker_job.TASK_ATTEMPTS}]",
        shuffle_partitions=max(tasks, 2),
        jit=jit,
    )
    try:
        began = time.perf_counter()
        expected = prefill(settings.kafka_bootstrap, topic, records_count)
        log(f"prefilled {records_count:,} records in {time.perf_counter() - began:.1f} s")
        warm_spark = spark_group_by_count(spark, settings.kafka_bootstrap, topic)
        warm_run = skewer_job(spark, settings, topic, expected)
        log(f"warm-up: Spark {warm_spark:.1f} s, skewer {warm_run.seconds:.1f} s")
        rows = []
        profiled = warm_run
        # skewer's job at its own max.poll.records and at Kafka's default.
        polls = {"skewer": worker_job.MAX_POLL_RECORDS, "skewer_500": 500}
        queries = ["spark", *polls]
        for index in range(rounds):
            row: dict[str, Any] = {"round": index + 1, "exact": True}
            for which in queries[index % 3 :] + queries[: index % 3]:
                if which == "spark":
                    row["spark"] = records_count / spark_group_by_count(
                        spark, settings.kafka_bootstrap, topic
                    )
                    continue
                measured = skewer_job(spark, settings, topic, expected, polls[which])
                row[which] = records_count / measured.seconds
                row["exact"] = row["exact"] and measured.exact
                if which == "skewer":
                    profiled = measured
            rows.append(row)
            log(
                f"round {index + 1}: Spark {row['spark']:,.0f}/s, skewer {row['skewer']:,.0f}/s, "
                f"at 500 a poll {row['skewer_500']:,.0f}/s, exact {row['exact']}"
            )
    finally:
        spark.stop()
        kafka_io.delete_topics(settings.kafka_bootstrap, [topic])
    ratios = [row["skewer"] / row["spark"] for row in rows]
    median = statistics.median(ratios)
    poll_gain = statistics.median(row["skewer"] / row["skewer_500"] for row in rows)
    exact = warm_run.exact and all(row["exact"] for row in rows)
    body = [
        f"{records_count:,} records of `{WORKLOAD}` routed by PKG into W = {WORKERS} partitions; "
        f"one SparkSession `local[{max(tasks, 2)}]`, its JIT `{jit}`; the worker job runs "
        f"T = {tasks} task(s) per micro-batch, each holding W / T workers.",
        "",
        table(rows),
        "",
        f"Median ratio {median:.2f} (target >= {TARGET_RATIO:.1f}: "
        f"{'met' if median >= TARGET_RATIO else 'NOT met'}); every count exact: "
        f"{'yes' if exact else 'NO'}. {worker_job.MAX_POLL_RECORDS:,} records a poll against "
        f"Kafka's default 500: {poll_gain:.2f}x skewer's rate (median of the rounds).",
        "",
        "Where the last skewer run's time went:",
        "",
        profile_table(profiled),
    ]
    return ExperimentResult(
        name="worker_stage" if jit == "peak" else f"worker_stage_{jit}",
        title="Worker stage at zero cost: skewer's job against Spark's own windowed count",
        markdown=re.sub(r":\w+:`", "`", method_markdown(METHOD)) + "\n\n" + "\n".join(body) + "\n",
        data={
            "records": records_count,
            "workers": WORKERS,
            "tasks": tasks,
            "jit": jit,
            "rows": rows,
            "median_ratio": median,
            "max_poll_records_gain": poll_gain,
            "exact": exact,
            "profile": {
                "tasks": [t._asdict() for t in profiled.tasks],
                "progress": profiled.progress,
            },
        },
    )
