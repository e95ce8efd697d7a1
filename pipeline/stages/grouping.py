"""The grouping stage: S sources route topic ``keys`` (or a user's topic) into topic ``work``,
exactly once.

Layer: stages.

Source ``s`` reads partition ``s`` and owns one scheme object, the very object the simulator
drives, so the live routing of every record equals the simulator's. Its parts, one job each:
an input format (:mod:`pipeline.stages.input_formats`: skewer's records or a user's topic)
decodes a consumed batch; :class:`GroupingSource` routes it and adds the markers; its checkpoint
(:mod:`pipeline.stages.source_checkpoint`) commits the batch's output and offset in one Kafka
transaction and counts it; a table follower (:mod:`pipeline.stages.table_follower`) keeps a
routing-table scheme on the control plane's newest table. :func:`run_sources` runs several
sources, one process each. Design: docs/design.md#grouping-stage.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import registry
from operators.base import Scheme, SchemeError, TableScheme
from operators.keys import KeyBatch
from operators.simulator import source_round
from pipeline.io import heap, kafka_io, records
from pipeline.io.control_store import ControlPlane, now_ms
from pipeline.io.dead_letters import REASONS
from pipeline.io.grouping_store import GroupingStore
from pipeline.io.kafka_io import COMMIT_INTERVAL_MS
from pipeline.io.records import Kind
from pipeline.io.redis_client import connect_redis
from pipeline.services import process
from pipeline.stages import control_plane, user_topic
from pipeline.stages.input_formats import (
    InputFormat,
    SkewerRecords,
    SourceWatermark,
    UserTopicRecords,
    Watermark,
)
from pipeline.stages.source_checkpoint import (
    EXIT_STUCK,
    BatchOutput,
    SourceCheckpoint,
    StageError,
    offset_metadata,
    parse_offset_metadata,
)
from pipeline.stages.table_follower import TableFollower
from pipeline.stages.user_topic import UserTopic

if TYPE_CHECKING:
    import redis

    from pipeline.observe.grouping import GroupingMetrics

# Names the stage's callers import from here, though their homes are its parts.
__all__ = [
    "COMMIT_INTERVAL_MS",
    "DEFAULT_BATCH_SIZE",
    "REASONS",
    "BatchOutput",
    "GroupingSource",
    "SourceSummary",
    "SourceWatermark",
    "StageConfig",
    "StageError",
    "create_scheme",
    "offset_metadata",
    "parse_offset_metadata",
    "prepare",
    "run_source",
    "run_sources",
]

DEFAULT_BATCH_SIZE = 20_000
#: Times the stage starts one killed source again within :data:`RESTART_WINDOW_SECONDS` before it
#: gives up and fails, for its own supervisor (:class:`RestartBudget`).
MAX_SOURCE_RESTARTS = 3
RESTART_WINDOW_SECONDS = 600.0
#: How often a source hands the heap pages it freed back to the OS (:mod:`pipeline.io.heap`):
#: the batches of a backlog read after an outage are some 40 times a paced batch, and their
#: memory, once free, would otherwise stay the process's size for good.
TRIM_EVERY_SECONDS = 10.0
#: The allocator of a stage's source processes (an explicit setting wins). glibc gives threads
#: arenas of their own (up to 8 per core), each keeping its own high-water mark, and librdkafka
#: runs a thread per broker: two arenas shared by all threads bound how many marks a source
#: keeps. Python's own allocator keeps small objects in arenas it returns only when wholly
#: empty, and a backlog's batches leave them fragmented: with glibc's malloc for everything,
#: the periodic trim hands that memory back too (tests/unit/test_heap.py).
SOURCE_ALLOCATOR = {"MALLOC_ARENA_MAX": "2", "PYTHONMALLOC": "malloc"}


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
    #: The longest a batch (one transaction) waits to fill up, in ms: a quiet stream still
    #: commits this often, and read_committed readers see nothing before a commit.
    commit_interval_ms: int = COMMIT_INTERVAL_MS
    until_end: bool = False
    #: Seconds between two looks at the control plane (routing-table schemes only).
    control_poll: float = 0.1
    report_keys: int = control_plane.DEFAULT_REPORT_KEYS
    #: Routing-table rounds every this many records of all sources: each source reports after
    #: every :func:`~operators.simulator.source_round` of its own (None: when the controller
    #: opens a round).
    control_every: int | None = None
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
    #: Records of a user topic that a query's WHERE left out.
    filtered: int = 0
    routed: list[int] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0
    ended: bool = False
    #: Times the stage started this source's process again (:func:`run_sources`: it was
    #: killed, or ended stuck); the counts above are then the last process's.
    restarts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


class GroupingSource:
    """Source ``source`` of the stage: consume, decode, route, commit (see the module)."""

    def __init__(
        self,
        config: StageConfig,
        source: int,
        redis_client: redis.Redis,
        metrics: GroupingMetrics | None = None,
        restart: int = 0,
    ) -> None:
        self.config = config
        #: How many times the stage started this source again before this process.
        self.restart = restart
        self.metrics = metrics
        self.source = int(source)
        self.names = config.names
        self.scheme = create_scheme(config, source)
        self.summary = SourceSummary(self.source, routed=[0] * config.n_workers)
        store = GroupingStore(redis_client, config.names.run_id)
        self.input: InputFormat = (
            SkewerRecords(self.source)
            if config.input is None
            else UserTopicRecords(config.input, self.source, store, until_end=config.until_end)
        )
        self.checkpoint = SourceCheckpoint(
            config.bootstrap, config.names, self.source, config.input_topic, config.n_workers, store
        )
        # The state of the last committed transaction: the watermark, and the routing-table
        # version (the scheme's table may be newer: then the next transaction starts with
        # TABLE_SWITCH markers).
        self.watermark: Watermark = self.input.fresh_watermark()
        self.table_version = 0
        self.tables = (
            TableFollower(
                ControlPlane(redis_client, config.names.run_id),
                self.scheme,
                self.source,
                config.control_poll,
                config.report_keys,
                report_every=(
                    source_round(config.control_every, config.n_sources)
                    if config.control_every
                    else None
                ),
            )
            if isinstance(self.scheme, TableScheme)
            else None
        )

    def start(self) -> None:
        """Fence predecessors, abort their open transaction, resume from the committed offset."""
        # Compile (or load from numba's cache) the scheme's and the input's kernels now, the
        # scheme's on a throwaway object, so the first live batch does not pay for them.
        began = time.perf_counter()
        create_scheme(self.config, self.source).route(KeyBatch.from_strings(["warm", "up"]))
        self.input.warm_up()
        warmed = time.perf_counter()
        committed = self.checkpoint.open()
        self.watermark, self.table_version = parse_offset_metadata(committed, self.watermark)
        self.input.start(self.checkpoint.consumer, self.watermark)
        if self.tables is not None:
            # Counted rounds go on from the records this source's committed batches routed.
            routed = self.checkpoint.store.source_counts(self.source).get("data", 0)
            self.tables.start(self.table_version, routed)
        self.checkpoint.resume(now_ms())
        announcing = time.perf_counter()
        self._announce()
        if self.restart:
            # Until the fencing, the predecessor's open transaction held back every ``work``
            # partition of the run (the workers read committed records only).
            resumed = time.perf_counter()
            phases = {
                "loading its kernels": warmed - began,
                **self.checkpoint.open_seconds,
                "its first transaction": resumed - announcing,
            }
            print(
                f"skewer group: source {self.source} (restart {self.restart}) resumed at offset "
                f"{self.checkpoint.next_offset} in {resumed - began:.1f} s: "
                + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()),
                file=sys.stderr,
                flush=True,
            )

    def _announce(self) -> None:
        """Commit one transaction of this source's TABLE_SWITCH marker, at the version it
        resumes with, to every ``work`` partition: the workers' next micro-batch reads, decodes
        and applies a row each, so their Kafka consumers, Python workers and Redis script are
        warm before the first record arrives. A version never goes down at a worker, so the
        marker repeats what the workers know (docs/design.md#grouping-stage)."""
        workers, version = self.config.n_workers, self.table_version
        marker = records.encode_marker(Kind.TABLE_SWITCH, self.source, table_version=version)
        output = BatchOutput(
            [],
            [],
            [],
            reasons=np.zeros(0, dtype=np.int8),
            data_rows=np.zeros(0, dtype=np.int64),
            switch_markers=[marker],
            routed=np.zeros(workers, dtype=np.int64),
            dead_letter_counts=np.zeros(len(REASONS), dtype=np.int64),
        )
        # An aborted announcement costs only the warm start: the first batch then warms up.
        self.checkpoint.commit(output, [], self.watermark, version, offsets=False)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> SourceSummary:
        """Process batches until ``should_stop()`` or, with ``until_end``, END_OF_STREAM."""
        began = time.perf_counter()
        self.start()
        checkpoint = self.checkpoint
        poll_timeout = self.config.commit_interval_ms / 1000
        next_trim = time.monotonic() + TRIM_EVERY_SECONDS
        try:
            while not should_stop() and not (self.config.until_end and self.watermark.ended):
                messages = checkpoint.consume(self.config.batch_size, poll_timeout)
                if time.monotonic() >= next_trim:
                    heap.release_freed_heap()
                    next_trim = time.monotonic() + TRIM_EVERY_SECONDS
                if self.tables is not None:
                    self.tables.poll()
                if messages or self._switch_pending:
                    self.process(messages)
                consumer, offset = checkpoint.consumer, checkpoint.next_offset
                if self.input.markers_due(self.watermark, consumer, offset, bool(messages)):
                    self.process([])  # markers alone: a bounded run's end, an idle source
        finally:
            self.summary.seconds = time.perf_counter() - began
            self.summary.ended = self.watermark.ended
            checkpoint.close()
        return self.summary

    @property
    def _switch_pending(self) -> bool:
        return self.tables is not None and self.scheme.table.version > self.table_version

    def route_batch(self, messages: list[Any], watermark: Watermark) -> BatchOutput:
        """Decode and route ``messages``, with the markers they call for; updates
        ``watermark`` (a copy) and the scheme."""
        decoded = self.input.decode(messages, watermark)
        if self.tables is not None:
            partitions = self.tables.route(decoded.keys)
        else:
            partitions = np.asarray(self.scheme.route(decoded.keys), dtype=np.int32)
        version = self.scheme.table.version if isinstance(self.scheme, TableScheme) else 0
        reasons = decoded.reasons
        output = BatchOutput(
            decoded.kafka_keys,
            decoded.work_values(version),
            partitions.tolist(),
            reasons=reasons,
            data_rows=decoded.rows,
            dead_letters=decoded.dead_letters,
            late=decoded.late,
            late_rows=decoded.late_rows,
            filtered_rows=decoded.filtered_rows,
            routed=np.bincount(partitions, minlength=self.config.n_workers),
            dead_letter_counts=np.bincount(reasons[reasons >= 0], minlength=len(REASONS)),
            watermark_rows=decoded.watermark_rows,
        )
        if version > self.table_version:
            output.switch_markers.append(
                records.encode_marker(Kind.TABLE_SWITCH, self.source, table_version=version)
            )
        forwarded = watermark.advance()
        if forwarded is not None:
            output.markers.append(records.encode_marker(Kind.WATERMARK, self.source, forwarded))
        return output

    def process(self, messages: list[Any]) -> None:
        """Route one batch and commit it (records, dead letters, markers, offset) atomically;
        a batch the broker aborted is read again."""
        began = time.perf_counter()
        watermark = self.watermark.copy()
        output = self.route_batch(messages, watermark)
        version = self.scheme.table.version if self.tables is not None else 0
        if not self.checkpoint.commit(output, messages, watermark, version):
            return
        self.input.committed(self.watermark, watermark)
        self.watermark = watermark
        self.table_version = version
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
        filtered = int(output.filtered_rows.shape[0])
        summary.filtered += filtered
        if self.metrics is not None:
            if records:
                self.metrics.batch(records, routed, dead, seconds, late=late, filtered=filtered)
            self.metrics.table_of(self.scheme)


# --- the stage -------------------------------------------------------------------------------


def prepare(config: StageConfig) -> None:
    """Check the scheme, W and the services, and create the run's topics: fail fast, one line.

    Raises :class:`SchemeError` (bad scheme or W), :class:`kafka_io.ServiceUnavailableError`
    (Kafka or Redis down) or :class:`kafka_io.KafkaIOError` (a topic with the wrong partitions).
    """
    for s in range(config.n_sources):
        create_scheme(config, s)
    kafka_io.require_kafka(config.bootstrap)
    client = connect_redis(config.redis_url)
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
    config: StageConfig,
    source: int,
    should_stop: Callable[[], bool] = lambda: False,
    restart: int = 0,
) -> SourceSummary:
    """Run source ``source`` in this process until stopped (or END_OF_STREAM, ``until_end``);
    ``restart``: how many times the stage started it again before."""
    from pipeline.observe.grouping import GroupingMetrics
    from pipeline.observe.series import RunLabels

    client = connect_redis(config.redis_url)
    try:
        labels = RunLabels(config.names.run_id, config.scheme)
        metrics = GroupingMetrics(labels, source, config.n_workers, reasons=REASONS)
        return GroupingSource(config, source, client, metrics, restart).run(should_stop)
    finally:
        client.close()


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies (kill -9 of ``skewer group``)."""
    process.die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _child(config: StageConfig, source: int, results: Any, parent: int, restart: int) -> None:
    _die_with_parent(parent)
    stopping = _stop_flag()
    try:
        summary = run_source(config, source, stopping, restart)
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


@dataclass
class RestartBudget:
    """At most ``limit`` restarts of one source killed by a signal within any ``window_s``
    seconds: a source that dies over and over has a cause a restart does not cure. A source
    that ended stuck (:data:`EXIT_STUCK`) is started again without spending the budget: a
    restart is what cures librdkafka's lost coordinator, every broker failover may leave each
    source stuck once, and its watchdog spaces such restarts at least
    :data:`~pipeline.stages.source_checkpoint.STUCK_AFTER_SECONDS` apart. ``spent`` counts
    every restart.

    >>> budget = RestartBudget(limit=2, window_s=60.0)
    >>> [budget.spend(t) for t in (0.0, 1.0, 2.0, 61.5)]
    [True, True, False, True]
    >>> budget.spend(62.0, exitcode=EXIT_STUCK), budget.spent
    (True, 4)
    """

    limit: int = 3
    window_s: float = 600.0
    #: When the restarts that spent the budget were taken.
    times: list[float] = field(default_factory=list)
    spent: int = 0

    def spend(self, now: float, exitcode: int = -signal.SIGKILL) -> bool:
        """Take one restart at ``now`` (monotonic seconds) of a source that ended with
        ``exitcode``, if the budget allows it."""
        if exitcode != EXIT_STUCK:
            if sum(1 for t in self.times if now - t < self.window_s) >= self.limit:
                return False
            self.times.append(now)
        self.spent += 1
        return True


def restartable(exitcode: int | None) -> bool:
    """A source process that ended this way is started again by its stage: killed by a signal
    (``kill -9``, the OOM killer) or ended stuck (:data:`EXIT_STUCK`). Either way its Kafka
    transaction is open on the broker: the new process's producer fences and aborts it, and its
    consumer resumes at the committed offset. A source that fails with an error is not."""
    return exitcode is not None and (exitcode < 0 or exitcode == EXIT_STUCK)


def run_sources(config: StageConfig, sources: Sequence[int]) -> list[SourceSummary]:
    """Run ``sources``: one in this process, several as one child process each.

    A child that is killed or ends stuck is started again (:func:`restartable`); a killed one up
    to :data:`MAX_SOURCE_RESTARTS` times within :data:`RESTART_WINDOW_SECONDS`
    (:class:`RestartBudget`). SIGTERM or SIGINT stops every source after its current batch.
    Raises :class:`StageError` naming the first source that failed (the others are then
    stopped).
    """
    if len(sources) == 1:
        return [run_source(config, sources[0], _stop_flag())]
    for name, value in SOURCE_ALLOCATOR.items():  # the children inherit them
        os.environ.setdefault(name, value)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()

    def started(source: int) -> Any:
        child = context.Process(
            target=_child,
            args=(config, source, results, os.getpid(), budgets[source].spent),
            name=f"group-source-{source}",
        )
        child.start()
        return child

    budgets = {s: RestartBudget(MAX_SOURCE_RESTARTS, RESTART_WINDOW_SECONDS) for s in sources}
    children = {s: started(s) for s in sources}
    stop = _stop_flag()
    forwarded_stop = False
    summaries: dict[int, SourceSummary] = {}
    silent_deaths: dict[int, int] = {}
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
                    if s in summaries:
                        continue
                    if (
                        restartable(child.exitcode)
                        and not forwarded_stop
                        and budgets[s].spend(time.monotonic(), child.exitcode)
                    ):
                        print(
                            f"skewer group: source {s} ended with code {child.exitcode}; "
                            "starting it again from its committed offset",
                            file=sys.stderr,
                            flush=True,
                        )
                        children[s] = started(s)
                        continue
                    if not child.is_alive():
                        # A child puts its result before it exits; allow the queue a moment.
                        silent_deaths[s] = silent_deaths.get(s, 0) + 1
                        if silent_deaths[s] >= 3:
                            failure = f"source {s} exited with code {child.exitcode}"
                continue
            if error is not None:
                failure = f"source {source}: {error}"
            else:
                summaries[source] = SourceSummary(**{**summary, "restarts": budgets[source].spent})
    finally:
        for child in children.values():
            if child.is_alive() and failure is not None:
                child.terminate()
            child.join(30)
    if failure is not None:
        raise StageError(failure)
    return [summaries[s] for s in sources]
