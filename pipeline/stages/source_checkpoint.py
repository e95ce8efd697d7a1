"""A grouping source's checkpoint: each batch one Kafka transaction holding the batch's output
and its consumed offset, aborted and read again when the broker refuses it, and the batch's
Redis counters, guarded so a batch replayed after a crash counts once.

Layer: stages.

The transactional id and the consumer group are ``skewer.{run}.{prefix}group.{s}``; the
committed offset's metadata carries the source's watermark and routing-table version
(:func:`offset_metadata`), so a restart resumes exactly where the committed output left it.
Design: docs/design.md#grouping-stage and docs/design.md#kafka-pitfalls.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.io import kafka_io
from pipeline.io.dead_letters import REASONS
from pipeline.io.grouping_store import GroupingStore, SourceBatchCounts
from pipeline.stages.input_formats import Letter, SourceWatermark, Watermark

#: Attempts of one batch whose transaction the broker aborts before the source gives up.
MAX_BATCH_ATTEMPTS = 3
#: How long ``send_offsets_to_transaction`` may block before the source counts as stuck.
#: librdkafka ignores that call's timeout (confluentinc/librdkafka#5456) and, once the group
#: coordinator's broker has left the cluster's metadata (killed, then fenced), may never look
#: for the new one (#5511). A failover that works is over once the controller fences the dead
#: broker: 7.5 s at most on skewer's cluster (a 6 s session timeout and a heartbeat), about
#: 15 s on Kafka's defaults, where a source may restart needlessly, which costs it a couple of
#: seconds. Meanwhile the source's open transaction holds back what the workers may read of
#: every ``work`` partition (they read committed records only), so the whole run waits on it
#: and its backlog grows.
STUCK_AFTER_SECONDS = 10.0
#: A stuck source's process exit code (EX_TEMPFAIL): the stage starts the source again.
EXIT_STUCK = 75


class StageError(Exception):
    """The stage cannot go on (fenced by a newer instance, fatal Kafka error): one line."""


@dataclass
class BatchOutput:
    """What one batch sends: routed records, dead letters and watermark markers."""

    #: Key, value and ``work`` partition of each routed record.
    keys: list[bytes | None]
    values: list[bytes]
    partitions: list[int]
    #: Per consumed record: -1 or its dead-letter reason; the rows that were routed.
    reasons: np.ndarray
    data_rows: np.ndarray
    dead_letters: list[Letter] = field(default_factory=list)
    #: Late records of a user topic: (original key, ``late`` value), and their rows.
    late: list[Letter] = field(default_factory=list)
    late_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Rows a query's WHERE left out (a user topic).
    filtered_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Values sent to every ``work`` partition after the records.
    markers: list[bytes] = field(default_factory=list)
    #: TABLE_SWITCH values sent to every ``work`` partition before the records.
    switch_markers: list[bytes] = field(default_factory=list)
    #: Records routed to each worker, and dead letters per reason (:data:`REASONS` order).
    routed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dead_letter_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    watermark_rows: int = 0


def offset_metadata(watermark: Watermark, table_version: int) -> str:
    """The committed offset's metadata: the watermark state and the routing-table version the
    source routes under from that offset on (:mod:`pipeline.stages.control_plane`)."""
    state = json.loads(watermark.to_metadata())
    if table_version:
        state["v"] = int(table_version)
    return json.dumps(state, separators=(",", ":"))


def parse_offset_metadata(
    text: str | None, fresh: Watermark | None = None
) -> tuple[Watermark, int]:
    """Inverse of :func:`offset_metadata` (no metadata: a fresh source on version 0);
    ``fresh`` is the kind of watermark the source keeps (default: its producers')."""
    version = int(json.loads(text).get("v", 0)) if text else 0
    return (fresh if fresh is not None else SourceWatermark()).restored(text), version


class StuckCallWatchdog:
    """Ends this process with :data:`EXIT_STUCK` when a guarded call blocks past ``after``
    seconds, saying which call on stderr. A source in a child process is then started again
    from Kafka's committed state (:func:`pipeline.stages.grouping.run_sources`), as after a
    kill -9; a stage of one source, which runs it in its own process, exits with that code for
    its supervisor.

    A thread, because the stuck call holds the main thread inside librdkafka and cannot be
    interrupted; a new process, because the stuck client cannot be closed either.

    >>> ended = []
    >>> watchdog = StuckCallWatchdog("source 0", after=0.05, end=ended.append)
    >>> with watchdog.guard("a quick call"):
    ...     pass
    >>> with watchdog.guard("a stuck call"):
    ...     time.sleep(0.3)
    >>> ended
    [75]
    """

    def __init__(
        self,
        who: str,
        after: float = STUCK_AFTER_SECONDS,
        end: Callable[[int], Any] = os._exit,
    ) -> None:
        self.who = who
        self.after = after
        self._end = end
        self._guarded: tuple[str, float] | None = None
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, call: str) -> Iterator[None]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="stuck-call", daemon=True)
            self._thread.start()
        self._guarded = (call, time.monotonic() + self.after)
        try:
            yield
        finally:
            self._guarded = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.5, self.after / 4))
            guarded = self._guarded
            if guarded is not None and time.monotonic() > guarded[1]:
                print(
                    f"skewer group: {self.who}: {guarded[0]} blocked for more than "
                    f"{self.after:g} s (librdkafka lost the coordinator): its process ends "
                    f"with exit code {EXIT_STUCK}, to start again from the committed offset",
                    file=sys.stderr,
                    flush=True,
                )
                self._end(EXIT_STUCK)
                return


