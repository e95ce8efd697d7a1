"""A user's own topic as the grouping stage's input: keys and times from the records, a
watermark from the data, and late records kept rather than dropped.

Layer: stages.

``skewer group --input-topic T --key ... --time ...`` reads topic T as it is (JSON, CSV or plain
bytes; :mod:`pipeline.io.extractors`); source ``s`` reads partition ``s``. :class:`UserTopic`
is how a run reads it; :class:`DataWatermark` is the highest event time seen minus
``--max-out-of-order``; a record whose window closed at the watermark its source already
forwarded is late (:func:`late_rows`) and goes, whole, to topic ``late`` (:func:`late_value`).
Design: docs/design.md#watermarks-and-late-records.

Example (a source's watermark and which records are late):
    >>> import numpy as np
    >>> watermark = DataWatermark(bound_ms=5_000)
    >>> times = np.array([12_000, 31_000, 20_000, 5_000, 19_999, 25_000])
    >>> late_rows(times, np.ones(6, dtype=bool), watermark, window_ms=10_000,
    ...           lateness_ms=0).tolist()
    [False, False, False, True, True, False]
    >>> watermark.observe(times)
    >>> watermark.advance()
    26000
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.aggregates import StateField
from pipeline.io import extractors
from pipeline.io.extractors import Extractor
from pipeline.io.grouping_store import GroupingStore
from pipeline.io.kafka_io import RunNames
from pipeline.io.query.job import Column, Job, Predicate
from pipeline.io.query.parse import parse_query
from pipeline.io.query.predicate import columns_read
from pipeline.io.records import END_OF_STREAM, window_start

if TYPE_CHECKING:
    import redis

#: "No watermark yet": nothing seen and nothing forwarded.
NO_WATERMARK = int(np.iinfo(np.int64).min)
DEFAULT_MAX_OUT_OF_ORDER_MS = 5_000
DEFAULT_IDLE_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class UserTopic:
    """How the grouping stage reads a user's topic; picklable, like the stage's config."""

    topic: str
    extractor: Extractor
    max_out_of_order_ms: int = DEFAULT_MAX_OUT_OF_ORDER_MS
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    window_ms: int = 10_000
    lateness_ms: int = 0
    #: Where a bounded run ends, partition by partition (Spark's ``endingOffsets``): by
    #: default each partition's end offset when the run first starts; given, a topic still
    #: being written can be read to a known end.
    ending_offsets: tuple[int, ...] | None = None
    #: The run's query (``--query``), when it was given as one: its WHERE filters each batch.
    query: str | None = None

    @functools.cached_property
    def job(self) -> Job | None:
        """The run's query, parsed once; None for a run given by flags."""
        return None if not self.query else parse_query(self.query)

    @property
    def where(self) -> Predicate | None:
        """The query's ``WHERE``, None without one."""
        return None if self.job is None else self.job.where

    @functools.cached_property
    def state_fields(self) -> tuple[StateField, ...]:
        """What the workers keep per (window, key) besides the count: the query's state fields
        (:attr:`pipeline.io.query.job.Job.state_fields`), or ``--sum``'s one sum, ``sums``."""
        if self.job is not None:
            return self.job.state_fields
        if self.extractor.amount is not None:
            return (StateField("sums", "sum", None),)
        return ()

    def validate(self) -> None:
        """ValueError with one line for the user unless every setting makes sense."""
        if not self.topic:
            raise ValueError("--input-topic names no topic")
        if self.max_out_of_order_ms < 0:
            raise ValueError(f"--max-out-of-order must be >= 0, got {self.max_out_of_order_ms}")
        if self.idle_timeout_ms < 0:
            raise ValueError(f"--idle-timeout must be >= 0, got {self.idle_timeout_ms}")
        if self.window_ms < 1 or self.lateness_ms < 0:
            raise ValueError("--window-ms must be >= 1 and --lateness-ms >= 0")
        if self.ending_offsets is not None and min(self.ending_offsets, default=-1) < 0:
            raise ValueError(f"--ending-offsets must be >= 0, got {list(self.ending_offsets)}")


