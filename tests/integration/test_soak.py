"""The soak's short version: ``skewer bench soak`` for 2 minutes with three faults, on a
cluster of the test's own.

The test starts every service the soak runs on, each on free ports in its own run folder
(``skewer services up --kafka-brokers 3 --spark-workers 2 --redis-sentinel``, through
:func:`pipeline.services.manager.up`): three Kafka nodes, a Spark standalone master with two
workers, a Redis primary with two replicas and three sentinels, and a Prometheus; it stops them
all at the end, pass or fail. Seed 197 strikes three faults at once, a kill -9 of a Kafka node,
of an executor and of the Redis primary, 46 s into both runs, so that a minute of the stream
is left for the replacements (an executor fault is recovered when its replacement has finished
a task).

What it asserts is what must hold on any machine: both runs exact (no partial state left),
every record applied once, every fault struck and recovered, no stage or service left stopped.
The flatness and timing checks (partial-state keys, lag back within 30 s, p99 within 1.5x, RSS
within 10 %) are the hour-long run's (``bench/results/soak.md``): two minutes are all warm-up
and recovery, and the machine runs other tests beside this one, so here they are reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_runs import free_ports

from bench import soak
from pipeline.io import config
from pipeline.services import manager

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs a Kafka, Spark and Redis Sentinel cluster of its own"),
]

MINUTES = 2.0
FAULTS = 3
SEED = 197
KINDS = ("broker", "executor", "redis-primary")
#: Records per second of each run: a low load, so that the check holds beside other tests.
RATE = 1_000.0


def own_cluster_environ(settings: config.Settings, run_dir: Path) -> dict[str, str]:
    """Every service on free ports of its own: Kafka node i on base + 2(i - 1) (client) and
    the next (controller), Spark's master and the UIs on the next four, Prometheus after them;
    the Redis primary and its replicas, and the sentinels, on three ports each."""
    nodes = config.KAFKA_CLUSTER_NODES
    base = free_ports(2 * nodes + 5)
    return {
        **settings.environ(),
        config.ENV_RUN_DIR: str(run_dir),
        config.ENV_KAFKA_BOOTSTRAP: ",".join(f"127.0.0.1:{base + 2 * i}" for i in range(nodes)),
        config.ENV_KAFKA_CONTROLLER: f"127.0.0.1:{base + 1}",
        config.ENV_SPARK_STANDALONE: f"127.0.0.1:{base + 2 * nodes}",
        config.ENV_PROMETHEUS_URL: f"http://127.0.0.1:{base + 2 * nodes + 4}",
        config.ENV_REDIS_URL: f"redis://127.0.0.1:{free_ports(3)}/0",
        config.ENV_REDIS_SENTINEL: f"127.0.0.1:{free_ports(3)}",
    }


@pytest.fixture
def cluster(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[config.Settings]:
    """The cluster services, running (their settings); the environment points every ``skewer``
    at them, Redis through its sentinels."""
    own = config.load(own_cluster_environ(settings, tmp_path / "run"))
    cluster = {"kafka_brokers": 3, "spark_workers": 2, "redis_sentinel_set": True}
    names = [s.name for s in manager.native_services(own, **cluster)]
    try:
        states = manager.up(own, **cluster)
        assert [s.state for s in states] == ["started"] * len(states), states
        for name, value in own.environ().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(config.ENV_REDIS_URL, own.redis_sentinel_url)
        yield own
    finally:
        manager.down(own, names)


def test_two_minutes_with_three_faults_at_once_keeps_both_runs_exact(
    cluster: config.Settings,
) -> None:
    """What is killed: a Kafka node, an executor and the Redis primary, all at once (seed 197),
    46 s into a two-minute soak of a mixed run and a pkg run side by side on a
    drifting stream, each service restarted after 3 s. Recovery expected: the cluster's
    survivors carry on (a broker's partitions and transactions move, Spark starts another
    executor, the sentinels promote a replica), the killed services rejoin, and both runs end
    with every (key, window) count equal to its ground truth."""
    result = soak.run(
        minutes=MINUTES,
        load=0.5,
        faults=FAULTS,
        seed=SEED,
        kinds=KINDS,
        rate=RATE,
        services=cluster,
        log=print,
    )
    print(result.markdown)  # shown when the test fails
    data, checks = result.data, result.data["checks"]
    struck = [(f["kind"], f["target"], f["skipped"], f["error"]) for f in data["faults"]]
    assert checks["faults_struck"] == FAULTS, struck
    assert checks["faults_failed"] == [], struck
    assert sorted(f["kind"] for f in data["faults"]) == sorted(KINDS)
    # An executor fault is restarted when Spark's replacement has finished its first task.
    assert all(f["restarted_s"] is not None for f in data["faults"]), struck
    for summary in data["summaries"]:
        assert "failed" not in summary, summary
        assert summary["exact"], "\n".join(summary["verification"])
        assert summary["produced"] == summary["processed"] == summary["records"], summary
    assert checks["no_stage_left_stopped"], (data["stopped"], data["services_down"])
    assert len(data["samples"]) >= MINUTES * 60 * 0.9  # one a second, a few lost to failovers
    assert "| every (key, window) count exact, both runs | yes |" in result.markdown
    assert "series" in result.figures  # the harness saves it as soak_series.png
