"""The Spark workers and the aggregator against real Kafka, Spark and Redis.

Topic ``work`` (W = 4 partitions) is written directly, the way the grouping stage writes it:
S = 2 sources, each with its own transactional producer, alternating transactions of 600
records. Keys come from 40 names with a skewed (1/rank) draw and each record goes to worker
``(rank + record number) mod W``, so every key is split over several workers and the final
counts only come out right if the partials are merged (the kill test sends the two hottest
keys to worker 0 only, so its tasks take longer than the others' and a kill can land between
two workers' applies of one micro-batch). Event time grows per source over
4.5 windows of 10 s; before its first record of each window a source sends a WATERMARK
(window start - 1) to every partition, and END_OF_STREAM at the end. One transaction of 500
records with key ``aborted`` is aborted (read_committed must never count it), and two values
that do not decode go to partition 1. The expected counts per (window, key) and per worker are
computed from the generator with ``collections.Counter``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.io import kafka_io, records
from pipeline.io.state_store import StateStore, key_bytes
from pipeline.stages.aggregator import AggregateOptions, Aggregator, KafkaPublisher
from pipeline.stages.worker_job import TaskSummary, WorkOptions
from pipeline.stages.worker_job import run as run_worker_job

pytestmark = [pytest.mark.integration, pytest.mark.live_path]

WORKERS = 4
SOURCES = 2
WINDOW_MS = 10_000
TRANSACTION_RECORDS = 600
KEYS = [f"key-{rank:02d}".encode() for rank in range(40)]


@dataclass
class Written:
    counts: Counter[tuple[int, bytes]]  # (window, key) -> committed DATA records
    per_worker: list[int]
    rejected: list[int]

    @property
    def windows(self) -> list[int]:
        return sorted({window for window, _ in self.counts})

    def window(self, window: int) -> dict[bytes, int]:
        return {key: n for (w, key), n in self.counts.items() if w == window}


def spread(rank: int, record: int) -> int:
    """The default routing: every key over every worker."""
    return (rank + record) % WORKERS


def write_work(
    bootstrap: str,
    topic: str,
    records_per_source: int,
    seed: int = 3,
    route: Callable[[int, int], int] = spread,
) -> Written:
    from confluent_kafka import Producer

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(KEYS) + 1)
    counts: Counter[tuple[int, bytes]] = Counter()
    per_worker = [0] * WORKERS
    span_ms = int(4.5 * WINDOW_MS)
    producers = [
        Producer(kafka_io.transactional_producer_config(bootstrap, f"{topic}-source-{s}"))
        for s in range(SOURCES)
    ]
    for producer in producers:
        producer.init_transactions(30)
    plans = []
    for _source in range(SOURCES):
        ranks = rng.choice(len(KEYS), size=records_per_source, p=weights / weights.sum())
        times = np.arange(records_per_source) * span_ms // records_per_source
        plans.append((ranks, times))
    sent_window = [None] * SOURCES
    position = [0] * SOURCES
    while any(position[s] < records_per_source for s in range(SOURCES)):
        for source, producer in enumerate(producers):
            ranks, times = plans[source]
            start, stop = position[source], min(position[source] + TRANSACTION_RECORDS, len(ranks))
            if start >= stop:
                continue
            producer.begin_transaction()
            for i in range(start, stop):
                window = int(times[i]) // WINDOW_MS * WINDOW_MS
                if window != sent_window[source]:
                    mark = records.encode_marker(records.Kind.WATERMARK, source, window - 1)
                    for worker in range(WORKERS):
                        producer.produce(topic, value=mark, partition=worker)
                    sent_window[source] = window
                worker = route(int(ranks[i]), i)
                key = KEYS[int(ranks[i])]
                producer.produce(
                    topic, key=key, value=_data(int(times[i]), source, i), partition=worker
                )
                counts[(window, key)] += 1
                per_worker[worker] += 1
            producer.commit_transaction(30)
            position[source] = stop
    # An aborted transaction: its records are in the log but must never be counted.
    producers[0].begin_transaction()
    for i in range(500):
        producers[0].produce(
            topic, key=b"aborted", value=_data(span_ms - 1, 0, i), partition=i % WORKERS
        )
    producers[0].flush(30)
    producers[0].abort_transaction(30)
    for source, producer in enumerate(producers):
        producer.begin_transaction()
        if source == 1:
            for junk in (b"junk", b"SK" + bytes(34)):  # wrong length; right length, bad version
                producer.produce(topic, key=b"k", value=junk, partition=1)
        eos = records.encode_marker(records.Kind.WATERMARK, source, int(records.END_OF_STREAM))
        for worker in range(WORKERS):
            producer.produce(topic, value=eos, partition=worker)
        producer.commit_transaction(30)
    return Written(counts, per_worker, rejected=[0, 2, 0, 0])


def _data(event_time_ms: int, source: int, seq: int) -> bytes:
    row = np.zeros(1, dtype=records.INPUT_DTYPE)
    row["magic"], row["version"], row["kind"] = records.MAGIC, records.VERSION, records.Kind.DATA
    row["event_time_ms"], row["producer"], row["seq"] = event_time_ms, source, seq
    return records.encode_work(row, source=source, table_version=0)[0]


def read_results(bootstrap: str, topic: str, expected: int) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_io.consumer_config(bootstrap, f"{topic}-reader"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[dict] = []
    try:
        deadline = time.monotonic() + 30
        while len(values) < expected and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=1):
                assert message.error() is None
                values.append(json.loads(message.value()))
    finally:
        consumer.close()
    return values


def assert_exact(store: StateStore, written: Written) -> None:
    assert len(written.windows) >= 3
    assert store.final_windows() == written.windows
    for window in written.windows:
        assert store.result(window) == written.window(window), f"window {window}"
    assert store.state_keys() == []  # every partial state freed
    assert store.processed_per_worker(WORKERS).tolist() == written.per_worker
    assert store.per_worker("rejected", WORKERS).tolist() == written.rejected
    assert store.per_worker("late", WORKERS).tolist() == [0] * WORKERS
    assert sum(store.latency_histogram(WORKERS).values()) == sum(written.per_worker)


@pytest.fixture
def run_names(kafka: str, create_topic: Callable[[str, int], str]) -> kafka_io.RunNames:
    names = kafka_io.RunNames(f"w{uuid.uuid4().hex[:10]}", f"test-{uuid.uuid4().hex[:8]}-")
    create_topic(names.work_topic, WORKERS)
    create_topic(names.results_topic, 1)
    return names


@pytest.mark.parametrize("tasks", [1, WORKERS], ids=["all-workers-in-one-task", "task-per-worker"])
def test_workers_and_aggregator_count_exactly(
    spark,
    kafka: str,
    redis,
    redis_url: str,
    run_names: kafka_io.RunNames,
    tmp_path: Path,
    tasks: int,
) -> None:
    """Spark's Arrow batches reach the workers whole and each worker's state sees only its own
    partition, whether one task holds every worker or each worker has a task."""
    written = write_work(kafka, run_names.work_topic, records_per_source=6_000)
    options = WorkOptions(
        workers=WORKERS,
        sources=SOURCES,
        kafka_bootstrap=kafka,
        redis_url=redis_url,
        checkpoint=tmp_path / "checkpoint",
        work_topic=run_names.work_topic,
        window_ms=WINDOW_MS,
        run_id=run_names.run_id,
        until_end=True,
        max_records_per_batch=4_000,
        tasks=tasks,
    )
    tasks_per_batch: list[list[int]] = []
    task_batch_ids: list[tuple[int, set[int]]] = []

    def on_batch(batch_id: int, rows: list[TaskSummary]) -> None:
        tasks_per_batch.append([row.worker for row in rows])
        task_batch_ids.append((batch_id, {row.batch_id for row in rows}))

    summary = run_worker_job(options, spark, on_batch=on_batch)
    assert summary.finished
    assert summary.processed == written.per_worker
    # One summary per worker per micro-batch: never two tasks on one partition.
    assert tasks_per_batch and all(len(set(t)) == len(t) for t in tasks_per_batch)
    # The tasks applied under the id foreachBatch got (they read it from their task context).
    assert all(ids == {batch_id} for batch_id, ids in task_batch_ids if ids)
    assert len(tasks_per_batch) >= 3  # 12,000 records at <= 4,000 per batch

    store = StateStore(redis, run_names.run_id)
    assert store.worker_watermarks(WORKERS) == [records.END_OF_STREAM] * WORKERS
    aggregator = Aggregator(
        store,
        AggregateOptions(workers=WORKERS, top_k=3, run_id=run_names.run_id, until_end=True),
        KafkaPublisher(kafka, run_names.results_topic, run_names.aggregate_transactional_id),
    )
    total = aggregator.run(poll_seconds=0.05)
    assert total.finished and total.finalized == written.windows
    assert_exact(store, written)
    # An aggregator started again after Kafka committed its windows and Redis forgot it did
    # (killed in between) finds them in the topic and publishes none twice.
    store.client.delete(store.keys.windows_published)
    again = KafkaPublisher(kafka, run_names.results_topic, run_names.aggregate_transactional_id)
    assert again.published_windows() == set(written.windows)
    Aggregator(store, aggregator.options, again).resume(again.published_windows())
    assert store.unpublished_windows() == []

    results = read_results(kafka, run_names.results_topic, len(written.windows))
    assert sorted(r["window"] for r in results) == written.windows
    for result in results:
        expected = written.window(result["window"])
        assert {key_bytes(k): n for k, n in result["counts"].items()} == expected
        ranked = sorted(expected.items(), key=lambda item: (-item[1], item[0]))[:3]
        assert [(key_bytes(k), n) for k, n in result["top_k"]] == ranked
    # Replication: each key lives on up to W workers per window (the writer spreads keys).
    totals = store.window_totals()
    assert totals["records"] == sum(written.per_worker)
    assert totals["distinct_keys"] == len(written.counts)
    assert totals["distinct_keys"] < totals["state_entries"] <= WORKERS * len(written.counts)


def hot_on_worker_zero(rank: int, record: int) -> int:
    """The two hottest keys (about 35 % of the records) only on worker 0."""
    return 0 if rank < 2 else spread(rank, record)


def _work_command(names: kafka_io.RunNames, checkpoint: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "skewer"),
        "work",
        "--workers",
        str(WORKERS),
        "--sources",
        str(SOURCES),
        "--run-id",
        names.run_id,
        "--topic-prefix",
        names.topic_prefix,
        "--checkpoint",
        str(checkpoint),
        "--cpu-cost-us",
        "500",
        "--max-records-per-batch",
        "2000",
        "--until-end",
        "--verbose",
    ]


def test_kill_9_mid_batch_and_restart_from_checkpoint_stays_exact(
    kafka: str,
    redis,
    redis_url: str,
    run_names: kafka_io.RunNames,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = write_work(
        kafka, run_names.work_topic, records_per_source=12_000, seed=11, route=hot_on_worker_zero
    )
    env = dict(os.environ, SKEWER_KAFKA_BOOTSTRAP=kafka, SKEWER_REDIS_URL=redis_url)
    command = _work_command(run_names, tmp_path / "checkpoint")
    store = StateStore(redis, run_names.run_id)

    # Worker 0's tasks wait ~0.5 s per batch, the others' ~0.15 s: kill -9 the job (driver,
    # JVM, Python workers: its whole process group) when another worker has applied a batch
    # that worker 0 has not -- a micro-batch half applied.
    with open(tmp_path / "first.log", "wb") as log:
        job = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=log)
        try:
            applied: list[int | None] = []
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and job.poll() is None:
                applied = store.applied_batches(WORKERS)
                ahead = max((a for a in applied[1:] if a is not None), default=-1)
                if ahead >= 1 and (applied[0] is None or applied[0] < ahead):
                    os.killpg(job.pid, signal.SIGKILL)
                    break
                time.sleep(0.01)
            job.wait(30)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
    assert job.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-2000:]
    half_applied = max(a for a in applied[1:] if a is not None)
    processed_at_kill = int(store.processed_per_worker(WORKERS).sum())
    assert 0 < processed_at_kill < sum(written.per_worker)

    restarted = subprocess.run(command, env=env, capture_output=True, timeout=240)
    log = restarted.stderr.decode()
    assert restarted.returncode == 0, log[-2000:]
    # Spark re-ran the half-applied batch with its logged offsets; the workers that had
    # applied it skipped it (and a rerun that double counted would break the totals below).
    assert f"batch {half_applied}: " in log
    # A line per micro-batch: its time (HH:MM:SS.mmm), then "batch N: ...".
    replayed = [line for line in log.splitlines() if f" batch {half_applied}: " in line]
    assert "replayed (skipped)" in replayed[0], log[-2000:]

    from pipeline.cli import app

    monkeypatch.setenv("SKEWER_REDIS_URL", redis_url)
    monkeypatch.setenv("SKEWER_KAFKA_BOOTSTRAP", kafka)
    code = app.main(
        [
            "aggregate",
            "--workers",
            str(WORKERS),
            "--run-id",
            run_names.run_id,
            "--topic-prefix",
            run_names.topic_prefix,
            "--until-end",
        ]
    )
    assert code == 0
    assert_exact(store, written)
