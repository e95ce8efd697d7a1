"""The workers in Spark's Real-Time Mode (``skewer work --trigger real-time``) on real Kafka,
Redis and Spark: exact under pkg, and under a routing-table scheme through ``kill -9`` of the
Spark driver with a migration in flight (the executor's kill, on a cluster, is in
test_spark_cluster.py; the Redis primary's, in test_redis_sentinel.py).

Each run is the real ``skewer`` stages as subprocesses, ``skewer work`` included (its own JVM
with the writer's jar): two runs side by side, pkg on a Zipf stream and mixed on a drifting one
whose controller migrates keys every few seconds (:func:`live_runs.two_runs_at_the_fault_moment`).
A real-time batch replays from its start after a failure; the writer's offsets keep that from
counting anything twice (docs/design.md#real-time-mode).
"""

from __future__ import annotations

import pytest
from live_runs import (
    REAL_TIME_FIELDS,
    check_exact_without_restarts,
    two_runs_at_the_fault_moment,
    wait_for_stages,
)

from pipeline.io import config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pkg_to_its_end_and_mixed_through_a_kill_9_of_its_driver_mid_migration_are_exact(
    settings: config.Settings,
) -> None:
    """Two real-time runs side by side. pkg runs to its end untouched: no stage restarts, and
    every (key, window) count equals its ground truth. What is killed in the mixed run:
    ``skewer work`` (its driver JVM runs the real-time tasks and their writers: a local
    master), with SIGKILL. When: a migration is in flight (the controller moves keys' state
    while the writers apply their rows). Recovery expected: the job restarts from its
    checkpoint; Spark replays the real-time batch that was running, and the writers skip every
    row at or below the offset Redis applied for its partition; the migration completes. Every
    (key, window) count equals its ground truth, each record applied once."""
    with two_runs_at_the_fault_moment(settings, "rt", **REAL_TIME_FIELDS) as (pkg, mixed):
        mixed.kill("work")
        assert mixed.progress().processed < mixed.plan.records, "killed after the end"
        mixed.start("work")
        check_exact_without_restarts(pkg)
        wait_for_stages(mixed)
        summary = mixed.summary()
        assert summary.restarts == {"work": 1}
        assert summary.verification.exact, "\n".join(summary.verification.lines())
        assert summary.records_produced == summary.records_processed == mixed.plan.records
        assert summary.migrations, "the mixed run completed no migration"
