"""One run of the live pipeline: produce, group, work and aggregate as ``skewer`` subprocesses.

Layer: runs.

:class:`Pipeline` starts each stage of a :class:`~pipeline.runs.plan.RunPlan` as the command a
user would type (``python -m pipeline.cli ...``), so a run exercises exactly the product's entry
points: Spark and the producers first, the producers held at a gate until the workers are warm
(:meth:`Pipeline.start_all`); the run is over when every stage exited 0 at END_OF_STREAM, and a
stage that fails stops it. It reports progress about once a second, marks the start-up
timeline (:mod:`pipeline.runs.run_clock`) and samples the latency while it waits
(:mod:`pipeline.runs.latency`), reads the figures (:meth:`Pipeline.summary`, a
:class:`~pipeline.runs.summary.RunSummary`; what they mean: docs/performance.md) and deletes
the run. :func:`run_pipeline` is the one way to run a plan whole (``skewer demo``, the
benchmarks); the fault tests drive a :class:`Pipeline` step by step.
Stage output goes to ``{run_dir}/demo/{run_id}/{stage}.out|.err``. The services a run needs:
:mod:`pipeline.runs.service_lease`.

Long because a run's whole life -- start-up, faults, figures, clean-up -- is one object that
the fault tests drive a step at a time, between steps of their own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from operators.metrics import load_figures
from pipeline.io import config, kafka_io
from pipeline.io.grouping_store import GroupingStore
from pipeline.io.redis_client import connect_redis
from pipeline.runs.latency import LatencySampler
from pipeline.runs.plan import STAGES, RunPlan
from pipeline.runs.run_clock import RunClock, summary_timing
from pipeline.runs.stage_process import StageProcess, signal_group, start_stage
from pipeline.runs.summary import RunSummary, top_rows
from pipeline.services.process import group_alive

if TYPE_CHECKING:
    import redis as redis_module

    from pipeline.io.state_store import StateStore
    from pipeline.runs.recount import RecountVerification
    from pipeline.runs.verify import RunVerification

#: Seconds Spark gets to start and commit its first micro-batch.
WORK_READY_SECONDS = 180.0
#: Micro-batches of markers the workers apply before gated producers send: a fresh driver runs
#: its first micro-batches (scheduling, the Python workers' hand-over, the logs) several times
#: slower than later ones, and a slow batch makes the next one bigger (docs/performance.md).
WARM_UP_BATCHES = 5
#: Markers per ``work`` partition in each warm-up batch in Real-Time Mode, where a batch is a
#: writer's apply: enough rows for the JVM to compile the writer's per-row path before the
#: first records (a few dozen do not).
REAL_TIME_WARM_UP_ROWS = 400
#: Seconds a stage gets to exit after SIGTERM before SIGKILL (Spark stops its query first).
STOP_GRACE_SECONDS = 15.0

Log = Callable[[str], None]


class PipelineError(Exception):
    """The run cannot go on; the message is one line for the user."""


class StageFailedError(PipelineError):
    """A stage exited with a non-zero code (or was killed and not restarted)."""

    def __init__(self, stage: str, code: int | None, reason: str, log_path: Path) -> None:
        self.stage, self.code, self.reason, self.log_path = stage, code, reason, log_path
        super().__init__(f"{stage} failed (exit {code}): {reason} (log: {log_path})")


@dataclass(frozen=True)
class Progress:
    """Where a run is, from Redis and Kafka: records produced (the ``keys`` topic's end offsets
    while the producer runs, then its acknowledged count), grouped, processed by the workers,
    final windows, and the load of the most loaded worker against the average."""

    elapsed: float
    produced: int
    grouped: int
    processed: int
    loads: list[int]
    windows_final: int

    def line(self, records: int) -> str:
        loads = self.loads
        hottest = max(range(len(loads)), key=loads.__getitem__) if loads else 0
        balance = (
            f"load max/avg {load_figures(loads)[2]:.2f} (worker {hottest}: {loads[hottest]:,})"
            if sum(loads)
            else "load -"
        )
        return (
            f"[{self.elapsed:6.1f} s] produced {self.produced:,}/{records:,} · grouped "
            f"{self.grouped:,} · processed {self.processed:,} "
            f"({100 * self.processed / records:.0f}%) · windows final {self.windows_final} · "
            + balance
        )


class Pipeline:
    """The stages of one run as subprocesses; a context manager that stops them on exit.

    ``python`` and ``environ`` say how to run ``skewer`` (by default this interpreter and this
    environment); the stages' ``SKEWER_*`` variables are ``settings``' own, so they reach the
    services this process does. :meth:`kill` and :meth:`start` are the fault tests' hook: kill
    -9 a stage mid-run and start it again with the same arguments.
    """

    def __init__(
        self,
        plan: RunPlan,
        settings: config.Settings | None = None,
        *,
        log_dir: Path | None = None,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
        log: Log | None = None,
        clock: RunClock | None = None,
    ) -> None:
        self.plan = plan
        self.settings = settings or config.load()
        self.log_dir = log_dir or self.settings.run_dir / "demo" / plan.run_id
        self.python = python
        self.environ = {
            **(os.environ if environ is None else environ),
            **self.settings.environ(),
        }
        self.environ.setdefault("PYTHONUNBUFFERED", "1")
        self.log = log or (lambda _line: None)
        self.stages: dict[str, StageProcess] = {}
        self.prepared = False
        self.started_at = time.monotonic()
        #: The start-up timeline (from the command, or from here) and the latency snapshots.
        self.clock = clock or RunClock()
        self.sampler = LatencySampler(plan.workers)
        self._redis: redis_module.Redis | None = None
        self._consumer: Any = None
        self._store: StateStore | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
        self.close()

    def prepare(self, *, start_work: bool = False) -> None:
        """Check the scheme and services, refuse a run that exists already (its topics or
        Redis keys), and create the run's topics; one line on failure. ``start_work`` starts
        the plan's Spark workers as soon as the run is known to be new, so that their JVM
        starts up while the topics are made (the job makes its own topic if it is first)."""
        from pipeline.stages import grouping

        bootstrap = self.settings.kafka_bootstrap
        try:
            kafka_io.require_kafka(bootstrap)
            existing = [t for t in self.plan.topics if kafka_io.topic_partitions(bootstrap, t)]
            if existing or self.store.run_exists():
                what = f"topic {existing[0]!r}" if existing else "Redis keys"
                raise PipelineError(
                    f"run {self.plan.run_id!r} exists already ({what}); use another --run-id "
                    "and --topic-prefix"
                )
            # From here on the run is ours: cleanup() may delete all of it.
            self.prepared = True
            if start_work and "work" in self.plan.stages:
                self.start("work")
            grouping.prepare(self.plan.stage_config(self.settings))
            self.clock.mark("run prepared")
        except kafka_io.KafkaIOError as error:
            raise PipelineError(str(error)) from None

    def start(self, stage: str, *, gated: bool = False) -> StageProcess:
        """Start ``stage`` (again, after :meth:`kill`: same arguments, logs appended).
        ``gated`` producers start up and wait for :meth:`release_producers`."""
        previous = self.stages.get(stage)
        if previous is not None and previous.exit_code() is None:
            raise PipelineError(f"{stage} is still running")
        argv = [self.python, "-m", "pipeline.cli", *self.plan.argv(stage, self.settings)]
        if gated:
            argv.append("--gated")
        starts = previous.starts + 1 if previous is not None else 1
        self.stages[stage] = start_stage(stage, argv, self.log_dir, self.environ, starts)
        # The subprocess exists: the stage's own start-up (imports, Spark's JVM) comes after.
        self.clock.mark(
            "producers started" if stage == "produce" and not gated else f"{stage} started"
        )
        return self.stages[stage]

    def release_producers(self) -> None:
        """Let gated producers send (a producer started later is not gated)."""
        from producers.kafka_producer import open_gate

        open_gate(self.store.client, self.plan.run_id)
        self.clock.mark("producers started")

    def start_all(self, stages: Sequence[str] | None = None, *, ready_timeout: float = 0) -> None:
        """Start ``stages`` (default: the plan's) in :data:`STAGES` order; when they include the
        producers and the workers, the producers send only once the run is warm.

        Then Spark's driver starts with the gated producers only, which plan their stream and
        write its truth beside the JVM's start-up; on two cores the other stages' start-up
        (three Python processes, their imports and compiled kernels) held the driver back by
        seconds. They start once Spark committed its first micro-batch, while the workers
        apply :data:`WARM_UP_BATCHES` micro-batches of markers (:meth:`warm_up_workers`), and
        the producers send once both are done, so that the first records meet neither a cold
        driver nor a cold path (docs/performance.md#start-up).
        """
        stages = self.plan.stages if stages is None else stages
        timeout = ready_timeout or WORK_READY_SECONDS
        gated = "produce" in stages and "work" in stages
        if "work" in stages and "work" not in self.stages:  # prepare() may have started it
            self.start("work")
        if gated:
            self.start("produce", gated=True)
            self._wait_work_ready_logged(timeout)
        for stage in STAGES:
            if stage in stages and stage not in self.stages and (gated or stage != "produce"):
                self.start(stage)
        if gated:
            self.warm_up_workers(WARM_UP_BATCHES, timeout)
        elif "work" in stages:
            self._wait_work_ready_logged(timeout)
        if "group" in stages and "produce" in stages:
            self.wait_group_ready(timeout)
        if "control" in stages and "produce" in stages:
            # A routing-table scheme's controller measures rounds in wall time: one still
            # importing under load would let a short stream pass without a single round.
            self.wait_control_ready(timeout)
        if gated:
            self.release_producers()
        elif "produce" in stages:
            self.start("produce")
        self.log(f"running: {', '.join(s for s in STAGES if s in stages)}")

    def _wait_work_ready_logged(self, timeout: float) -> None:
        began = time.monotonic()
        self.log("waiting for the Spark workers to start ...")
        self.wait_work_ready(timeout)
        self.log(f"Spark workers ready after {time.monotonic() - began:.1f} s")

    def wait_work_ready(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until Spark committed a micro-batch in the run's checkpoint (raises if work died).

        In Real-Time Mode a batch commits only at the end of its checkpoint interval and logs
        its offsets then: the workers are ready once each applied a marker."""
        if self.plan.trigger == config.REAL_TIME:
            self._put_markers_through(1, timeout)
        else:
            commits = self.plan.checkpoint_dir(self.settings) / "commits"
            self._wait_ready(
                "work", lambda: commits.is_dir() and any(commits.iterdir()), timeout, poll=0.05
            )
        # As this poll sees the first commit file: at most 0.05 s late.
        self.clock.mark("Spark workers ready")

    def wait_workers_applied(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until every worker applied a micro-batch: the grouping sources' first transaction
        (a marker to every partition) went through the whole path -- Kafka, the Python
        workers, the Redis apply -- so the first records do not wait for it to warm up."""
        applied = functools.partial(self._applied_since, [None] * self.plan.workers)
        self._wait_ready("work", applied, timeout, poll=0.05)
        self.clock.mark("workers applied a batch")

    def warm_up_workers(self, batches: int, timeout: float = WORK_READY_SECONDS) -> None:
        """Put ``batches`` micro-batches through the whole path before the producers send:
        each a WATERMARK marker of source 0 at event time 0 on every ``work`` partition, waited
        for until every worker applied a later batch than before it. A watermark only ever
        rises, and the run's own producers stamp every record after 1970, so these markers
        change no watermark and no count; they run the driver's per-batch path until it is as
        fast as it will be. In Real-Time Mode each batch is :data:`REAL_TIME_WARM_UP_ROWS`
        markers per partition, for the writers' per-row path."""
        real_time = self.plan.trigger == config.REAL_TIME
        self._put_markers_through(batches, timeout, REAL_TIME_WARM_UP_ROWS if real_time else 1)
        self.clock.mark("workers warmed up")

    def _put_markers_through(self, batches: int, timeout: float, rows: int = 1) -> None:
        """``batches`` times: ``rows`` harmless WATERMARK markers (:meth:`warm_up_workers`) to
        every ``work`` partition, then wait until every worker applied a later batch than
        before."""
        from confluent_kafka import Producer

        from pipeline.io.records import Kind, encode_marker

        marker = encode_marker(Kind.WATERMARK, source=0, time_ms=0)
        topic, workers = self.plan.names.work_topic, self.plan.workers
        producer = Producer(
            kafka_io.producer_config(self.settings.kafka_bootstrap, **{"linger.ms": 0})
        )
        for _ in range(batches):
            before = self.store.applied_batches(workers)
            for partition in range(workers):
                for _ in range(rows):
                    producer.produce(topic, value=marker, partition=partition)
            producer.flush(timeout)
            applied = functools.partial(self._applied_since, before)
            self._wait_ready("work", applied, timeout, poll=0.01)

    def _applied_since(self, before: list[int | None]) -> bool:
        """Whether every worker applied a later micro-batch than in ``before``."""
        now = self.store.applied_batches(len(before))
        return all(b is not None and (a is None or b > a) for a, b in zip(before, now, strict=True))

    def wait_group_ready(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until every source of the grouping stage has started (consumer assigned, producer's
        transactions initialised, table installed); raises if the stage died."""
        counters = GroupingStore(self.store.client, self.plan.run_id)

        def every_source_started() -> bool:
            return counters.sources_started(self.plan.sources)

        self._wait_ready("group", every_source_started, timeout, poll=0.1)
        self.clock.mark("grouping sources ready")  # as polled: at most 0.1 s late

    def wait_control_ready(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until the controller adopted the control plane's state (raises if it died)."""
        from pipeline.io.control_store import ControlPlane

        plane = ControlPlane(self.store.client, self.plan.run_id)
        self._wait_ready("control", plane.controller_started, timeout, poll=0.1)
        self.clock.mark("controller ready")

    def _wait_ready(
        self, stage: str, ready: Callable[[], bool], timeout: float, poll: float = 0.2
    ) -> None:
        """Poll ``ready()`` until true; :class:`StageFailedError` as soon as ``stage`` dies,
        :class:`PipelineError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not ready():
            self.check([stage])
            if time.monotonic() > deadline:
                raise PipelineError(f"{stage} did not start within {timeout:.0f} s")
            time.sleep(poll)

    def kill(self, stage: str, signum: int = signal.SIGKILL) -> None:
        """Signal ``stage`` and all its children (``kill -9`` by default); wait until gone."""
        process = self.stages[stage]
        process.killed = True
        signal_group(process.pgid, signum)
        process.process.wait()
        deadline = time.monotonic() + 30
        while group_alive(process.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every running stage, SIGKILL what is left after ``grace`` seconds."""
        running = [p for p in self.stages.values() if p.exit_code() is None]
        for process in running:
            signal_group(process.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.process.wait(max(0.0, deadline - time.monotonic()))
        for process in self.stages.values():
            if group_alive(process.pgid):
                signal_group(process.pgid, signal.SIGKILL)
            process.process.poll()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None
            self._store = None

    # -- waiting -----------------------------------------------------------------------------

    def check(self, stages: Sequence[str] | None = None) -> None:
        """Raise :class:`StageFailedError` for a stage that exited non-zero or was killed."""
        for name in stages if stages is not None else list(self.stages):
            process = self.stages.get(name)
            if process is None:
                continue
            code = process.exit_code()
            if code is not None and (code != 0 or process.killed):
                reason = "killed" if process.killed else process.reason()
                raise StageFailedError(name, code, reason, process.stderr_path)

    def wait(
        self,
        stages: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        progress_every: float = 1.0,
    ) -> None:
        """Until every stage of ``stages`` (default: all started) exited 0.

        Raises :class:`StageFailedError` as soon as one fails, :class:`PipelineError` on timeout.
        """
        names = [n for n in (stages if stages is not None else self.stages) if n in self.stages]
        deadline = None if timeout is None else time.monotonic() + timeout
        next_report = time.monotonic()
        while True:
            self.check(names)
            if all(self.stages[n].exit_code() == 0 for n in names):
                self.sampler.snapshot(self.store)  # the stages are done: the last snapshot
                return
            # The processed counters every 0.1 s, a latency snapshot about once a second.
            self.sampler.poll(self.store)
            now = time.monotonic()
            if deadline is not None and now > deadline:
                waiting = [n for n in names if self.stages[n].exit_code() is None]
                raise PipelineError(
                    f"timed out after {timeout:.0f} s waiting for {', '.join(waiting)}"
                )
            if on_progress is not None and now >= next_report:
                on_progress(self.progress())
                next_report = now + progress_every
            time.sleep(0.1)

    # -- reading the run ---------------------------------------------------------------------

    @property
    def store(self) -> StateStore:
        if self._store is None:
            from pipeline.io.state_store import StateStore

            self._redis = connect_redis(self.settings.redis_url)
            self._store = StateStore(self._redis, self.plan.run_id)
        return self._store

    def _kafka(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            group = f"skewer-demo-monitor-{uuid.uuid4().hex[:8]}"
            self._consumer = Consumer(
                kafka_io.consumer_config(self.settings.kafka_bootstrap, group)
            )
        return self._consumer

    def _end_offsets(self, topic: str, partitions: int) -> list[int]:
        from confluent_kafka import TopicPartition

        consumer = self._kafka()
        return [
            kafka_io.watermark_offsets(consumer, TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        ]

    def progress(self) -> Progress:
        plan, store = self.plan, self.store
        sent = _produced(store)
        if sent is None:
            in_topic = sum(self._end_offsets(self.input_topic, plan.sources))
            sent = min(in_topic, plan.records)  # minus a few watermark records, while running
        routed = GroupingStore(store.client, plan.run_id).routed_per_worker().values()
        loads = store.processed_per_worker(plan.workers).tolist()
        return Progress(
            elapsed=time.monotonic() - self.started_at,
            produced=sent,
            grouped=sum(int(v) for v in routed),
            processed=sum(loads),
            loads=loads,
            windows_final=store.final_window_count(),
        )

    @property
    def input_topic(self) -> str:
        """Where the run's records come from: ``keys``, or the user's ``--input-topic``."""
        return self.plan.input_topic or self.plan.names.keys_topic

    def timeline(self) -> tuple[int | None, int | None, int | None, int | None]:
        """Kafka timestamps (ms): the first and the last record of ``keys``, the last of
        ``work`` (the grouping stage done) and the last of ``results`` (the last window final).
        A user's topic may hold records of long ago: its run starts and ends with ``work``, or
        with the topic's first record if that came later (a topic written while it is read)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        names, consumer = self.plan.names, self._kafka()
        first_topic, first_partitions = (
            (names.keys_topic, self.plan.sources)
            if self.plan.input_topic is None
            else (names.work_topic, self.plan.workers)
        )
        ends = self._end_offsets(first_topic, first_partitions)
        firsts = [
            kafka_io.first_timestamp(consumer, TopicPartition(first_topic, p, 0))
            for p, end in enumerate(ends)
            if end > 0
        ]
        lasts = [
            kafka_io.last_timestamp(consumer, first_topic, p, end) for p, end in enumerate(ends)
        ]
        routed = [
            kafka_io.last_timestamp(consumer, names.work_topic, p, end)
            for p, end in enumerate(self._end_offsets(names.work_topic, self.plan.workers))
            if end > 0
        ]
        (results_end,) = self._end_offsets(names.results_topic, 1)
        final = kafka_io.last_timestamp(consumer, names.results_topic, 0, results_end)
        first = min((t for t in firsts if t is not None), default=None)
        if self.plan.input_topic is not None and first is not None:
            topic = self.plan.input_topic
            written = [
                kafka_io.first_timestamp(consumer, TopicPartition(topic, p, OFFSET_BEGINNING))
                for p, end in enumerate(self._end_offsets(topic, self.plan.sources))
                if end > 0
            ]
            first = max(first, min((t for t in written if t is not None), default=first))
        last_routed = max((t for t in routed if t is not None), default=None)
        last = max((t for t in lasts if t is not None), default=None)
        return first, last, last_routed, final

    def summary(
        self, verification: RunVerification | RecountVerification | None = None
    ) -> RunSummary:
        """The run's figures (call after the stages finished)."""
        from operators.metrics import latency_quantile
        from pipeline.io.control_store import ControlPlane

        plan, store = self.plan, self.store
        verification = verification or self.verify()
        self.clock.mark("verified")
        if not self.sampler.snapshots:
            self.sampler.snapshot(store)
        loads = store.processed_per_worker(plan.workers).tolist()
        imbalance_final, _, max_avg_ratio = load_figures(loads)
        histograms = [store.latency_histogram(plan.workers, w) for w in range(plan.workers)]
        overall: dict[int, int] = {}
        for histogram in histograms:
            for bucket, count in histogram.items():
                overall[bucket] = overall.get(bucket, 0) + count
        totals = store.window_totals()
        counters = GroupingStore(store.client, plan.run_id)
        dead = counters.dead_letters_by_reason()
        first_ms, last_ms, routed_ms, final_ms = self.timeline()
        seconds = (final_ms - first_ms) / 1000 if first_ms is not None and final_ms else None
        offered = (routed_ms - first_ms) / 1000 if first_ms is not None and routed_ms else None
        processed = sum(loads)
        distinct = totals.get("distinct_keys", 0)
        timing = summary_timing(self.clock, self.sampler, plan.records, first_ms, last_ms, final_ms)
        return RunSummary(
            scheme=plan.scheme,
            run_id=plan.run_id,
            workload=plan.workload,
            workers=plan.workers,
            sources=plan.sources,
            window_ms=plan.window_ms,
            cpu_cost_us=plan.cpu_cost_us,
            records_requested=plan.records,
            # a user's topic: the records it held when the run began (what the run read)
            records_produced=(_produced(store) or 0) if plan.input_topic is None else plan.records,
            records_grouped=sum(counters.routed_per_worker().values()),
            records_processed=processed,
            per_worker=loads,
            latency_p50_per_worker=[latency_quantile(h, 0.5) for h in histograms],
            latency_p99_per_worker=[latency_quantile(h, 0.99) for h in histograms],
            windows=len(store.final_windows()),
            verification=verification,
            seconds=seconds,
            throughput=processed / seconds if seconds else None,
            offered_rate=processed / offered if offered else None,
            latency_p50_ms=latency_quantile(overall, 0.5),
            latency_p99_ms=latency_quantile(overall, 0.99),
            imbalance_final=imbalance_final,
            max_avg_ratio=max_avg_ratio,
            replication=totals.get("state_entries", 0) / distinct if distinct else None,
            dead_letters=sum(dead.values()),
            late_records=sum(counters.late_per_source().values()),
            filtered_records=sum(counters.filtered_per_source().values()),
            top_rows=top_rows(self.store, self.plan.query),
            state_fields=[f.name for f in self.store.declared_fields()],
            dead_letter_reasons=dead,
            stages={name: p.output() for name, p in self.stages.items()},
            restarts={name: p.starts - 1 for name, p in self.stages.items() if p.starts > 1},
            wall_seconds=time.monotonic() - self.started_at,
            migrations=ControlPlane(store.client, plan.run_id).rebalances(),
            **timing,
        )

    def verify(self) -> RunVerification | RecountVerification:
        """Is the run exact? Against the producers' ground truth, or, for a user's topic, a
        Spark batch recount of it (:mod:`pipeline.runs.recount`)."""
        from pipeline.runs.recount import verify_recount
        from pipeline.runs.verify import verify_run

        user_topic = self.plan.user_topic()
        if user_topic is None:
            return verify_run(self.store)
        from pyspark import SparkContext

        from pipeline.io.spark_session import build_spark_session

        # A process that runs Spark already (a test session's workers) lends its session.
        ours = SparkContext._active_spark_context is None
        spark = build_spark_session("skewer-recount", settings=self.settings)
        try:
            return verify_recount(
                spark,
                self.store,
                self.settings.kafka_bootstrap,
                self.plan.names,
                user_topic,
            )
        finally:
            if ours:
                spark.stop()

    def cleanup(self, *, logs: bool = True) -> None:
        """Delete the run's topics, Redis keys, checkpoint and (``logs``) stage logs; nothing
        unless :meth:`prepare` found the run new (never someone else's topics)."""
        if not self.prepared:
            return
        kafka_io.delete_topics(self.settings.kafka_bootstrap, self.plan.topics)
        self.store.delete_run()
        shutil.rmtree(self.plan.checkpoint_dir(self.settings), ignore_errors=True)
        if logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def _produced(store: StateStore) -> int | None:
    """Records the producers acknowledged, once they have all finished (None before)."""
    from pipeline.runs.verify import produced_records

    return produced_records(store) or None


def start_together(pipelines: Sequence[Pipeline]) -> None:
    """Start the stages of several runs side by side, their producers together once every run
    is ready: the Spark applications start at once, then the other stages, then every
    producer. Call from the thread that will stop the runs (a stage dies with the thread that
    started it)."""
    for pipeline in pipelines:
        pipeline.prepare()
        pipeline.start("work")
    for pipeline in pipelines:
        pipeline.wait_work_ready()
    for pipeline in pipelines:
        pipeline.start_all([s for s in pipeline.plan.stages if s not in ("work", "produce")])
    for pipeline in pipelines:
        pipeline.wait_group_ready()
        pipeline.wait_workers_applied()
        if "control" in pipeline.plan.stages:
            pipeline.wait_control_ready()
    for pipeline in pipelines:
        pipeline.start("produce")


# --- one whole run --------------------------------------------------------------------------


def run_pipeline(
    plan: RunPlan,
    settings: config.Settings | None = None,
    *,
    timeout: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    keep: bool = False,
    log: Log | None = None,
    environ: Mapping[str, str] | None = None,
    on_start: Callable[[Pipeline], None] | None = None,
    on_end: Callable[[Pipeline, RunSummary], None] | None = None,
    clock: RunClock | None = None,
) -> RunSummary:
    """Run every stage of ``plan`` to the end and summarize: the one way to run a plan whole.

    ``on_start`` sees the run once its stages started, ``on_end`` once it is summarized and
    before it is deleted (what else to read of it). Whatever happens, the stages are stopped
    and, unless ``keep``, the run's topics, Redis keys and checkpoint deleted; the stage logs
    only when it succeeded. ``clock`` is the command's start-up timeline (default: from the
    call on). Raises :class:`StageFailedError` / :class:`PipelineError`.
    """
    settings = settings or config.load()
    summary: RunSummary | None = None
    with Pipeline(plan, settings, log=log, environ=environ, clock=clock) as pipeline:
        try:
            pipeline.prepare(start_work=True)
            pipeline.start_all()
            if on_start is not None:
                on_start(pipeline)
            pipeline.wait(timeout=timeout, on_progress=on_progress)
            pipeline.clock.mark("every stage exited")  # as wait() polls them: 0.1 s
            summary = pipeline.summary()
            if on_end is not None:
                on_end(pipeline, summary)
            return summary
        finally:
            # Stop what still runs before deleting the run (a failure, Ctrl-C, a timeout);
            # a failed run's logs stay for the error message to point at.
            pipeline.stop()
            if not keep:
                pipeline.cleanup(logs=summary is not None)
