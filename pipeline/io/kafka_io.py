"""Kafka plumbing of the live pipeline: names of a run, its topics, client configurations.

Layer: io.

One *run* (``--run-id``) owns the topics ``keys`` (unless it reads a user's topic), ``work``,
``dead-letters``, ``late`` and ``results``, named with an optional ``--topic-prefix`` so runs
and tests sit side by side; :class:`RunNames` spells them (its Redis keys:
:mod:`pipeline.io.redis_layout`). Every stage builds its clients here, with the environment's
security settings (:mod:`pipeline.io.kafka_security`): an idempotent producer, a
transactional one per grouping source and one for the aggregator, ``read_committed`` consumers
with manual assignment. Topics are created with their partition count, which is part of the
routing. Why each setting: docs/design.md#kafka-pitfalls.

Long because each answer of a broker that needs care (a leader moving, a transaction to commit
again, offsets not yet known) is handled here once, for every stage.

Example:
    >>> names = RunNames(run_id="r1", topic_prefix="t-")
    >>> names.keys_topic, names.work_topic, names.dead_letters_topic, names.late_topic
    ('t-keys', 't-work', 't-dead-letters', 't-late')
    >>> transactional_producer_config("h:1", "skewer.r1.t-group.0")["transactional.id"]
    'skewer.r1.t-group.0'
    >>> consumer_config("h:1", "g")["isolation.level"]
    'read_committed'
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.io import kafka_security, probes, records
from pipeline.io.config import ENV_KAFKA_REPLICATION
from pipeline.io.errors import KafkaIOError, ServiceUnavailableError
from pipeline.io.redis_layout import run_prefix

#: ``max.message.bytes`` of the ``keys`` and ``dead-letters`` topics (and the producers'
#: ``message.max.bytes``): room for a key somewhat over :data:`records.MAX_KEY_BYTES`, so an
#: oversized key reaches the grouping stage and is dead-lettered with its reason (and kept,
#: whole, as the dead letter's key) instead of being refused by the broker with a generic error.
LARGE_MESSAGE_BYTES = 4 * records.MAX_KEY_BYTES


@dataclass(frozen=True)
class RunNames:
    """Topic names and Redis keys of one run."""

    run_id: str = "default"
    topic_prefix: str = ""

    @property
    def keys_topic(self) -> str:
        return f"{self.topic_prefix}keys"

    @property
    def work_topic(self) -> str:
        return f"{self.topic_prefix}work"

    @property
    def results_topic(self) -> str:
        return f"{self.topic_prefix}results"

    @property
    def dead_letters_topic(self) -> str:
        return f"{self.topic_prefix}dead-letters"

    @property
    def late_topic(self) -> str:
        """Records of a user's topic that came after their window closed, with the reason."""
        return f"{self.topic_prefix}late"

    @property
    def redis_prefix(self) -> str:
        """The prefix of the run's Redis keys (:mod:`pipeline.io.redis_layout`)."""
        return run_prefix(self.run_id)

    @property
    def work_query(self) -> str:
        """The name of the workers' Spark application and of their streaming query."""
        return f"skewer-work-{self.run_id}"

    def transactional_id(self, source: int) -> str:
        """One per grouping source: a restarted source fences its predecessor by this id."""
        return f"skewer.{self.run_id}.{self.topic_prefix}group.{source}"

    @property
    def aggregate_transactional_id(self) -> str:
        """The aggregator's: a restarted aggregator fences its predecessor by this id."""
        return f"skewer.{self.run_id}.{self.topic_prefix}aggregate"

    def consumer_group(self, source: int) -> str:
        """One group per source: its committed offset of ``keys`` partition ``source``."""
        return f"skewer.{self.run_id}.{self.topic_prefix}group.{source}"