@dataclass
class SourceCheckpoint:
    """Source ``source``'s Kafka clients and counters: its consumer of partition ``source`` of
    ``topic``, its transactional producer into the run's topics, and where it resumes."""

    bootstrap: str
    names: kafka_io.RunNames
    source: int
    topic: str
    n_workers: int
    store: GroupingStore
    consumer: Any = field(default=None, init=False)
    #: The offset after the last committed batch: where the source reads on.
    next_offset: int = field(default=0, init=False)
    _producer: Any = field(default=None, init=False)
    _group_metadata: Any = field(default=None, init=False)
    _start_offset: int = field(default=-1, init=False)
    _counted_offset: int = field(default=-1, init=False)
    _failed_at: int = field(default=-1, init=False)
    _failures: int = field(default=0, init=False)
    _watchdog: StuckCallWatchdog = field(init=False)
    #: Seconds :meth:`open` spent fencing predecessors and reading the committed offset.
    open_seconds: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._watchdog = StuckCallWatchdog(f"source {self.source}")

    def open(self) -> str | None:
        """Fence predecessors (and abort the transaction they left open), find the committed
        offset; its metadata (None before the first commit)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

        self._producer = Producer(
            kafka_io.transactional_producer_config(
                self.bootstrap, self.names.transactional_id(self.source)
            )
        )
        began = time.perf_counter()
        self._producer.init_transactions(60)
        fenced = time.perf_counter()
        self.consumer = Consumer(
            kafka_io.consumer_config(self.bootstrap, self.names.consumer_group(self.source))
        )
        committed = kafka_io.committed_offset(
            self.consumer, TopicPartition(self.topic, self.source), timeout=60
        )
        self.open_seconds = {
            "fencing its predecessor": fenced - began,
            "reading its committed offset": time.perf_counter() - fenced,
        }
        self._start_offset = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
        self.next_offset = max(committed.offset, 0)
        return committed.metadata

    def resume(self, started_ms: int) -> None:
        """Read on from the committed offset; say the source is ready at ``started_ms``."""
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(self.topic, self.source, self._start_offset)])
        # A manually assigned consumer's group metadata never changes (and costs a call).
        self._group_metadata = self.consumer.consumer_group_metadata()
        self._counted_offset = self.store.counted_offset(self.source)
        # The orchestrator starts the producers once every source is here: a backlog routed in
        # one burst would reach the controller as one round that averages the stream's drift.
        self.store.mark_started(self.source, started_ms)

    def consume(self, batch_size: int, timeout: float) -> list[Any]:
        """The next batch: up to ``batch_size`` records, waiting at most ``timeout`` s."""
        messages = self.consumer.consume(num_messages=batch_size, timeout=timeout)
        return [m for m in messages if m.error() is None]

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        self._producer = None

    def commit(
        self,
        output: BatchOutput,
        messages: list[Any],
        watermark: Watermark,
        table_version: int,
        *,
        offsets: bool = True,
    ) -> bool:
        """Send ``output``, count it and commit the batch's offset in one transaction; False
        if the broker aborted it (nothing of it is visible: the batch is read again). Without
        ``offsets`` (markers alone, no batch) the committed offset stays as it is."""
        from confluent_kafka import KafkaException

        # No messages: an idle source's transaction of markers alone.
        first = messages[0].offset() if messages else -1
        last = messages[-1].offset() if messages else self.next_offset - 1
        producer = self._producer
        try:
            producer.begin_transaction()
            self._send(output)
            if messages:
                self._count(output, messages, first, last)
            if offsets:
                self._send_offsets(last + 1, watermark, table_version)
            kafka_io.commit_transaction(producer, attempts=11)
        except KafkaException as exception:
            self._abort(exception.args[0], first, bool(messages))
            return False
        self._failures = 0
        self.next_offset = last + 1
        return True

    def _send_offsets(self, offset: int, watermark: Watermark, table_version: int) -> None:
        """Commit ``offset``, with the watermark state and table version as its metadata, in
        the open transaction."""
        from confluent_kafka import TopicPartition

        metadata = offset_metadata(watermark, table_version)
        with self._watchdog.guard("send_offsets_to_transaction"):
            self._producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, self.source, offset, metadata=metadata)],
                self._group_metadata,
            )

    def _abort(self, error: Any, first: int, read_again: bool) -> None:
        """Abort an abortable transaction and seek back to its first offset; a fatal error,
        or a batch that fails again and again (a record the broker refuses), stops the source
        rather than loop: its offset stays uncommitted, nothing is lost."""
        from confluent_kafka import TopicPartition

        if error.fatal() or not error.txn_requires_abort():
            raise StageError(
                f"source {self.source}: {error.str()} (fenced by a newer instance?)"
            ) from None
        self._producer.abort_transaction(60)
        self._failures = self._failures + 1 if self._failed_at == first else 1
        self._failed_at = first
        if self._failures >= MAX_BATCH_ATTEMPTS:
            raise StageError(
                f"source {self.source}: batch at offset {first} failed "
                f"{self._failures} times: {error.str()}"
            ) from None
        if read_again:
            self.consumer.seek(TopicPartition(self.topic, self.source, first))

    def _send(self, output: BatchOutput) -> None:
        produce = self._producer.produce
        work = self.names.work_topic
        for marker in output.switch_markers:
            for worker in range(self.n_workers):
                self._produce_blocking(work, marker, None, worker)
        for key, value, worker in zip(output.keys, output.values, output.partitions, strict=True):
            try:
                produce(work, value, key, worker)
            except BufferError:
                self._produce_blocking(work, value, key, worker)
        for key, value in output.dead_letters:
            self._produce_blocking(self.names.dead_letters_topic, value, key, 0)
        for key, value in output.late:
            self._produce_blocking(self.names.late_topic, value, key, 0)
        for marker in output.markers:
            for worker in range(self.n_workers):
                self._produce_blocking(work, marker, None, worker)

    def _produce_blocking(
        self, topic: str, value: bytes, key: bytes | None, partition: int
    ) -> None:
        kafka_io.produce_blocking(self._producer, topic, value, key, partition)

    def _count(self, output: BatchOutput, messages: list[Any], first: int, last: int) -> None:
        """Add this batch's counts to Redis, skipping records counted before a crash."""
        n = len(messages)
        if first > self._counted_offset:  # the usual batch: nothing counted yet
            fresh = np.ones(n, dtype=bool)
        else:  # a batch replayed after a crash
            offsets = np.fromiter((m.offset() for m in messages), dtype=np.int64, count=n)
            fresh = offsets > self._counted_offset
        routed, bad_counts = output.routed, output.dead_letter_counts
        late = int(fresh[output.late_rows].sum())
        filtered = int(fresh[output.filtered_rows].sum())
        if not fresh.any():
            return
        if not fresh.all():
            fresh_data = fresh[output.data_rows]
            routed = np.bincount(
                np.asarray(output.partitions, dtype=np.int64)[fresh_data],
                minlength=self.n_workers,
            )
            fresh_reasons = output.reasons[fresh]
            bad_counts = np.bincount(fresh_reasons[fresh_reasons >= 0], minlength=len(REASONS))
            data_count = int(fresh_data.sum())
        else:
            data_count = int(output.data_rows.shape[0])
        counts = SourceBatchCounts(
            records=int(fresh.sum()),
            data=data_count,
            offset=last,
            routed=routed.tolist(),
            dead_letters=dict(zip(REASONS, bad_counts.tolist(), strict=True)),
            late=late,
            filtered=filtered,
        )
        self.store.count_batch(self.source, counts)
        self._counted_offset = last
