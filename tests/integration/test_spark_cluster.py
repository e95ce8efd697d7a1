"""The workers on a Spark standalone cluster (issue 13, point 1), and its bad settings.

``skewer services up --spark-workers 2`` runs a standalone master and two workers of 4 cores
from the pip package (:mod:`pipeline.services.spark_standalone`); here the test takes a lease
on them (and stops them at the end if it started them). The demo on such a cluster, exact, is
test_kafka_cluster.py's README run (``services up --spark-workers 2 --kafka-brokers 3``). A
cluster with fewer executor cores than the tasks of a micro-batch, and a master that does not
answer, are refused at start with one line and exit 2, and the refused session is gone from
the master (nothing left half-started).

Two fault tests kill a part of the cluster with SIGKILL mid-run (issue 13, point 5), each under
pkg and under mixed with a migration in flight; each is described in its docstring.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_runs import check_exact_without_restarts, fault_plan, run_of, wait_for_the_fault_moment

from pipeline.cli import app
from pipeline.io import config, probes
from pipeline.services import manager, process
from pipeline.services.spark_standalone import SparkMasterService, SparkWorkerService

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
    """The cluster with both workers registered, whatever the test before left: a worker a
    fault test failed to restart is started again here, so one failure does not leave every
    later test short of cores. The module's lease covers what this starts (same holder)."""
    lease_the_whole_cluster(settings)
    return master_url


def active_applications(settings: config.Settings) -> list[object]:
    status = probes.spark_status(SparkMasterService(settings).master_web_url)
    assert status is not None
    return list(status["activeapps"])


def test_fewer_executor_cores_than_tasks_is_refused_with_exit_2(
    master_url: str, settings: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code = app.main(["demo", "--spark-master", master_url, "--workers", "12", "--records", "1000"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert "offers 8 executor core(s), fewer than the 12 tasks" in error, error
    assert active_applications(settings) == []


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


def executor_pids() -> list[int]:
    """The pids of the executor JVMs on this machine (the cluster's, in a test run)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in command:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("scheme", ["pkg", "mixed"])
def test_kill_9_of_a_spark_worker_mid_run_keeps_counts_exact(
    whole_cluster: str, settings: config.Settings, scheme: str
) -> None:
    """What is killed: standalone worker 1's JVM (SIGKILL); its executor exits with it (it
    watches its worker). When: for pkg, once a quarter of the records are processed, with
    micro-batches in flight; for mixed on a drifting stream, while a migration is in flight
    (the controller published a table and keys' state moves between workers). Recovery
    expected: Spark re-runs the lost tasks on worker 2's executor (the apply is idempotent per
    worker and batch, so a task that had applied is skipped); worker 1 is started again and
    its new executor joins; the migration completes. No stage restarts, and every
    (key, window) count equals the ground truth."""
    worker = SparkWorkerService(settings, 1)
    record = process.read_pid_file(worker.pid_path)
    if record is None:
        pytest.skip("the Spark workers are not this checkout's (started by someone else)")
    plan = fault_plan(scheme, f"spark-worker-{scheme}", spark_master=whole_cluster)
    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        pipeline.start_all()
        wait_for_the_fault_moment(pipeline)
        assert process.kill(record), "spark-worker-1 was not running"
        # Reaped before the restart, so its web UI port is free for the new worker.
        assert process.wait_gone(record, timeout=10), "the killed worker is still there"
        # A lease, not `up`: `up` adopts what it starts, and the worker would outlive the tests.
        states = manager.acquire(settings, [worker.name])
        assert [s.state for s in states] == ["started"]
        check_exact_without_restarts(pipeline)


@pytest.mark.parametrize("scheme", ["pkg", "mixed"])
def test_kill_9_of_an_executor_mid_run_keeps_counts_exact(
    whole_cluster: str, settings: config.Settings, scheme: str
) -> None:
    """What is killed: one executor JVM (SIGKILL), its worker left running. When: for pkg,
    once a quarter of the records are processed; for mixed on a drifting stream, while a
    migration is in flight. Recovery expected: the standalone worker launches a new executor
    for the application, Spark re-runs the lost tasks, the migration completes, and every
    (key, window) count equals the ground truth with no stage restarted."""
    plan = fault_plan(scheme, f"spark-executor-{scheme}", spark_master=whole_cluster)
    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        pipeline.start_all()
        wait_for_the_fault_moment(pipeline)
        victims = executor_pids()
        assert victims, "no executor JVM found"
        os.kill(victims[0], signal.SIGKILL)
        check_exact_without_restarts(pipeline)
