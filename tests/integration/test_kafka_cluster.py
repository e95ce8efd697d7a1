"""Kafka as a cluster of three KRaft nodes: the demo on it, its fault tests,
and a replication it cannot meet.

``skewer services up --kafka-brokers 3`` runs three combined broker-and-controller nodes
(:class:`pipeline.services.kafka_broker.KafkaNodeService`); here they run on ports and in a run
folder of the module's own, beside the test session's one broker. Topics get three replicas,
two in sync, and so do the offsets and the transaction state.

- The acceptance run is docs/cluster.md's: ``skewer services up
  --spark-workers 2 --kafka-brokers 3``, then ``skewer demo --spark-master spark://... --verify``,
  then ``skewer services down``, each a subprocess.
- The fault tests kill -9 the broker that coordinates the grouping stage's transactions
  mid-run, then start it again; each is described in its docstring.
- A replication larger than the cluster is refused at start with one line and exit 2.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_runs import (
    assert_exact_without_restarts,
    batches_beyond,
    fault_plan,
    free_ports,
    shared_spark_run,
    skewer,
    wait_for,
    wait_for_the_fault_moment,
)

from pipeline.io import config, kafka_io, probes
from pipeline.runs.orchestrator import Pipeline
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.services import manager, process
from pipeline.services.kafka_broker import KafkaNodeService, node_name

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs and kills native Kafka nodes of its own"),
]

NODES = [node_name(node) for node in range(1, config.KAFKA_CLUSTER_NODES + 1)]


def cluster_environ(settings: config.Settings, run_dir: Path) -> dict[str, str]:
    """The environment of a cluster of the test's own: node i on ports base + 2(i - 1) (client)
    and base + 2(i - 1) + 1 (controller), Spark's standalone master on the next four, and a
    Prometheus of its own on the port after them.

    Redis is the session's (it answers, so ``services up`` leaves it alone). Prometheus must not
    be: ``services up`` starts one where none answers, and on the session's default port that
    one would be taken for the session's by a test module running beside this one, which would
    then lose it at this test's ``services down``: test_dashboard_queries and test_metrics_live
    failed with "connection refused" that way when the two ran side by side."""
    nodes = config.KAFKA_CLUSTER_NODES
    base = free_ports(2 * nodes + 5)
    brokers = [f"127.0.0.1:{base + 2 * i}" for i in range(nodes)]
    return {
        **os.environ,
        **settings.environ(),
        config.ENV_RUN_DIR: str(run_dir),
        config.ENV_KAFKA_BOOTSTRAP: ",".join(brokers),
        config.ENV_KAFKA_CONTROLLER: f"127.0.0.1:{base + 1}",
        # The master, its web UI and two workers' UIs: the ports after the cluster's.
        config.ENV_SPARK_STANDALONE: f"127.0.0.1:{base + 2 * nodes}",
        config.ENV_PROMETHEUS_URL: f"http://127.0.0.1:{base + 2 * nodes + 4}",
    }


@pytest.fixture(scope="module")
def cluster(
    settings: config.Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[config.Settings]:
    """The settings of a running cluster of three nodes (under this module's lease)."""
    environ = cluster_environ(settings, tmp_path_factory.mktemp("kafka-cluster") / "run")
    cluster_settings = config.load(environ)
    states = manager.acquire(cluster_settings, NODES)
    assert [s.state for s in states] == ["started"] * len(NODES)
    try:
        yield cluster_settings
    finally:
        manager.release(cluster_settings, NODES)


def topic_replicas(bootstrap: str, topic: str) -> set[int]:
    """How many replicas each partition of ``topic`` has (one number if all agree). The
    broker asked may learn of a new topic a moment after the one that created it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + 30
    while (described := admin.list_topics(topic=topic, timeout=10).topics[topic]).error:
        assert time.monotonic() < deadline, f"no broker describes {topic} after 30 s"
        time.sleep(0.2)
    return {len(partition.replicas) for partition in described.partitions.values()}


def test_the_documented_cluster_runs_the_demo_exactly(
    settings: config.Settings, tmp_path: Path
) -> None:
    """docs/cluster.md's run: ``services up --spark-workers 2 --kafka-brokers 3``, then the
    demo on the standalone master with ``--verify``; every (key, window) count exact, and
    ``services down`` stops what ``up`` started."""
    environ = cluster_environ(settings, tmp_path / "run")
    cluster_settings = config.load(environ)
    try:
        up = skewer(
            environ, "services", "up", "--spark-workers", "2", "--kafka-brokers", "3", timeout=300
        )
        assert up.returncode == 0, up.stdout + up.stderr
        started = {line.split()[0] for line in up.stdout.splitlines() if " started " in line}
        assert started >= {*NODES, "spark-master", "spark-worker-1", "spark-worker-2"}
        run_id = f"cluster-{new_run_id()[5:]}"
        demo = skewer(
            environ,
            "demo",
            "--spark-master",
            cluster_settings.spark_standalone_url,
            "--records",
            "20000",
            "--workers",
            "8",
            "--run-id",
            run_id,
            "--verify",
            "--json",
            timeout=600,
        )
        assert demo.returncode == 0, demo.stderr
        report = json.loads(demo.stdout)
        assert report["exact"] is True
        assert report["records_produced"] == report["records_processed"] == 20_000
        assert len(report["per_worker"]) == 8 and min(report["per_worker"]) > 0
        # The transactions the run committed are on three nodes.
        assert topic_replicas(cluster_settings.kafka_bootstrap, "__transaction_state") == {3}
    finally:
        down = skewer(environ, "services", "down", timeout=120)
    assert down.returncode == 0, down.stderr
    stopped = {line.split()[0] for line in down.stdout.splitlines() if " stopped " in line}
    assert stopped == started


def test_topics_on_the_cluster_have_three_replicas_two_in_sync(cluster: config.Settings) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    topic = f"replicas-{new_run_id()[5:]}"
    bootstrap = cluster.kafka_bootstrap
    assert kafka_io.ensure_topic(bootstrap, topic, 4, replication=cluster.kafka_replication)
    try:
        assert topic_replicas(bootstrap, topic) == {3}
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        # The broker asked may learn of the new topic a moment after the one that created it.
        deadline = time.monotonic() + 30
        while True:
            (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
            try:
                configs = described.result()
                break
            except KafkaException as error:
                if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                assert time.monotonic() < deadline, f"no broker describes {topic} after 30 s"
                time.sleep(0.2)
        assert configs["min.insync.replicas"].value == "2"
    finally:
        kafka_io.delete_topics(bootstrap, [topic])


def test_replication_beyond_the_brokers_is_refused_with_exit_2(
    settings: config.Settings,
) -> None:
    """The session's one broker cannot hold three replicas: the demo refuses at start, with one
    line, before it created any topic or started any stage."""
    run_id = f"replicas-{new_run_id()[5:]}"
    environ = {**os.environ, **settings.environ(), config.ENV_KAFKA_REPLICATION: "3"}
    done = skewer(environ, "demo", "--records", "1000", "--run-id", run_id, timeout=120)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "kafka: replication 3 (SKEWER_KAFKA_REPLICATION) is more than the 1 broker(s) of the "
            "cluster"
        )
    ), done.stderr
    assert kafka_io.topic_partitions(settings.kafka_bootstrap, f"{run_id}-keys") is None
    group = skewer(environ, "group", "--workers", "2", "--run-id", run_id, timeout=60)
    assert group.returncode == 2, group.stderr
    assert group.stderr.strip().splitlines() == [
        "skewer group: error: kafka: replication 3 (SKEWER_KAFKA_REPLICATION) is more than the "
        "1 broker(s) of the cluster"
    ]


def kill_node(cluster: config.Settings, node_id: int) -> KafkaNodeService:
    """kill -9 the module's Kafka node ``node_id`` and wait until it is gone; the node."""
    node = KafkaNodeService(cluster, node_id)
    record = process.read_pid_file(node.pid_path)
    assert record is not None, f"{node.name} is not this module's"
    assert process.kill(record), f"{node.name} was not running"
    process.wait_gone(record)
    return node


def restart_node(cluster: config.Settings, node: KafkaNodeService) -> None:
    """Start a killed node again, under the module's lease: ``up`` would adopt it, and it would
    outlive the tests."""
    assert [s.state for s in manager.acquire(cluster, [node.name])] == ["started"]


def kill_and_restart_coordinator(cluster: config.Settings, plan: RunPlan) -> int:
    """kill -9 the node coordinating source 0's transactions, start it again; its node id."""
    coordinator = probes.transaction_coordinator(
        cluster.kafka_bootstrap, plan.names.transactional_id(0)
    )
    restart_node(cluster, kill_node(cluster, coordinator))
    return coordinator


@pytest.mark.parametrize("scheme", ["pkg", "mixed"])
def test_kill_9_of_the_transaction_coordinator_keeps_counts_exact(
    cluster: config.Settings, spark: object, scheme: str
) -> None:
    """What is killed: the node that coordinates the grouping stage's transactions (source 0's
    ``transactional.id``), with SIGKILL. When: once a fifth of the records are processed; for
    mixed, while a migration is in flight (the controller published a table and keys move).
    Recovery expected: the controller fences the node after its session timeout, the
    partitions and the transaction state fail over to the two others (two replicas stay in
    sync), the producer finds the new coordinator and commits or aborts and replays its open
    transaction; the node is started again and catches up. No stage restarts, and every
    (key, window) count equals the ground truth."""
    # Four workers for pkg: the run shares two cores with three brokers and the session's
    # services. For mixed, eight workers and twice the records: at four, the drifting stream
    # could stay within mixed's balance bound, and on a loaded machine 30,000 records (hot set
    # changing every 2.5 s) could end before a controller round planned a migration (both
    # seen in CI); at 60,000 each hot set lasts 5 s, several rounds.
    mixed = scheme == "mixed"
    plan = fault_plan(
        scheme,
        f"brokers-{scheme}",
        records=60_000 if mixed else 30_000,
        workers=8 if mixed else 4,
        cpu_cost_us=0,
    )
    killed: list[int] = []

    def kill_mid_run(pipeline: Pipeline) -> None:
        wait_for_the_fault_moment(pipeline, 0.2)
        killed.append(kill_and_restart_coordinator(cluster, plan))

    with shared_spark_run(plan, cluster, spark, during=kill_mid_run) as pipeline:
        summary = pipeline.summary()
    assert killed, "no broker was killed"
    assert_exact_without_restarts(summary, plan)


def partition_leader(bootstrap: str, topic: str, partition: int) -> int:
    """The node id that leads ``partition`` of ``topic``."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    metadata = admin.list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def test_the_workers_go_on_applying_while_a_leader_of_their_topic_is_down(
    cluster: config.Settings, spark: object
) -> None:
    """What is killed: the node leading partition 0 of the run's work topic, with SIGKILL.
    When: once a fifth of the records are processed, with most of the paced stream still to
    come. Expected: the controller fences the node within its session timeout and the
    partitions it led get new leaders; the driver's listing of a micro-batch's end offsets, if
    it went to the dead node, gives up after the worker job's offsets timeout and asks again,
    so the workers apply three more micro-batches while the node is still down (with Kafka's
    default timeout every micro-batch could wait a minute). The node is then started again; no
    stage restarts, and every (key, window) count equals the ground truth."""
    plan = fault_plan("pkg", "leader-down", records=60_000, workers=4, cpu_cost_us=0)
    killed: list[int] = []

    def kill_the_leader(pipeline: Pipeline) -> None:
        wait_for_the_fault_moment(pipeline, 0.2)
        leader = partition_leader(cluster.kafka_bootstrap, plan.names.work_topic, 0)
        at_kill = pipeline.progress().processed
        node = kill_node(cluster, leader)
        killed.append(leader)
        wait_for(
            pipeline,
            lambda p: p.processed >= batches_beyond(pipeline, at_kill),
            "three micro-batches applied while a leader of the work topic is down",
        )
        restart_node(cluster, node)

    with shared_spark_run(plan, cluster, spark, during=kill_the_leader) as pipeline:
        summary = pipeline.summary()
    assert killed, "no leader was killed"
    assert_exact_without_restarts(summary, plan)


def wait_in_sync(bootstrap: str, node_id: int, timeout: float = 360.0) -> None:
    """Wait until node ``node_id`` is in sync on every partition it holds a replica of, the
    internal topics' included."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        partitions = [
            p for t in admin.list_topics(timeout=10).topics.values() for p in t.partitions.values()
        ]
        behind = [p for p in partitions if node_id in p.replicas and node_id not in p.isrs]
        if not behind:
            return
        assert time.monotonic() < deadline, f"node {node_id} is behind on {len(behind)} partitions"
        time.sleep(0.5)


