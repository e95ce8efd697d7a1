"""kill -9 of Redis mid-run: its append-only file brings every count back.

The native Redis writes every command to its append-only file before it replies
(:mod:`pipeline.services.redis_server`), so a killed process loses nothing it acknowledged; the
stages' clients retry through the gap (:func:`pipeline.io.redis_client.retry_through_restarts`),
and the commands exactness rests on are guarded scripts, so a retry never counts twice.

What is killed, when, and what recovery is expected: two paced runs on a Redis of this test's
own (own port and data folder; the session's Kafka), pkg and mixed side by side, have their
Redis process killed with SIGKILL while mixed's keys' state migrates and pkg is mid-run, and the
Redis is started again on the same data folder about a second later. Every stage must ride out
the gap without a restart, and every (key, window) count must equal the producers' truth.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from live_runs import check_exact_without_restarts, free_port, two_runs_at_the_fault_moment

from pipeline.io import config, probes
from pipeline.services import manager

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("kills a native Redis of its own and starts it again on its files"),
]


def test_kill_9_of_redis_under_two_runs_with_its_append_only_file_keeps_both_exact(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is killed: a Redis of this test's own (own port and data folder, append-only
    file), with SIGKILL. When: two paced runs use it at once (pkg, and mixed on a drifting
    stream), while the mixed run has keys' state moving between workers in Redis and the pkg
    run has micro-batches in flight. It is started again on the same folder about a second
    later. Recovery expected: every stage of both runs retries through the gap without a
    restart, the append-only file brings back everything Redis acknowledged, the migration
    completes, and every (key, window) count of each run equals its ground truth."""
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, settings.kafka_bootstrap)
    monkeypatch.setenv(config.ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.ENV_REDIS_URL, f"redis://127.0.0.1:{free_port()}/0")
    own = config.load()
    [started] = manager.up(own, ["redis"])
    assert started.state == "started" and started.pid is not None
    try:
        with two_runs_at_the_fault_moment(own, "redis-kill") as pipelines:
            os.kill(started.pid, signal.SIGKILL)
            while probes.redis_answers(own.redis_url, timeout=0.2):
                time.sleep(0.05)
            time.sleep(1.0)
            [again] = manager.up(own, ["redis"])
            assert again.state == "started"
            for pipeline in pipelines:
                check_exact_without_restarts(pipeline)
    finally:
        manager.down(own)
