"""Live runs for the end-to-end tests: the ``skewer`` stages as subprocesses, the workers as a
streaming query in the test session's shared Spark application (the ``spark`` fixture).

Spark's start-up (a JVM, then Python workers) dominates a short run, so tests that run several
pipelines give each its own query in one Spark application --
:func:`pipeline.stages.worker_job.run`, the code ``skewer work`` runs -- while producer, grouping
stage, aggregator and controller are the real subprocesses
(:class:`pipeline.runs.orchestrator.Pipeline`). Each run keeps its own topics, Redis keys and
checkpoint, and each query reads only its own run's ``work`` topic with one task per partition,
so partition w is still worker w.
"""

from __future__ import annotations

import contextlib
import faulthandler
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.io import config
from pipeline.io.kafka_io import RunNames
from pipeline.runs.orchestrator import Pipeline, start_together
from pipeline.runs.plan import RunPlan
from pipeline.runs.summary import RunSummary

#: How long a run may go without any progress (records produced, grouped, applied, windows
#: closed) before a wait on it fails: a hang. A slow machine makes progress, only more slowly,
#: so no wait bounds a run's speed; a run that stalls this long on a machine three times slower
#: than this one is stuck.
STALL_SECONDS = 300.0
#: A run plan's fields for a run in Spark's Real-Time Mode (which has no micro-batch size).
REAL_TIME_FIELDS: dict[str, Any] = {"trigger": config.REAL_TIME, "max_records_per_batch": None}


@contextlib.contextmanager
def run_of(plan: RunPlan, settings: config.Settings) -> Iterator[Pipeline]:
    """The pipeline of ``plan``; its run is stopped and deleted at the end, pass or fail (the
    stage logs stay when it failed)."""
    pipeline = Pipeline(plan, settings)
    passed = False
    try:
        yield pipeline
        passed = True
    finally:
        pipeline.stop()
        pipeline.cleanup(logs=passed)
        pipeline.close()


class ProgressWatch:
    """Fails a wait on ``pipeline`` once its progress has stood still for
    :data:`STALL_SECONDS`: :meth:`saw` each progress read, or :meth:`look` to read one."""

    def __init__(self, pipeline: Pipeline, what: str) -> None:
        self.pipeline, self.what = pipeline, what
        self.last: tuple[int, ...] | None = None
        self.moved = time.monotonic()

    def saw(self, progress: Any) -> None:
        figures = (progress.produced, progress.grouped, progress.processed, progress.windows_final)
        if figures != self.last:
            self.last, self.moved = figures, time.monotonic()
        assert time.monotonic() - self.moved < STALL_SECONDS, (
            f"waiting for {self.what}: the run made no progress for {STALL_SECONDS:.0f} s "
            f"({progress.line(self.pipeline.plan.records)})"
        )

    def look(self) -> None:
        self.saw(self.pipeline.progress())


def wait_for_stages(pipeline: Pipeline, stages: list[str] | None = None) -> None:
    """Until every stage of ``stages`` (default: all started) exited 0; fails at once when one
    fails, and when the run made no progress for :data:`STALL_SECONDS`."""
    watch = ProgressWatch(pipeline, f"{', '.join(stages or pipeline.stages)} to end")
    pipeline.wait(stages, on_progress=watch.saw, progress_every=2.0)


def run_watched(plan: RunPlan, settings: config.Settings) -> RunSummary:
    """``run_pipeline(plan)``, the one way to run a plan whole, failing when the run made no
    progress for :data:`STALL_SECONDS`."""
    from pipeline.runs.orchestrator import run_pipeline

    watch: list[ProgressWatch] = []
    return run_pipeline(
        plan,
        settings,
        on_start=lambda pipeline: watch.append(ProgressWatch(pipeline, "the run to end")),
        on_progress=lambda progress: watch[0].saw(progress),
    )


