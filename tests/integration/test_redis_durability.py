"""kill -9 of Redis mid-run: its append-only file brings every count back.

The native Redis writes every command to its append-only file before it replies
(:mod:`pipeline.services.redis_server`), so a killed process loses nothing it acknowledged; the
stages' clients retry through the gap (:func:`pipeline.io.redis_client.retry_through_restarts`),
and the commands exactness rests on are guarded scripts, so a retry never counts twice.

What is killed, when, and what recovery is expected: a paced run on a Redis of this test's own
(own port and data folder; the session's Kafka) has its Redis process killed with SIGKILL mid-run
-- under pkg a quarter through, under mixed while keys' state migrates -- and the Redis is
started again on the same data folder about a second later. Every stage must ride out the gap
without a restart, and every (key, window) count must equal the producers' ground truth.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from live_runs import (
    check_exact_without_restarts,
    fault_plan,
    free_port,
    run_of,
    wait_for_the_fault_moment,
)

from pipeline.io import config, probes
from pipeline.services import manager

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("kills a native Redis of its own and starts it again on its files"),
]


@pytest.mark.parametrize("scheme", ["pkg", "mixed"])
def test_kill_9_of_redis_with_its_append_only_file_keeps_counts_exact(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """What is killed: a Redis of this test's own (own port and data folder, append-only
    file), with SIGKILL. When: for pkg, once a quarter of a paced run's records are processed;
    for mixed on a drifting stream, while a migration is in flight (keys' state moving between
    workers in Redis). It is started again on the same folder about a second later. Recovery
    expected: every stage retries through the gap without a restart, the append-only file
    brings back everything Redis acknowledged, a migration completes, and every (key, window)
    count equals the ground truth."""
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, settings.kafka_bootstrap)
    monkeypatch.setenv(config.ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.ENV_REDIS_URL, f"redis://127.0.0.1:{free_port()}/0")
    own = config.load()
    [started] = manager.up(own, ["redis"])
    assert started.state == "started" and started.pid is not None
    plan = fault_plan(scheme, f"redis-kill-{scheme}")
    try:
        with run_of(plan, own) as pipeline:
            pipeline.prepare()
            pipeline.start_all()
            wait_for_the_fault_moment(pipeline)
            os.kill(started.pid, signal.SIGKILL)
            while probes.redis_answers(own.redis_url, timeout=0.2):
                time.sleep(0.05)
            time.sleep(1.0)
            [again] = manager.up(own, ["redis"])
            assert again.state == "started"
            check_exact_without_restarts(pipeline)
    finally:
        manager.down(own)
