"""The grouping stage: S sources route topic ``keys`` into topic ``work``, exactly once.

Layer: stages. One module of ~860 lines because it is one thing: a source's loop, its
exactly-once transaction and the pieces only it uses (validation and dead letters, the
source's watermark, the offset metadata it commits); each is a few small functions below.

Source ``s`` reads partition ``s`` of ``keys`` (written by producer ``s``) and owns one scheme
object, ``operators.registry.create(scheme, W, source=s, n_sources=S)`` -- the very object the
simulator drives (:class:`operators.simulator.Router` gives source ``s`` records ``s, s+S, ...``
of a stream; :mod:`producers.kafka_producer` writes exactly those to partition ``s``), so the
live routing of every record equals the simulator's. Per consumed batch, all vectorized:

1. :func:`validate` decodes the values in one ``np.frombuffer`` (:func:`records.decode_input`)
   and sorts out bad input: no key (None or empty, for DATA), a key over
   :data:`records.MAX_KEY_BYTES`, a value that does not decode (length, magic, version) and a
   wrong kind (TABLE_SWITCH or an unknown kind in ``keys``). Bad records go to
   ``dead-letters`` -- Kafka key = the original key, value = JSON with the reason, a detail,
   the source topic/partition/offset and the original value in base64 -- and are counted per
   reason; the batch's valid records are routed as usual.
2. The valid DATA keys become one :class:`~operators.keys.KeyBatch`, routed by one
   ``scheme.route`` call; their values are re-encoded as ``work`` values
   (:func:`records.encode_work`: source and routing-table version added).
3. The records go to partition ``w`` of ``work`` (partition = worker, passed explicitly); the
   only per-record Python is that ``produce`` call, as in a plain consume-and-produce loop.
4. Producer watermarks (INPUT records of kind WATERMARK) advance the source's watermark, the
   minimum over the producers the source has seen of their latest watermark; when it
   advances, one WATERMARK marker goes to every ``work`` partition after the batch's records,
   so "every DATA record of this source up to ``time_ms`` is before the marker" holds.
   END_OF_STREAM is forwarded the same way; with ``until_end`` the source then stops.

Exactly once from ``keys`` to ``work``: each batch is one Kafka transaction of a producer with
``transactional.id = skewer.{run}.{prefix}group.{s}`` holding the batch's ``work`` records,
dead letters and markers plus the consumed offset (``send_offsets_to_transaction``, consumer
group ``skewer.{run}.{prefix}group.{s}``); consumers downstream read with
``isolation.level=read_committed``. Either all of a batch's effects become visible, offset
included, or none do. Why transactions rather than, say, deduplicating by (producer, seq)
downstream: the guarantee then holds for every reader of ``work`` without state, marker
ordering is part of the same atomic write, and the broker does the fencing. What a restart
(after ``kill -9``) does:

- ``init_transactions`` with the same ``transactional.id`` fences the predecessor (a zombie
  that still runs gets ``ProducerFenced`` on its next call and exits) and aborts the
  transaction it left open: that batch's records are never visible to read_committed readers.
- The consumer resumes at the offset committed by the last committed transaction, so the
  aborted batch is read and routed again -- once.
- The watermark state travels in the same transaction, as the committed offset's metadata
  (per-producer watermarks and the last one forwarded), so it restarts exactly where the
  committed output left it; a source that had forwarded END_OF_STREAM knows it.
- The scheme's own state (PKG's local load estimates, sketches) restarts from zero. That is
  safe for correctness: every scheme routes each record to exactly one worker, and the
  aggregator merges a key's partial counts across all workers, so where a record lands
  changes balance, never the final counts. Key-grouping-like schemes (``key``,
  ``consistent``) are stateless and route identically after a restart; for the others the
  estimates re-converge within a few batches (PKG's local estimation needs no history to be
  within its bounds; PKG §III-B).

Counters go to Redis (``skewer:{run}:stats:*``) in one MULTI per batch, written before the
transaction commits and guarded by the last counted offset of the source, so a batch replayed
after a crash is not counted twice: ``stats:source:{s}`` (records, data, watermarks,
dead_letters, offset), ``stats:dead_letters`` (reason -> count), ``stats:routed`` (worker ->
records the stage routed there).

Several sources: :func:`run_sources` runs one source in the calling process and several as one
process each (``multiprocessing`` spawn; a child dies with its parent via ``PR_SET_PDEATHSIG``),
because sources share nothing and each is one core's worth of Python. ``skewer group --source
s`` runs one source alone, so sources can also be spread over machines.

Example (validation is pure and vectorized):
    >>> from pipeline.io.records import encode_input
    >>> import numpy as np
    >>> good = encode_input(np.array([5]), np.array([0]), np.array([0]))[0]
    >>> checked = validate([b"k", None, b"k"], [good, good, b"junk"])
    >>> checked.data.tolist()
    [0]
    >>> [REASONS[r] if r >= 0 else "ok" for r in checked.reasons]
    ['ok', 'no-key', 'undecodable-value']
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import registry
from operators.base import Scheme, SchemeError, TableScheme
from operators.keys import KeyBatch
from pipeline.io import kafka_io, records
from pipeline.io.extractors import REASONS as EXTRACTOR_REASONS
from pipeline.io.records import MAX_KEY_BYTES, Kind
from pipeline.services import process
from pipeline.stages import control_plane, user_topic
from pipeline.stages.user_topic import DataWatermark, ForwardedWatermark, UserTopic

if TYPE_CHECKING:
    import redis

    from pipeline.observe.grouping import GroupingMetrics

#: Reasons a record is dead-lettered; ``Validation.reasons`` holds indices into this tuple. The
#: last two are a user topic's (:mod:`pipeline.io.extractors`: no time, no numeric field).
REASONS = ("no-key", "key-too-large", "undecodable-value", "wrong-kind", "bad-time", "bad-amount")
NO_KEY, KEY_TOO_LARGE, UNDECODABLE, WRONG_KIND, BAD_TIME, BAD_AMOUNT = range(len(REASONS))
#: Seconds between two looks at the other sources' watermarks while a source is idle.
IDLE_CHECK_SECONDS = 1.0
#: "No watermark yet" for a producer seen only through its DATA records.
NO_WATERMARK = int(np.iinfo(np.int64).min)
DEFAULT_BATCH_SIZE = 20_000
#: Time bound of a batch: at low rates, a transaction commits at least this often, so a
#: ``work`` record waits at most this long before read_committed workers can see it.
MAX_BATCH_SECONDS = 0.1
#: Attempts of one batch whose transaction the broker aborts before the source gives up.
MAX_BATCH_ATTEMPTS = 3
#: How long ``send_offsets_to_transaction`` may block before the source counts as stuck.
#: librdkafka ignores that call's timeout (confluentinc/librdkafka#5456) and, once the group
#: coordinator's broker has left the cluster's metadata (killed, then fenced), may never look
#: for the new one (#5511); a failover that works takes a session timeout (6-20 s).
STUCK_AFTER_SECONDS = 30.0
#: A stuck source's process exit code (EX_TEMPFAIL): the stage starts the source again.
EXIT_STUCK = 75
#: Times the stage starts one stuck source again before it gives up.
MAX_SOURCE_RESTARTS = 3


# --- validation (pure) -----------------------------------------------------------------------


@dataclass
class Validation:
    """One consumed batch, checked: decoded rows, the valid ones by kind, and bad-row reasons."""

    records: np.ndarray
    #: Row indices of valid DATA records and of valid WATERMARK records, in batch order.
    data: np.ndarray
    watermarks: np.ndarray
    #: Per row: -1 if valid, else an index into :data:`REASONS`.
    reasons: np.ndarray
    key_lengths: np.ndarray

    @property
    def bad(self) -> np.ndarray:
        return np.flatnonzero(self.reasons >= 0)


def validate(keys: Sequence[bytes | None], values: Sequence[bytes | None]) -> Validation:
    """Decode and check a batch of ``keys``-topic records (see the module docstring, step 1).

    The first failing check names the reason: undecodable value, then wrong kind, then (DATA
    only) no key, then key too large. WATERMARK records need no key.
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
    of a structured-array round trip (half the cost; equality is tested).
    """
    suffix = np.array([(source, table_version)], dtype="<u4,<u8").tobytes()
    return [value + suffix for value in input_values]


def dead_letter_value(
    reason: int,
    key_length: int,
    value: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    detail: str | None = None,
) -> bytes:
    """The JSON value of a dead letter (its Kafka key is the original key); ``detail`` says
    what was wrong when the reason alone does not (a user topic's extractor)."""
    details = {
        NO_KEY: "a DATA record needs a key",
        KEY_TOO_LARGE: f"key of {key_length} bytes exceeds {MAX_KEY_BYTES}",
        UNDECODABLE: (
            f"value of {len(value)} bytes is not a {records.INPUT_DTYPE.itemsize}-byte "
            f"skewer v{records.VERSION} record"
            if value is not None
            else "no value"
        ),
        WRONG_KIND: "kind is not DATA or WATERMARK",
    }
    return json.dumps(
        {
            "reason": REASONS[reason],
            "detail": detail if detail is not None else details[reason],
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key_bytes": max(key_length, 0),
            "value_b64": base64.b64encode(value).decode("ascii") if value is not None else None,
        }
    ).encode()


# --- watermarks (pure) -----------------------------------------------------------------------


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

    def copy(self) -> SourceWatermark:
        return SourceWatermark(dict(self.producers), self.forwarded)


def offset_metadata(watermark: SourceWatermark | DataWatermark, table_version: int) -> str:
    """The committed offset's metadata: the watermark state and the routing-table version the
    source routes under from that offset on (:mod:`pipeline.stages.control_plane`)."""
    state = json.loads(watermark.to_metadata())
    if table_version:
        state["v"] = int(table_version)
    return json.dumps(state, separators=(",", ":"))


def parse_offset_metadata(
    text: str | None, fresh: SourceWatermark | DataWatermark | None = None
) -> tuple[SourceWatermark | DataWatermark, int]:
    """Inverse of :func:`offset_metadata` (no metadata: a fresh source on version 0);
    ``fresh`` is the kind of watermark the source keeps (default: its producers')."""
    version = int(json.loads(text).get("v", 0)) if text else 0
    if isinstance(fresh, DataWatermark):
        return fresh.restored(text), version
    return SourceWatermark.from_metadata(text), version


# --- one source ------------------------------------------------------------------------------


class StageError(Exception):
    """The stage cannot go on (fenced by a newer instance, fatal Kafka error): one line."""


@dataclass(frozen=True)
class StageConfig:
    """Everything a source needs; picklable, so a child process gets it whole."""

    bootstrap: str
    redis_url: str
    names: kafka_io.RunNames
    scheme: str
    n_workers: int
    n_sources: int
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    #: The longest a batch (one transaction) waits to fill up: a quiet stream still commits
    #: this often, and read_committed readers see nothing before a commit.
    poll_timeout: float = MAX_BATCH_SECONDS
    until_end: bool = False
    #: Seconds between two looks at the control plane (routing-table schemes only).
    control_poll: float = 0.1
    report_keys: int = control_plane.DEFAULT_REPORT_KEYS
    #: A user's own topic to read instead of ``keys`` (:mod:`pipeline.stages.user_topic`).
    input: UserTopic | None = None
    #: Replicas of the run's topics (None: min(3, brokers); kafka_io.topic_replication).
    replication: int | None = None

    @property
    def input_topic(self) -> str:
        return self.input.topic if self.input is not None else self.names.keys_topic


@dataclass
class SourceSummary:
    """What one source did in this process (records replayed after a restart included)."""

    source: int
    records: int = 0
    data: int = 0
    watermarks: int = 0
    dead_letters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    #: Records of a user topic that came after their window closed (topic ``late``).
    late: int = 0
    routed: list[int] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0
    ended: bool = False
    #: Times the stage started this source's process again (:class:`StuckCallWatchdog`); the
    #: counts above are then the last process's.
    restarts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    dead_letters: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    #: Late records of a user topic: (original key, ``late`` value), and their rows.
    late: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    late_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Values sent to every ``work`` partition after the records.
    markers: list[bytes] = field(default_factory=list)
    #: TABLE_SWITCH values sent to every ``work`` partition before the records.
    switch_markers: list[bytes] = field(default_factory=list)
    #: Records routed to each worker, and dead letters per reason (:data:`REASONS` order).
    routed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dead_letter_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    watermark_rows: int = 0


def create_scheme(config: StageConfig, source: int) -> Scheme:
    """Source ``source``'s scheme object; simulator-only schemes are refused."""
    if config.scheme in registry.SIMULATOR_ONLY:
        raise SchemeError(
            f"{config.scheme} reads global state no live source has; it runs only in the "
            f"simulator (skewer sim). Live schemes: "
            + ", ".join(n for n in registry.names() if n not in registry.SIMULATOR_ONLY)
        )
    return registry.create(
        config.scheme,
        config.n_workers,
        source=source,
        n_sources=config.n_sources,
        seed=config.seed,
        **config.params,
    )


class StuckCallWatchdog:
    """Ends this process with :data:`EXIT_STUCK` when a guarded call blocks past ``after``
    seconds, saying which call on stderr. A source in a child process is then started again
    from Kafka's committed state (:func:`run_sources`), as after a kill -9; a stage of one
    source, which runs it in its own process, exits with that code for its supervisor.

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


class GroupingSource:
    """Source ``source`` of the stage: consume, validate, route, produce, commit; see module."""

    def __init__(
        self,
        config: StageConfig,
        source: int,
        redis_client: redis.Redis,
        metrics: GroupingMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.source = int(source)
        self.redis = redis_client
        self.names = config.names
        self.scheme = create_scheme(config, source)
        self.summary = SourceSummary(self.source, routed=[0] * config.n_workers)
        self.watermark: SourceWatermark | DataWatermark = (
            SourceWatermark()
            if config.input is None
            else DataWatermark(config.input.max_out_of_order_ms)
        )
        # A user topic: when the source last read a record (idle timeout), the watermark the
        # others forwarded that an idle source adopts, and whether it reached its end offset.
        self._last_record_at = time.monotonic()
        self._idle_checked = 0.0
        self._idle_floor = user_topic.NO_WATERMARK
        self._finish_pending = False
        # The input partition's first offset when the run began, and when the source last
        # asked for it (a bounded run that has read nothing yet: see _user_topic_markers).
        self._first_offset = 0
        self._log_start_checked = 0.0
        self._counted_offset = -1
        self._failed_at = -1
        self._failures = 0
        self._consumer: Any = None
        self._producer: Any = None
        self._group_metadata: Any = None
        self._watchdog = StuckCallWatchdog(f"source {self.source}")
        # Routing-table schemes: the version of the last committed transaction (the scheme's
        # table may be newer: then the next transaction starts with TABLE_SWITCH markers).
        self.table_version = 0
        self.control = (
            control_plane.ControlPlane(redis_client, config.names.run_id)
            if isinstance(self.scheme, TableScheme)
            else None
        )
        self._next_offset = 0
        self._control_checked = 0.0
        self._reported_round = 0
        self._known_names: dict[int, bytes] = {}
        self._table_names: dict[int, bytes] = {}
        # The latest batches, RECENT_RECORDS records or a little more, to name reported keys.
        self._recent: collections.deque[KeyBatch] = collections.deque()
        self._recent_records = 0

    # -- lifecycle

    def start(self) -> None:
        """Fence predecessors, abort their open transaction, resume from the committed offset."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

        config, names = self.config, self.names
        # Compile (or load from numba's cache) the scheme's kernels now, on a throwaway object,
        # so the first live batch does not pay for it.
        create_scheme(config, self.source).route(KeyBatch.from_strings(["warm", "up"]))
        self._producer = Producer(
            kafka_io.transactional_producer_config(
                config.bootstrap, names.transactional_id(self.source)
            )
        )
        self._producer.init_transactions(60)
        self._consumer = Consumer(
            kafka_io.consumer_config(config.bootstrap, names.consumer_group(self.source))
        )
        topic = config.input_topic
        committed = kafka_io.committed_offset(
            self._consumer, TopicPartition(topic, self.source), timeout=60
        )
        self.watermark, self.table_version = parse_offset_metadata(
            committed.metadata, self.watermark
        )
        start = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
        self._next_offset = max(committed.offset, 0)
        bounded = isinstance(self.watermark, DataWatermark) and config.until_end
        if bounded and self.watermark.end_offset < 0:  # a bounded run's first start: its end
            self._first_offset, self.watermark.end_offset = kafka_io.watermark_offsets(
                self._consumer, TopicPartition(topic, self.source), timeout=60
            )
        if self.control is not None:
            self._install(self.table_version)
            self._reported_round = self.control.current().round
            self.poll_control(force=True)
        self._consumer.assign([TopicPartition(topic, self.source, start)])
        # A manually assigned consumer's group metadata never changes (and costs a call).
        self._group_metadata = self._consumer.consumer_group_metadata()
        counted = self.redis.hget(self._stats_key(), "offset")
        self._counted_offset = int(counted) if counted is not None else -1
        # The orchestrator starts the producers once every source is here: a backlog routed in
        # one burst would reach the controller as one round that averages the stream's drift.
        self.redis.hset(self._stats_key(), "started_ms", control_plane.now_ms())

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._producer = None

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> SourceSummary:
        """Process batches until ``should_stop()`` or, with ``until_end``, END_OF_STREAM."""
        began = time.perf_counter()
        self.start()
        try:
            while not should_stop():
                if self.config.until_end and self.watermark.ended:
                    break
                messages = self._consumer.consume(
                    num_messages=self.config.batch_size, timeout=self.config.poll_timeout
                )
                messages = [m for m in messages if m.error() is None]
                if self.control is not None:
                    self.poll_control()
                if messages:
                    self._last_record_at = time.monotonic()
                    self.process(messages)
                elif self._switch_pending:
                    self.process([])
                if self.config.input is not None:
                    self._user_topic_markers(bool(messages))
        finally:
            self.summary.seconds = time.perf_counter() - began
            self.summary.ended = self.watermark.ended
            self.close()
        return self.summary

    # -- a user topic's end and idleness (pipeline.stages.user_topic)

    def _user_topic_markers(self, got_records: bool) -> None:
        """Forward END_OF_STREAM at a bounded run's end offset; raise an idle source's
        watermark to the others' (one transaction of markers, no records)."""
        from confluent_kafka import TopicPartition

        watermark = self.watermark
        assert isinstance(watermark, DataWatermark) and self.config.input is not None
        if watermark.ended:
            return
        if watermark.end_offset >= 0:
            tp = TopicPartition(self.config.input_topic, self.source)
            # librdkafka's position moves past transaction markers; before the first fetch it
            # is invalid (< 0), and then what was committed is where the source stands.
            position = max(self._consumer.position([tp])[0].offset, self._next_offset)
            if position < watermark.end_offset and not got_records:
                position = max(position, self._log_start(tp))
            if position >= watermark.end_offset:
                self._finish_pending = True
                self.process([])
                return
        idle_ms = self.config.input.idle_timeout_ms
        now = time.monotonic()
        if got_records or not idle_ms or (now - self._last_record_at) * 1000 < idle_ms:
            return
        if now - self._idle_checked < IDLE_CHECK_SECONDS:
            return
        self._idle_checked = now
        others = [
            int(v)
            for s, v in self.redis.hgetall(self._source_watermarks_key()).items()
            if int(s) != self.source
        ]
        floor = max(others, default=user_topic.NO_WATERMARK)
        if floor > watermark.forwarded:
            self._idle_floor = floor
            self.process([])

    def _log_start(self, tp: Any) -> int:
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
        first = kafka_io.watermark_offsets(self._consumer, tp, timeout=30)[0]
        unread = max(self._next_offset, self._first_offset)
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

    def _source_watermarks_key(self) -> str:
        return self.names.redis_key("sources", "watermark")

    # -- routing-table control (pipeline.stages.control_plane)

    @property
    def _switch_pending(self) -> bool:
        return self.control is not None and self.scheme.table.version > self.table_version

    def _install(self, version: int) -> None:
        """Route by published table ``version`` from the next batch on."""
        published = self.control.table(version)
        self.scheme.install(published.table)
        self._table_names = dict(
            zip(published.table.key_ids.tolist(), published.names, strict=True)
        )
        self._known_names = {**self._known_names, **self._table_names}

    def poll_control(self, *, force: bool = False) -> None:
        """Adopt a newly published table; report statistics when the controller opened a new
        round. At most every ``control_poll`` seconds (one HMGET)."""
        now = time.monotonic()
        if not force and now - self._control_checked < self.config.control_poll:
            return
        self._control_checked = now
        current = self.control.current()
        if current.version > self.scheme.table.version:
            self._install(current.version)
        if current.round > self._reported_round:
            self._report(current.round)

    def _remember(self, batch: KeyBatch) -> None:
        recent = self._recent
        recent.append(batch)
        self._recent_records += len(batch)
        while self._recent_records - len(recent[0]) >= control_plane.RECENT_RECORDS:
            self._recent_records -= len(recent.popleft())

    def _report(self, round_: int) -> None:
        scheme: TableScheme = self.scheme  # type: ignore[assignment]
        report = control_plane.compact_report(
            scheme.statistics(reset=True),
            list(self._recent),
            self._known_names,
            source=self.source,
            round_=round_,
            table_version=scheme.table.version,
            max_keys=self.config.report_keys,
        )
        self.control.report(report)
        self._reported_round = round_
        # Next time, name the keys of the current table and of this report without a search
        # (and forget older ones: the map stays as small as one report plus one table).
        self._known_names = {
            **dict(zip(report.key_ids.tolist(), report.names, strict=True)),
            **self._table_names,
        }

    # -- one batch

    def route_batch(
        self, messages: list[Any], watermark: SourceWatermark | DataWatermark
    ) -> BatchOutput:
        """Validate and route ``messages``; updates ``watermark`` (a copy) and the scheme."""
        if isinstance(watermark, DataWatermark):
            return self._route_user_batch(messages, watermark)
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
        batch = KeyBatch(key_bytes, key_offsets)
        partitions = np.asarray(self.scheme.route(batch), dtype=np.int32)
        version = self.scheme.table.version if isinstance(self.scheme, TableScheme) else 0
        if self.control is not None and len(batch):
            self._remember(batch)
        out_values = work_values(data_values, self.source, version)  # type: ignore[arg-type]
        output = BatchOutput(
            data_keys,
            out_values,
            partitions.tolist(),
            reasons=checked.reasons,
            data_rows=data,
            watermark_rows=int(checked.watermarks.shape[0]),
        )
        output.routed = np.bincount(partitions, minlength=self.config.n_workers)
        output.dead_letter_counts = np.bincount(
            checked.reasons[checked.reasons >= 0], minlength=len(REASONS)
        )
        if version > self.table_version:
            output.switch_markers.append(
                records.encode_marker(Kind.TABLE_SWITCH, self.source, table_version=version)
            )
        rows = checked.records
        watermark.observe(
            rows["producer"][data],
            rows["producer"][checked.watermarks],
            rows["event_time_ms"][checked.watermarks],
        )
        forwarded = watermark.advance()
        if forwarded is not None:
            output.markers.append(records.encode_marker(Kind.WATERMARK, self.source, forwarded))
        for row in checked.bad.tolist():
            message = messages[row]
            output.dead_letters.append(
                (
                    keys[row],
                    dead_letter_value(
                        int(checked.reasons[row]),
                        int(checked.key_lengths[row]),
                        values[row],
                        message.topic(),
                        message.partition(),
                        message.offset(),
                    ),
                )
            )
        return output

    def _route_user_batch(self, messages: list[Any], watermark: DataWatermark) -> BatchOutput:
        """:meth:`route_batch` on a user's topic: extract key and time, set late records
        aside, route the rest with the user's value wrapped (module user_topic)."""
        spec = self.config.input
        assert spec is not None
        n = len(messages)
        keys = [m.key() for m in messages]
        values = [m.value() for m in messages]
        offsets = np.fromiter((m.offset() for m in messages), dtype=np.int64, count=n)
        if spec.extractor.time.source == "kafka-timestamp":
            # (type, ms); type 0 (no timestamp) comes with -1, which the extractor refuses
            stamps = np.fromiter((m.timestamp()[1] for m in messages), dtype=np.int64, count=n)
        else:
            stamps = np.zeros(n, dtype=np.int64)
        extracted = spec.extractor.extract(values, keys, stamps)
        reasons = np.full(n, -1, dtype=np.int8)
        for index, name in enumerate(EXTRACTOR_REASONS):
            reasons[extracted.reasons == index] = REASONS.index(name)
        times = extracted.event_time_ms
        valid = reasons < 0
        late = user_topic.late_rows(times, valid, watermark, spec.window_ms, spec.lateness_ms)
        data = np.flatnonzero(valid & ~late)
        batch = extracted.keys.take(data)
        partitions = np.asarray(self.scheme.route(batch), dtype=np.int32)
        version = self.scheme.table.version if isinstance(self.scheme, TableScheme) else 0
        if self.control is not None and len(batch):
            self._remember(batch)
        rows = data.tolist()
        headers = records.work_headers(
            times[data], self.source, offsets[data], self.source, version
        )
        output = BatchOutput(
            batch.to_list(),
            [header + (values[i] or b"") for header, i in zip(headers, rows, strict=True)],
            partitions.tolist(),
            reasons=reasons,
            data_rows=data,
        )
        output.routed = np.bincount(partitions, minlength=self.config.n_workers)
        output.dead_letter_counts = np.bincount(reasons[reasons >= 0], minlength=len(REASONS))
        if version > self.table_version:
            output.switch_markers.append(
                records.encode_marker(Kind.TABLE_SWITCH, self.source, table_version=version)
            )
        topic = spec.topic
        output.late_rows = np.flatnonzero(late)
        for row in output.late_rows.tolist():
            output.late.append(
                (
                    keys[row],
                    user_topic.late_value(
                        event_time_ms=int(times[row]),
                        window_ms=spec.window_ms,
                        watermark=watermark.forwarded,
                        key=extracted.keys[row],
                        value=values[row],
                        topic=topic,
                        partition=self.source,
                        offset=int(offsets[row]),
                    ),
                )
            )
        for row in np.flatnonzero(~valid).tolist():
            reason = int(reasons[row])
            output.dead_letters.append(
                (
                    keys[row],
                    dead_letter_value(
                        reason,
                        len(extracted.keys[row]),
                        values[row],
                        topic,
                        self.source,
                        int(offsets[row]),
                        detail=spec.extractor.detail(int(extracted.reasons[row])),
                    ),
                )
            )
        watermark.observe(times[data])
        watermark.raise_to(self._idle_floor)
        if self._finish_pending:
            watermark.finish()
        forwarded = watermark.advance()
        if forwarded is not None:
            output.markers.append(records.encode_marker(Kind.WATERMARK, self.source, forwarded))
        return output

    def process(self, messages: list[Any]) -> None:
        """Route one batch and commit it (records, dead letters, markers, offset) atomically."""
        from confluent_kafka import KafkaException, TopicPartition

        began = time.perf_counter()
        watermark = self.watermark.copy()
        output = self.route_batch(messages, watermark)
        # No messages: an idle source's transaction of TABLE_SWITCH markers alone.
        first = messages[0].offset() if messages else -1
        last = messages[-1].offset() if messages else self._next_offset - 1
        version = self.scheme.table.version if self.control is not None else 0
        producer = self._producer
        try:
            producer.begin_transaction()
            self._send(output)
            if messages:
                self._count(output, messages, first, last)
            with self._watchdog.guard("send_offsets_to_transaction"):
                producer.send_offsets_to_transaction(
                    [
                        TopicPartition(
                            self.config.input_topic,
                            self.source,
                            last + 1,
                            metadata=offset_metadata(watermark, version),
                        )
                    ],
                    self._group_metadata,
                )
            self._commit()
        except KafkaException as exception:
            error = exception.args[0]
            if error.fatal() or not error.txn_requires_abort():
                raise StageError(
                    f"source {self.source}: {error.str()} (fenced by a newer instance?)"
                ) from None
            # Abortable: nothing of this batch is visible; read it again from its first offset.
            # A batch that fails again and again (a record the broker refuses) stops the
            # source rather than loop: its offset stays uncommitted, nothing is lost.
            producer.abort_transaction(60)
            self._failures = self._failures + 1 if self._failed_at == first else 1
            self._failed_at = first
            if self._failures >= MAX_BATCH_ATTEMPTS:
                raise StageError(
                    f"source {self.source}: batch at offset {first} failed "
                    f"{self._failures} times: {error.str()}"
                ) from None
            if messages:
                self._consumer.seek(TopicPartition(self.config.input_topic, self.source, first))
            return
        self._failures = 0
        if self.config.input is not None and watermark.forwarded > self.watermark.forwarded:
            # what an idle source adopts (a hint only: each source's own lateness rule holds)
            self.redis.hset(self._source_watermarks_key(), self.source, watermark.forwarded)
        self.watermark = watermark
        self.table_version = version
        self._next_offset = last + 1
        self._committed(output, len(messages), time.perf_counter() - began)

    def _committed(self, output: BatchOutput, records: int, seconds: float) -> None:
        """Count a committed batch in this process's summary and metrics (an aborted attempt
        counts nothing: the batch is read again and counted when it commits)."""
        summary = self.summary
        summary.records += records
        summary.data += int(output.data_rows.shape[0])
        summary.watermarks += output.watermark_rows
        routed = output.routed.tolist()
        dead = dict(zip(REASONS, output.dead_letter_counts.tolist(), strict=True))
        summary.routed = [
            total + count for total, count in zip(summary.routed, routed, strict=True)
        ]
        for reason, count in dead.items():
            summary.dead_letters[reason] += count
        summary.batches += 1
        late = int(output.late_rows.shape[0])
        summary.late += late
        if self.metrics is not None:
            if records:
                self.metrics.batch(records, routed, dead, seconds, late=late)
            self.metrics.table_of(self.scheme)

    def _send(self, output: BatchOutput) -> None:
        produce = self._producer.produce
        work = self.names.work_topic
        for marker in output.switch_markers:
            for worker in range(self.config.n_workers):
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
            for worker in range(self.config.n_workers):
                self._produce_blocking(work, marker, None, worker)

    def _produce_blocking(
        self, topic: str, value: bytes, key: bytes | None, partition: int
    ) -> None:
        kafka_io.produce_blocking(self._producer, topic, value, key, partition)

    def _commit(self) -> None:
        from confluent_kafka import KafkaException

        for _attempt in range(10):
            try:
                self._producer.commit_transaction(60)
                return
            except KafkaException as exception:
                if not exception.args[0].retriable():
                    raise
        self._producer.commit_transaction(60)

    # -- counters

    def _stats_key(self) -> str:
        return self.names.redis_key("stats", "source", self.source)

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
        if not fresh.any():
            return
        if not fresh.all():
            fresh_data = fresh[output.data_rows]
            routed = np.bincount(
                np.asarray(output.partitions, dtype=np.int64)[fresh_data],
                minlength=self.config.n_workers,
            )
            fresh_reasons = output.reasons[fresh]
            bad_counts = np.bincount(fresh_reasons[fresh_reasons >= 0], minlength=len(REASONS))
            data_count = int(fresh_data.sum())
        else:
            data_count = int(output.data_rows.shape[0])
        pipe = self.redis.pipeline(transaction=True)
        stats = self._stats_key()
        pipe.hincrby(stats, "records", int(fresh.sum()))
        pipe.hincrby(stats, "data", data_count)
        pipe.hincrby(stats, "dead_letters", int(bad_counts.sum()))
        pipe.hset(stats, "offset", last)
        if late:
            pipe.hincrby(stats, "late", late)
            pipe.hincrby(self.names.redis_key("stats", "late_input"), self.source, late)
        for w, count in enumerate(routed.tolist()):
            if count:
                pipe.hincrby(self.names.redis_key("stats", "routed"), w, count)
        for reason, count in zip(REASONS, bad_counts.tolist(), strict=True):
            if count:
                pipe.hincrby(self.names.redis_key("stats", "dead_letters"), reason, count)
        pipe.execute()
        self._counted_offset = last


# --- the stage -------------------------------------------------------------------------------


def prepare(config: StageConfig) -> None:
    """Check the scheme, W and the services, and create the run's topics: fail fast, one line.

    Raises :class:`SchemeError` (bad scheme or W), :class:`kafka_io.ServiceUnavailableError`
    (Kafka or Redis down) or :class:`kafka_io.KafkaIOError` (a topic with the wrong partitions).
    """
    for s in range(config.n_sources):
        create_scheme(config, s)
    kafka_io.require_kafka(config.bootstrap)
    client = kafka_io.connect_redis(config.redis_url)
    try:
        if config.input is not None:
            user_topic.record(client, config.input, config.names)
    finally:
        client.close()
    if config.input is not None:
        partitions = kafka_io.topic_partitions(config.bootstrap, config.input.topic)
        if partitions is None:
            raise kafka_io.KafkaIOError(f"kafka: no topic {config.input.topic!r} to read")
        if partitions != config.n_sources:
            raise kafka_io.KafkaIOError(
                f"topic {config.input.topic!r} has {partitions} partition(s): that many sources"
            )
    kafka_io.ensure_run_topics(
        config.bootstrap,
        config.names,
        sources=config.n_sources if config.input is None else None,
        workers=config.n_workers,
        replication=config.replication,
    )


def run_source(
    config: StageConfig, source: int, should_stop: Callable[[], bool] = lambda: False
) -> SourceSummary:
    """Run source ``source`` in this process until stopped (or END_OF_STREAM, ``until_end``)."""
    from pipeline.observe.grouping import GroupingMetrics
    from pipeline.observe.series import RunLabels

    client = kafka_io.connect_redis(config.redis_url)
    try:
        labels = RunLabels(config.names.run_id, config.scheme)
        metrics = GroupingMetrics(labels, source, config.n_workers, reasons=REASONS)
        return GroupingSource(config, source, client, metrics).run(should_stop)
    finally:
        client.close()


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies (kill -9 of ``skewer group``)."""
    process.die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _child(config: StageConfig, source: int, results: Any, parent: int) -> None:
    _die_with_parent(parent)
    stopping = _stop_flag()
    try:
        summary = run_source(config, source, stopping)
        results.put((source, summary.as_dict(), None))
    except (StageError, kafka_io.KafkaIOError) as error:
        results.put((source, None, str(error)))
    except Exception as error:  # report, don't hang the parent waiting for a result
        results.put((source, None, f"{type(error).__name__}: {error}"))


def _stop_flag() -> Callable[[], bool]:
    """A flag SIGTERM and SIGINT set: the source stops after its current batch."""
    state = {"stop": False}

    def handler(_signum: int, _frame: Any) -> None:
        state["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: state["stop"]


def run_sources(config: StageConfig, sources: Sequence[int]) -> list[SourceSummary]:
    """Run ``sources``: one in this process, several as one child process each.

    SIGTERM or SIGINT stops every source after its current batch. Raises :class:`StageError`
    naming the first source that failed (the others are then stopped).
    """
    if len(sources) == 1:
        return [run_source(config, sources[0], _stop_flag())]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()

    def started(source: int) -> Any:
        child = context.Process(
            target=_child,
            args=(config, source, results, os.getpid()),
            name=f"group-source-{source}",
        )
        child.start()
        return child

    children = {s: started(s) for s in sources}
    stop = _stop_flag()
    forwarded_stop = False
    summaries: dict[int, SourceSummary] = {}
    silent_deaths: dict[int, int] = {}
    restarts: dict[int, int] = {}
    failure: str | None = None
    try:
        while len(summaries) < len(children) and failure is None:
            if stop() and not forwarded_stop:
                forwarded_stop = True
                for child in children.values():
                    if child.is_alive():
                        child.terminate()  # SIGTERM: the child stops after its batch
            try:
                source, summary, error = results.get(timeout=0.5)
            except queue.Empty:
                for s, child in list(children.items()):
                    stuck = child.exitcode == EXIT_STUCK and not forwarded_stop
                    if s not in summaries and stuck and restarts.get(s, 0) < MAX_SOURCE_RESTARTS:
                        # Its transaction is open on the broker: the new process's producer
                        # fences it and aborts it, and its consumer resumes at the committed
                        # offset (the recovery of a kill -9).
                        restarts[s] = restarts.get(s, 0) + 1
                        children[s] = started(s)
                        continue
                    if s not in summaries and not child.is_alive():
                        # A child puts its result before it exits; allow the queue a moment.
                        silent_deaths[s] = silent_deaths.get(s, 0) + 1
                        if silent_deaths[s] >= 3:
                            failure = f"source {s} exited with code {child.exitcode}"
                continue
            if error is not None:
                failure = f"source {source}: {error}"
            else:
                summaries[source] = SourceSummary(
                    **{**summary, "restarts": restarts.get(source, 0)}
                )
    finally:
        for child in children.values():
            if child.is_alive() and failure is not None:
                child.terminate()
            child.join(30)
    if failure is not None:
        raise StageError(failure)
    return [summaries[s] for s in sources]