def start_worker_query(
    plan: RunPlan, settings: config.Settings, spark: Any
) -> Callable[[Pipeline], None]:
    """Start ``plan``'s workers as a query in ``spark`` on a thread of their own; returns
    ``join(pipeline)``, which waits for the worker job to end and fails if it ended with an
    error, or if the run made no progress for :data:`STALL_SECONDS` meanwhile."""
    from pipeline.stages import worker_job

    failure: list[BaseException] = []

    def work() -> None:
        try:
            worker_job.run(plan.work_options(settings), spark)
        except BaseException as error:
            failure.append(error)

    worker = threading.Thread(target=work, name=f"work-{plan.run_id}", daemon=True)
    worker.start()

    def join(pipeline: Pipeline) -> None:
        watch = ProgressWatch(pipeline, "the worker job to end")
        while worker.is_alive() and not failure:
            worker.join(2.0)
            try:
                watch.look()
            except AssertionError as stalled:
                report = report_hang(spark, plan.run_id)
                raise AssertionError(f"{plan.run_id}: {stalled}; {report}") from None
        worker.join(30)
        # Where it failed, not only why: a lost py4j connection reads "X does not exist in the
        # JVM" whichever call it broke.
        if failure:
            where = "".join(traceback.format_exception(failure[0])[-12:])
            raise AssertionError(f"{plan.run_id}: the worker job failed: {failure[0]}\n{where}")

    return join


def report_hang(spark: Any, run_id: str) -> str:
    """What a worker query that did not finish was doing, for the failure's message: its
    status and last progress, with the driver JVM's threads, the test process's Python
    threads and the Python workers' stacks written to a file in the temporary folder. The
    query is then stopped, so that later tests in the same Spark application get its slots."""
    lines: list[str] = []
    query = next((q for q in spark.streams.active if q.name == RunNames(run_id).work_query), None)
    if query is not None:
        progress = query.lastProgress or {}
        lines.append(
            f"query status {query.status}, last batch {progress.get('batchId')} "
            f"at {progress.get('timestamp')} ({progress.get('numInputRows')} rows)"
        )
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    jvm_threads = _command_output(["jcmd", str(jvm_pid), "Thread.print"])
    dump = [*lines, jvm_threads]
    workers = _command_output(["pgrep", "-f", "pyspark.daemon|pyspark/daemon|worker_task"])
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    for pid in workers.split():
        dump.append(_command_output([py_spy, "dump", "--pid", pid]))
    with tempfile.NamedTemporaryFile("w+", suffix=".txt") as python_threads:
        faulthandler.dump_traceback(python_threads, all_threads=True)
        python_threads.seek(0)
        dump.append(python_threads.read())
    path = Path(tempfile.gettempdir()) / f"skewer-hang-{run_id}.txt"
    path.write_text("\n\n".join(dump))
    stream = _thread_frames(
        jvm_threads, f'"stream execution thread for {RunNames(run_id).work_query}'
    )
    if stream:
        lines.append(f"its stream thread at {' < '.join(stream[0][:3])}")
    tasks = Counter(
        " < ".join(frames[:3])
        for frames in _thread_frames(jvm_threads, '"Executor task launch worker')
    )
    lines.append(
        f"{sum(tasks.values())} running tasks at: "
        + " | ".join(f"{count}x {where}" for where, count in tasks.most_common())
        + f"; thread dumps in {path}"
    )
    if query is not None:
        stopper = threading.Thread(target=query.stop, daemon=True)
        stopper.start()
        stopper.join(30)
        lines.append("query stopped" if not stopper.is_alive() else "query.stop() hung too")
    return "; ".join(lines)


JDK_FRAMES = ("java.", "javax.", "jdk.", "sun.")


def _thread_frames(thread_dump: str, name_prefix: str) -> list[list[str]]:
    """The stack frames (``at ...``, innermost first) of each thread whose name starts so,
    the JDK's own left out when others remain (they say a socket is read, not who reads)."""
    stacks: list[list[str]] = []
    for block in thread_dump.split("\n\n"):
        if block.startswith(name_prefix):
            frames = [line.strip()[3:] for line in block.splitlines() if "\tat " in line]
            stacks.append([f for f in frames if not f.startswith(JDK_FRAMES)] or frames)
    return stacks


def _command_output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{argv[0]}: {error}"
    return done.stdout + done.stderr


@contextlib.contextmanager
def shared_spark_run(
    plan: RunPlan,
    settings: config.Settings,
    spark: Any,
    *,
    during: Callable[[Pipeline], None] | None = None,
) -> Iterator[Pipeline]:
    """Run ``plan`` to its end with the workers as a query in ``spark``; yields the finished
    run's pipeline (topics and Redis keys still there), then deletes the run.

    ``during(pipeline)`` runs once every stage has started (a fault test's kill).
    """
    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        join_workers = start_worker_query(plan, settings, spark)
        others = [stage for stage in plan.stages if stage != "work"]
        pipeline.start_all(others)
        if during is not None:
            during(pipeline)
        wait_for_stages(pipeline, ["produce", "group"])
        join_workers(pipeline)
        wait_for_stages(pipeline, [s for s in others if s not in ("produce", "group")])
        yield pipeline


