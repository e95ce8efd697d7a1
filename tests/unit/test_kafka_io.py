"""Kafka client logic of pipeline/io/kafka_io.py that needs no broker."""

from __future__ import annotations

import pytest


class _Consumer:
    """Answers ``committed`` with the given errors first, then with an offset."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0

    def committed(self, partitions: list[object], timeout: float) -> list[object]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return [f"offset of {partitions[0]}"]


def test_committed_offset_waits_for_a_coordinator_that_is_not_ready() -> None:
    """A fresh broker answers NOT_COORDINATOR while it creates __consumer_offsets (seen in a
    fresh clone's CI run): the stage asks again instead of failing; other errors fail at once."""
    from confluent_kafka import KafkaError, KafkaException

    from pipeline.io.kafka_io import committed_offset

    consumer = _Consumer(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    assert committed_offset(consumer, "keys-0", timeout=10) == "offset of keys-0"
    assert consumer.calls == 3
    refused = _Consumer(KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        committed_offset(refused, "keys-0", timeout=10)
    assert refused.calls == 1
    stuck = _Consumer(*[KafkaError.NOT_COORDINATOR] * 100)
    with pytest.raises(KafkaException):
        committed_offset(stuck, "keys-0", timeout=0.5)
    assert 2 <= stuck.calls < 10


class _DeadLeaderConsumer:
    """Its metadata names a dead leader until it is asked for the topic's: an ask for offsets
    until then waits out its whole timeout and times out, as librdkafka's does."""

    def __init__(self) -> None:
        self.refreshed = False
        self.asks: list[float] = []

    def get_watermark_offsets(
        self, partition: object, timeout: float, cached: bool
    ) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        self.asks.append(timeout)
        if not self.refreshed:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return (0, 42)

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed = True


def test_offsets_are_asked_again_of_a_new_leader_when_the_first_ask_goes_unanswered() -> None:
    """An ask sent to a leader that died gets no answer: it gives up after a slice of the
    timeout, and the next one, after a metadata refresh, reaches the new leader."""
    from confluent_kafka import TopicPartition

    from pipeline.io.kafka_io import OFFSETS_ASK_SECONDS, watermark_offsets

    consumer = _DeadLeaderConsumer()
    assert watermark_offsets(consumer, TopicPartition("keys", 0), timeout=30) == (0, 42)
    assert len(consumer.asks) == 2
    assert all(ask <= OFFSETS_ASK_SECONDS for ask in consumer.asks)


@pytest.mark.parametrize("error", ["_DESTROY_BROKER", "OFFSET_NOT_AVAILABLE"])
def test_offsets_refused_while_a_leader_moves_are_asked_again(error: str) -> None:
    """Asks that fail at once while a leader moves, both seen under a leader's kill -9: one on
    the dead leader's connection as the client drops it (_DESTROY_BROKER), one to a new leader
    whose high watermark has not caught up yet (OFFSET_NOT_AVAILABLE). Asked again, the new
    leader answers."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from pipeline.io.kafka_io import watermark_offsets

    class Refused(_DeadLeaderConsumer):
        def get_watermark_offsets(
            self, partition: object, timeout: float, cached: bool
        ) -> tuple[int, int]:
            self.asks.append(timeout)
            if not self.refreshed:
                raise KafkaException(KafkaError(getattr(KafkaError, error)))
            return (0, 42)

    consumer = Refused()
    assert watermark_offsets(consumer, TopicPartition("keys", 0), timeout=30) == (0, 42)
    assert len(consumer.asks) == 2


def test_offsets_that_no_leader_answers_fail_at_the_timeout() -> None:
    from confluent_kafka import KafkaException, TopicPartition

    from pipeline.io.kafka_io import watermark_offsets

    class Unanswered(_DeadLeaderConsumer):
        def list_topics(self, topic: str, timeout: float) -> None:
            """The cluster has not elected a new leader yet."""

    consumer = Unanswered()
    with pytest.raises(KafkaException):
        watermark_offsets(consumer, TopicPartition("keys", 0), timeout=0.5)
    assert 1 <= len(consumer.asks) < 10
