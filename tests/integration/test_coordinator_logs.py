"""What a Kafka coordinator reads before it answers stays small, however long a run commits.

A broker that takes over a partition of ``__consumer_offsets`` (its leader died, or leaders
moved back to their preferred nodes) reads all of it before it coordinates the groups on it
again; the grouping stage's transactions commit their offsets there, so until then they stay
open and the run's read_committed readers wait. Compaction keeps such a log to the last commit
of each group, but never touches a log's open segment: with Kafka's 100 MiB segments an hour of
commits stays whole, and the takeover, with the workers' wait, grows with the run's age. The
brokers' coordinator topics have 1 MiB segments (deploy/kafka/server.properties).

The test commits ~17 MiB of offsets for one group, the same partition over and over, then reads
the group's ``__consumer_offsets`` partition from its start, as a new coordinator would, until
compaction has left less than 4 MiB of it (the open segment and the last commit of each key).
With 100 MiB segments all 17 MiB stay.
"""

from __future__ import annotations

import time
import uuid

import pytest

from pipeline.io import kafka_io

pytestmark = [pytest.mark.integration]

#: Kafka's ``offsets.topic.num.partitions`` on skewer's brokers.
OFFSETS_PARTITIONS = 8
#: Offset metadata per commit, under the broker's ``offset.metadata.max.bytes`` (4096).
METADATA_BYTES = 3_000
COMMITS = 6_000
#: Bytes of the partition a new coordinator may read once compaction ran: the open 1 MiB
#: segment, the other groups' last commits and a segment being cleaned.
AFTER_COMPACTION_BYTES = 4 * 2**20
#: The log cleaner looks for dirty logs every 15 s (``log.cleaner.backoff.ms``).
COMPACTION_WAIT_S = 300.0


def offsets_partition(group: str, partitions: int = OFFSETS_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition of ``group``: Kafka's
    ``Utils.abs(group.hashCode()) % partitions``, with Java's String.hashCode (an int).

    >>> offsets_partition("dbg-9531cd"), offsets_partition("dbg-24596e")  # read off a broker
    (1, 7)
    >>> offsets_partition("")
    0
    """
    code = 0
    for char in group:  # skewer's group names are ASCII: one UTF-16 unit per character
        code = (31 * code + ord(char)) & 0xFFFFFFFF
    signed = code - 2**32 if code >= 2**31 else code
    return (abs(signed) if signed != -(2**31) else 0) % partitions


#: How long a read of the offsets topic may get nothing before it fails.
READ_STALL_SECONDS = 120.0


def partition_bytes(kafka: str, partition: int) -> int:
    """Bytes of keys and values in ``__consumer_offsets`` partition ``partition``, read from its
    start to its end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"test-coordinator-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition("__consumer_offsets", partition, OFFSET_BEGINNING)])
        total = 0
        # A bound on a hang, not on speed: the read fails only if nothing comes for a while.
        read_last = time.monotonic()
        while time.monotonic() - read_last < READ_STALL_SECONDS:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                read_last = time.monotonic()
                error = message.error()
                if error is None:
                    total += len(message.key() or b"") + len(message.value() or b"")
                elif error.code() == KafkaError._PARTITION_EOF:
                    return total
        raise AssertionError(
            f"__consumer_offsets-{partition}: nothing read for {READ_STALL_SECONDS:.0f} s "
            f"before its end ({total:,} bytes read)"
        )
    finally:
        consumer.close()


def test_a_groups_offset_commits_are_compacted_to_a_small_log(kafka: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = f"test-coordinator-{uuid.uuid4().hex[:8]}"
    group = f"test-coordinator-{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topic(kafka, topic, 1)
    partition = offsets_partition(group)
    committer = Consumer(
        {"bootstrap.servers": kafka, "group.id": group, "enable.auto.commit": False}
    )
    try:
        metadata = "m" * METADATA_BYTES
        for offset in range(COMMITS):
            last = offset == COMMITS - 1 or offset % 500 == 499
            committer.commit(
                offsets=[TopicPartition(topic, 0, offset, metadata=metadata)],
                asynchronous=not last,
            )
        committed = committer.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed[0].offset == COMMITS - 1
        written = COMMITS * METADATA_BYTES
        deadline = time.monotonic() + COMPACTION_WAIT_S
        while (read := partition_bytes(kafka, partition)) > AFTER_COMPACTION_BYTES:
            assert time.monotonic() < deadline, (
                f"__consumer_offsets-{partition} still holds {read / 2**20:.1f} MiB of the "
                f"{written / 2**20:.1f} MiB committed {COMPACTION_WAIT_S:.0f} s ago: a new "
                "coordinator would read it all before it answers"
            )
            time.sleep(5)
    finally:
        committer.close()
        kafka_io.delete_topics(kafka, [topic])
