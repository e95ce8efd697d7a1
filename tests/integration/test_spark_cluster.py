"""The workers on a Spark standalone cluster (issue 13, point 1), and its bad settings.

``skewer services up --spark-workers 2`` runs a standalone master and two workers of 4 cores
from the pip package (:mod:`pipeline.services.spark_standalone`); here the test takes a lease
on them (and stops them at the end if it started them). The demo on such a cluster, exact, is
test_kafka_cluster.py's README run (``services up --spark-workers 2 --kafka-brokers 3``). A
cluster with fewer executor cores than the tasks of a micro-batch, and a master that does not
answer, are refused at start with one line and exit 2, and the refused session is gone from
the master (nothing left half-started).

Two fault tests kill a part of the cluster with SIGKILL mid-run (issue 13, point 5), each while
a pkg run and a mixed run with a migration in flight share the cluster, so that one kill strikes
both schemes; each is described in its docstring. Each run asks the standalone master for the
cores of its tasks only (``spark.cores.max``), which is what lets two runs share it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_runs import (
    check_exact_without_restarts,
    fault_plan,
    runs_side_by_side,
    wait_for_the_fault_moment,
)

from pipeline.cli import app
from pipeline.io import config, probes
from pipeline.runs.orchestrator import Pipeline
from pipeline.runs.plan import RunPlan
from pipeline.services import manager, process
from pipeline.services.spark_standalone import SparkMasterService, SparkWorkerService

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTER = ["spark-master", "spark-worker-1", "spark-worker-2"]


@pytest.fixture(scope="module")
def master_url(settings: config.Settings) -> Iterator[str]:
    states = manager.acquire(settings, CLUSTER)
    assert [s.state for s in states if s.state not in ("started", "running", "external")] == []
    try:
        yield settings.spark_standalone_url
    finally:
        manager.release(settings, CLUSTER)


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


def application_of(executor_pid: int) -> str:
    """The application id an executor JVM serves (its ``--app-id`` argument)."""
    arguments = Path(f"/proc/{executor_pid}/cmdline").read_bytes().split(b"\0")
    return arguments[arguments.index(b"--app-id") + 1].decode()


def side_by_side_plans(master_url: str, tag: str) -> list[RunPlan]:
    """A pkg run and a mixed run on a drifting stream, W = 8 in 4 Spark tasks each: two
    applications that share the cluster's 8 cores (each asks for its 4, ``spark.cores.max``),
    so that one kill strikes both schemes. 10 s of records, so each is still going at the
    other's moment. (At W = 4 the drifting stream stayed within mixed's balance bound in one
    run of three, and no migration came.)"""
    return [
        fault_plan(scheme, f"{tag}-{scheme}", tasks=4, records=30_000, spark_master=master_url)
        for scheme in ("pkg", "mixed")
    ]


def wait_until_both_are_mid_run(pkg: Pipeline, mixed: Pipeline) -> None:
    """A quarter of pkg's records processed, then a migration of mixed in flight, and pkg
    still going."""
    wait_for_the_fault_moment(pkg)
    wait_for_the_fault_moment(mixed)
    assert pkg.progress().processed < pkg.plan.records, "the pkg run ended before the fault"


def test_kill_9_of_a_spark_worker_mid_run_keeps_counts_exact(
    master_url: str, settings: config.Settings
) -> None:
    """What is killed: standalone worker 1's JVM (SIGKILL), and with it the executor of each
    application on it (an executor watches its worker). When: while a pkg run has processed
    more than a quarter of its records and a mixed run on a drifting stream has a migration in
    flight (the controller published a table and keys' state moves between workers), both on
    the cluster at once. Recovery expected: each application re-runs its lost tasks on its
    executor on worker 2 (the apply is idempotent per worker and batch, so a task that had
    applied is skipped); worker 1 is started again and new executors join; the migration
    completes. No stage restarts, and every (key, window) count of both runs equals the
    ground truth."""
    worker = SparkWorkerService(settings, 1)
    record = process.read_pid_file(worker.pid_path)
    if record is None:
        pytest.skip("the Spark workers are not this checkout's (started by someone else)")
    with runs_side_by_side(side_by_side_plans(master_url, "spark-worker"), settings) as runs:
        wait_until_both_are_mid_run(*runs)
        os.kill(record.pid, signal.SIGKILL)
        # A lease, not `up`: `up` adopts what it starts, and the worker would outlive the tests.
        states = manager.acquire(settings, [worker.name])
        assert [s.state for s in states] == ["started"]
        for pipeline in runs:
            check_exact_without_restarts(pipeline)


def test_kill_9_of_an_executor_mid_run_keeps_counts_exact(
    master_url: str, settings: config.Settings
) -> None:
    """What is killed: one executor JVM of each of two applications (SIGKILL), their workers
    left running. When: while a pkg run has processed more than a quarter of its records and a
    mixed run on a drifting stream has a migration in flight, both on the cluster at once.
    Recovery expected: the standalone workers launch a new executor for each application,
    Spark re-runs the lost tasks, the migration completes, and every (key, window) count of
    both runs equals the ground truth with no stage restarted."""
    with runs_side_by_side(side_by_side_plans(master_url, "spark-executor"), settings) as runs:
        wait_until_both_are_mid_run(*runs)
        by_application = {application_of(pid): pid for pid in executor_pids()}
        assert len(by_application) == 2, f"executors of two applications: {by_application}"
        for pid in by_application.values():
            os.kill(pid, signal.SIGKILL)
        for pipeline in runs:
            check_exact_without_restarts(pipeline)
