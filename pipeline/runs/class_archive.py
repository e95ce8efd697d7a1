"""The Spark driver's class archive: built once per JDK and PySpark, by a short worker run.

Layer: runs.

A JVM that maps the classes it needs from a class-data-sharing archive skips loading and
verifying them one by one, a large part of a Spark driver's start. The archive that pays is
one of the classes a worker stage really loads: :func:`ensure_class_archive` runs
:func:`train` in a subprocess, a whole ``worker_job.run`` over a small topic (session, query,
Kafka source, Python workers, Redis apply), whose JVM writes what it loaded when it exits
(``-XX:ArchiveClassesAtExit``). Every later session maps it
(:func:`pipeline.io.spark_session.class_archive_options`). Why and what it saves:
docs/performance.md#start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.io import config, file_lock, kafka_io, records
from pipeline.io.spark_session import CLASS_ARCHIVE_ENV, class_archive_path

#: Seconds the training run may take (a Spark start, a few micro-batches, the archive's dump;
#: a minute on an idle machine, several beside a test session's other Spark jobs).
TRAINING_SECONDS = 600.0
#: The training topic's records per partition (a micro-batch reads a quarter of them, so the
#: run takes a few batches).
TRAINING_RECORDS = 2_000
TRAINING_WORKERS = 8


def ensure_class_archive(
    settings: config.Settings, log: Callable[[str], None] = lambda _line: None
) -> Path | None:
    """The archive for this JDK and PySpark, built first if missing (needs Kafka and Redis).

    Never fails its caller: a build that does not work says so in one line through ``log``,
    and Spark starts as it would without an archive.
    """
    archive = class_archive_path(settings)
    if archive is None or archive.is_file():
        return archive
    with file_lock.exclusive(settings.run_dir / "class-archive.lock"):
        if archive.is_file():
            return archive  # built by another process while this one waited
        return _build(settings, archive, log)


def _build(settings: config.Settings, archive: Path, log: Callable[[str], None]) -> Path | None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    log("building the Spark driver's class archive (once per JDK and PySpark) ...")
    command = [sys.executable, "-m", "pipeline.runs.class_archive"]
    environ = {**os.environ, **settings.environ(), CLASS_ARCHIVE_ENV: f"dump:{partial}"}
    try:
        done = subprocess.run(
            command, env=environ, capture_output=True, text=True, timeout=TRAINING_SECONDS
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0 or not partial.is_file():
        lines = (done.stderr if done is not None else "").strip().splitlines()
        why = lines[-1] if lines else f"no archive within {TRAINING_SECONDS:.0f} s"
        log(f"the Spark class archive was not built ({why}); Spark starts without it")
        partial.unlink(missing_ok=True)
        return None
    partial.replace(archive)  # atomic: a session never maps half an archive
    for stale in archive.parent.glob("driver-classes-*.jsa"):
        if stale != archive:
            stale.unlink(missing_ok=True)
    return archive


def train(settings: config.Settings) -> None:
    """One worker stage over a small topic of its own, end to end, then everything deleted;
    returns once the driver's JVM has exited (and so written the archive)."""
    from pyspark import SparkContext

    from pipeline.io.state_store import StateStore
    from pipeline.stages import worker_job

    run_id = f"class-archive-{uuid.uuid4().hex[:8]}"
    names = kafka_io.RunNames(run_id, f"{run_id}-")
    _write_training_topic(settings.kafka_bootstrap, names.work_topic)
    options = worker_job.WorkOptions(
        workers=TRAINING_WORKERS,
        sources=1,
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        checkpoint=Path(tempfile.mkdtemp(prefix="skewer-class-archive-")) / "checkpoint",
        work_topic=names.work_topic,
        run_id=run_id,
        until_end=True,
        max_records_per_batch=TRAINING_RECORDS * TRAINING_WORKERS // 4,
    )
    spark = worker_job.job_session(options)
    gateway = SparkContext._gateway
    try:
        worker_job.run(options, spark, poll_seconds=0.05)
    finally:
        spark.stop()
        kafka_io.delete_topics(settings.kafka_bootstrap, [names.work_topic])
        store = StateStore.from_url(settings.redis_url, run_id)
        store.delete_run()
        store.client.close()
    # The JVM ends when its standard input does, and writes the archive as it exits.
    process = gateway.proc if gateway is not None else None
    if process is not None:
        process.stdin.close()
        process.wait(TRAINING_SECONDS)


def _write_training_topic(bootstrap: str, topic: str) -> None:
    """DATA records over two windows and END_OF_STREAM on every partition of ``topic``."""
    from confluent_kafka import Producer

    kafka_io.ensure_topic(bootstrap, topic, TRAINING_WORKERS)
    n = TRAINING_RECORDS * TRAINING_WORKERS
    # A DATA value without a payload is its header: producer 0, seq i, source 0, table 0.
    values = records.work_headers(np.arange(n) * 20_000 // n, 0, np.arange(n), 0, 0)
    end = records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=records.END_OF_STREAM)
    producer = Producer(kafka_io.producer_config(bootstrap))
    for i, value in enumerate(values):
        key = b"k%d" % (i % 97)
        kafka_io.produce_blocking(producer, topic, value, key, i % TRAINING_WORKERS)
    for worker in range(TRAINING_WORKERS):
        kafka_io.produce_blocking(producer, topic, end, b"", worker)
    producer.flush()


if __name__ == "__main__":
    train(config.load())
