"""A user's topic and the grouping stage alone: an idle partition stops holding windows open,
and a bounded run over records deleted before it read them ends.

The stage reads a topic keyed and timed by Kafka (:func:`kafka_keyed_stage`), records out of
order by up to 1 s; the tests drive its sources directly, without workers.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from pipeline.io import config, kafka_io
from pipeline.io.redis_layout import RunKeys
from pipeline.runs.plan import new_run_id

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: An hour ago, on a minute's boundary: brokers refuse Kafka timestamps more than an hour ahead,
#: and a day-old stream would be deleted by the broker's retention while the stage read it.
START_MS = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000


# --- the grouping stage alone, on a topic keyed and timed by Kafka ------------------------------


def kafka_keyed_stage(
    settings: config.Settings,
    topic: str,
    tag: str,
    sources: int,
    *,
    idle_timeout_ms: int = 0,
    until_end: bool = False,
) -> Any:
    """A pkg grouping stage of W = 2 over ``topic``, keyed by the Kafka key and timed by the
    Kafka timestamp, records out of order by up to 1 s; its run's topics are created."""
    from pipeline.io import extractors
    from pipeline.stages import grouping
    from pipeline.stages.user_topic import UserTopic

    run = f"{tag}-{new_run_id()[5:]}"
    stage = grouping.StageConfig(
        bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        names=kafka_io.RunNames(run, f"{run}-"),
        scheme="pkg",
        n_workers=2,
        n_sources=sources,
        until_end=until_end,
        input=UserTopic(
            topic=topic,
            extractor=extractors.Extractor(
                key=extractors.parse_key("kafka-key"),
                time=extractors.parse_time("kafka-timestamp"),
            ),
            max_out_of_order_ms=1_000,
            idle_timeout_ms=idle_timeout_ms,
        ),
    )
    grouping.prepare(stage)
    return stage


def delete_run_topics(stage: Any) -> None:
    """Delete the topics ``kafka_keyed_stage`` created."""
    names = stage.names
    kafka_io.delete_topics(
        stage.bootstrap,
        [names.work_topic, names.dead_letters_topic, names.late_topic, names.results_topic],
    )


# --- an idle partition -------------------------------------------------------------------------


def test_an_idle_partition_stops_holding_windows_open(
    settings: config.Settings, redis: Any, create_topic: Any, topic_name: str
) -> None:
    """Partition 0 gets records, partition 1 none. After the idle timeout (1 s here) source 1
    adopts the watermark source 0 forwarded and forwards it too, so the workers' minimum over
    the sources moves on; a record partition 1 gets afterwards, older than that watermark, is
    late (the late topic), not lost."""
    from confluent_kafka import Producer

    from pipeline.io.records import Kind, decode_work
    from pipeline.stages import grouping

    topic = create_topic(topic_name, PARTITIONS)
    stage = kafka_keyed_stage(settings, topic, "idle", PARTITIONS, idle_timeout_ms=1_000)
    names = stage.names
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(300):  # 30 s of event time
        producer.produce(
            topic, b"v", f"k{i % 7}".encode(), partition=0, timestamp=START_MS + 100 * i
        )
    assert producer.flush(30) == 0
    stop = threading.Event()
    threads = [
        threading.Thread(target=grouping.run_source, args=(stage, s, stop.is_set), daemon=True)
        for s in range(PARTITIONS)
    ]
    for thread in threads:
        thread.start()
    forwarded = RunKeys(names.run_id).sources_watermark
    expected = START_MS + 100 * 299 - 1_000
    try:
        deadline = time.monotonic() + 60
        while redis.hget(forwarded, 1) is None:
            assert time.monotonic() < deadline, "the idle source never adopted a watermark"
            time.sleep(0.2)
        assert int(redis.hget(forwarded, 0)) == int(redis.hget(forwarded, 1)) == expected
        producer.produce(topic, b"v", b"old", partition=1, timestamp=START_MS)
        assert producer.flush(30) == 0
        while not redis.hget(RunKeys(names.run_id).stats("late_input"), 1):
            assert time.monotonic() < deadline, "the old record was not reported late"
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        work = kafka_io.read_topic(settings.kafka_bootstrap, names.work_topic)
        late = kafka_io.read_topic(settings.kafka_bootstrap, names.late_topic)
        delete_run_topics(stage)
    decoded, ok = decode_work([r.value for r in work])
    marks = ok & (decoded["kind"] == Kind.WATERMARK) & (decoded["source"] == 1)
    assert {int(t) for t in decoded["event_time_ms"][marks]} == {expected}
    assert {r.partition for r, m in zip(work, marks.tolist(), strict=True) if m} == {0, 1}
    assert [json.loads(r.value or b"{}")["partition"] for r in late] == [1]


# --- records deleted before they were read -----------------------------------------------------


def test_a_bounded_run_over_a_topic_emptied_by_deletion_ends(
    settings: config.Settings, create_topic: Any, topic_name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """The topic held 100 records, all deleted (delete-records here; in CI the broker's
    retention removed a stream timestamped a day back) before a bounded run began: its one
    source finds nothing to read, and must see that it stands at its end offset (the first
    offset left), forward END_OF_STREAM and end, not wait for records that no longer exist.
    Nothing is reported lost: the records were gone before the run began."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from pipeline.stages import grouping

    topic = create_topic(topic_name, 1)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(100):
        producer.produce(topic, b"v", f"k{i % 7}".encode(), partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    [deleted] = admin.delete_records([TopicPartition(topic, 0, 100)]).values()
    assert deleted.result(30).low_watermark == 100  # the partition's first offset now
    stage = kafka_keyed_stage(settings, topic, "gone", 1, until_end=True)
    deadline = time.monotonic() + 60
    try:
        summary = grouping.run_source(stage, 0, lambda: time.monotonic() > deadline)
    finally:
        delete_run_topics(stage)
    assert summary.ended, "the source did not reach its end offset"
    assert time.monotonic() < deadline
    assert summary.records == 0
    assert "deleted" not in capfd.readouterr().err