#: How long a producer holds a record for more to join its batch (Kafka's ``linger.ms``; ``skewer
#: produce --linger-ms``): well within a micro-batch's cycle, and fewer, fuller requests.
LINGER_MS = 10
#: A real-time run's producers send a record at once: its wait for a batch would be part of a
#: latency measured in milliseconds.
REAL_TIME_LINGER_MS = 1


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """An idempotent producer: exactly once per partition across retries, order kept."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": LINGER_MS,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "message.max.bytes": LARGE_MESSAGE_BYTES + 65_536,
        "log_level": 3,
        **kafka_security.from_environ().client_config(),
    }
    config.update(overrides)
    return config


#: The grouping stage's transaction cadence in ms (``skewer group --commit-interval-ms``): the
#: longest a source waits for a batch to fill up. While fewer than a batch's worth of records
#: arrive per interval, a source commits a transaction about this often, so a ``work`` record
#: waits about this long before read_committed readers see it; a shorter interval commits more,
#: smaller transactions (bench/results/grouping_stage.md measures the cost).
COMMIT_INTERVAL_MS = 100


def transactional_producer_config(
    bootstrap: str, transactional_id: str, **overrides: Any
) -> dict[str, Any]:
    """An idempotent producer whose writes (and consumed offsets) commit atomically."""
    config = producer_config(bootstrap, **{"transactional.id": transactional_id})
    # A transaction spans one consumed batch; a source that dies with one open has it aborted
    # when it (or its successor) calls init_transactions, or by the broker after this timeout.
    config["transaction.timeout.ms"] = 60_000
    config.update(overrides)
    return config


#: How much a consumer fetches ahead of what it was asked for. With larger bounds (200,000
#: records, librdkafka's 64 MiB queue, 8 MiB per fetch) a consumer that falls behind, as a
#: grouping source does while a broker is down, holds some 100 MiB more until the backlog is
#: read, which the process keeps as its high-water mark after (glibc rarely returns freed
#: heap). These hold it to about 30 MiB, still two and a half of a source's batches ahead
#: (tests/integration/test_consumer_prefetch.py).
PREFETCH: dict[str, int] = {
    "queued.min.messages": 50_000,
    "queued.max.messages.kbytes": 8 << 10,
    "max.partition.fetch.bytes": 2 << 20,
}


def consumer_config(bootstrap: str, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer for manual assignment whose offsets are committed only by transactions."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "fetch.wait.max.ms": 50,
        **PREFETCH,
        # librdkafka pauses fetching this long once its local queue is full (default 1 s):
        # with batch consumption that is a stall every time the queue refills.
        "fetch.queue.backoff.ms": 10,
        "log_level": 3,
        **kafka_security.from_environ().client_config(),
    }
    config.update(overrides)
    return config


def produce_blocking(
    producer: Any, topic: str, value: bytes, key: bytes | None, partition: int
) -> None:
    """``producer.produce``, waiting (and serving delivery reports) while librdkafka's local
    queue is full, instead of raising ``BufferError``. Hot loops call ``produce`` directly and
    come here only on ``BufferError``."""
    while True:
        try:
            producer.produce(topic, value, key, partition)
            return
        except BufferError:
            producer.poll(0.05)


def commit_transaction(producer: Any, attempts: int = 10) -> None:
    """``producer.commit_transaction``, asked again while the broker answers with a retriable
    error (a coordinator moving): the transaction stays open until it commits or fails."""
    from confluent_kafka import KafkaException

    for _attempt in range(attempts - 1):
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as exception:
            if not exception.args[0].retriable():
                raise
    producer.commit_transaction(60)


def require_kafka(bootstrap: str, timeout: float = 5.0) -> None:
    """:class:`ServiceUnavailableError` with one line unless a broker answers at ``bootstrap``;
    through the environment's SASL or TLS settings, it says which protocol and why not."""
    refusal = probes.kafka_refusal(bootstrap, timeout=timeout)
    if refusal is None:
        return
    security = kafka_security.from_environ()
    if not security.plaintext:
        refusal = f"over {security.protocol}: {refusal}"
    elif refusal == probes.CONNECTION_REFUSED:
        refusal = "(start it: skewer services up)"
    else:  # something takes connections, but does not answer as a plaintext broker
        refusal = (
            f"over PLAINTEXT ({refusal}); if it asks for TLS or a login, set "
            f"{kafka_security.ENV_SECURITY_PROTOCOL}"
        )
    raise ServiceUnavailableError(f"kafka does not answer at {bootstrap} {refusal}")


#: What a group coordinator answers while it is elected or loads its offsets, e.g. on a fresh
#: broker, where the first request creates ``__consumer_offsets``: the same request shortly after
#: succeeds (librdkafka does not flag these as retriable on ``committed()``).
COORDINATOR_NOT_READY = (
    "NOT_COORDINATOR",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
)


