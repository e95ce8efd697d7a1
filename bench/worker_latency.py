"""The worker stage's latency under a paced stream, and what two of its settings buy.

What it measures and how: :data:`METHOD`, the prose of bench/results/worker_latency.md.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.end_to_end import STEADY_FROM, Trace
from bench.experiment import (
    ExperimentResult,
    median_or_none,
    method_markdown,
    or_dash,
    ratio_or_dash,
)
from bench.worker_stage import (
    WORKERS,
    WORKLOAD,
    counts_exact,
    end_of_stream,
    expected_counts,
    routed_keys,
    work_values,
)
from operators.keys import KeyBatch
from operators.metrics import latency_quantile
from pipeline.io import config, kafka_io
from pipeline.io.state_store import StateStore
from pipeline.stages import grouping, worker_job

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: What the benchmark measures and how: the prose of bench/results/worker_latency.md.
METHOD = """\
``skewer bench latency`` writes ``bench/results/worker_latency.md`` (and ``.json``), headed by
the command and the machine. Needs a running broker and Redis (``skewer services up``).

What is measured. A writer in this process offers ``--rate`` records per second of
``zipf:z=1.2,keys=100000`` routed by PKG into a fresh ``work`` topic of W = 8 partitions for
``--seconds``, the way the grouping stage does: one Kafka transaction every 100 ms (its
cadence), event time = the time of writing, then END_OF_STREAM on every partition. Meanwhile
:func:`pipeline.stages.worker_job.run` reads the topic at zero CPU cost in one warm SparkSession
(``local[T]``, T = the job's default task count), with one of these settings:

- **skewer**: the job as it ships;
- **Kafka's fetch.max.wait.ms**: the query's consumers with Kafka's default of 500 ms instead
  of :data:`pipeline.stages.worker_job.FETCH_MAX_WAIT_MS`. Under read_committed each task's
  offset range ends with a transaction's commit marker, and fetching it while no newer record
  exists waits that long, once per partition, one partition after another in a task;
- **Spark's checkpoint file manager**: the query's offset and commit logs written through
  Hadoop's FileContext, Spark's default, instead of
  :data:`pipeline.stages.worker_job.CHECKPOINT_FILE_MANAGER` (Hadoop's FileSystem).

Each setting runs once per round, the order rotating from round to round, after one run that
warms the session. Latency is the workers' own histogram: from the writer's write to ``work``
(the record's Kafka timestamp) to the worker's count, over the records applied after the first
20 % (start-up left out); quantiles are the upper edges of its buckets (20 per decade, so
... 355, 398, 447, 501, 562 ... ms). The batch cycle is Spark's ``triggerExecution`` of each
micro-batch, the logs its offset and commit logs (``walCommit`` + ``commitOffsets``), medians
over the batches after the third. After every run, every (window, key) count in Redis must
equal what was written.
"""

#: About a quarter of the pipeline's zero-cost capacity on the 2-core machine
#: (bench/results/end_to_end.md): the load of the latency target of p50 <= 0.5 s and
#: p99 <= 1.5 s.
RATE = 14_000.0
SECONDS = 20.0
#: The grouping stage's transaction cadence at a low rate (its default commit interval).
TRANSACTION_MS = grouping.COMMIT_INTERVAL_MS
#: The settings compared, as changes to the job's options.
SETTINGS: dict[str, dict[str, Any]] = {
    "skewer": {},
    "Kafka's fetch.max.wait.ms (500 ms)": {"fetch_max_wait_ms": 500},
    "Spark's checkpoint file manager (FileContext)": {"checkpoint_file_manager": None},
}
#: What each run measures, in the tables' column order.
FIGURES = ("p50_ms", "p99_ms", "cycle_ms", "logs_ms")
#: Micro-batches left out of the medians (the query's start).
FIRST_BATCHES = 3


def paced_write(
    bootstrap: str,
    topic: str,
    keys: KeyBatch,
    destinations: np.ndarray,
    rate: float,
) -> np.ndarray:
    """Write ``keys`` to their partitions at ``rate`` records/s, a transaction every
    :data:`TRANSACTION_MS`, then END_OF_STREAM; returns each record's event time (ms)."""
    from confluent_kafka import Producer

    producer = Producer(
        kafka_io.transactional_producer_config(bootstrap, f"bench-latency-{uuid.uuid4().hex}")
    )
    producer.init_transactions(30)
    n = len(keys)
    per_transaction = max(1, round(rate * TRANSACTION_MS / 1000))
    event_times = np.zeros(n, dtype=np.int64)
    key_list = keys.to_list()
    partitions = destinations.tolist()
    began = time.monotonic()
    for start in range(0, n, per_transaction):
        time.sleep(max(0.0, began + start / rate - time.monotonic()))
        stop = min(n, start + per_transaction)
        event_times[start:stop] = int(time.time() * 1000)
        values = work_values(event_times[start:stop], first_seq=start)
        producer.begin_transaction()
        for key, value, partition in zip(
            key_list[start:stop], values, partitions[start:stop], strict=True
        ):
            kafka_io.produce_blocking(producer, topic, value, key, partition)
        producer.commit_transaction(30)
    producer.begin_transaction()
    for partition in range(WORKERS):
        kafka_io.produce_blocking(producer, topic, end_of_stream(), b"", partition)
    producer.commit_transaction(30)
    return event_times


def measured_run(
    spark: SparkSession,
    settings: config.Settings,
    options: worker_job.WorkOptions,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    """One paced stream into a fresh topic, read by the job with ``options``' settings."""
    n = int(rate * seconds)
    keys, destinations = routed_keys(n)
    topic = f"bench-latency-{uuid.uuid4().hex[:8]}-work"
    kafka_io.ensure_topic(settings.kafka_bootstrap, topic, WORKERS)
    options = replace(
        options,
        work_topic=topic,
        run_id=f"bench-latency-{uuid.uuid4().hex[:8]}",
        checkpoint=Path(tempfile.mkdtemp(prefix="skewer-bench-latency-")) / "checkpoint",
    )
    store = StateStore.from_url(settings.redis_url, options.run_id)
    trace = Trace()
    processed = 0

    def on_batch(_batch_id: int, rows: list[worker_job.TaskSummary]) -> None:
        nonlocal processed
        processed += sum(row.records for row in rows)
        if trace.latency_at_steady is None and processed >= STEADY_FROM * n:
            trace.latency_at_steady = store.latency_histogram(WORKERS)

    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["summary"] = worker_job.run(
                options, spark, on_batch=on_batch, poll_seconds=0.05
            )
        except BaseException as error:  # reported by the caller, on its own thread
            outcome["error"] = error

    worker = threading.Thread(target=work, name="bench-latency-worker-job")
    worker.start()
    try:
        event_times = paced_write(settings.kafka_bootstrap, topic, keys, destinations, rate)
    except BaseException:
        # The job waits for an END_OF_STREAM that will not come now: stop its query (it may
        # start only after the write failed), so that the error is reported, not a hang.
        while worker.is_alive():
            for query in spark.streams.active:
                query.stop()
            worker.join(1.0)
        raise
    finally:
        worker.join()
        kafka_io.delete_topics(settings.kafka_bootstrap, [topic])
    try:
        if "error" in outcome:
            raise outcome["error"]
        trace.latency_at_end = store.latency_histogram(WORKERS)
        exact = counts_exact(store, expected_counts(keys, event_times))
        store.delete_run()
    finally:
        store.client.close()
    progress = outcome["summary"].progress[FIRST_BATCHES:]
    steady = trace.steady_latency()
    return {
        "p50_ms": latency_quantile(steady, 0.5),
        "p99_ms": latency_quantile(steady, 0.99),
        "cycle_ms": median_or_none(p.get("triggerExecution", 0) for p in progress),
        "logs_ms": median_or_none(
            p.get("walCommit", 0) + p.get("commitOffsets", 0) for p in progress
        ),
        "batches": len(outcome["summary"].progress),
        "exact": exact,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The results table, plain markdown.

    Example (the table is plain markdown):
        >>> print(table([{"setting": "skewer", "round": 1, "p50_ms": 398.1, "p99_ms": 631.0,
        ...               "cycle_ms": 300, "logs_ms": 50, "batches": 60, "exact": True}]))
        | setting | round | p50 (ms) | p99 (ms) | batch cycle (ms) | logs (ms) | batches | exact |
        |---|---:|---:|---:|---:|---:|---:|---|
        | skewer | 1 | 398 | 631 | 300 | 50 | 60 | yes |
    """
    lines = [
        "| setting | round | p50 (ms) | p99 (ms) | batch cycle (ms) | logs (ms) | batches "
        "| exact |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        figures = [or_dash(row[name], ",.0f") for name in FIGURES]
        lines.append(
            f"| {row['setting']} | {row['round']} | {' | '.join(figures)} | {row['batches']} "
            f"| {'yes' if row['exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def comparison(rows: list[dict[str, Any]]) -> str:
    """Each setting's medians over the rounds, and their ratios to skewer's."""
    medians = {
        setting: {
            figure: median_or_none(r[figure] for r in rows if r["setting"] == setting and r[figure])
            for figure in FIGURES
        }
        for setting in SETTINGS
    }
    base = medians["skewer"]
    lines = [
        "| setting | p50 (ms) | x skewer's | p99 (ms) | x skewer's | batch cycle (ms) "
        "| x skewer's | logs (ms) | x skewer's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setting, figures in medians.items():
        cells = []
        for figure in FIGURES:
            value = figures[figure]
            cells += [or_dash(value, ",.0f"), ratio_or_dash(value, base[figure])]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(
    *,
    rate: float = RATE,
    seconds: float = SECONDS,
    rounds: int = 2,
    log: Callable[[str], None] = lambda _line: None,
) -> ExperimentResult:
    """A warm-up run, then ``rounds`` rounds of every setting; the services must answer."""
    from pipeline.io.spark_session import build_spark_session

    if not rate > 0 or not seconds > 0 or rounds < 1:
        raise ValueError("rate and seconds must be > 0, rounds >= 1")
    settings = config.load()
    kafka_io.require_kafka(settings.kafka_bootstrap)
    tasks = worker_job.default_tasks(WORKERS)
    base = worker_job.WorkOptions(
        workers=WORKERS,
        sources=1,
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        checkpoint=Path("unused"),
        work_topic="unused",
        until_end=True,
    )
    spark = build_spark_session(
        "skewer-bench-latency",
        master=f"local[{max(tasks, 2)},{worker_job.TASK_ATTEMPTS}]",
        shuffle_partitions=max(tasks, 2),
    )
    rows: list[dict[str, Any]] = []
    try:
        warm = measured_run(spark, settings, base, rate, min(seconds, 5.0))
        log(f"warm-up: p50/p99 {warm['p50_ms']}/{warm['p99_ms']} ms, exact {warm['exact']}")
        names = list(SETTINGS)
        for index in range(rounds):
            for setting in names[index % len(names) :] + names[: index % len(names)]:
                options = replace(base, **SETTINGS[setting])
                row = {"setting": setting, "round": index + 1}
                row |= measured_run(spark, settings, options, rate, seconds)
                rows.append(row)
                log(
                    f"round {index + 1}, {setting}: p50/p99 {or_dash(row['p50_ms'], ',.0f')}/"
                    f"{or_dash(row['p99_ms'], ',.0f')} ms, "
                    f"cycle {or_dash(row['cycle_ms'], ',.0f')} ms, exact {row['exact']}"
                )
    finally:
        spark.stop()
    exact = all(row["exact"] for row in rows)
    body = [
        f"{rate:,.0f} records/s offered for {seconds:g} s per run ({int(rate * seconds):,} "
        f"records), `{WORKLOAD}` routed by PKG into W = {WORKERS} partitions; one SparkSession "
        f"`local[{max(tasks, 2)}]`, T = {tasks} task(s) per micro-batch; zero CPU cost.",
        "",
        table(rows),
        "",
        "Medians over the rounds:",
        "",
        comparison(rows),
        "",
        f"Every count exact: {'yes' if exact else 'NO'}.",
    ]
    return ExperimentResult(
        name="worker_latency",
        title="Worker stage latency under a paced stream, and what two of its settings buy",
        markdown=method_markdown(METHOD) + "\n\n" + "\n".join(body),
        data={"rate": rate, "seconds": seconds, "tasks": tasks, "rows": rows, "exact": exact},
    )
