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
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.io import config
from pipeline.runs.orchestrator import Pipeline
from pipeline.runs.plan import RunPlan

#: Seconds the stages of one run may take (several share two cores).
RUN_TIMEOUT = 300.0


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
    from pipeline.stages import worker_job

    failure: list[BaseException] = []

    def work() -> None:
        try:
            worker_job.run(plan.work_options(settings), spark)
        except BaseException as error:
            failure.append(error)

    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        worker = threading.Thread(target=work, name=f"work-{plan.run_id}", daemon=True)
        worker.start()
        others = [stage for stage in plan.stages if stage != "work"]
        pipeline.start_all(others)
        if during is not None:
            during(pipeline)
        pipeline.wait(["produce", "group"], timeout=RUN_TIMEOUT)
        worker.join(RUN_TIMEOUT)
        assert not failure, f"{plan.run_id}: the worker job failed: {failure[0]}"
        assert not worker.is_alive(), f"{plan.run_id}: the worker job did not finish"
        pipeline.wait([s for s in others if s not in ("produce", "group")], timeout=120)
        yield pipeline


def wait_for(pipeline: Pipeline, condition: Any, what: str, timeout: float = 120.0) -> None:
    """Poll the run's progress until ``condition(progress)``; a stage that died fails at once."""
    deadline = time.monotonic() + timeout
    while not condition(pipeline.progress()):
        pipeline.check()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a service of a test's own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
