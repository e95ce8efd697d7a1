"""kill -9 of Redis mid-run: its append-only file brings every count back (issue 13, point 5).

The native Redis writes every command to its append-only file before it replies
(:mod:`pipeline.services.redis_server`), so a killed process loses nothing it acknowledged; the
stages' clients retry through the gap (:func:`pipeline.io.kafka_io.retry_through_restarts`),
and the commands exactness rests on are guarded scripts, so a retry never counts twice.

What is killed, when, and what recovery is expected: a paced pkg run on a Redis of this test's
own (own port and data folder; the session's Kafka) has its Redis process killed with SIGKILL
once about a third of the records are processed; the Redis is started again on the same data
folder about a second later. Every stage must ride out the gap without a restart, and every
(key, window) count must equal the producers' ground truth.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from live_runs import RUN_TIMEOUT, free_port, run_of, wait_for

from pipeline.io import config, probes
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.services import manager

pytestmark = pytest.mark.integration


def test_kill_9_of_redis_with_its_append_only_file_keeps_counts_exact(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is killed: a Redis of this test's own (own port and data folder, append-only
    file), with SIGKILL. When: once a third of a paced pkg run's records are processed; it
    is started again on the same folder about a second later. Recovery expected: every stage
    retries through the gap without a restart, the append-only file brings back everything
    Redis acknowledged, and every (key, window) count equals the ground truth."""
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, settings.kafka_bootstrap)
    monkeypatch.setenv(config.ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.ENV_REDIS_URL, f"redis://127.0.0.1:{free_port()}/0")
    own = config.load()
    [started] = manager.up(own, ["redis"])
    assert started.state == "started" and started.pid is not None
    plan = RunPlan(
        scheme="pkg",
        records=40_000,
        workers=4,
        sources=2,
        workload="zipf:z=1.2,keys=20000,seed=9",
        rate=8_000,
        window_ms=2_000,
        cpu_cost_us=200,
        max_records_per_batch=4_000,
        run_id=f"redis-kill-{new_run_id()[5:]}",
    )
    try:
        with run_of(plan, own) as pipeline:
            pipeline.prepare()
            pipeline.start_all()
            wait_for(pipeline, lambda p: p.processed >= 12_000, "a third processed")
            assert pipeline.progress().processed < plan.records  # mid-run indeed
            os.kill(started.pid, signal.SIGKILL)
            while probes.redis_answers(own.redis_url, timeout=0.2):
                time.sleep(0.05)
            time.sleep(1.0)
            [again] = manager.up(own, ["redis"])
            assert again.state == "started"
            pipeline.wait(timeout=RUN_TIMEOUT)
            summary = pipeline.summary()
            assert summary.restarts == {}
            assert summary.verification.exact, "\n".join(summary.verification.lines())
            assert summary.records_produced == summary.records_processed == plan.records
    finally:
        manager.down(own)
