"""The workers' query in Spark's Real-Time Mode: Kafka source -> a JVM writer -> Redis.

Layer: stages.

``skewer work --trigger real-time`` runs the same job as the micro-batch path
(:mod:`pipeline.stages.worker_job`) with two things swapped: the trigger
(``Trigger.RealTime``: long-running tasks, one per ``work`` partition, that see each record as
it arrives) and the sink, a ``ForeachWriter`` written for the JVM (jvm/realtime-writer,
``skewer.realtime.WorkWriter``), the only user code Real-Time Mode lets a query end in. The
writer applies each worker's rows with the micro-batch path's Lua script a few milliseconds at
a time, exactly once by Kafka offsets. Why and how: docs/design.md#real-time-mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.io.redis_client import replicas_to_wait, sentinel_address
from pipeline.io.redis_layout import APPLY_SCRIPT, RunKeys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: The Java class of the writer (jvm/realtime-writer).
WRITER_CLASS = "skewer.realtime.WorkWriter"
#: The columns the writer reads, in this order.
WRITER_COLUMNS = ("partition", "offset", "key", "value", "timestamp_ms")


@dataclass(frozen=True)
class RealTimeSettings:
    """How the writer batches its applies and how long a Real-Time Mode batch runs."""

    #: A worker's rows are applied once this many wait ...
    flush_rows: int = 1_000
    #: ... or once the oldest has waited this long (ms), whether or not more rows come.
    flush_ms: float = 5.0
    #: How long each of Spark's real-time batches runs (its checkpoint interval): the most a
    #: restart replays (the offsets keep a replay from counting twice), and how often the
    #: tasks stop and start again.
    checkpoint_seconds: int = 30


def writer(
    spark: SparkSession,
    *,
    redis_url: str,
    run_id: str,
    workers: int,
    sources: int,
    window_ms: int,
    cpu_cost_us: float,
    settings: RealTimeSettings,
) -> object:
    """A new ``WorkWriter`` (a Py4J handle) for the run: its Redis, its keys and the apply
    script come from here (:mod:`pipeline.io.redis_layout`), so the Java side spells none."""
    keys = RunKeys(run_id)
    sentinel = sentinel_address(redis_url)
    gateway = spark.sparkContext._gateway
    applied = gateway.new_array(gateway.jvm.java.lang.String, workers)
    for worker in range(workers):
        applied[worker] = keys.applied(worker)
    writer_class = gateway.jvm
    for part in WRITER_CLASS.split("."):
        writer_class = getattr(writer_class, part)
    return writer_class(
        "" if sentinel else redis_url,
        sentinel.service if sentinel else "",
        ",".join(f"{host}:{port}" for host, port in sentinel.sentinels) if sentinel else "",
        (sentinel.username or "") if sentinel else "",
        (sentinel.password or "") if sentinel else "",
        sentinel.db if sentinel else 0,
        replicas_to_wait(redis_url),
        APPLY_SCRIPT,
        keys.prefix,
        applied,
        keys.busy,
        sources,
        window_ms,
        float(cpu_cost_us),
        settings.flush_rows,
        float(settings.flush_ms),
    )


def start(
    spark: SparkSession,
    stream: DataFrame,
    java_writer: object,
    *,
    query_name: str,
    checkpoint: str,
    settings: RealTimeSettings,
) -> StreamingQuery:
    """Start ``stream`` (of :data:`WRITER_COLUMNS`) into the writer in Real-Time Mode.

    PySpark's ``foreach`` takes only a Python writer, whose rows go through PySpark's batching
    row transport (docs/performance.md#sparks-real-time-mode); the query is built on the JVM
    side instead, with Spark's own ``DataStreamWriter.foreach`` and ``Trigger.RealTime``.
    Output mode ``update``: Real-Time Mode refuses ``append``."""
    from pyspark.sql.streaming import StreamingQuery

    jvm = spark.sparkContext._jvm
    trigger = getattr(jvm, "org.apache.spark.sql.streaming.Trigger").RealTime(
        f"{settings.checkpoint_seconds} seconds"
    )
    java_query = (
        stream.select(*WRITER_COLUMNS)
        ._jdf.writeStream()
        .queryName(query_name)
        .option("checkpointLocation", checkpoint)
        .foreach(java_writer)
        .outputMode("update")
        .trigger(trigger)
        .start()
    )
    return StreamingQuery(java_query)
