"""The workers on a Spark standalone cluster, and its bad settings.

``skewer services up --spark-workers 2`` runs a standalone master and two workers of 8 cores
from the pip package (:mod:`pipeline.services.spark_standalone`); here the test takes a lease
on them (and stops them at the end if it started them). The demo on such a cluster, exact, is
test_kafka_cluster.py's docs/cluster.md run (``services up --spark-workers 2 --kafka-brokers 3``). A
cluster with fewer executor cores than the tasks of a micro-batch, and a master that does not
answer, are refused at start with one line and exit 2, and the refused session is gone from
the master (nothing left half-started).

Two fault tests kill a part of the cluster (a worker; an executor) with SIGKILL mid-run, each
while two runs share the cluster (each asks for a share of it, ``spark.cores.max``): one
under pkg, one under mixed with a migration in flight, the executor's with the mixed run in
Spark's Real-Time Mode; a third stops an executor for a while (SIGSTOP), and checks that
executors map the driver's class archive; each is described in its docstring.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_runs import (
    REAL_TIME_FIELDS,
    batches_beyond,
    check_exact_without_restarts,
    fault_plan,
    run_of,
    two_runs_at_the_fault_moment,
    wait_for,
)

from bench import chaos
from pipeline.cli import app
from pipeline.io import config
from pipeline.io.spark_session import class_archive_path
from pipeline.runs.orchestrator import Pipeline, start_together
from pipeline.services import manager, process, spark_standalone
from pipeline.services.spark_standalone import SparkWorkerService
from pipeline.stages.worker_job import PYTHON_DAEMON_MODULE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs and kills a native Spark standalone cluster"),
]

CLUSTER = ["spark-master", "spark-worker-1", "spark-worker-2"]


def lease_the_whole_cluster(settings: config.Settings) -> None:
    """This session's lease on the master and both workers, starting whichever is down."""
    states = manager.acquire(settings, CLUSTER)
    assert [s.state for s in states if s.state not in ("started", "running", "external")] == []


@pytest.fixture(scope="module")
def master_url(settings: config.Settings) -> Iterator[str]:
    lease_the_whole_cluster(settings)
    try:
        yield settings.spark_standalone_url
    finally:
        manager.release(settings, CLUSTER)