def describe(topic: UserTopic, names: RunNames) -> str:
    """JSON of how a run reads ``topic`` (kept in Redis as ``input``; :func:`restore`)."""
    spec = topic.extractor
    return json.dumps(
        {
            "topic": topic.topic,
            "topic_prefix": names.topic_prefix,
            "key": spec.key.text,
            "time": spec.time.text,
            "sum": spec.amount.text if spec.amount is not None else None,
            "max_out_of_order_ms": topic.max_out_of_order_ms,
            "idle_timeout_ms": topic.idle_timeout_ms,
            "window_ms": topic.window_ms,
            "lateness_ms": topic.lateness_ms,
            "ending_offsets": None if topic.ending_offsets is None else list(topic.ending_offsets),
            "query": topic.query,
        }
    )


def record(client: redis.Redis, topic: UserTopic, names: RunNames) -> None:
    """Keep in Redis (``input``) how the run reads ``topic``: the workers' ``--sum``,
    ``skewer work``'s source count and ``skewer verify --recount`` read it back
    (:func:`recorded`). The grouping stage records it before it routes anything."""
    GroupingStore(client, names.run_id).record_input(describe(topic, names))


def recorded(client: redis.Redis, run_id: str) -> tuple[UserTopic, str] | None:
    """How run ``run_id`` reads a user's topic, and its topic prefix, as :func:`record` kept
    it; None for a run on skewer's own producers (or before its grouping stage started)."""
    described = GroupingStore(client, run_id).recorded_input()
    return None if described is None else restore(described)


def restore(text: str | bytes) -> tuple[UserTopic, str]:
    """Inverse of :func:`describe`: the run's :class:`UserTopic` and its topic prefix."""
    state = json.loads(text)
    query = state.get("query")
    extractor = topic_extractor(state["key"], state["time"], state.get("sum"), query)
    topic = UserTopic(
        topic=state["topic"],
        extractor=extractor,
        max_out_of_order_ms=int(state["max_out_of_order_ms"]),
        idle_timeout_ms=int(state["idle_timeout_ms"]),
        window_ms=int(state["window_ms"]),
        lateness_ms=int(state["lateness_ms"]),
        ending_offsets=_offsets(state.get("ending_offsets")),
        query=query,
    )
    return topic, str(state["topic_prefix"])


def topic_extractor(key: str, time: str, amount: str | None, query: str | None) -> Extractor:
    """The extractor of a run on a user's topic: the key, time and amount specs, the columns
    ``query``'s WHERE reads, its grouping columns after the first and the columns its
    aggregates read (ValueError with one line for a bad spec or query)."""
    columns: tuple[Column, ...] = ()
    key_columns: tuple[Column, ...] = ()
    aggregated: tuple[Column, ...] = ()
    if query:
        job = parse_query(query)
        key_columns = tuple(job.column(name) for name in job.group_by[1:])
        if job.where is not None:
            read = columns_read(job.where)
            columns = tuple(c for c in job.columns if c.name in read)
        named = dict.fromkeys(f.column for f in job.state_fields)
        aggregated = tuple(job.column(name) for name in named if name is not None)
    return Extractor(
        key=extractors.parse_key(key),
        time=extractors.parse_time(time),
        amount=extractors.parse_amount(amount) if amount else None,
        columns=columns,
        key_columns=key_columns,
        aggregated=aggregated,
    )


def _offsets(listed: list[int] | None) -> tuple[int, ...] | None:
    return None if listed is None else tuple(int(offset) for offset in listed)


class ForwardedWatermark:
    """What a source's watermark does with its :meth:`current` value: forward it once it rose,
    and say when it forwarded END_OF_STREAM. Shared by this module's :class:`DataWatermark` and
    :class:`pipeline.stages.input_formats.SourceWatermark`; each declares ``forwarded``."""

    forwarded: int

    def current(self) -> int:
        raise NotImplementedError

    def advance(self) -> int | None:
        """The watermark to forward now (and remember as forwarded), or None if unchanged."""
        now = self.current()
        if now > self.forwarded:
            self.forwarded = now
            return now
        return None

    @property
    def ended(self) -> bool:
        return self.forwarded == END_OF_STREAM