def elect_preferred_leaders(bootstrap: str) -> None:
    """What Kafka's controller does every ``leader.imbalance.check.interval.seconds`` when
    ``auto.leader.rebalance.enable`` is on: every partition led again by its preferred
    replica, the internal topics' (and so their coordinators) included."""
    from confluent_kafka import ElectionType
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=30)


def test_the_workers_go_on_applying_when_leaders_move_back_to_their_preferred_nodes(
    cluster: config.Settings, spark: object
) -> None:
    """What happens: the node leading partition 0 of the run's work topic is killed with
    SIGKILL and started again at once; its partitions (of the run's topics, of the offsets and
    of the transaction state) are led by the two others meanwhile. Once it is in sync again,
    every partition's leadership moves back to its preferred replica, as Kafka's controller
    does on its own five minutes after a node's return. Expected: the workers apply three more
    micro-batches after the move, no stage restarts, and every (key, window) count equals the
    ground truth."""
    plan = fault_plan("pkg", "election", records=180_000, workers=4, cpu_cost_us=0)
    moved: list[int] = []  # processed at the election

    def move_the_leaders_back(pipeline: Pipeline) -> None:
        wait_for_the_fault_moment(pipeline, 0.1)
        leader = partition_leader(cluster.kafka_bootstrap, plan.names.work_topic, 0)
        restart_node(cluster, kill_node(cluster, leader))
        wait_in_sync(cluster.kafka_bootstrap, leader)
        assert partition_leader(cluster.kafka_bootstrap, plan.names.work_topic, 0) != leader
        at_election = pipeline.progress().processed
        after = batches_beyond(pipeline, at_election)
        assert after <= plan.records, "the stream ended before the leaders moved back"
        elect_preferred_leaders(cluster.kafka_bootstrap)
        assert partition_leader(cluster.kafka_bootstrap, plan.names.work_topic, 0) == leader
        wait_for(
            pipeline,
            lambda p: p.processed >= after,
            "three micro-batches applied after the leaders moved back to their preferred nodes",
        )
        moved.append(at_election)

    with shared_spark_run(plan, cluster, spark, during=move_the_leaders_back) as pipeline:
        summary = pipeline.summary()
    assert moved, "the leaders did not move"
    assert_exact_without_restarts(summary, plan)
