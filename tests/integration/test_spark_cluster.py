"""The workers on a Spark standalone cluster (issue 13, point 1), and its bad settings.

``skewer services up --spark-workers 2`` runs a standalone master and two workers of 4 cores
from the pip package (:mod:`pipeline.services.spark_standalone`); here the test takes a lease
on them (and stops them at the end if it started them). ``skewer demo --spark-master
spark://...`` then runs the workers as executors of that cluster, and every (key, window)
count must equal the ground truth. A cluster with fewer executor cores than the tasks of a
micro-batch, and a master that does not answer, are refused at start with one line and exit
2, and the refused session is gone from the master (nothing left half-started).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pipeline.cli import app
from pipeline.io import config, probes
from pipeline.services import manager
from pipeline.services.spark_standalone import SparkMasterService

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


def test_demo_on_a_standalone_cluster_is_exact(
    master_url: str, settings: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--spark-master", master_url, "--records", "20000", "--verify", "--json"]
    code = app.main([*argv, "--scheme", "pkg", "--workers", "8"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["exact"] is True
    assert report["records_produced"] == report["records_processed"] == 20_000
    assert len(report["per_worker"]) == 8 and min(report["per_worker"]) > 0
    assert active_applications(settings) == []


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
