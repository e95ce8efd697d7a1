"""A grouping source's input format: skewer's records or a user's topic, each consumed batch
turned into one :class:`DecodedBatch` (the keys to route, the dead letters, the late records).

Layer: stages.

:class:`SkewerRecords` validates topic ``keys`` (bad input becomes a dead letter with its
reason) and follows its producers' watermarks (:class:`SourceWatermark`);
:class:`UserTopicRecords` extracts key and time with the user's specs
(:mod:`pipeline.io.extractors`), sets late records aside and keeps the watermark of the data,
raised while the source is idle and closed at a bounded run's end offset. Design:
docs/design.md#grouping-stage and docs/design.md#watermarks-and-late-records.

Example (validation is pure and vectorized):
    >>> from pipeline.io.dead_letters import REASONS
    >>> from pipeline.io.records import encode_input
    >>> good = encode_input(np.array([5]), np.array([0]), np.array([0]))[0]
    >>> checked = validate([b"k", None, b"k"], [good, good, b"junk"])
    >>> checked.data.tolist()
    [0]
    >>> [REASONS[r] if r >= 0 else "ok" for r in checked.reasons]
    ['ok', 'no-key', 'undecodable-value']
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators.keys import KeyBatch
from pipeline.io import kafka_io, records
from pipeline.io.dead_letters import (
    KEY_TOO_LARGE,
    NO_KEY,
    UNDECODABLE,
    WRONG_KIND,
    dead_letter_value,
)
from pipeline.io.grouping_store import GroupingStore
from pipeline.io.query.predicate import kept
from pipeline.io.records import MAX_KEY_BYTES, Kind
from pipeline.stages import user_topic
from pipeline.stages.user_topic import DataWatermark, ForwardedWatermark, UserTopic

#: "No watermark yet" for a producer seen only through its DATA records.
NO_WATERMARK = int(np.iinfo(np.int64).min)
#: Seconds between two looks at the other sources' watermarks while a source is idle.
IDLE_CHECK_SECONDS = 1.0

#: A Kafka key and value to send to topic ``dead-letters`` or ``late``.
Letter = tuple[bytes | None, bytes]


@dataclass
class DecodedBatch:
    """One consumed batch as its input format read it: what to route, and what not."""

    #: The keys of the records to route, and their rows in the batch.
    keys: KeyBatch
    rows: np.ndarray
    #: The Kafka keys those records get in ``work``.
    kafka_keys: list[bytes | None]
    #: Their ``work`` values, given the routing-table version they are routed under.
    work_values: Callable[[int], list[bytes]]
    #: Per consumed record: -1 or its dead-letter reason (:mod:`pipeline.io.dead_letters`).
    reasons: np.ndarray
    dead_letters: list[Letter] = field(default_factory=list)
    #: Records of a user's topic that came after their window closed, and their rows.
    late: list[Letter] = field(default_factory=list)
    late_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Rows of valid records a query's WHERE left out (a user's topic).
    filtered_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Producer watermark records in the batch (skewer's records).
    watermark_rows: int = 0


# --- skewer's records ------------------------------------------------------------------------


@dataclass
class Validation:
    """One consumed batch, checked: decoded rows, the valid ones by kind, and bad-row reasons."""

    records: np.ndarray
    #: Row indices of valid DATA records and of valid WATERMARK records, in batch order.
    data: np.ndarray
    watermarks: np.ndarray
    #: Per row: -1 if valid, else an index into :data:`pipeline.io.dead_letters.REASONS`.
    reasons: np.ndarray
    key_lengths: np.ndarray

    @property
    def bad(self) -> np.ndarray:
        return np.flatnonzero(self.reasons >= 0)


def validate(keys: Sequence[bytes | None], values: Sequence[bytes | None]) -> Validation:
    """Decode and check a batch of ``keys``-topic records.

    The first failing check names the reason: undecodable value (length, magic, version), then
    wrong kind (TABLE_SWITCH or unknown), then (DATA only) no key, then key too large.
    WATERMARK records need no key.
    """
    decoded, ok = records.decode_input(values)
    n = len(values)
    try:  # map(len) runs in C; a missing key (None) makes it raise
        key_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)  # type: ignore[arg-type]
    except TypeError:
        key_lengths = np.fromiter(
            (len(k) if k is not None else -1 for k in keys), dtype=np.int64, count=n
        )
    # Rows that did not decode are zeroed, so their magic is wrong too.
    well_formed = (decoded["magic"] == records.MAGIC) & (decoded["version"] == records.VERSION)
    is_data = decoded["kind"] == Kind.DATA
    reasons = np.full(n, -1, dtype=np.int8)
    reasons[is_data & (key_lengths > MAX_KEY_BYTES)] = KEY_TOO_LARGE
    reasons[is_data & (key_lengths <= 0)] = NO_KEY
    reasons[well_formed & ~ok] = WRONG_KIND
    reasons[~well_formed] = UNDECODABLE
    valid = reasons < 0
    return Validation(
        records=decoded,
        data=np.flatnonzero(valid & is_data),
        watermarks=np.flatnonzero(valid & (decoded["kind"] == Kind.WATERMARK)),
        reasons=reasons,
        key_lengths=key_lengths,
    )


def work_values(input_values: Sequence[bytes], source: int, table_version: int) -> list[bytes]:
    """``work`` values of valid ``keys`` values: :func:`records.encode_work` of their rows.

    :data:`records.WORK_DTYPE` is :data:`records.INPUT_DTYPE` with ``source`` and
    ``table_version`` appended, so each work value is its input value's 24 bytes followed by
    one 12-byte suffix shared by the whole batch: one bytes concatenation per record instead
    of a structured-array round trip (tests/unit/test_records.py checks they are equal).
    """
    suffix = np.array([(source, table_version)], dtype="<u4,<u8").tobytes()
    return [value + suffix for value in input_values]


@dataclass
class SourceWatermark(ForwardedWatermark):
    """The watermark of one source: min over the producers it has seen of their latest one."""

    producers: dict[int, int] = field(default_factory=dict)
    forwarded: int = NO_WATERMARK

    def observe(
        self, data_producers: np.ndarray, wm_producers: np.ndarray, wm_times: np.ndarray
    ) -> None:
        """Learn the producers of a batch's DATA rows and its producers' WATERMARK rows."""
        if data_producers.shape[0]:
            low, high = int(data_producers.min()), int(data_producers.max())
            # one producer per partition is the usual case: no sort needed to find it
            seen = [low] if low == high else np.unique(data_producers).tolist()
            for p in seen:
                self.producers.setdefault(int(p), NO_WATERMARK)
        for p, t in zip(wm_producers.tolist(), wm_times.tolist(), strict=True):
            self.producers[int(p)] = max(self.producers.get(int(p), NO_WATERMARK), int(t))

    def current(self) -> int:
        return min(self.producers.values(), default=NO_WATERMARK)

    def to_metadata(self) -> str:
        return json.dumps({"p": self.producers, "f": self.forwarded}, separators=(",", ":"))

    @classmethod
    def from_metadata(cls, text: str | None) -> SourceWatermark:
        if not text:
            return cls()
        state = json.loads(text)
        return cls({int(p): int(t) for p, t in state["p"].items()}, int(state["f"]))

    def restored(self, text: str | None) -> SourceWatermark:
        """The state a committed offset's metadata holds (as :meth:`from_metadata`)."""
        return self.from_metadata(text)

    def copy(self) -> SourceWatermark:
        return SourceWatermark(dict(self.producers), self.forwarded)


