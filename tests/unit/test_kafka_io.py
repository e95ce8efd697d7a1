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