@pytest.fixture
def whole_cluster(master_url: str, settings: config.Settings) -> str:
    """The cluster with both workers registered and every core free, whatever the test before
    left: a worker a fault test failed to restart is started again here, so one failure does
    not leave every later test short of cores, and an application of an earlier test (another
    module's, which held the cluster before) is gone. The module's lease covers what this
    starts (same holder)."""
    lease_the_whole_cluster(settings)
    deadline = time.monotonic() + 60
    while (left := spark_standalone.active_applications(settings)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"applications of earlier tests still hold the cluster: {left}"
    return master_url


def test_fewer_executor_cores_than_tasks_is_refused_with_exit_2(
    master_url: str, settings: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code = app.main(["demo", "--spark-master", master_url, "--workers", "20", "--records", "1000"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    refusal = (
        "offers 16 executor core(s) (its live workers have 16 in all), fewer than the 20 tasks"
    )
    assert refusal in error, error
    assert spark_standalone.active_applications(settings) == []


def test_a_master_that_does_not_answer_is_refused_with_exit_2(
    settings: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from live_runs import free_port

    url = f"spark://127.0.0.1:{free_port()}"
    code = app.main(["demo", "--spark-master", url, "--records", "1000"])
    assert code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(f"the Spark master {url} does not answer")
    )


def two_runs_on(
    master: str, settings: config.Settings, tag: str, **fields: Any
) -> contextlib.AbstractContextManager[list[Pipeline]]:
    """:func:`live_runs.two_runs_at_the_fault_moment` on the cluster, W = 4 each, so each
    asks for 8 of its 16 cores (its 4 tasks' and as many spare), in two executors of 4, one
    on each worker (``fields``: more of its arguments)."""
    return two_runs_at_the_fault_moment(settings, tag, spark_master=master, workers=4, **fields)


#: How long a lost worker's executors may take to start again once it is back, and finish a
#: task: a hang bound (their JVMs start on a machine busy with two runs).
REPLACEMENT_SECONDS = 360.0


def executors_on(settings: config.Settings, run_id: str, host: str) -> list[int]:
    """The executors of run ``run_id`` on the worker whose host is ``host``."""
    return spark_standalone.executor_pids(settings, [run_id], host=host)


def test_kill_9_of_a_spark_worker_under_two_runs_keeps_both_exact(
    whole_cluster: str, settings: config.Settings
) -> None:
    """What is killed: standalone worker 1's JVM (SIGKILL); the executors on it, one of each
    run, exit with it (they watch their worker). When: two runs share the cluster (pkg, and
    mixed on a drifting stream), while the mixed run has a migration in flight (the controller
    published a table and keys' state moves between workers) and the pkg run has micro-batches
    in flight. Recovery expected: each run's Spark re-runs its lost tasks on its executor on
    worker 2, which has a core for every task (a run asks for twice its tasks' cores), and
    the apply is idempotent per worker and batch, so a task that had applied is skipped; the
    pkg run goes on there (three more micro-batches applied while worker 1 is down), with no
    second executor on worker 2 (it is full: a replacement there would start beside the
    survivor, and its slow first tasks could not be copied, as Spark copies only to another
    host). Then worker 1 is started again, and the pkg run gets an executor back there that
    finishes tasks. The migration completes. No stage of either run restarts, and every (key,
    window) count of each equals its ground truth. (How long a cold replacement holds a run
    back is the soak's measure: docs/performance.md#the-soak.)"""
    worker = SparkWorkerService(settings, 1)
    record = process.read_pid_file(worker.pid_path)
    if record is None:
        pytest.skip("the Spark workers are not this checkout's (started by someone else)")
    # The pkg stream (60 s) outlasts the worker's absence and its executor's return; the mixed
    # one (30 s) its absence, so worker 2 stays full meanwhile, as in a soak.
    with two_runs_on(
        whole_cluster, settings, "spark-worker", records=180_000, mixed={"records": 90_000}
    ) as pipelines:
        pkg = pipelines[0]
        survivor, lost = (spark_standalone.worker_host(settings, i) for i in (2, 1))
        assert len(executors_on(settings, pkg.plan.run_id, lost)) == 1, "one executor on worker 1"
        at_kill = pkg.progress().processed
        assert process.kill(record), "spark-worker-1 was not running"
        # Reaped before the restart, so its web UI port is free for the new worker.
        assert process.wait_gone(record, timeout=10), "the killed worker is still there"
        wait_for(
            pkg,
            lambda p: p.processed >= batches_beyond(pkg, at_kill),
            "three micro-batches of pkg applied on worker 2 while worker 1 is down",
        )
        on_survivor = [len(executors_on(settings, p.plan.run_id, survivor)) for p in pipelines]
        assert on_survivor == [1, 1], (
            f"each run's executors on worker 2: {on_survivor} (one each expected, no replacement)"
        )
        # A lease, not `up`: `up` adopts what it starts, and the worker would outlive the tests.
        states = manager.acquire(settings, [worker.name])
        assert [s.state for s in states] == ["started"]
        deadline = time.monotonic() + REPLACEMENT_SECONDS
        while not any(
            chaos.executor_says(pid, chaos.SERVED)
            for pid in executors_on(settings, pkg.plan.run_id, lost)
        ):
            pkg.check()
            assert pkg.progress().processed < pkg.plan.records, (
                "the pkg run ended before its executor on worker 1 finished a task"
            )
            assert time.monotonic() < deadline, (
                f"no executor of pkg on worker 1 finished a task within "
                f"{REPLACEMENT_SECONDS:.0f} s of the worker's restart"
            )
            time.sleep(0.5)
        for pipeline in pipelines:
            check_exact_without_restarts(pipeline)


def test_kill_9_of_an_executor_of_each_trigger_under_two_runs_keeps_both_exact(
    whole_cluster: str, settings: config.Settings
) -> None:
    """What is killed: one executor JVM of each run (SIGKILL), the workers left running.
    When: two runs share the cluster, pkg in micro-batches with micro-batches in flight, and
    mixed on a drifting stream in Spark's Real-Time Mode with a migration in flight (the
    killed executor held two of its four long-running tasks and their writers). Recovery
    expected: each standalone worker launches a new executor for the application that lost
    one; pkg's Spark re-runs the lost tasks (an apply is idempotent per worker and batch);
    mixed's restarts the real-time batch from its start, and each writer skips every row at
    or below the offset Redis applied for its partition; the migration completes. No stage of
    either run restarts, and every (key, window) count of each equals its ground truth."""
    with two_runs_on(whole_cluster, settings, "spark-executor", mixed=REAL_TIME_FIELDS) as runs:
        for pipeline in runs:
            victims = spark_standalone.executor_pids(settings, [pipeline.plan.run_id])
            assert len(victims) == 2, f"two executors per run expected, found {victims}"
            os.kill(victims[0], signal.SIGKILL)
        for pipeline in runs:
            check_exact_without_restarts(pipeline)


def test_a_stopped_executors_tasks_are_copied_to_the_other_worker_and_the_run_stays_exact(
    whole_cluster: str, settings: config.Settings
) -> None:
    """What is done: one of a micro-batch run's two executors is stopped (SIGSTOP) for
    a while, then resumed: an executor that stalls, as a replacement does while its JVM and
    Python daemon start on a busy machine, or one in a long pause. When: a fifth of the records
    processed, with 20 s of the paced stream left. Expected: each task stuck on it gets a
    speculative copy on the executor of the other worker (a host of its own), so the
    micro-batches go on while it is stopped: three more are applied before it resumes
    (without the copies every batch would wait for it).
    When it resumes, its late attempts apply nothing twice (the apply is idempotent per worker
    and batch). No stage restarts, and every (key, window) count equals the ground truth.
    Before the stall, each executor maps the driver's class archive, was warmed by the job's
    plugin (its Python daemon and a worker per core) before its first task, and runs that one
    daemon only: the tasks found it."""
    plan = fault_plan("pkg", "spark-stall", records=90_000, workers=4, spark_master=whole_cluster)
    with run_of(plan, settings) as pipeline:
        start_together([pipeline])
        wait_for(pipeline, lambda p: p.processed >= plan.records // 5, "a fifth processed")
        victims = spark_standalone.executor_pids(settings, [plan.run_id])
        assert len(victims) == 2, f"two executors expected, found {victims}"
        archive = class_archive_path(settings)
        assert archive is not None and archive.is_file(), "no driver class archive"
        for pid in victims:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert str(archive) in maps, f"executor {pid} does not map {archive}"
            # Warmed before its first task, and the tasks use that daemon: a task whose Python
            # environment differs from the warm-up's (PYTHON_TASK_ENVIRONMENT) starts another.
            log = (Path(f"/proc/{pid}/cwd") / "stderr").read_text()
            assert "warmed the Python daemon and 4 idle workers" in log, log[-2000:]
            daemons = process.child_pids(pid, PYTHON_DAEMON_MODULE.encode())
            assert len(daemons) == 1, f"executor {pid} runs Python daemons {daemons}"
        at_stop = pipeline.progress().processed
        os.kill(victims[0], signal.SIGSTOP)
        try:
            wait_for(
                pipeline,
                lambda p: p.processed >= batches_beyond(pipeline, at_stop),
                "three micro-batches applied while an executor is stopped",
            )
        finally:
            os.kill(victims[0], signal.SIGCONT)
        check_exact_without_restarts(pipeline)
