"""Redis failover with Sentinel: a kill -9 of the primary loses no count, a stage that starts
during a failover waits for it, and sentinels that do not monitor the service are refused at
start.

Each test runs a Sentinel set of its own (``skewer services up --redis-sentinel``, through
:func:`pipeline.services.manager.up`: the primary, 2 replicas and 3 sentinels on free ports,
in the test's own run folder; the session's Kafka), pointed at by ``SKEWER_REDIS_URL`` =
``redis+sentinel://...``, and stops it at the end, pass or fail.

The fault test kills the primary with SIGKILL while two runs use it; its docstring says what is
killed, when and what recovery is expected. What makes them exact: a worker's apply returns
only once a replica acknowledged it (``WAIT 1``), so the replica Sentinel promotes holds every
batch Spark may have committed, and an apply cut off by the kill is retried on the new
primary, where it is applied once (idempotent per worker and batch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_runs import (
    REAL_TIME_FIELDS,
    check_exact_without_restarts,
    free_ports,
    two_runs_at_the_fault_moment,
)

from pipeline.cli import app
from pipeline.io import config, kafka_io, redis_client
from pipeline.io.errors import ServiceUnavailableError
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.services import manager, process, redis_sentinel

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs a native Redis Sentinel set and kills its primary"),
]

SET = ("redis", *redis_sentinel.NAMES)


@pytest.fixture
def sentinel_set(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[config.Settings]:
    """A Sentinel set of this test's own, running; the returned settings are the services'
    (``redis_url`` the primary's); every ``skewer`` the test starts gets the Sentinel URL."""
    own = config.load(
        {
            config.ENV_KAFKA_BOOTSTRAP: settings.kafka_bootstrap,
            config.ENV_RUN_DIR: str(tmp_path / "run"),
            config.ENV_REDIS_URL: f"redis://127.0.0.1:{free_ports(3)}/0",
            config.ENV_REDIS_SENTINEL: f"127.0.0.1:{free_ports(3)}",
        }
    )
    try:
        states = manager.up(own, ["redis"], redis_sentinel_set=True)
        assert [(s.name, s.state) for s in states] == [(name, "started") for name in SET]
        monkeypatch.setenv(config.ENV_RUN_DIR, str(own.run_dir))
        monkeypatch.setenv(config.ENV_REDIS_URL, own.redis_sentinel_url)
        yield own
    finally:
        manager.down(own, SET)


def kill_primary(own: config.Settings) -> int:
    """SIGKILL the process the sentinels name as primary now; its port."""
    _, port = redis_client.require_primary(own.redis_sentinel_url)
    [service] = [s for s in manager.native_services(own, SET) if getattr(s, "port", 0) == port]
    record = process.read_pid_file(service.pid_path)
    assert record is not None, f"{service.name} has no pid file"
    assert process.kill(record), f"{service.name} was not running"
    return port


def wait_for_failover(own: config.Settings, killed_port: int, timeout: float = 30.0) -> int:
    """The port of the replica the sentinels promoted in place of ``killed_port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, port = redis_client.require_primary(own.redis_sentinel_url, timeout=1.0)
        except redis_client.NoPrimaryError:  # the primary is down, none promoted yet
            port = killed_port
        if port != killed_port:
            return port
        time.sleep(0.1)
    raise AssertionError(f"no failover within {timeout:.0f} s of killing port {killed_port}")


def test_a_sentinel_that_names_no_primary_is_refused_with_exit_2(
    sentinel_set: config.Settings,
    settings: config.Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A wrong service name: the sentinels answer but name no primary. ``skewer demo`` and
    ``skewer work`` stop at start with one line and exit 2, before any stage, topic or Spark
    session exists."""
    wrong = sentinel_set.redis_sentinel_url.replace("/skewer/", "/no-such-service/")
    monkeypatch.setenv(config.ENV_REDIS_URL, wrong)
    run_id = f"sentinel-refused-{new_run_id()[5:]}"
    expected = "name no primary for service 'no-such-service'"
    for command in (
        ["demo", "--records", "1000", "--run-id", run_id],
        ["work", "--run-id", run_id, "--workers", "2", "--until-end"],
    ):
        capsys.readouterr()
        code = app.main(command)
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2, lines
        assert len(lines) == 1 and expected in lines[0], lines
        assert lines[0].startswith(f"skewer {command[0]}: error: the Redis Sentinels at ")
    assert not (sentinel_set.run_dir / "demo" / run_id).exists()  # no stage was started
    plan = RunPlan(scheme="pkg", records=1000, run_id=run_id)
    for topic in plan.topics:
        assert kafka_io.topic_partitions(settings.kafka_bootstrap, topic) is None, topic


def test_a_stage_that_starts_during_a_failover_waits_for_it(
    sentinel_set: config.Settings,
) -> None:
    """What is killed: the Redis primary, with SIGKILL, and a stage's Redis client is made at
    once, as when a stage killed a moment before restarts: the sentinels still name the dead
    primary, then none until they promote a replica. Expected: the client waits for the
    failover and answers from the promoted replica, instead of the stage exiting (a named
    primary refusing, then sentinels naming none, had it exit 1, then 2 with "check the service
    name"). With every Redis of the set killed no failover comes: one line after the wait."""
    url = sentinel_set.redis_sentinel_url
    killed = kill_primary(sentinel_set)
    client = redis_client.connect_redis(url)
    assert client.ping()
    _, promoted = client.connection_pool.get_master_address()
    assert promoted != killed
    client.close()

    for service in manager.native_services(sentinel_set, SET):
        record = process.read_pid_file(service.pid_path)
        if not service.name.startswith("redis-sentinel") and record is not None:
            process.kill(record)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError) as refused:
        redis_client.connect_redis(url, failover_wait=3.0)
    assert time.monotonic() - started >= 3.0
    assert "named no primary that answers for service 'skewer' within 3 s" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_kill_9_of_the_primary_under_two_runs_fails_over_and_keeps_both_exact(
    sentinel_set: config.Settings,
) -> None:
    """What is killed: the Redis primary, with SIGKILL. When: two runs use it at once (pkg in
    micro-batches, and mixed on a drifting stream in Spark's Real-Time Mode), while the mixed
    run has a migration in flight (the controller published a table and keys' state moves
    between workers in Redis) and the pkg run has micro-batches in flight. Recovery expected:
    within seconds the sentinels promote a replica, which holds every apply a replica
    acknowledged (``WAIT``); every stage's client (Spark's workers, grouping stage,
    aggregator, controller, producers) reconnects to it through the sentinels and retries, an
    apply cut off is applied there once, and the migration completes. The real-time writers in
    Spark's JVM do the same through Jedis's Sentinel pool, their applies guarded by Kafka
    offsets instead of batch ids. No stage of either run restarts, records produced =
    processed, and every (key, window) count of each equals its ground truth."""
    settings = config.load()
    with two_runs_at_the_fault_moment(settings, "sentinel", mixed=REAL_TIME_FIELDS) as pipelines:
        killed = kill_primary(sentinel_set)
        wait_for_failover(sentinel_set, killed)
        for pipeline in pipelines:
            check_exact_without_restarts(pipeline)