@dataclass
class DataWatermark(ForwardedWatermark):
    """One source's watermark on a user's topic: highest event time seen minus a bound."""

    bound_ms: int
    max_event: int = NO_WATERMARK
    #: Raised to other sources' watermark while this source is idle.
    floor: int = NO_WATERMARK
    forwarded: int = NO_WATERMARK
    #: Bounded runs: the partition's end offset when the run began (-1: unbounded).
    end_offset: int = -1
    finished: bool = field(default=False)

    def observe(self, event_time_ms: np.ndarray) -> None:
        if event_time_ms.shape[0]:
            self.max_event = max(self.max_event, int(event_time_ms.max()))

    def raise_to(self, floor: int) -> None:
        self.floor = max(self.floor, int(floor))

    def finish(self) -> None:
        """The source read everything it will read: close every window."""
        self.finished = True

    def current(self) -> int:
        if self.finished:
            return int(END_OF_STREAM)
        seen = self.max_event - self.bound_ms if self.max_event != NO_WATERMARK else NO_WATERMARK
        return max(seen, self.floor)

    def to_metadata(self) -> str:
        state = {"m": self.max_event, "l": self.floor, "f": self.forwarded, "e": self.end_offset}
        return json.dumps(state, separators=(",", ":"))

    def restored(self, text: str | None) -> DataWatermark:
        """This (fresh) watermark with the state a committed offset's metadata holds."""
        if not text:
            return self.copy()
        state = json.loads(text)
        return replace(
            self,
            max_event=int(state["m"]),
            floor=int(state["l"]),
            forwarded=int(state["f"]),
            end_offset=int(state.get("e", -1)),
            finished=int(state["f"]) == END_OF_STREAM,
        )

    def copy(self) -> DataWatermark:
        return replace(self)


def late_rows(
    event_time_ms: np.ndarray,
    valid: np.ndarray,
    watermark: DataWatermark,
    window_ms: int,
    lateness_ms: int,
) -> np.ndarray:
    """Mask of the ``valid`` records that are late: each record's window closed at the
    source's watermark just before it.

    The aggregator closes window ``[start, start + L)`` once the workers' watermark reaches
    ``start + L - 1 + lateness`` (:func:`operators.windows.closable_windows`). The watermark
    before record i is the one the source forwarded (or adopted while idle), raised by the
    highest event time of the records before i minus the bound: record by record, as if a
    marker followed every record, so whether a record is late depends on the stream's order
    only, never on where a batch happened to end. It is never below what was forwarded, so a
    record that is not late reaches its worker before its window can close.
    """
    n = event_time_ms.shape[0]
    times = np.where(valid, event_time_ms, NO_WATERMARK).astype(np.int64)
    seen = np.maximum.accumulate(np.concatenate(([watermark.max_event], times[: n - 1])))
    bounded = np.where(seen == NO_WATERMARK, NO_WATERMARK, seen - watermark.bound_ms)
    before = np.maximum(bounded, max(watermark.forwarded, watermark.floor))
    closes = window_start(event_time_ms, window_ms) + (window_ms - 1 + lateness_ms)
    return valid & (before != NO_WATERMARK) & (closes <= before)


def late_value(
    *,
    event_time_ms: int,
    window_ms: int,
    watermark: int,
    key: bytes,
    value: bytes | None,
    topic: str,
    partition: int,
    offset: int,
) -> bytes:
    """The JSON value of a record in the ``late`` topic (its Kafka key is the original key)."""
    start = int(window_start(np.array([event_time_ms]), window_ms)[0])
    record: dict[str, Any] = {
        "reason": "late",
        "detail": (
            f"event time {event_time_ms} ms is in window [{start}, {start + window_ms}), "
            f"closed at watermark {watermark}"
        ),
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "event_time_ms": event_time_ms,
        "window": start,
        "watermark": watermark,
        "key_b64": base64.b64encode(key).decode("ascii"),
        "value_b64": base64.b64encode(value).decode("ascii") if value is not None else None,
    }
    return json.dumps(record).encode()