#: The watermark a source keeps: its producers' or its data's.
Watermark = SourceWatermark | DataWatermark


class SkewerRecords:
    """Topic ``keys`` as skewer's producers write it: 24-byte headers, producer watermarks."""

    def __init__(self, source: int) -> None:
        self.source = source

    def fresh_watermark(self) -> Watermark:
        return SourceWatermark()

    def start(self, consumer: Any, watermark: Watermark) -> None:
        """Nothing to look up before the first batch."""

    def warm_up(self) -> None:
        """Load the validation's compiled kernels now, not in the first live batch."""
        validate([b"k"], records.encode_input(np.zeros(1), np.zeros(1), np.zeros(1)))

    def decode(self, messages: list[Any], watermark: Watermark) -> DecodedBatch:
        """Validate ``messages``; their producers' watermarks update ``watermark``."""
        assert isinstance(watermark, SourceWatermark)
        keys = [m.key() for m in messages]
        values = [m.value() for m in messages]
        checked = validate(keys, values)
        data = checked.data
        if data.shape[0] == len(messages):  # the usual batch: every record a valid DATA one
            data_keys, data_values = keys, values
            key_lengths = checked.key_lengths
        else:
            rows = data.tolist()
            data_keys = [keys[i] for i in rows]
            data_values = [values[i] for i in rows]
            key_lengths = checked.key_lengths[data]
        # KeyBatch.from_bytes would measure the keys again; validate already did.
        key_offsets = np.zeros(key_lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(key_lengths, out=key_offsets[1:])
        key_bytes = np.frombuffer(b"".join(data_keys), dtype=np.uint8).copy()  # type: ignore[arg-type]
        decoded = checked.records
        watermark.observe(
            decoded["producer"][data],
            decoded["producer"][checked.watermarks],
            decoded["event_time_ms"][checked.watermarks],
        )
        source = self.source
        batch = DecodedBatch(
            KeyBatch(key_bytes, key_offsets),
            data,
            data_keys,
            lambda version: work_values(data_values, source, version),  # type: ignore[arg-type]
            checked.reasons,
            watermark_rows=int(checked.watermarks.shape[0]),
        )
        for row in checked.bad.tolist():
            message = messages[row]
            value = dead_letter_value(
                int(checked.reasons[row]),
                int(checked.key_lengths[row]),
                values[row],
                message.topic(),
                message.partition(),
                message.offset(),
            )
            batch.dead_letters.append((keys[row], value))
        return batch

    def markers_due(
        self, watermark: Watermark, consumer: Any, next_offset: int, got_records: bool
    ) -> bool:
        """Producers send their own watermarks: no batch of markers alone."""
        return False

    def committed(self, before: Watermark, after: Watermark) -> None:
        """Nothing to tell the other sources."""


# --- a user's topic --------------------------------------------------------------------------


class UserTopicRecords:
    """A user's topic (:mod:`pipeline.stages.user_topic`): key and time from the records, the
    watermark from the data, late records aside; source ``source`` reads partition ``source``."""

    def __init__(
        self, spec: UserTopic, source: int, store: GroupingStore, *, until_end: bool
    ) -> None:
        self.spec = spec
        self.source = source
        self.store = store
        self.until_end = until_end
        # When the source last read a record (idle timeout), the watermark the others
        # forwarded that an idle source adopts, and whether it reached its end offset.
        self._last_record_at = time.monotonic()
        self._idle_checked = 0.0
        self._idle_floor = user_topic.NO_WATERMARK
        self._finish_pending = False
        # The input partition's first offset when the run began, and when the source last
        # asked for it (a bounded run that has read nothing yet: see _log_start).
        self._first_offset = 0
        self._log_start_checked = 0.0

    def fresh_watermark(self) -> Watermark:
        return DataWatermark(self.spec.max_out_of_order_ms)

    def start(self, consumer: Any, watermark: Watermark) -> None:
        """A bounded run's first start: note where it ends, the partition's end offset or the
        one ``--ending-offsets`` gives it."""
        from confluent_kafka import TopicPartition

        assert isinstance(watermark, DataWatermark)
        if self.until_end and watermark.end_offset < 0:
            self._first_offset, watermark.end_offset = kafka_io.watermark_offsets(
                consumer, TopicPartition(self.spec.topic, self.source), timeout=60
            )
            if self.spec.ending_offsets is not None:
                watermark.end_offset = self.spec.ending_offsets[self.source]

    def warm_up(self) -> None:
        """Load the extractor's compiled kernels now, not in the first live batch."""
        self.spec.extractor.extract([b"{}"], [b"k"], np.zeros(1, dtype=np.int64))

    def decode(self, messages: list[Any], watermark: Watermark) -> DecodedBatch:
        """Extract key and time, set late records aside; the records' times, the idle floor
        and a pending end update ``watermark``."""
        assert isinstance(watermark, DataWatermark)
        spec = self.spec
        if watermark.end_offset >= 0 and messages and messages[-1].offset() >= watermark.end_offset:
            # A bounded run routes nothing at or past its end (the topic may still be written).
            messages = [m for m in messages if m.offset() < watermark.end_offset]
        n = len(messages)
        if n:
            self._last_record_at = time.monotonic()
        keys = [m.key() for m in messages]
        values = [m.value() for m in messages]
        offsets = np.fromiter((m.offset() for m in messages), dtype=np.int64, count=n)
        if spec.extractor.time.source == "kafka-timestamp":
            # (type, ms); type 0 (no timestamp) comes with -1, which the extractor refuses
            stamps = np.fromiter((m.timestamp()[1] for m in messages), dtype=np.int64, count=n)
        else:
            stamps = np.zeros(n, dtype=np.int64)
        extracted = spec.extractor.extract(values, keys, stamps)
        reasons = extracted.reasons
        times = extracted.event_time_ms
        valid = reasons < 0
        # A record the WHERE leaves out still moves the watermark (it is the partition's
        # progress), but is neither routed nor late: no window would have held it.
        passed = valid if spec.where is None else valid & kept(spec.where, extracted.columns)
        late = user_topic.late_rows(times, passed, watermark, spec.window_ms, spec.lateness_ms)
        data = np.flatnonzero(passed & ~late)
        routed = extracted.keys.take(data)
        rows = data.tolist()
        source = self.source

        def wrapped(version: int) -> list[bytes]:
            headers = records.work_headers(times[data], source, offsets[data], source, version)
            return [header + (values[i] or b"") for header, i in zip(headers, rows, strict=True)]

        batch = DecodedBatch(routed, data, routed.to_list(), wrapped, reasons)
        batch.late_rows = np.flatnonzero(late)
        batch.filtered_rows = np.flatnonzero(valid & ~passed)
        for row in batch.late_rows.tolist():
            value = user_topic.late_value(
                event_time_ms=int(times[row]),
                window_ms=spec.window_ms,
                watermark=watermark.forwarded,
                key=extracted.keys[row],
                value=values[row],
                topic=spec.topic,
                partition=source,
                offset=int(offsets[row]),
            )
            batch.late.append((keys[row], value))
        for row in np.flatnonzero(~valid).tolist():
            reason = int(reasons[row])
            value = dead_letter_value(
                reason,
                len(extracted.keys[row]),
                values[row],
                spec.topic,
                source,
                int(offsets[row]),
                detail=spec.extractor.detail(reason),
            )
            batch.dead_letters.append((keys[row], value))
        watermark.observe(times[np.flatnonzero(valid & ~late)])
        watermark.raise_to(self._idle_floor)
        if self._finish_pending:
            watermark.finish()
        return batch

    def markers_due(
        self, watermark: Watermark, consumer: Any, next_offset: int, got_records: bool
    ) -> bool:
        """Whether a batch of markers alone is due: END_OF_STREAM at a bounded run's end
        offset, or an idle source's watermark raised to the highest the others forwarded."""
        from confluent_kafka import TopicPartition

        assert isinstance(watermark, DataWatermark)
        if watermark.ended:
            return False
        if watermark.end_offset >= 0:
            tp = TopicPartition(self.spec.topic, self.source)
            # librdkafka's position moves past transaction markers; before the first fetch it
            # is invalid (< 0), and then what was committed is where the source stands.
            position = max(consumer.position([tp])[0].offset, next_offset)
            if position < watermark.end_offset and not got_records:
                position = max(position, self._log_start(consumer, tp, next_offset))
            if position >= watermark.end_offset:
                self._finish_pending = True
                return True
        idle_ms = self.spec.idle_timeout_ms
        now = time.monotonic()
        if got_records or not idle_ms or (now - self._last_record_at) * 1000 < idle_ms:
            return False
        if now - self._idle_checked < IDLE_CHECK_SECONDS:
            return False
        self._idle_checked = now
        others = [mark for s, mark in self.store.source_watermarks().items() if s != self.source]
        floor = max(others, default=user_topic.NO_WATERMARK)
        if floor > watermark.forwarded:
            self._idle_floor = floor
            return True
        return False

    def _log_start(self, consumer: Any, tp: Any, next_offset: int) -> int:
        """The input partition's first offset, asked at most once per IDLE_CHECK_SECONDS while
        the source reads nothing (else -1). Records below it are gone: the topic's retention
        (or a delete-records call) removed them, and librdkafka moves on to the first one left
        without a word, so a bounded run that had read none of them would wait for its end
        offset forever. Offsets removed since the run began, before the source read them, are
        said on standard error: those records are lost to the run."""
        now = time.monotonic()
        if now - self._log_start_checked < IDLE_CHECK_SECONDS:
            return -1
        self._log_start_checked = now
        first = kafka_io.watermark_offsets(consumer, tp, timeout=30)[0]
        unread = max(next_offset, self._first_offset)
        if first > unread:
            print(
                f"skewer group: source {self.source}: offsets {unread}..{first - 1} of "
                f"{tp.topic} were deleted (the topic's retention, or delete-records) before "
                f"they were read: those records are lost to this run, which goes on at {first}",
                file=sys.stderr,
                flush=True,
            )
            self._first_offset = first
        return first

    def committed(self, before: Watermark, after: Watermark) -> None:
        """Keep a forwarded watermark where an idle source adopts it (a hint only: each
        source's own lateness rule holds)."""
        if after.forwarded > before.forwarded:
            self.store.forward_watermark(self.source, after.forwarded)


#: What a source's loop reads its input with.
InputFormat = SkewerRecords | UserTopicRecords
