"""One run of the live pipeline: produce, group, work and aggregate as ``skewer`` subprocesses.

``skewer demo`` (and the end-to-end tests and benchmark) run the four stages of issue 4 for
one run id, each as the ``skewer`` command a user would type (``python -m pipeline.cli ...``),
so the demo exercises exactly the product's entry points:

1. the run must be new (no topic or Redis key of it exists, so that cleaning up afterwards
   deletes nothing of anyone else's); its topics are created up front with their partition
   counts (``{prefix}keys``: S, ``{prefix}work``: W, ``dead-letters`` and ``results``: 1) by
   the grouping stage's own :func:`pipeline.stages.grouping.prepare`, which also checks the
   scheme and the services;
2. ``skewer work --until-end`` (Spark) starts first and the run waits until its streaming query
   has committed its first micro-batch (``{checkpoint}/commits``): a JVM takes seconds to
   start, and a producer that ran meanwhile would measure Spark's start-up, not the grouping;
3. ``skewer aggregate --until-end`` and ``skewer group --until-end`` start, then
   ``skewer produce``; the run is over when all four exited 0 (the stages stop by themselves at
   END_OF_STREAM). A stage that exits otherwise stops the run: its last error line and log file
   are reported. A timeout stops it too.

Every stage runs in its own session (process group): Ctrl-C reaches only the orchestrator,
which stops the stages itself (SIGTERM, then SIGKILL after a grace period), and
:meth:`Pipeline.kill` can ``kill -9`` a stage with all its children (the Spark JVM and its
Python workers, the grouping stage's source processes) the way a crashed machine would. Each
stage also gets SIGTERM if the orchestrator dies (``PR_SET_PDEATHSIG``). Stage output goes to
``{run_dir}/demo/{run_id}/{stage}.out|.err``; each stage prints one JSON summary on stdout.

Progress (stderr, about once a second): records produced (the ``keys`` topic's end offsets
while the producer runs, then its acknowledged count), grouped (``stats:routed``), processed
by the workers (``stats:records``), final windows, and the current load of the most loaded
worker against the average (max/avg).

The summary (:class:`RunSummary`) is read from Redis and Kafka after the run:

- ``throughput``: records processed / seconds from the first record of ``keys`` to the last
  record of ``results`` (both Kafka timestamps): from first produce to last window final. With
  an offered load above what the workers can serve (the benchmark's setting), that time is
  set by the most loaded worker, so an overloaded worker shows up as lost throughput;
  ``offered_rate`` is records / seconds from the first record of ``keys`` to the grouping
  stage's last write to ``work``: what producers and stage offered the workers;
- ``latency_p50_ms`` / ``latency_p99_ms``: the workers' latency histograms
  (:mod:`pipeline.io.state_store`: from the grouping stage's write to ``work`` to the worker's
  apply, queueing included), over all workers and per worker;
- ``imbalance_final`` = max_i L_i - avg_i L_i of the records each worker processed,
  ``max_avg_ratio`` = max_i L_i / avg_i L_i (the papers' lambda), ``replication`` = (key,
  worker) state entries / distinct keys summed over windows (1 for key grouping);
- ``exact`` and the mismatches from :func:`pipeline.runs.verify.verify_run` (a user's topic:
  :func:`pipeline.runs.recount.verify_recount`, a Spark batch recount of it).

What each stage is started with comes from the run's :class:`~pipeline.runs.plan.RunPlan`;
the figures are a :class:`~pipeline.runs.summary.RunSummary`. (layer: runs)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from operators.metrics import load_figures
from pipeline.io import config, kafka_io, kafka_security, probes, redis_client
from pipeline.runs.plan import STAGES, RunPlan
from pipeline.runs.summary import RunSummary
from pipeline.services import manager, native
from pipeline.services.process import die_with_parent, group_alive

if TYPE_CHECKING:
    import redis as redis_module

    from pipeline.io.state_store import StateStore
    from pipeline.runs.recount import RecountVerification
    from pipeline.runs.verify import RunVerification

#: Seconds Spark gets to start and commit its first micro-batch.
WORK_READY_SECONDS = 180.0
#: Seconds a stage gets to exit after SIGTERM before SIGKILL (Spark stops its query first).
STOP_GRACE_SECONDS = 15.0
#: The services a run needs (Prometheus is not on the data path).
RUN_SERVICES = ("kafka", "redis")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

Log = Callable[[str], None]


class PipelineError(Exception):
    """The run cannot go on; the message is one line for the user."""


class StageFailedError(PipelineError):
    """A stage exited with a non-zero code (or was killed and not restarted)."""

    def __init__(self, stage: str, code: int | None, reason: str, log_path: Path) -> None:
        self.stage, self.code, self.reason, self.log_path = stage, code, reason, log_path
        super().__init__(f"{stage} failed (exit {code}): {reason} (log: {log_path})")


# --- services -------------------------------------------------------------------------------


@dataclass
class ServiceLease:
    """The services a run made sure of; :meth:`release` stops the ones it had to start."""

    settings: config.Settings
    leased: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.leased:
            manager.release(self.settings, self.leased)
            self.leased = []


def ensure_services(settings: config.Settings, *, start: bool, keep: bool = False) -> ServiceLease:
    """Kafka and Redis answering, natively started if needed (and allowed); else PipelineError.

    Services are only started for loopback addresses (a remote broker is not ours to start),
    and Kafka only for a bootstrap list of one address (a cluster is not ours either).
    Started ones are held by a lease (:func:`pipeline.services.manager.acquire`): the lease's
    release stops them unless someone else (``skewer services up``, a test session) holds them.
    With ``keep`` they are started like ``skewer services up`` and keep running.
    """
    lease = ServiceLease(settings)
    sentinel = redis_client.is_sentinel_url(settings.redis_url)
    if sentinel:
        # Sentinel is never started for a run: before anything starts, its sentinels name a
        # primary, or the run stops (none answers: exit 1; none names a primary: exit 2).
        kafka_io.connect_redis(settings.redis_url).close()
    kafka_host = settings.kafka_host if len(settings.kafka_hosts) == 1 else "(a cluster)"
    redis_host = "(sentinel)" if sentinel else settings.redis_host
    where = {
        "kafka": (kafka_host, settings.kafka_bootstrap, probes.kafka_answers),
        "redis": (redis_host, settings.redis_url, probes.redis_answers),
    }
    down = [name for name in RUN_SERVICES if not where[name][2](where[name][1], timeout=5.0)]
    # Skewer's own broker and Redis speak plaintext, so starting one cannot help a client that
    # asks for TLS or a login: say why the service it asks does not answer (a login refused, a
    # certificate not trusted ...).
    if "kafka" in down and kafka_security.from_environ().protocol != "PLAINTEXT":
        kafka_io.require_kafka(settings.kafka_bootstrap)
        down.remove("kafka")
    if "redis" in down and settings.redis_url.startswith("rediss://"):
        kafka_io.connect_redis(settings.redis_url).close()
        down.remove("redis")
    if not down:
        return lease
    for name in down:
        host, address, _ = where[name]
        if not start or host not in LOOPBACK_HOSTS:
            why = "" if start else " (--no-start)"
            raise PipelineError(
                f"{name} does not answer at {address}{why}; start it: skewer services up"
            )
    try:
        if keep:
            states = manager.up(settings, down)
        else:
            states = manager.acquire(settings, down)
            lease.leased = list(down)
    except native.ServiceError as error:
        raise PipelineError(str(error)) from None
    lease.started = [s.name for s in states if s.state == "started"]
    return lease


# --- processes ------------------------------------------------------------------------------


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@dataclass
class StageProcess:
    """A running (or finished) stage: its process, logs and start count."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    starts: int = 1
    killed: bool = False

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the stage leads its own group

    def exit_code(self) -> int | None:
        return self.process.poll()

    def output(self) -> dict[str, Any] | None:
        """The stage's JSON summary (its last stdout line), if it printed one."""
        lines = [line for line in _read(self.stdout_path).splitlines() if line.strip()]
        if not lines:
            return None
        try:
            parsed = json.loads(lines[-1])
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def reason(self) -> str:
        """The stage's own error line, else the last line of its stderr."""
        lines = [line.strip() for line in _read(self.stderr_path).splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith("skewer ")]
        if ours:
            return ours[-1]
        return lines[-1] if lines else "no error output"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Progress:
    """Where a run is, from Redis and Kafka."""

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
        self._redis: redis_module.Redis | None = None
        self._consumer: Any = None
        self._store: StateStore | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
        self.close()

    def prepare(self) -> None:
        """Check the scheme and services, refuse a run that exists already (its topics or
        Redis keys), and create the run's topics; one line on failure."""
        from pipeline.stages import grouping

        bootstrap = self.settings.kafka_bootstrap
        try:
            kafka_io.require_kafka(bootstrap)
            existing = [t for t in self.plan.topics if kafka_io.topic_partitions(bootstrap, t)]
            client = self.store.client
            if existing or next(client.scan_iter(match=f"{self.store.keys.prefix}*"), None):
                what = f"topic {existing[0]!r}" if existing else "Redis keys"
                raise PipelineError(
                    f"run {self.plan.run_id!r} exists already ({what}); use another --run-id "
                    "and --topic-prefix"
                )
            # From here on the run is ours: cleanup() may delete all of it.
            self.prepared = True
            grouping.prepare(self.plan.stage_config(self.settings))
        except kafka_io.KafkaIOError as error:
            raise PipelineError(str(error)) from None

    def start(self, stage: str) -> StageProcess:
        """Start ``stage`` (again, after :meth:`kill`: same arguments, logs appended)."""
        previous = self.stages.get(stage)
        if previous is not None and previous.exit_code() is None:
            raise PipelineError(f"{stage} is still running")
        argv = [self.python, "-m", "pipeline.cli", *self.plan.argv(stage, self.settings)]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stdout_path = self.log_dir / f"{stage}.out"
        stderr_path = self.log_dir / f"{stage}.err"
        with open(stdout_path, "ab") as stdout, open(stderr_path, "ab") as stderr:
            _mark(stderr, f"=== {time.ctime()}: {' '.join(argv)}")
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=self.environ,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),
            )
        starts = previous.starts + 1 if previous is not None else 1
        self.stages[stage] = StageProcess(stage, argv, process, stdout_path, stderr_path, starts)
        return self.stages[stage]

    def start_all(self, stages: Sequence[str] | None = None, *, ready_timeout: float = 0) -> None:
        """Start ``stages`` (default: the plan's) in :data:`STAGES` order; the others after
        ``work`` is ready, and the producers after ``group`` is."""
        stages = self.plan.stages if stages is None else stages
        for stage in (s for s in STAGES if s in stages):
            self.start(stage)
            if stage == "work":
                began = time.monotonic()
                self.log("waiting for the Spark workers to start ...")
                self.wait_work_ready(ready_timeout or WORK_READY_SECONDS)
                self.log(f"Spark workers ready after {time.monotonic() - began:.1f} s")
            elif stage == "group" and "produce" in stages:
                self.wait_group_ready(ready_timeout or WORK_READY_SECONDS)
        self.log(f"running: {', '.join(s for s in STAGES if s in stages)}")

    def wait_work_ready(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until Spark committed a micro-batch in the run's checkpoint (raises if work died)."""
        commits = self.plan.checkpoint_dir(self.settings) / "commits"
        self._wait_ready("work", lambda: commits.is_dir() and any(commits.iterdir()), timeout)

    def wait_group_ready(self, timeout: float = WORK_READY_SECONDS) -> None:
        """Until every source of the grouping stage has started (consumer assigned, producer's
        transactions initialised, table installed); raises if the stage died."""
        names, client = self.plan.names, self.store.client

        def every_source_started() -> bool:
            pipe = client.pipeline(transaction=False)
            for source in range(self.plan.sources):
                pipe.hexists(names.redis_key("stats", "source", source), "started_ms")
            return all(pipe.execute())

        self._wait_ready("group", every_source_started, timeout, poll=0.1)

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
        _signal_group(process.pgid, signum)
        process.process.wait()
        deadline = time.monotonic() + 30
        while group_alive(process.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every running stage, SIGKILL what is left after ``grace`` seconds."""
        running = [p for p in self.stages.values() if p.exit_code() is None]
        for process in running:
            _signal_group(process.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.process.wait(max(0.0, deadline - time.monotonic()))
        for process in self.stages.values():
            if group_alive(process.pgid):
                _signal_group(process.pgid, signal.SIGKILL)
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
                return
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

            self._redis = kafka_io.connect_redis(self.settings.redis_url)
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
        routed = store.client.hvals(plan.names.redis_key("stats", "routed"))
        loads = store.processed_per_worker(plan.workers).tolist()
        return Progress(
            elapsed=time.monotonic() - self.started_at,
            produced=sent,
            grouped=sum(int(v) for v in routed),
            processed=sum(loads),
            loads=loads,
            windows_final=int(store.client.scard(store.keys.windows_final)),
        )

    @property
    def input_topic(self) -> str:
        """Where the run's records come from: ``keys``, or the user's ``--input-topic``."""
        return self.plan.input_topic or self.plan.names.keys_topic

    def timeline(self) -> tuple[int | None, int | None, int | None]:
        """Kafka timestamps (ms): the first record of ``keys``, the last of ``work`` (the
        grouping stage done) and the last of ``results`` (the last window final). A user's
        topic may hold records of long ago: its run starts at the first record of ``work``."""
        from confluent_kafka import TopicPartition

        names, consumer = self.plan.names, self._kafka()
        first_topic, first_partitions = (
            (names.keys_topic, self.plan.sources)
            if self.plan.input_topic is None
            else (names.work_topic, self.plan.workers)
        )
        firsts = [
            _first_timestamp(consumer, TopicPartition(first_topic, p, 0))
            for p, end in enumerate(self._end_offsets(first_topic, first_partitions))
            if end > 0
        ]
        routed = [
            _last_timestamp(consumer, names.work_topic, p, end)
            for p, end in enumerate(self._end_offsets(names.work_topic, self.plan.workers))
            if end > 0
        ]
        (results_end,) = self._end_offsets(names.results_topic, 1)
        final = _last_timestamp(consumer, names.results_topic, 0, results_end)
        first = min((t for t in firsts if t is not None), default=None)
        last_routed = max((t for t in routed if t is not None), default=None)
        return first, last_routed, final

    def summary(
        self, verification: RunVerification | RecountVerification | None = None
    ) -> RunSummary:
        """The run's figures (call after the stages finished)."""
        from pipeline.io.state_store import latency_quantile
        from pipeline.stages.control_plane import ControlPlane

        plan, store = self.plan, self.store
        verification = verification or self.verify()
        loads = store.processed_per_worker(plan.workers).tolist()
        imbalance_final, _, max_avg_ratio = load_figures(loads)
        histograms = [store.latency_histogram(plan.workers, w) for w in range(plan.workers)]
        overall: dict[int, int] = {}
        for histogram in histograms:
            for bucket, count in histogram.items():
                overall[bucket] = overall.get(bucket, 0) + count
        totals = store.window_totals()
        dead = {
            k.decode(): int(v)
            for k, v in store.client.hgetall(plan.names.redis_key("stats", "dead_letters")).items()
        }
        first_ms, routed_ms, final_ms = self.timeline()
        seconds = (final_ms - first_ms) / 1000 if first_ms is not None and final_ms else None
        offered = (routed_ms - first_ms) / 1000 if first_ms is not None and routed_ms else None
        processed = sum(loads)
        distinct = totals.get("distinct_keys", 0)
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
            records_grouped=sum(
                int(v) for v in store.client.hvals(plan.names.redis_key("stats", "routed"))
            ),
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
            late_records=sum(
                int(v) for v in store.client.hvals(plan.names.redis_key("stats", "late_input"))
            ),
            dead_letter_reasons=dead,
            stages={name: p.output() for name, p in self.stages.items()},
            restarts={name: p.starts - 1 for name, p in self.stages.items() if p.starts > 1},
            wall_seconds=time.monotonic() - self.started_at,
            migrations=ControlPlane(store.client, plan.run_id).rebalances(),
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
                user_topic.topic,
                user_topic.extractor,
                user_topic.window_ms,
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


def _mark(stream: IO[bytes], line: str) -> None:
    stream.write(f"{line}\n".encode())
    stream.flush()


def _produced(store: StateStore) -> int | None:
    """Records the producers acknowledged, once they have all finished (None before)."""
    from pipeline.runs.verify import produced_records

    return produced_records(store) or None


def _first_timestamp(consumer: Any, partition: Any, timeout: float = 10.0) -> int | None:
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


def _last_timestamp(
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


# --- one whole run --------------------------------------------------------------------------


def run_pipeline(
    plan: RunPlan,
    settings: config.Settings | None = None,
    *,
    timeout: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    keep: bool = False,
    log: Log | None = None,
) -> RunSummary:
    """Run all four stages of ``plan`` to the end and summarize; cleans up unless ``keep``.

    Raises :class:`StageFailedError` / :class:`PipelineError` (stages stopped, logs kept).
    """
    settings = settings or config.load()
    with Pipeline(plan, settings, log=log) as pipeline:
        pipeline.prepare()
        pipeline.start_all()
        pipeline.wait(timeout=timeout, on_progress=on_progress)
        summary = pipeline.summary()
        if not keep:
            pipeline.cleanup()
    return summary
