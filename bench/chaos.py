"""Faults for the soak (``skewer bench soak``): a schedule of kill -9s drawn from a seed, and
the kills and restarts themselves, on the cluster services and the stages of running pipelines.

Each fault kills one process with SIGKILL, keeps it down for :data:`DOWN_SECONDS`, and starts
it again the way docs/cluster.md says (a service with ``skewer services up NAME``, a stage with
its own arguments); an executor is restarted by Spark itself (restarted once its replacement has
registered with the driver), a Redis primary is replaced by the sentinels' failover before the
dead one comes back as a replica (docs/performance.md#the-soak).

Example (the same seed, the same schedule):
    >>> faults = schedule(6, 300.0, seed=7)
    >>> [f.kind for f in faults] == [f.kind for f in schedule(6, 300.0, seed=7)]
    True
    >>> len(faults), all(60.0 <= f.at_s <= 240.0 for f in faults)
    (6, True)
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What a fault kills: a Kafka node (every other one the transaction coordinator of a grouping
#: source), a Spark standalone worker (with its executors), one executor, the Redis primary, one
#: source process of a grouping stage, an aggregator, a controller (waiting up to
#: :data:`MIGRATION_WAIT_SECONDS` for a migration in flight).
KINDS = (
    "broker",
    "spark-worker",
    "executor",
    "redis-primary",
    "group-source",
    "aggregator",
    "controller",
)
#: Seconds a killed process stays down before it is started again.
DOWN_SECONDS = 3.0
#: How long an executor fault waits for Spark's replacement executor to register with its
#: driver (its JVM starts on a busy machine), and then again for it to finish a task, which is
#: when the fault counts as restarted.
REPLACEMENT_SECONDS = 180.0
#: What an executor writes to its stderr (in its work directory, its current directory) once
#: its driver has accepted it: from then on it takes tasks ...
REGISTERED = b"Successfully registered with driver"
#: ... and once it has finished one: a replacement's first tasks, cold, lose to speculation's
#: copies on a warm executor and are killed, for up to a minute on a busy machine
#: (docs/design.md#spark-pitfalls), and until one of its tasks finishes the run is not back.
SERVED = b"INFO Executor: Finished task"
#: How long a controller fault waits for a table's publication, to strike in its migration.
MIGRATION_WAIT_SECONDS = 20.0
#: Of the faults after the first, the share that strikes together with the one before it, and
#: the share that strikes while the one before it recovers (its process just restarted).
TOGETHER = 0.2
DURING_RECOVERY = 0.2


@dataclass(frozen=True)
class Fault:
    """Kill ``kind`` at ``at_s`` seconds into the soak; ``pick`` chooses which one (a run, a
    node, a worker, a source: modulo how many there are)."""

    at_s: float
    kind: str
    pick: int


def schedule(
    count: int,
    seconds: float,
    seed: int,
    kinds: Sequence[str] = KINDS,
    *,
    margin: float = 0.2,
) -> list[Fault]:
    """``count`` faults over the middle of a soak of ``seconds`` (``margin`` of it left quiet
    at either end), every kind in turn in an order drawn from ``seed``. Each fault after the
    first joins the episode of the one before it with probability :data:`TOGETHER` (at the
    same moment) and :data:`DURING_RECOVERY` (just after the episode's first restart), unless
    its kind is in the episode already (so two faults never kill the same process at once);
    the others are episodes of their own, spread evenly with a random jitter. In time order."""
    if count < 0 or not kinds:
        raise ValueError("a fault schedule needs a count >= 0 and at least one kind")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"no fault kind {unknown[0]!r}; kinds: {', '.join(KINDS)}")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    chosen = [order[i % len(order)] for i in range(count)]
    # Episodes: a fault that follows the one before it joins that one's episode, at that one's
    # moment or just after its restart.
    offsets: list[float | None] = []  # None: the fault starts an episode of its own
    episode_kinds: set[str] = set()
    for i in range(count):
        draw = rng.random()
        if i and chosen[i] not in episode_kinds and draw < TOGETHER + DURING_RECOVERY:
            offsets.append(0.0 if draw < TOGETHER else DOWN_SECONDS + 1.0)
            episode_kinds.add(chosen[i])
        else:
            offsets.append(None)
            episode_kinds = {chosen[i]}
    episodes = sum(1 for offset in offsets if offset is None)
    start, span = seconds * margin, seconds * (1 - 2 * margin)
    slot = span / max(episodes, 1)
    faults: list[Fault] = []
    episode, at = -1, start
    for offset, kind in zip(offsets, chosen, strict=True):
        if offset is None:
            episode += 1
            at = start + slot * (episode + 0.5 + rng.uniform(-0.25, 0.25))
        moment = min(at + (offset or 0.0), start + span)
        faults.append(Fault(round(moment, 3), kind, rng.randrange(1 << 16)))
    return sorted(faults, key=lambda fault: fault.at_s)


@dataclass
class Struck:
    """What one fault did: when its process was killed and started again (seconds into the
    soak), what it was, and why it could not strike (then nothing was killed)."""

    fault: Fault
    target: str = ""
    killed_s: float | None = None
    restarted_s: float | None = None
    skipped: str | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at_s": self.fault.at_s,
            "kind": self.fault.kind,
            "target": self.target,
            "killed_s": self.killed_s,
            "restarted_s": self.restarted_s,
            "skipped": self.skipped,
            "error": self.error,
            **self.details,
        }

    @classmethod
    def from_dict(cls, recorded: dict[str, Any]) -> Struck:
        """The fault :meth:`as_dict` recorded (its ``pick`` is not: 0), without what the
        checks added to it (``recovery_s``)."""
        own = {"at_s", "kind", "target", "killed_s", "restarted_s", "skipped", "error"}
        return cls(
            Fault(recorded["at_s"], recorded["kind"], 0),
            target=recorded["target"],
            killed_s=recorded["killed_s"],
            restarted_s=recorded["restarted_s"],
            skipped=recorded["skipped"],
            error=recorded["error"],
            details={k: v for k, v in recorded.items() if k not in own | {"recovery_s"}},
        )


class Injector:
    """Strikes faults on the cluster services of ``settings`` and the stages of ``pipelines``
    (:class:`pipeline.runs.orchestrator.Pipeline`), each in a thread of its own at its time.

    While a stage is down for a fault it is in :attr:`down`, so that whoever watches the
    pipelines does not take its exit for a failure. Every stage is started from the thread that
    started the pipelines (:meth:`serve`): a stage dies with the thread that started it."""

    def __init__(
        self,
        settings: Any,
        pipelines: Sequence[Any],
        origin: float,
        log: Callable[[str], None] = lambda _line: None,
        applied: Callable[[], bool] = lambda: False,
    ) -> None:
        self.settings = settings
        self.pipelines = list(pipelines)
        self.origin = origin
        self.log = log
        #: Whether every run has applied all of its records: no batch is left for a
        #: replacement executor to serve.
        self.applied = applied
        self.struck: list[Struck] = []
        self.down: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Stage starts wait here for the main thread (serve()).
        self._starts: list[tuple[int, str, threading.Event]] = []

    def now(self) -> float:
        return round(time.monotonic() - self.origin, 3)

    # -- the schedule ----------------------------------------------------------------------

    def launch(self, faults: Sequence[Fault]) -> None:
        """Strike every fault at its time, from a thread per fault (overlaps run at once)."""

        def strike_at(fault: Fault) -> None:
            time.sleep(max(0.0, fault.at_s - self.now()))
            self.strike(fault)

        for fault in faults:
            thread = threading.Thread(target=strike_at, args=(fault,), daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def busy(self) -> bool:
        """A fault is still to strike or to recover."""
        return any(t.is_alive() for t in self._threads)

    def serve(self) -> None:
        """Start the stages faults asked for (call often, from the pipelines' own thread)."""
        with self._lock:
            starts, self._starts = self._starts, []
        for run, stage, done in starts:
            try:
                self.pipelines[run].start(stage)
            finally:
                done.set()

    def _start_stage(self, run: int, stage: str) -> None:
        done = threading.Event()
        with self._lock:
            self._starts.append((run, stage, done))
        done.wait()

    # -- one fault -------------------------------------------------------------------------

    def strike(self, fault: Fault) -> Struck:
        struck = Struck(fault)
        with self._lock:
            self.struck.append(struck)
        action = getattr(self, "_" + fault.kind.replace("-", "_"))
        try:
            action(fault, struck)
        except Exception as error:  # recorded: the soak's result names it
            struck.error = f"{type(error).__name__}: {error}"
        restarted = (
            "its replacements served" if fault.kind in ("executor", "spark-worker") else "restarted"
        )
        what = (
            struck.skipped
            or struck.error
            or struck.details.get("replacement")
            or f"{restarted} at {struck.restarted_s} s"
        )
        self.log(
            f"fault at {struck.killed_s or self.now()} s: {fault.kind} {struck.target}: {what}"
        )
        return struck

    def _killed(self, struck: Struck, target: str) -> None:
        struck.target = target
        struck.killed_s = self.now()

    def _restarted(self, struck: Struck) -> None:
        struck.restarted_s = self.now()

    def _kill_service(
        self,
        name: str,
        struck: Struck,
        while_down: Callable[[], None] = lambda: None,
        back: Callable[[], None] | None = None,
        **up_options: Any,
    ) -> None:
        """kill -9 the native service ``name``, keep it down (``while_down()`` first), ``services
        up`` it again (with ``up_options``); restarted then, or once ``back()`` returns."""
        from pipeline.services import manager, process

        [service] = manager.native_services(self.settings, [name])
        record = process.read_pid_file(service.pid_path)
        if record is None or not process.kill(record):
            struck.skipped = f"{name} was not running"
            return
        self._killed(struck, name)
        process.wait_gone(record, timeout=30)
        while_down()
        time.sleep(DOWN_SECONDS)
        manager.up(self.settings, [name], **up_options)
        if back is None:
            self._restarted(struck)
        else:
            back()

    def _broker(self, fault: Fault, struck: Struck) -> None:
        from pipeline.io import config, probes
        from pipeline.services.kafka_broker import node_name

        node = 1 + fault.pick % config.KAFKA_CLUSTER_NODES
        if fault.pick % 2 == 0:  # the coordinator of a grouping source's transactions
            pipeline = self.pipelines[fault.pick // 2 % len(self.pipelines)]
            transactional_id = pipeline.plan.names.transactional_id(fault.pick // 4 % 2)
            node = probes.transaction_coordinator(self.settings.kafka_bootstrap, transactional_id)
            struck.details["coordinator_of"] = transactional_id
        self._kill_service(node_name(node), struck)

    def _spark_worker(self, fault: Fault, struck: Struck) -> None:
        from pipeline.services.spark_standalone import executor_pids, worker_host, worker_name

        workers = sorted(_spark_workers(self.settings))
        if not workers:
            struck.skipped = "no Spark worker runs"
            return
        index = workers[fault.pick % len(workers)]
        host = worker_host(self.settings, index)
        runs = [p.plan.run_id for p in self.pipelines]
        # The executors on it exit with it: the runs that had one are back at full strength
        # once their replacements have registered, not when the worker is.
        lost = {
            run: set(executor_pids(self.settings, [run]))
            for run in runs
            if executor_pids(self.settings, [run], host=host)
        }

        def replaced() -> None:
            struck.details["worker_restarted_s"] = self.now()
            self._until_replaced(struck, lost)

        self._kill_service(worker_name(index), struck, back=replaced)

    def _executor(self, fault: Fault, struck: Struck) -> None:
        from pipeline.services.spark_standalone import executor_pids

        pipeline = self.pipelines[fault.pick % len(self.pipelines)]
        deadline = time.monotonic() + 30  # the master may be slow to answer, or relaunching one
        while not (pids := executor_pids(self.settings, [pipeline.plan.run_id])):
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if not pids:
            struck.skipped = f"{pipeline.plan.run_id} has no executor"
            return
        pid = sorted(pids)[fault.pick // 2 % len(pids)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._killed(struck, f"executor {pid} of {pipeline.plan.run_id}")
        self._until_replaced(struck, {pipeline.plan.run_id: set(pids)})

    def _until_replaced(self, struck: Struck, lost: Mapping[str, set[int]]) -> None:
        """Restarted once each run of ``lost`` has an executor beyond the pids it had before the
        fault that has finished a task: Spark's master starts a replacement on a worker with
        free cores, it registers with its driver (``registered_s``), and the run is back at
        full strength once its cold first tasks stop losing to speculation's copies
        (docs/performance.md#the-soak)."""
        deadline = time.monotonic() + REPLACEMENT_SECONDS
        if not self._until_replacements_say(lost, REGISTERED, deadline):
            struck.details["replacement"] = f"none registered within {REPLACEMENT_SECONDS:g} s"
            return
        struck.details["registered_s"] = self.now()
        ended = False

        def streams_ended() -> bool:
            nonlocal ended
            ended = self.applied()
            return ended

        if not self._until_replacements_say(lost, SERVED, deadline, or_else=streams_ended):
            struck.details["replacement"] = f"none finished a task within {REPLACEMENT_SECONDS:g} s"
            return
        if ended:
            # Registered, but the streams ended first: no task was left for it, and the runs
            # are back as far as a run can be; its recovery ends with the last record applied.
            struck.details["served"] = "no task: the streams ended first"
        self._restarted(struck)

    def _until_replacements_say(
        self,
        lost: Mapping[str, set[int]],
        line: bytes,
        deadline: float,
        or_else: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Whether each run of ``lost`` had an executor beyond its pids there write ``line``
        (:func:`executor_says`), or ``or_else()`` held, before ``deadline``
        (``time.monotonic()``)."""
        from pipeline.services.spark_standalone import executor_pids

        while True:
            fresh = [set(executor_pids(self.settings, [run])) - old for run, old in lost.items()]
            if all(any(executor_says(pid, line) for pid in pids) for pids in fresh) or or_else():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def _redis_primary(self, fault: Fault, struck: Struck) -> None:
        from pipeline.io import redis_client
        from pipeline.services import manager, redis_sentinel

        sentinels = self.settings.redis_sentinel_url
        _, port = redis_client.require_primary(sentinels)
        names = ("redis", *redis_sentinel.NAMES)
        services = manager.native_services(self.settings, names, redis_sentinel_set=True)
        [primary] = [s.name for s in services if getattr(s, "port", 0) == port]

        def until_failover() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):  # no primary named yet
                    if redis_client.require_primary(sentinels, 1.0)[1] != port:
                        struck.details["failover_s"] = round(self.now() - (struck.killed_s or 0), 3)
                        return
                time.sleep(0.1)

        self._kill_service(primary, struck, until_failover, redis_sentinel_set=True)

    def _group_source(self, fault: Fault, struck: Struck) -> None:
        """kill -9 one source process of a grouping stage: the stage starts it again
        (:func:`pipeline.stages.grouping.run_sources`), and it resumes at its committed offset.
        A stage that fails instead is started again with its own arguments."""
        from pipeline.services.process import child_pids

        run = fault.pick % len(self.pipelines)
        pipeline = self.pipelines[run]
        stage = pipeline.stages["group"]
        sources = child_pids(stage.process.pid, b"spawn_main")  # not its resource tracker
        if stage.exit_code() is not None or not sources:
            struck.skipped = "the grouping stage is not running"
            return
        with self._lock:
            self.down.add((run, "group"))
        try:
            victim = sources[fault.pick // 2 % len(sources)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            self._killed(struck, f"group source {victim} of {pipeline.plan.run_id}")
            deadline = time.monotonic() + 30
            while stage.exit_code() is None and time.monotonic() < deadline:
                now = child_pids(stage.process.pid, b"spawn_main")
                if len(now) == len(sources) and victim not in now:
                    self._restarted(struck)  # by its stage
                    return
                time.sleep(0.1)
            if stage.exit_code() is None:  # it neither restarted the source nor failed
                pipeline.kill("group")
            time.sleep(DOWN_SECONDS)
            self._start_stage(run, "group")
            self._restarted(struck)
        finally:
            with self._lock:
                self.down.discard((run, "group"))

    def _kill_stage(
        self, run: int, stage: str, struck: Struck, while_down: Callable[[], None] = lambda: None
    ) -> None:
        """kill -9 ``stage`` of run ``run``, keep it down (``while_down()`` first), start it
        again with its own arguments."""
        pipeline = self.pipelines[run]
        process = pipeline.stages.get(stage)
        if process is None or process.exit_code() is not None:
            struck.skipped = f"{stage} of {pipeline.plan.run_id} is not running"
            return
        with self._lock:
            self.down.add((run, stage))
        try:
            pipeline.kill(stage)
            self._killed(struck, f"{stage} of {pipeline.plan.run_id}")
            while_down()
            time.sleep(DOWN_SECONDS)
            self._start_stage(run, stage)
            self._restarted(struck)
        finally:
            with self._lock:
                self.down.discard((run, stage))

    def _aggregator(self, fault: Fault, struck: Struck) -> None:
        self._kill_stage(fault.pick % len(self.pipelines), "aggregate", struck)

    def _controller(self, fault: Fault, struck: Struck) -> None:
        from pipeline.io.control_store import ControlPlane
        from pipeline.io.redis_client import connect_redis

        runs = [i for i, p in enumerate(self.pipelines) if "control" in p.plan.stages]
        if not runs:
            struck.skipped = "no run has a controller"
            return
        run = runs[fault.pick % len(runs)]
        pipeline = self.pipelines[run]
        plane = ControlPlane(connect_redis(pipeline.settings.redis_url), pipeline.plan.run_id)
        try:
            version = _published_migration(plane, MIGRATION_WAIT_SECONDS, struck.details)

            def note_phase() -> None:
                # Whether the kill came before COMPLETE: the phase the dead controller left.
                if version is not None:
                    phase = plane.migration(version).get("phase")
                    struck.details["mid_migration"] = phase == "running"

            struck.details["mid_migration"] = False
            self._kill_stage(run, "control", struck, while_down=note_phase)
        finally:
            plane.client.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait for every fault to strike and recover, starting the stages they ask for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.busy and (deadline is None or time.monotonic() < deadline):
            self.serve()
            time.sleep(0.05)
        self.serve()


def executor_says(pid: int, line: bytes) -> bool:
    """Whether executor ``pid`` has written ``line`` (:data:`REGISTERED`, :data:`SERVED`) to the
    ``stderr`` of its work directory; False once it is gone."""
    try:
        return line in (Path(f"/proc/{pid}/cwd") / "stderr").read_bytes()
    except OSError:
        return False


def _published_migration(plane: Any, timeout: float, details: dict[str, Any]) -> int | None:
    """The version of the migration ``plane``'s controller has in flight, polled every 5 ms
    until one is published (a migration runs for a few hundred milliseconds), or None after
    ``timeout`` s; the last error reading Redis (a failover meanwhile) goes to ``details``."""
    from redis.exceptions import RedisError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (version := plane.current().migrating) is not None:
                details["table_version"] = version
                return version
        except RedisError as error:
            details["wait_error"] = f"{type(error).__name__}: {error}"
        time.sleep(0.005)
    return None


def _spark_workers(settings: Any) -> list[int]:
    """The indexes of the Spark standalone workers with a pid file."""
    from pipeline.services import manager
    from pipeline.services.spark_standalone import SparkWorkerService

    return [
        s.index
        for s in manager.native_services(settings, ["spark"])
        if isinstance(s, SparkWorkerService)
    ]
