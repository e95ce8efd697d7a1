"""The workers in Spark's Real-Time Mode (``skewer work --trigger real-time``) on real Kafka,
Redis and Spark: exact under pkg and under a routing-table scheme with a migration in flight,
and through ``kill -9`` of the Spark driver mid-migration (the executor's kill, on a cluster, is
in test_spark_cluster.py).

Each run is the real ``skewer`` stages as subprocesses, ``skewer work`` included (its own JVM
with the writer's jar): two runs side by side, pkg on a Zipf stream and mixed on a drifting one
whose controller migrates keys every few seconds (:func:`live_runs.two_runs_at_the_fault_moment`).
A real-time batch replays from its start after a failure; the writer's offsets keep that from
counting anything twice (docs/design.md#real-time-mode).
"""

from __future__ import annotations

import pytest
from live_runs import check_exact_without_restarts, two_runs_at_the_fault_moment

from pipeline.io import config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: What makes a fault test's runs real-time ones (Real-Time Mode has no micro-batch size).
REAL_TIME = {"trigger": config.REAL_TIME, "max_records_per_batch": None}


def test_pkg_and_mixed_with_a_migration_in_flight_are_exact(settings: config.Settings) -> None:
    """Both runs to their end with no fault: every (key, window) count equals its ground
    truth, every record produced was applied once, and the migration that was in flight
    completed (the controller moved keys' state while the writers applied their rows)."""
    with two_runs_at_the_fault_moment(settings, "rt", **REAL_TIME) as pipelines:
        for pipeline in pipelines:
            check_exact_without_restarts(pipeline)
        mixed = pipelines[1].summary()
        assert mixed.migrations, "the mixed run completed no migration"


def test_kill_9_of_the_driver_mid_migration_keeps_both_exact(settings: config.Settings) -> None:
    """What is killed: ``skewer work`` of both runs (its driver JVM runs the real-time tasks
    and their writers: a local master), with SIGKILL. When: the mixed run has a migration in
    flight and the pkg run has records in flight. Recovery expected: each restarts from its
    checkpoint; Spark replays the real-time batch that was running, and the writers skip every
    row at or below the offset Redis applied for its partition; the migration completes. Every
    (key, window) count of each run equals its ground truth, each record applied once."""
    with two_runs_at_the_fault_moment(settings, "rt-kill", **REAL_TIME) as pipelines:
        for pipeline in pipelines:
            pipeline.kill("work")
        for pipeline in pipelines:
            assert pipeline.progress().processed < pipeline.plan.records, "killed after the end"
            pipeline.start("work")
        for pipeline in pipelines:
            pipeline.wait(timeout=300)
            summary = pipeline.summary()
            assert summary.restarts == {"work": 1}
            assert summary.verification.exact, "\n".join(summary.verification.lines())
            assert summary.records_produced == summary.records_processed == pipeline.plan.records