def batches_beyond(pipeline: Pipeline, processed: int, batches: int = 3) -> int:
    """Records applied once ``batches`` more micro-batches than at ``processed`` are: a run
    applies one batch at a time, so at least ``batches - 1`` were planned after that moment."""
    return processed + batches * (pipeline.plan.max_records_per_batch or 1)


def wait_for(pipeline: Pipeline, condition: Any, what: str) -> None:
    """Poll the run's progress until ``condition(progress)``. A stage that died fails at once,
    and a run whose progress stood still for :data:`STALL_SECONDS` fails then."""
    watch = ProgressWatch(pipeline, what)
    while not condition(progress := pipeline.progress()):
        pipeline.check()
        watch.saw(progress)
        time.sleep(0.05)


def skewer(environ: dict[str, str], *argv: str, timeout: float) -> subprocess.CompletedProcess:
    """``skewer ARGV...`` as a user runs it: a process of its own with ``environ``, its output
    captured, its exit code returned (never raised)."""
    command = [sys.executable, "-m", "pipeline.cli", *argv]
    return subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 now (for services of a
    test's own). Drawn at random between skewer's default ports (all below 20000) and the
    kernel's ephemeral range: a port the kernel handed out (``bind(0)``) can go to another
    process's outgoing connection, or to a test session running beside this one, before the
    service binds it (one did, and a Kafka node's raft client spoke to another test's node)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        first = random.randrange(20_000, ephemeral_low - count)
        probes = [socket.socket() for _ in range(count)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", first + offset))
            return first
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError(f"no {count} free ports in a row")


def free_port() -> int:
    """One TCP port free on 127.0.0.1 now (:func:`free_ports`)."""
    return free_ports(1)


def fault_plan(scheme: str, tag: str, **fields: Any) -> RunPlan:
    """A paced run long enough to kill something in its middle (~8 s of records): pkg on a
    Zipf stream, or mixed on a drifting one (the hot set changes every 2 s, so migrations come
    every few seconds, the drift measured against the plan's W); ``fields`` add to or override
    the plan's (``spark_master=...``)."""
    from pipeline.runs.plan import new_run_id

    drifting = scheme == "mixed"
    workers = fields.get("workers", 8)
    plan: dict[str, Any] = {
        "scheme": scheme,
        "records": 24_000,
        "workers": workers,
        "sources": 2,
        "workload": (
            f"drift:mode=fluctuate,z=1.0,keys=5000,intervals=4,workers={workers},seed=3"
            if drifting
            else "zipf:z=1.2,keys=20000,seed=11"
        ),
        "rate": 3_000,
        "window_ms": 2_000,
        "cpu_cost_us": 100,
        "max_records_per_batch": 4_000,
        "control_interval": 1.0,
        "run_id": f"{tag}-{new_run_id()[5:]}",
    }
    return RunPlan(**{**plan, **fields})


def kill_group_and_work_mid_run(
    settings: config.Settings, run_id: str, records_total: int
) -> RunSummary:
    """``kill -9`` of ``skewer group`` (with its source processes) a quarter through, and of
    ``skewer work`` (driver, JVM and Python workers) half way; both restart with the same
    arguments (the Spark job from its checkpoint). The producer is paced and each worker waits
    200 µs per record in micro-batches of at most 4,000 records, so both kills land mid-run.
    Asserts each stage restarted once and every record was grouped; returns the summary."""
    plan = RunPlan(
        scheme="pkg",
        records=records_total,
        workers=4,
        sources=2,
        workload="zipf:z=1.2,keys=20000,seed=5",
        rate=8_000,
        window_ms=2_000,
        cpu_cost_us=200,
        max_records_per_batch=4_000,
        run_id=run_id,
    )
    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        pipeline.start_all()
        wait_for(pipeline, lambda p: p.grouped >= records_total // 4, "a quarter grouped")
        pipeline.kill("group")
        assert pipeline.progress().grouped < records_total  # mid-run indeed
        pipeline.start("group")
        wait_for(pipeline, lambda p: p.processed >= records_total // 2, "half processed")
        pipeline.kill("work")
        assert pipeline.progress().processed < records_total
        pipeline.start("work")
        wait_for_stages(pipeline)
        summary = pipeline.summary()
    assert summary.restarts == {"group": 1, "work": 1}
    assert summary.verification.exact, "\n".join(summary.verification.lines())
    assert summary.records_produced == summary.records_processed == records_total
    assert summary.records_grouped == records_total
    return summary


def wait_for_a_migration(pipeline: Pipeline) -> None:
    """Wait until the run's controller has a migration in flight (a table published, keys'
    state moving between workers)."""
    from pipeline.io.control_store import ControlPlane
    from pipeline.io.redis_client import connect_redis

    plan = pipeline.plan
    plane = ControlPlane(connect_redis(pipeline.settings.redis_url), plan.run_id)
    try:
        # A run that ends without one fails now, not at the timeout.
        wait_for(
            pipeline,
            lambda p: plane.current().migrating is not None or p.processed >= plan.records,
            "a migration in flight",
        )
        assert plane.current().migrating is not None, f"{plan.run_id}: no migration came"
    finally:
        plane.client.close()


def wait_for_the_fault_moment(pipeline: Pipeline, fraction: float = 0.25) -> None:
    """Wait for the moment a fault test strikes: for a routing-table scheme (the run has a
    controller), a migration in flight; for any other, ``fraction`` of the records processed.
    Either way the run must still be going, or the fault would test nothing."""
    plan = pipeline.plan
    if "control" in plan.stages:
        wait_for_a_migration(pipeline)
    else:
        wait_for(
            pipeline, lambda p: p.processed >= plan.records * fraction, f"{fraction:.0%} processed"
        )
    assert pipeline.progress().processed < plan.records, "the run ended before the fault"


@contextlib.contextmanager
def two_runs_at_the_fault_moment(
    settings: config.Settings,
    tag: str,
    mixed: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Iterator[list[Pipeline]]:
    """A pkg run and a mixed run (:func:`fault_plan`; ``fields`` for both, ``mixed`` for the
    mixed one only, over ``fields``) side by side, their producers started together once both
    runs are ready; yields them once the mixed one, on a drifting stream, has a migration in
    flight, with both still running: the moment a fault test strikes both at once. The pkg
    run's stream is the longer (20 s against 8 s), so it still has records in flight then.

    Both producers have written records by then: a stage connects to its services once as it
    starts, and one still starting when the fault strikes would fail at its start instead of
    riding out the fault (:func:`wait_until_each_produces`)."""
    plans = [
        fault_plan("pkg", f"{tag}-pkg", **{"records": 60_000, **fields}),
        fault_plan("mixed", f"{tag}-mixed", **{**fields, **(mixed or {})}),
    ]
    with contextlib.ExitStack() as runs:
        pipelines = [runs.enter_context(run_of(plan, settings)) for plan in plans]
        start_together(pipelines)
        wait_until_each_produces(pipelines)
        wait_for_the_fault_moment(pipelines[1])
        pkg = pipelines[0]
        assert pkg.progress().processed < pkg.plan.records, "the pkg run ended before the fault"
        yield pipelines


def wait_until_each_produces(pipelines: list[Pipeline]) -> None:
    """Wait until every run's producer has written records, so that each has passed its start
    (the last of a run's stages to start, :func:`~pipeline.runs.orchestrator.start_together`)."""
    for pipeline in pipelines:
        wait_for(pipeline, lambda p: p.produced > 0, f"{pipeline.plan.run_id}'s first records")


def check_exact_without_restarts(pipeline: Pipeline) -> None:
    """Wait for the run's end, then :func:`assert_exact_without_restarts` on its summary."""
    wait_for_stages(pipeline)
    assert_exact_without_restarts(pipeline.summary(), pipeline.plan)


def assert_exact_without_restarts(summary: RunSummary, plan: RunPlan) -> None:
    """No stage restarted, every record produced was processed, and every (key, window)
    count equals the ground truth."""
    run = plan.run_id
    assert summary.restarts == {}, f"{run}: stages restarted: {summary.restarts}"
    assert summary.verification.exact, f"{run}:\n" + "\n".join(summary.verification.lines())
    assert summary.records_produced == summary.records_processed == plan.records, run
