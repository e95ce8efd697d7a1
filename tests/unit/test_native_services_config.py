"""Configuration and the pure parts of the native service manager (no process is started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from service_backends import parse_properties

from pipeline.io import artifacts, config
from pipeline.services import manager, native, process


def test_defaults_are_loopback_with_non_default_ports() -> None:
    settings = config.load({})
    assert settings.kafka_bootstrap == "127.0.0.1:19092"
    assert settings.kafka_controller == "127.0.0.1:19093"
    assert settings.redis_url == "redis://127.0.0.1:16379/0"
    assert settings.prometheus_url == "http://127.0.0.1:19090"
    assert (settings.kafka_host, settings.kafka_port, settings.kafka_controller_port) == (
        "127.0.0.1",
        19092,
        19093,
    )
    assert (settings.redis_host, settings.redis_port) == ("127.0.0.1", 16379)
    assert (settings.prometheus_host, settings.prometheus_port) == ("127.0.0.1", 19090)
    assert settings.cache_dir == config.PROJECT_ROOT / ".cache"
    assert settings.run_dir == config.PROJECT_ROOT / ".cache" / "run"
    assert settings.kafka_libs_dir == config.PROJECT_ROOT / ".cache" / "kafka" / "libs"
    assert settings.spark_jars_dir == config.PROJECT_ROOT / ".cache" / "spark-jars"


def test_environment_overrides(tmp_path: Path) -> None:
    settings = config.load(
        {
            "SKEWER_KAFKA_BOOTSTRAP": "127.0.0.2:29092",
            "SKEWER_KAFKA_CONTROLLER": "127.0.0.2:29093",
            "SKEWER_REDIS_URL": "redis://127.0.0.3:26379/2",
            "SKEWER_PROMETHEUS_URL": "http://127.0.0.4:29090/",
            "SKEWER_CACHE_DIR": str(tmp_path / "cache"),
        }
    )
    assert (settings.kafka_host, settings.kafka_port) == ("127.0.0.2", 29092)
    assert settings.kafka_controller_port == 29093
    assert (settings.redis_host, settings.redis_port) == ("127.0.0.3", 26379)
    assert settings.prometheus_url == "http://127.0.0.4:29090"  # trailing slash dropped
    assert settings.run_dir == tmp_path / "cache" / "run"
    assert config.load({"SKEWER_RUN_DIR": str(tmp_path / "r")}).run_dir == tmp_path / "r"


def test_a_bad_address_names_its_variable() -> None:
    for bad in ("localhost", "k1:9092,", "k1:9092,k2", "::1:9092", "k1:0", "k1:x"):
        with pytest.raises(ValueError, match=r"^SKEWER_KAFKA_BOOTSTRAP='.*' is not HOST:PORT"):
            config.load({"SKEWER_KAFKA_BOOTSTRAP": bad})


def test_a_bootstrap_list_of_several_brokers() -> None:
    """A Kafka cluster's bootstrap list is host:port pairs; the first is the native broker's."""
    settings = config.load({"SKEWER_KAFKA_BOOTSTRAP": "10.0.0.1:9092, kafka-2:9093,[::1]:9094"})
    assert (settings.kafka_host, settings.kafka_port) == ("10.0.0.1", 9092)
    assert settings.kafka_hosts == ["10.0.0.1", "kafka-2", "::1"]
    assert config.load({"SKEWER_KAFKA_BOOTSTRAP": "[::1]:19092"}).kafka_host == "::1"


def test_kafka_server_properties_are_filled_in(tmp_path: Path) -> None:
    settings = config.load({"SKEWER_RUN_DIR": str(tmp_path)})
    [kafka] = manager.native_services(settings, ["kafka"])
    lines = kafka.server_properties().splitlines()
    assert "${" not in "\n".join(lines)
    properties = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert properties["process.roles"] == "broker,controller"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert properties["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert properties["log.dirs"] == str(tmp_path / "kafka" / "data")
    assert properties["auto.create.topics.enable"] == "false"
    assert kafka.command()[-2:] == ["kafka.Kafka", str(tmp_path / "kafka" / "server.properties")]


def test_prometheus_config_and_command(tmp_path: Path) -> None:
    import yaml

    settings = config.load({"SKEWER_RUN_DIR": str(tmp_path)})
    [prometheus] = manager.native_services(settings, ["prometheus"])
    parsed = yaml.safe_load(prometheus.prometheus_config())
    assert parsed["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:19090"]
    assert "--web.listen-address=127.0.0.1:19090" in prometheus.command()
    assert f"--config.file={tmp_path / 'prometheus' / 'prometheus.yml'}" in prometheus.command()


def test_services_come_in_a_fixed_order_and_unknown_names_fail(tmp_path: Path) -> None:
    # A run folder of its own: the default one says which services are up here (a cluster's
    # three Kafka nodes, say), and that is not what this test is about.
    settings = config.load({"SKEWER_RUN_DIR": str(tmp_path)})
    names = [s.name for s in manager.native_services(settings, ["prometheus", "kafka"])]
    assert names == ["kafka", "prometheus"]
    with pytest.raises(native.ServiceError, match="unknown service 'zk'; valid services: kafka"):
        manager.native_services(settings, ["zk"])


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.0.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.0.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("log4j-1.2-api-2.24.3.jar", "log4j-1.2-api"),
        ("zstd-jni-1.5.6-9.jar", "zstd-jni"),
        ("hive-shims-0.23-2.3.10.jar", "hive-shims-0.23"),
        ("jline-3.27.1-jdk8.jar", "jline"),
        (
            "netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar",
            "netty-transport-native-epoll",
        ),
        ("noversion.jar", "noversion"),
    ],
)
def test_artifact_id_of_a_jar_name(jar: str, artifact: str) -> None:
    assert artifacts.artifact_id(jar) == artifact


def test_a_pid_is_ours_only_with_its_recorded_start_time() -> None:
    ticks = process.start_ticks(os.getpid())
    assert isinstance(ticks, int) and ticks > 0
    assert process.is_alive(process.PidRecord(os.getpid(), ticks, ("python",)))
    assert not process.is_alive(process.PidRecord(os.getpid(), ticks + 1, ("python",)))
    # A process that exited (and was reaped) has no start time at all.
    finished = subprocess.Popen(["true"])
    finished.wait()
    assert process.start_ticks(finished.pid) is None


def test_pid_files_round_trip_and_garbage_reads_as_none(tmp_path: Path) -> None:
    record = process.PidRecord(1234, 5678, ("redis-server", "--port", "16379"))
    path = tmp_path / "redis.pid"
    process.write_pid_file(path, record)
    assert process.read_pid_file(path) == record
    path.write_text("not json")
    assert process.read_pid_file(path) is None
    assert process.read_pid_file(tmp_path / "missing.pid") is None


def test_state_lines() -> None:
    assert (
        manager.ServiceState("kafka", "127.0.0.1:19092", "running", 42).line()
        == "kafka          running  127.0.0.1:19092            pid 42"
    )
    assert (
        manager.ServiceState("redis", "redis://x", "down").line()
        == "redis          down     redis://x"
    )


def test_console_script_help_lists_every_subcommand() -> None:
    script = Path(sys.executable).parent / "skewer"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    for command in ("services", "route", "sim", "bench", "demo"):
        assert f"    {command}" in result.stdout
    result = subprocess.run(
        [str(script), "services", "--help"], capture_output=True, text=True, check=True
    )
    assert "{up,down,status,install}" in result.stdout


def test_redis_keeps_an_append_only_file_with_the_chosen_fsync_policy(tmp_path: Path) -> None:
    def flags(environ: dict[str, str]) -> dict[str, str]:
        settings = config.load({"SKEWER_RUN_DIR": str(tmp_path), **environ})
        [redis] = manager.native_services(settings, ["redis"])
        command = redis.command()
        return dict(zip(command[1::2], command[2::2], strict=False))

    default = flags({})
    assert default["--appendonly"] == "yes" and default["--appendfsync"] == "everysec"
    assert default["--dir"] == str(tmp_path / "redis")
    assert flags({"SKEWER_REDIS_APPENDFSYNC": "always"})["--appendfsync"] == "always"
    with pytest.raises(ValueError, match=r"^SKEWER_REDIS_APPENDFSYNC='sometimes' is not one of"):
        config.load({"SKEWER_REDIS_APPENDFSYNC": "sometimes"})


def test_a_redis_node_is_given_the_time_to_load_its_append_only_files(tmp_path: Path) -> None:
    """A soak's kill -9 of the primary: the node, restarted as a replica, held 100 MB of
    append-only files (41 MB of snapshot, 59 MB of log), loaded them in 12.8 s, then took the
    new primary's copy whole, and would have been synced some 31 s after its start. Given 20 s,
    ``up`` stopped it and left it down."""
    settings = config.load({"SKEWER_RUN_DIR": str(tmp_path)})
    services = manager.native_services(settings, redis_sentinel_set=True)
    nodes = [service for service in services if service.name in ("redis", "redis-replica-1")]
    assert [node.start_timeout for node in nodes] == [20.0, 20.0]
    for node in nodes:
        aof = node.data_dir / "appendonlydir"
        aof.mkdir(parents=True)
        for name, size in (
            ("appendonly.aof.1.base.rdb", 41e6),
            ("appendonly.aof.1.incr.aof", 59e6),
        ):
            with (aof / name).open("wb") as sparse:
                sparse.truncate(int(size))
    primary, replica = (node.start_timeout for node in nodes)
    assert primary == pytest.approx(20 + 0.4 * 100)
    assert replica == pytest.approx(20 + 2 * 0.4 * 100) and replica > 2 * 31


def test_spark_standalone_services_order_and_the_spark_shorthand(tmp_path: Path) -> None:
    settings = config.load({config.ENV_RUN_DIR: str(tmp_path)})
    asked = manager.native_services(settings, ["redis"], spark_workers=2, spark_worker_cores=3)
    assert [s.name for s in asked] == ["redis", "spark-master", "spark-worker-1", "spark-worker-2"]
    worker = asked[-1]
    assert worker.command()[worker.command().index("--cores") + 1] == "3"
    # Worker 2 is a host of its own, for Spark's speculative copies (worker_host).
    assert worker.environment()["SPARK_LOCAL_IP"] == "127.0.0.2"  # type: ignore[index]
    assert worker.command()[worker.command().index("--host") + 1] == "127.0.0.2"
    assert asked[-3].environment()["SPARK_LOCAL_IP"] == "127.0.0.1"  # type: ignore[index]
    assert "spark.worker.cleanup.enabled=true" in worker.environment()["SPARK_WORKER_OPTS"]  # type: ignore[index]
    # Without names: the default three, and the Spark services `up` left pid files of.
    assert [s.name for s in manager.native_services(settings)] == list(manager.SERVICE_NAMES)
    for name in ("spark-master", "spark-worker-10", "spark-worker-2"):
        (tmp_path / f"{name}.pid").write_text("{}")
    assert [s.name for s in manager.native_services(settings)][3:] == [
        "spark-master",
        "spark-worker-2",
        "spark-worker-10",
    ]
    assert [s.name for s in manager.native_services(settings, ["spark"])] == [
        "spark-master",
        "spark-worker-2",
        "spark-worker-10",
    ]
    with pytest.raises(native.ServiceError, match="spark, spark-master, spark-worker-N"):
        manager.native_services(settings, ["spark-worker-0"])


def test_spark_master_setting_is_checked_at_load() -> None:
    assert config.load({config.ENV_SPARK_MASTER: " yarn "}).spark_master == "yarn"
    assert config.load({}).spark_master == "local"
    for bad in ("spark://host", "local[0]", "mesos://x:5050", "k8s://"):
        with pytest.raises(ValueError, match=f"{config.ENV_SPARK_MASTER}="):
            config.load({config.ENV_SPARK_MASTER: bad})


def test_services_spark_workers_is_an_option_of_up_only() -> None:
    from pipeline.cli import app

    assert app.main(["services", "status", "--spark-workers", "2"]) == 2


def test_the_kafka_cluster_is_three_voters_with_their_own_ports_and_folders(
    tmp_path: Path,
) -> None:
    settings = config.load({config.ENV_RUN_DIR: str(tmp_path)})
    nodes = manager.native_services(settings, ["prometheus", "kafka"], kafka_brokers=3)
    assert [s.name for s in nodes] == ["kafka-1", "kafka-2", "kafka-3", "prometheus"]
    assert [s.address for s in nodes[:3]] == settings.kafka_cluster_bootstrap.split(",")
    second = parse_properties(nodes[1].server_properties())
    assert second["node.id"] == "2"
    assert second["controller.quorum.voters"] == (
        "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    )
    assert second["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    assert second["log.dirs"] == str(tmp_path / "kafka-2" / "data")
    for replicated in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert second[replicated] == "3"
    assert second["min.insync.replicas"] == second["transaction.state.log.min.isr"] == "2"
    # The one broker: itself its only voter, every topic one replica.
    single = parse_properties(manager.native_services(settings, ["kafka"])[0].server_properties())
    assert (single["node.id"], single["controller.quorum.voters"]) == ("1", "1@127.0.0.1:19093")
    assert single["offsets.topic.replication.factor"] == single["min.insync.replicas"] == "1"
    # Once a node has a pid file, "kafka" (and the default list) means the cluster.
    (tmp_path / "kafka-2.pid").write_text("{}")
    assert [s.name for s in manager.native_services(settings)][:3] == [
        "kafka-1",
        "kafka-2",
        "kafka-3",
    ]
    with pytest.raises(native.ServiceError, match=r"kafka-1\.\.3, redis-replica"):
        manager.native_services(settings, ["kafka-4"])


def test_topic_replication_follows_the_brokers_and_refuses_more_than_there_are() -> None:
    from pipeline.io import kafka_io

    assert [kafka_io.topic_replication(n) for n in (1, 2, 3, 4)] == [(1, 1), (2, 1), (3, 2), (3, 2)]
    assert kafka_io.topic_replication(3, requested=1) == (1, 1)
    with pytest.raises(kafka_io.KafkaIOError, match=r"replication 2 .* more than the 1 broker"):
        kafka_io.topic_replication(1, requested=2)
    assert config.load({config.ENV_KAFKA_REPLICATION: "2"}).kafka_replication == 2
    for bad in ("0", "three", "-1"):
        with pytest.raises(ValueError, match=f"{config.ENV_KAFKA_REPLICATION}="):
            config.load({config.ENV_KAFKA_REPLICATION: bad})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (config.ENV_KAFKA_REPLICATION, "0"),
        (config.ENV_KAFKA_BOOTSTRAP, "kafka"),
        (config.ENV_SPARK_MASTER, "mesos://x:5050"),
        (config.ENV_REDIS_APPENDFSYNC, "sometimes"),
    ],
)
@pytest.mark.parametrize("command", [["verify", "--run-id", "r"], ["services", "status"]])
def test_a_setting_that_cannot_work_is_one_line_and_exit_2(
    variable: str,
    value: str,
    command: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not a traceback: every command loads the settings first, and app.main says which."""
    from pipeline.cli import app

    monkeypatch.setenv(variable, value)
    assert app.main(command) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"skewer {command[0]}: error: {variable}=")


def test_services_kafka_brokers_takes_one_or_three_and_only_with_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.cli import app

    assert app.main(["services", "status", "--kafka-brokers", "3"]) == 2
    assert "--kafka-brokers is an option of `up`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        app.main(["services", "up", "--kafka-brokers", "2"])
    assert exit_info.value.code == 2


def test_peers_that_need_a_quorum_are_killed_once_it_is_lost() -> None:
    """Two peers stop on SIGTERM, the third cannot (it would wait for a quorum that is gone):
    with quorum 2 it is killed as soon as it is alone, not after the grace."""
    import time

    obeying = "import time; print(1, flush=True); time.sleep(60)"
    ignoring = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + obeying
    children = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        for code in (obeying, obeying, ignoring)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline()  # signals set up
        records = []
        for child in children:
            ticks = process.start_ticks(child.pid)
            assert ticks is not None
            records.append(process.PidRecord(child.pid, ticks, ()))
        began = time.monotonic()
        process.terminate_all(records, grace_seconds=30, quorum=2)
        assert time.monotonic() - began < 10
        assert [child.wait(5) for child in children] == [-15, -15, -9]
    finally:
        for child in children:
            child.kill()
            child.wait()
