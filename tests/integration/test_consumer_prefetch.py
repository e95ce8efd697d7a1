"""A consumer of skewer's fetches a bounded backlog ahead of what it was asked for.

A grouping source that falls behind (a broker was down, its transactions waited) has a
backlog to read, and librdkafka fetches ahead of each batch, as much as its bounds allow; the
process keeps that as its high-water mark after the backlog is gone. ``kafka_io.PREFETCH``
bounds it.

The test writes a backlog of 300,000 records, then a fresh process consumes one batch of
20,000 the way a source does, waits while librdkafka prefetches, and reports how much its
resident memory grew: at most 64 MiB (with 200,000 records and 8 MiB fetches, about 100 MiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from pipeline.io import kafka_io

pytestmark = [pytest.mark.integration]

RECORDS = 300_000
#: What the consumer's memory may grow by while it prefetches.
MAX_GROWTH_MIB = 64

#: Run in a fresh interpreter: its memory before and after one batch and a prefetch.
CONSUMER = """
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
from pipeline.io import kafka_io

def resident_mib():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024

bootstrap, topic = sys.argv[1], sys.argv[2]
consumer = Consumer(kafka_io.consumer_config(bootstrap, f"prefetch-{time.time_ns()}"))
consumer.assign([TopicPartition(topic, 0, 0)])
before = resident_mib()
batch = consumer.consume(num_messages=20_000, timeout=30)
got = len(batch)
del batch
time.sleep(4)  # librdkafka fetches ahead in its own threads
print(json.dumps({"got": got, "growth_mib": resident_mib() - before}))
consumer.close()
"""


@pytest.fixture
def backlog(kafka: str) -> Iterator[str]:
    topic = f"test-prefetch-{uuid.uuid4().hex[:8]}"
    kafka_io.ensure_topic(kafka, topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 50})
    value = os.urandom(30)
    for i in range(RECORDS):
        kafka_io.produce_blocking(producer, topic, value, b"key%d" % (i % 100_000), 0)
    producer.flush()
    yield topic
    kafka_io.delete_topics(kafka, [topic])


def test_a_consumer_behind_a_backlog_prefetches_a_bounded_amount(kafka: str, backlog: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CONSUMER, kafka, backlog],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["got"] == 20_000, report
    assert report["growth_mib"] <= MAX_GROWTH_MIB, (
        f"a consumer grew {report['growth_mib']:.0f} MiB prefetching a backlog "
        f"(at most {MAX_GROWTH_MIB})"
    )