def committed_offset(consumer: Any, partition: Any, timeout: float = 60.0) -> Any:
    """``consumer.committed([partition])[0]``, asked again while the coordinator is not ready
    (:data:`COORDINATOR_NOT_READY`) until ``timeout``; any other error is raised at once."""
    return _asked_until_answered(
        lambda left: consumer.committed([partition], timeout=left)[0],
        COORDINATOR_NOT_READY,
        timeout,
    )


#: What a broker answers about a partition whose leader is moving (a broker of a cluster died
#: or came back): the new leader answers the same request shortly after (a new leader answers
#: OFFSET_NOT_AVAILABLE until its high watermark has caught up, KIP-207). The client's own: its
#: metadata can lack the partition, name the dead leader, which never answers, or the ask was on
#: the dead leader's dropped connection (docs/design.md#spark-pitfalls); it does not ask again by
#: itself: each retry asks for the topic's metadata (callers know the topic exists).
LEADER_MOVING = (
    *("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "FENCED_LEADER_EPOCH"),
    "OFFSET_NOT_AVAILABLE",
    *("UNKNOWN_LEADER_EPOCH", "_TRANSPORT", "_UNKNOWN_PARTITION", "_TIMED_OUT", "_DESTROY_BROKER"),
)
#: The longest one ask for offsets waits, so that a dead leader's silence costs one slice.
OFFSETS_ASK_SECONDS = 5.0


def watermark_offsets(
    consumer: Any, partition: Any, timeout: float = 30.0, *, cached: bool = False
) -> tuple[int, int]:
    """``consumer.get_watermark_offsets(partition)`` (low, high), asked in slices of
    :data:`OFFSETS_ASK_SECONDS` while its leader moves (:data:`LEADER_MOVING`) until ``timeout``."""
    return _asked_until_answered(
        lambda left: consumer.get_watermark_offsets(
            partition, timeout=min(left, OFFSETS_ASK_SECONDS), cached=cached
        ),
        LEADER_MOVING,
        timeout,
        before_retry=lambda: consumer.list_topics(partition.topic, timeout=5),
    )


def _asked_until_answered(
    ask: Any,
    passing: Sequence[str],
    timeout: float,
    before_retry: Callable[[], Any] | None = None,
) -> Any:
    """``ask(seconds left)``, again after an error named in ``passing`` until ``timeout``
    (``before_retry()`` first, its own errors ignored: the next ask says what is wrong)."""
    from confluent_kafka import KafkaError, KafkaException

    passing_codes = {getattr(KafkaError, name) for name in passing}
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask(max(deadline - time.monotonic(), 1.0))
        except KafkaException as error:
            if error.args[0].code() not in passing_codes or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
            if before_retry is not None:
                with contextlib.suppress(KafkaException):
                    before_retry()


def topic_partitions(bootstrap: str, name: str, timeout: float = 10.0) -> int | None:
    """Partition count of topic ``name``, or None if it does not exist."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_security.admin_config(bootstrap))
    topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
    if topic is None or topic.error is not None:
        return None
    return len(topic.partitions)


def topic_records(bootstrap: str, name: str, timeout: float = 10.0) -> list[int] | None:
    """Records each partition of ``name`` holds now (high minus low watermark offset), None
    if there is no such topic."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    partitions = topic_partitions(bootstrap, name, timeout)
    if partitions is None:
        return None
    consumer = Consumer(consumer_config(bootstrap, f"skewer-sizer-{uuid.uuid4().hex}"))
    try:
        marks = [
            watermark_offsets(consumer, TopicPartition(name, p), timeout) for p in range(partitions)
        ]
    finally:
        consumer.close()
    return [high - low for low, high in marks]


#: The most replicas skewer gives a topic: a broker may fail while another is down for upkeep.
MAX_REPLICATION = 3


def topic_replication(brokers: int, requested: int | None = None) -> tuple[int, int]:
    """(replicas, ``min.insync.replicas``) of a topic created on a cluster of ``brokers``.

    ``requested`` None means min(3, brokers). A write (``acks=all``, as every producer here
    sends) then needs two replicas in sync once there are three, so a committed record or
    transaction survives the loss of any one broker, and one replica in sync below that (two
    replicas may still lose one broker without refusing writes). More replicas than brokers is
    a setting the cluster cannot meet: :class:`KafkaIOError`, one line.

    >>> topic_replication(1), topic_replication(2), topic_replication(3), topic_replication(5)
    ((1, 1), (2, 1), (3, 2), (3, 2))
    >>> try:
    ...     topic_replication(1, requested=3)
    ... except KafkaIOError as error:
    ...     print(error)
    kafka: replication 3 (SKEWER_KAFKA_REPLICATION) is more than the 1 broker(s) of the cluster
    """
    replicas = min(MAX_REPLICATION, brokers) if requested is None else requested
    if replicas > brokers:
        raise KafkaIOError(
            f"kafka: replication {replicas} ({ENV_KAFKA_REPLICATION}) is more than the "
            f"{brokers} broker(s) of the cluster"
        )
    return replicas, 2 if replicas >= 3 else 1


def cluster_brokers(bootstrap: str, timeout: float = 10.0) -> int:
    """How many brokers the cluster at ``bootstrap`` has registered now."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_security.admin_config(bootstrap))
    return len(admin.list_topics(timeout=timeout).brokers)


def require_replication(bootstrap: str, requested: int | None) -> tuple[int, int]:
    """:func:`topic_replication` on the cluster at ``bootstrap`` as it is now: a stage's check
    at start, before it creates or writes anything."""
    return topic_replication(cluster_brokers(bootstrap), requested)


#: A topic to create: its name, partition count and topic configuration (None: the broker's).
TopicSpec = tuple[str, int, dict[str, str] | None]


def ensure_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
    *,
    replication: int | None = None,
) -> bool:
    """Create ``name`` with ``partitions`` partitions unless it exists; True if created
    (:func:`ensure_topics` for one topic)."""
    spec: TopicSpec = (name, partitions, config)
    return bool(ensure_topics(bootstrap, [spec], timeout, replication=replication))


def ensure_topics(
    bootstrap: str,
    topics: Sequence[TopicSpec],
    timeout: float = 30.0,
    *,
    replication: int | None = None,
) -> list[str]:
    """Create those of ``topics`` that do not exist, in one request; the names created.

    A new topic has :func:`topic_replication`'s replicas (``replication``: the setting, None
    for min(3, brokers)), and every partition of it has a leader before this returns, so
    anyone may produce at once. An existing topic must have exactly the partitions asked for
    (:class:`KafkaIOError` otherwise). Two processes creating the same topic at once both
    succeed. One admin client and one request for all: a run's five topics one after another
    cost several round trips and waits each, on the way to its first record.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_security.admin_config(bootstrap))

    def metadata(name: str) -> Any:
        topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
        return None if topic is None or topic.error is not None else topic

    counts = {name: metadata(name) for name, _, _ in topics}
    missing = [(name, n, config) for name, n, config in topics if counts[name] is None]
    created: list[str] = []
    if missing:
        replicas, min_insync = require_replication(bootstrap, replication)
        futures = admin.create_topics(
            [
                NewTopic(
                    name,
                    n,
                    replicas,
                    config={"min.insync.replicas": str(min_insync), **(config or {})},
                )
                for name, n, config in missing
            ],
            request_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
                created.append(name)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise KafkaIOError(f"kafka: cannot create topic {name!r}: {error}") from None
        deadline = time.monotonic() + timeout
        for name, _, _ in missing:
            while (
                (topic := metadata(name)) is None
                or not topic.partitions
                or any(p.leader < 0 for p in topic.partitions.values())
            ):
                if time.monotonic() > deadline:
                    raise KafkaIOError(
                        f"kafka: topic {name!r} has no leaders after {timeout:.0f} s"
                    )
                time.sleep(0.05)
            counts[name] = topic
    for name, n, _ in topics:
        existing = len(counts[name].partitions)
        if existing != n:
            raise KafkaIOError(
                f"topic {name!r} has {existing} partitions, but this run needs {n} "
                "(use another --topic-prefix or delete the topic)"
            )
    return created


def ensure_run_topics(
    bootstrap: str,
    names: RunNames,
    *,
    sources: int | None = None,
    workers: int | None = None,
    replication: int | None = None,
) -> None:
    """Create the run's topics that are missing, each with its partition count and size limit.

    ``keys`` has S partitions (``sources``), ``work`` W (``workers``); ``results``,
    ``dead-letters`` and ``late`` one. A topic whose count is not given is only created if its
    count is fixed (results, dead-letters, late). ``keys``, ``work``, ``dead-letters`` and
    ``late`` accept records up to :data:`LARGE_MESSAGE_BYTES`, so any key the stage accepts (up
    to MAX_KEY_BYTES) fits everywhere it goes. ``replication`` as for :func:`ensure_topic`.
    """
    large = {"max.message.bytes": str(LARGE_MESSAGE_BYTES)}
    counts = [
        (names.keys_topic, sources, large),
        (names.work_topic, workers, large),
        (names.dead_letters_topic, 1, large),
        (names.late_topic, 1, large),
        (names.results_topic, 1, None),
    ]
    ensure_topics(
        bootstrap,
        [
            (name, partitions, config)
            for name, partitions, config in counts
            if partitions is not None
        ],
        replication=replication,
    )


@dataclass(frozen=True)
class StoredRecord:
    """One record read back from a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    #: The Kafka timestamp (ms), -1 when the record has none.
    timestamp_ms: int = -1


def read_topic(
    bootstrap: str, topic: str, *, read_committed: bool = True, timeout: float = 60.0
) -> list[StoredRecord]:
    """Every record of ``topic`` up to its current end, in partition then offset order.

    With ``read_committed`` (the default) records of aborted transactions are skipped; the read
    ends when every partition's position reaches its high watermark (librdkafka's position
    moves past transaction markers), or raises :class:`KafkaIOError` after ``timeout``.
    """
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    count = topic_partitions(bootstrap, topic)
    if count is None:
        raise KafkaIOError(f"kafka: no topic {topic!r}")
    isolation = "read_committed" if read_committed else "read_uncommitted"
    consumer = Consumer(
        consumer_config(
            bootstrap, f"skewer-reader-{uuid.uuid4().hex}", **{"isolation.level": isolation}
        )
    )
    partitions = [TopicPartition(topic, p, 0) for p in range(count)]
    ends = [watermark_offsets(consumer, tp, timeout)[1] for tp in partitions]
    consumer.assign(partitions)
    out: list[StoredRecord] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            positions = consumer.position(partitions)
            if all(max(tp.offset, 0) >= end for tp, end in zip(positions, ends, strict=True)):
                break
            if time.monotonic() > deadline:
                raise KafkaIOError(f"kafka: reading {topic!r} did not finish in {timeout:.0f} s")
            for message in consumer.consume(num_messages=100_000, timeout=0.2):
                if message.error() is None:
                    out.append(
                        StoredRecord(
                            message.partition(),
                            message.offset(),
                            message.key(),
                            message.value(),
                            message.timestamp()[1],
                        )
                    )
    finally:
        consumer.close()
    out.sort(key=lambda record: (record.partition, record.offset))
    return out


def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete the topics that exist among ``names`` (tests and benchmarks clean up with it)."""
    from confluent_kafka.admin import AdminClient

    present = [name for name in names if topic_partitions(bootstrap, name) is not None]
    if not present:
        return
    admin = AdminClient(kafka_security.admin_config(bootstrap))
    for future in admin.delete_topics(present, request_timeout=timeout).values():
        future.result(timeout=timeout)


def first_timestamp(consumer: Any, partition: Any, timeout: float = 10.0) -> int | None:
    """The Kafka timestamp (ms) of the record at ``partition``'s offset, None if unreadable."""
    consumer.assign([partition])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return int(message.timestamp()[1])
    finally:
        consumer.unassign()
    return None


def last_timestamp(
    consumer: Any, topic: str, partition: int, end: int, timeout: float = 10.0
) -> int | None:
    """The latest Kafka timestamp (ms) among the last records before offset ``end``.

    Reads a few records back, not just ``end - 1``: in a transactional topic the last offsets
    are commit markers, which no consumer ever returns.
    """
    from confluent_kafka import TopicPartition

    if end <= 0:
        return None
    start = TopicPartition(topic, partition, max(0, end - 32))
    consumer.assign([start])
    latest = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                stamp = int(message.timestamp()[1])
                latest = stamp if latest is None else max(latest, stamp)
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                break
    finally:
        consumer.unassign()
    return latest
