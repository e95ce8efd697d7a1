"""Smoke tests of the real services: Kafka partitions are workers, end to end through Spark.

10,000 keyed records go into a topic of W = 8 partitions, each at an explicit partition: record
i has key ``key-(i mod 10)`` and goes to partition ``i mod 10`` when that is below 8, else to
partition 0. So partition 0 holds 3,000 records (keys 0, 8, 9) and partitions 1..7 hold 1,000
each -- numbers known by hand, skewed on purpose, no partition empty.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from pipeline.io import kafka_io

pytestmark = [pytest.mark.integration, pytest.mark.live_path]

RECORDS = 10_000
WORKERS = 8
EXPECTED_COUNTS = {0: 3_000, 1: 1_000, 2: 1_000, 3: 1_000, 4: 1_000, 5: 1_000, 6: 1_000, 7: 1_000}


def partition_of(record: int) -> int:
    bucket = record % 10
    return bucket if bucket < WORKERS else 0


@pytest.fixture(scope="module")
def produced_topic(kafka: str) -> Iterator[str]:
    from confluent_kafka import Producer

    topic = f"test-smoke-{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topic(kafka, topic, WORKERS)
    # Idempotence keeps each partition in production order even when a batch is retried (a
    # fresh topic's first produce can meet a leader that is not ready yet); without it a
    # retried batch lands after later ones.
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True, "linger.ms": 10})
    failures: list[object] = []
    for record in range(RECORDS):
        producer.produce(
            topic,
            key=f"key-{record % 10}".encode(),
            value=str(record).encode(),
            partition=partition_of(record),
            on_delivery=lambda error, _message: failures.append(error) if error else None,
        )
    assert producer.flush(30) == 0
    assert failures == []
    yield topic
    kafka_io.delete_topics(kafka, [topic])


def test_expected_counts_follow_from_the_partition_rule() -> None:
    assert Counter(partition_of(record) for record in range(RECORDS)) == EXPECTED_COUNTS


def test_records_read_back_exactly_per_partition(kafka: str, produced_topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": kafka, "group.id": produced_topic, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(produced_topic, p, 0) for p in range(WORKERS)])
    seen: dict[int, tuple[int, int, bytes]] = {}  # record -> (partition, offset, key)
    try:
        while len(seen) < RECORDS:
            messages = consumer.consume(num_messages=5_000, timeout=10)
            assert messages, f"only {len(seen)} of {RECORDS} records came back"
            for message in messages:
                assert message.error() is None
                record = int(message.value())
                assert record not in seen, f"record {record} read twice"
                seen[record] = (message.partition(), message.offset(), message.key())
    finally:
        consumer.close()

    assert Counter(partition for partition, _, _ in seen.values()) == EXPECTED_COUNTS
    for record, (partition, _, key) in seen.items():
        assert partition == partition_of(record)
        assert key == f"key-{record % 10}".encode()
    # Each partition holds exactly its records, in production order, at offsets 0..count-1.
    for partition, count in EXPECTED_COUNTS.items():
        in_offset_order = sorted(
            (offset, record) for record, (p, offset, _) in seen.items() if p == partition
        )
        assert [offset for offset, _ in in_offset_order] == list(range(count))
        assert [record for _, record in in_offset_order] == [
            record for record in range(RECORDS) if partition_of(record) == partition
        ]


def test_spark_reads_one_kafka_partition_per_task(spark, kafka: str, produced_topic: str) -> None:
    """Spark's Kafka source: count per Kafka partition = produced, one task per partition."""
    from pyspark.sql.functions import spark_partition_id

    batches: list[list[tuple[int, int, int]]] = []

    def collect_batch(batch_frame, _batch_id: int) -> None:
        rows = (
            batch_frame.select("partition", spark_partition_id().alias("task"))
            .groupBy("partition", "task")
            .count()
            .collect()
        )
        batches.append([(row["partition"], row["task"], row["count"]) for row in rows])

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka)
        .option("subscribe", produced_topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = stream.writeStream.foreachBatch(collect_batch).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None

    assert batches, "the query processed no micro-batch"
    counts: Counter[int] = Counter()
    for rows in batches:
        # Within a micro-batch, every Spark task holds exactly one Kafka partition and vice
        # versa: the task reading partition w is worker w.
        tasks_of_partition: dict[int, set[int]] = {}
        partitions_of_task: dict[int, set[int]] = {}
        for partition, task, count in rows:
            tasks_of_partition.setdefault(partition, set()).add(task)
            partitions_of_task.setdefault(task, set()).add(partition)
            counts[partition] += count
        assert all(len(tasks) == 1 for tasks in tasks_of_partition.values())
        assert all(len(partitions) == 1 for partitions in partitions_of_task.values())
    assert dict(counts) == EXPECTED_COUNTS
    assert len({task for rows in batches for _, task, _ in rows}) == WORKERS
