"""skewer's services in docker-compose.yml, checked without a Docker daemon: every command parsed
by the real ``skewer`` argument parser (a wrong flag fails here), the services agreeing on run
id, topics, W and S, and the two profiles, ``spark-cluster`` (a standalone master and scalable
workers from the skewer image, their launcher run for real; ``work`` the driver) and
``kafka-cluster`` (three KRaft nodes agreeing on quorum, cluster id and replication), neither
changing what ``docker compose up`` starts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
from compose_files import (
    ENV_EXAMPLE,
    INFRASTRUCTURE,
    KAFKA_NODES,
    PROFILES,
    ROOT,
    SKEWER_COMMANDS,
    SPARK_SERVICES,
    TEST_SECRETS,
    VariableUse,
    dockerfile_stages,
    enabled_services,
    interpolate,
    published_ports,
    service_environment,
    service_profiles,
    stage_env,
    variable_defaults,
)
from service_backends import native_kafka_properties

from pipeline.cli import demo
from pipeline.cli.app import build_parser
from pipeline.io import config, kafka_io, kafka_security, spark_session
from pipeline.services import spark_standalone
from pipeline.stages import grouping
from producers.workloads import DEFAULT_WORKLOAD

# --- the skewer services ------------------------------------------------------------------------


def _parse(command: list[str]) -> argparse.Namespace:
    """``skewer COMMAND...`` parsed by the real parser; flags must be spelt out in full (argparse
    would take an abbreviation, which a later flag could make ambiguous)."""
    parser = build_parser()
    try:
        args = parser.parse_args(command)
    except SystemExit as error:
        raise AssertionError(f"`skewer {' '.join(command)}` does not parse") from error
    [subcommands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    known = subcommands.choices[command[0]]._option_string_actions
    for word in command[1:]:
        if word.startswith("--"):
            assert word in known, f"`skewer {command[0]}`: {word} is not an option's full name"
    return args


def test_skewer_service_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    kafka = service_environment(services["kafka"])
    internal = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    redis_port = next(iter(published_ports(services["redis"])))
    for name in SKEWER_COMMANDS:
        env = service_environment(services[name])
        settings = config.load(env)
        assert settings.kafka_bootstrap == internal["INTERNAL"], name
        url = urlsplit(settings.redis_url)
        assert (url.hostname, url.port, url.password) == (
            "redis",
            redis_port,
            TEST_SECRETS["REDIS_PASSWORD"],
        ), name
        assert env["GROUPING_SCHEME"] == "pkg", name


@pytest.mark.parametrize("service", sorted(SKEWER_COMMANDS))
def test_skewer_command_parses(compose: dict[str, Any], service: str) -> None:
    command = [str(part) for part in compose["services"][service]["command"]]
    args = _parse(command)
    assert args.command == SKEWER_COMMANDS[service]
    assert (args.run_id, args.topic_prefix) == ("live", "live-")


def test_skewer_services_agree_on_the_run(compose: dict[str, Any]) -> None:
    parsed = {
        name: _parse([str(part) for part in compose["services"][name]["command"]])
        for name in SKEWER_COMMANDS
    }
    assert {name: args.workers for name, args in parsed.items() if "workers" in args} == {
        "group": 8,
        "work": 8,
        "aggregate": 8,
        "control": 8,
    }
    assert {name: args.sources for name, args in parsed.items() if "sources" in args} == {
        "group": 2,
        "work": 2,
        "control": 2,
        "producer": 2,
    }
    producer = parsed["producer"]
    assert producer.workload == DEFAULT_WORKLOAD
    assert (producer.records, producer.rate) == (10_000_000, 2000.0)
    assert parsed["group"].scheme is None, "the grouping stage reads GROUPING_SCHEME"
    assert parsed["work"].checkpoint is None, "the default checkpoint lies on the volume"
    assert parsed["work"].cpu_cost_us == 0.0


def test_control_command_follows_the_scheme_and_the_run(raw: dict[str, Any]) -> None:
    """The controller gets the scheme as a flag, every other service from the environment."""
    for scheme in ("pkg", "mixed"):
        compose = interpolate(raw, {**TEST_SECRETS, "GROUPING_SCHEME": scheme})
        command = [str(part) for part in compose["services"]["control"]["command"]]
        flags = dict(zip(command[1::2], command[2::2], strict=True))
        assert command[0] == "control"
        assert flags == {
            "--scheme": scheme,
            "--workers": "8",
            "--sources": "2",
            "--run-id": "live",
            "--topic-prefix": "live-",
            "--interval": "5",
        }
        for name in SKEWER_COMMANDS:
            assert service_environment(compose["services"][name])["GROUPING_SCHEME"] == scheme


def test_control_interval_default_is_the_controllers(
    variables: dict[str, list[VariableUse]],
) -> None:
    own_default = _parse(["control", "--workers", "1"]).interval
    assert float(variable_defaults(variables)["CONTROL_INTERVAL"]) == own_default


def test_the_default_scheme_runs_live(variables: dict[str, list[VariableUse]]) -> None:
    defaults = variable_defaults(variables)
    scheme = defaults["GROUPING_SCHEME"]
    assert scheme == demo.DEFAULT_SCHEME == "pkg"
    stage = grouping.StageConfig(
        bootstrap=config.DEFAULT_KAFKA_BOOTSTRAP,
        redis_url=config.DEFAULT_REDIS_URL,
        names=kafka_io.RunNames(defaults["RUN_ID"], f"{defaults['RUN_ID']}-"),
        scheme=scheme,
        n_workers=int(defaults["WORKERS"]),
        n_sources=int(defaults["SOURCES"]),
    )
    for source in range(stage.n_sources):
        assert grouping.create_scheme(stage, source).name == scheme


def test_switching_run_id_switches_every_topic(raw: dict[str, Any]) -> None:
    compose = interpolate(raw, {**TEST_SECRETS, "RUN_ID": "live-mixed", "WORKERS": "4"})
    for name in SKEWER_COMMANDS:
        command = [str(part) for part in compose["services"][name]["command"]]
        flags = dict(zip(command[1::2], command[2::2], strict=False))
        assert (flags["--run-id"], flags["--topic-prefix"]) == ("live-mixed", "live-mixed-")
        if "--workers" in flags:
            assert flags["--workers"] == "4", name


# --- profiles: the Spark and Kafka clusters -----------------------------------------------------


def test_profiles_leave_the_default_stack_unchanged(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for profile, members in PROFILES.items():
        assert {name for name, s in services.items() if profile in service_profiles(s)} == members
        assert all(service_profiles(services[name]) == {profile} for name in members), profile
    assert enabled_services(compose, set()) == INFRASTRUCTURE | set(SKEWER_COMMANDS)


@pytest.mark.parametrize(
    "active", [set(), {"spark-cluster"}, {"kafka-cluster"}, {"spark-cluster", "kafka-cluster"}]
)
def test_services_depend_only_on_services_their_profiles_enable(
    compose: dict[str, Any], active: set[str]
) -> None:
    """Compose refuses a model in which an enabled service depends on one that no active
    profile enables (it does not start the dependency instead)."""
    enabled = enabled_services(compose, active)
    for name in enabled:
        for dependency in compose["services"][name].get("depends_on", {}):
            assert dependency in enabled, f"{name} depends on {dependency}, off with {active}"


def _spark_launch(service: dict[str, Any]) -> list[str]:
    return [str(part) for part in [*service["entrypoint"], *service["command"]]]


def test_spark_services_share_the_pip_launcher(compose: dict[str, Any]) -> None:
    services = compose["services"]
    entrypoints = {tuple(services[name]["entrypoint"]) for name in SPARK_SERVICES}
    [entrypoint] = entrypoints
    assert entrypoint[:2] == ("sh", "-c")
    check = subprocess.run(["sh", "-n", "-c", entrypoint[2]], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # The image puts its virtualenv (with PySpark) first on PATH: `python` there is that one.
    stages = dockerfile_stages()
    assert stage_env(stages, len(stages) - 1)["PATH"].startswith("/opt/venv/bin:")


@pytest.mark.skipif(shutil.which("java") is None, reason="no Java runtime")
@pytest.mark.parametrize("service", sorted(SPARK_SERVICES))
def test_spark_launcher_finds_spark_class_and_the_main_class(
    compose: dict[str, Any], service: str, tmp_path: Path
) -> None:
    """The entrypoint run for real with this interpreter's PySpark: `MAIN --help` starts the
    daemon's own argument parser, so spark-class, Java and the class name are all right."""
    launch = _spark_launch(compose["services"][service])
    main_class = launch[4]
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        [*launch[:4], main_class, "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"Usage: {main_class.rpartition('.')[2]} [options]" in output


def test_spark_master_and_workers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master = _spark_launch(services["spark-master"])[4:]
    assert master[0] == "org.apache.spark.deploy.master.Master"
    master_flags = dict(zip(master[1::2], master[2::2], strict=True))
    # It listens under its service name: the URL the workers and the driver use names it.
    assert master_flags["--host"] == "spark-master"
    master_url = f"spark://{master_flags['--host']}:{master_flags['--port']}"
    assert master_flags["--webui-port"] == "8080" and 8080 in published_ports(
        services["spark-master"]
    )

    worker_service = services["spark-worker"]
    worker = _spark_launch(worker_service)[4:]
    assert worker[:2] == ["org.apache.spark.deploy.worker.Worker", master_url]
    flags = dict(zip(worker[2::2], worker[3::2], strict=True))
    assert int(flags["--cores"]) == spark_standalone.DEFAULT_WORKER_CORES
    assert flags["--memory"] == spark_standalone.DEFAULT_WORKER_MEMORY
    # The work folder must be writable by the image's user: under its home.
    assert PurePosixPath(flags["--work-dir"]).is_relative_to("/var/lib/skewer")
    # `--scale spark-worker=N`: nothing that only one container may have.
    for unique in ("container_name", "hostname", "ports"):
        assert unique not in worker_service, f"spark-worker: {unique} prevents --scale"
    # Finished applications' folders are deleted, as by the native workers.
    native = spark_standalone.SparkWorkerService(config.load({}), 1).environment()
    assert service_environment(worker_service)["SPARK_WORKER_OPTS"] == native["SPARK_WORKER_OPTS"]
    assert "-Dspark.worker.cleanup.enabled=true" in native["SPARK_WORKER_OPTS"].split()
    # The health checks probe each daemon's own UI port.
    assert ":8080/json/" in services["spark-master"]["healthcheck"]["test"][-1]
    assert f":{flags['--webui-port']}/json/" in worker_service["healthcheck"]["test"][-1]


def test_the_spark_master_variable_makes_work_the_driver_on_the_cluster(
    raw: dict[str, Any], compose: dict[str, Any], variables: dict[str, list[VariableUse]]
) -> None:
    master = _spark_launch(compose["services"]["spark-master"])[4:]
    flags = dict(zip(master[1::2], master[2::2], strict=True))
    url = f"spark://{flags['--host']}:{flags['--port']}"
    work = service_environment(compose["services"]["work"])
    assert config.load(work).spark_master == config.DEFAULT_SPARK_MASTER == "local"

    switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_SPARK_MASTER": url})
    for name in SKEWER_COMMANDS:
        assert config.load(service_environment(switched["services"][name])).spark_master == url, (
            name
        )
    # Not a loopback master, so the session leaves the driver's address to Spark, whose
    # default (spark.driver.host) is SPARK_LOCAL_HOSTNAME: the name executors reach `work` by.
    assert not spark_session._on_this_machine(url)
    assert service_environment(switched["services"]["work"])["SPARK_LOCAL_HOSTNAME"] == "work"
    # The default run fits the default two workers: a micro-batch runs its W tasks at once.
    defaults = variable_defaults(variables)
    assert int(defaults["WORKERS"]) <= 2 * int(defaults["SPARK_WORKER_CORES"])
    assert f"SKEWER_SPARK_MASTER={url}" in ENV_EXAMPLE.read_text()


def test_the_kafka_login_variables_reach_every_skewer_service(
    raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    """Plaintext unless set; set, every skewer service's clients log in with them."""
    for name in SKEWER_COMMANDS:
        env = service_environment(compose["services"][name])
        assert config.load(env).kafka_security == kafka_security.KafkaSecurity(), name
    login = {
        kafka_security.ENV_SECURITY_PROTOCOL: "SASL_PLAINTEXT",
        kafka_security.ENV_SASL_MECHANISM: "SCRAM-SHA-512",
        kafka_security.ENV_SASL_USERNAME: "skewer",
        kafka_security.ENV_SASL_PASSWORD: "s3cret",
    }
    switched = interpolate(raw, {**TEST_SECRETS, **login})
    for name in SKEWER_COMMANDS:
        env = service_environment(switched["services"][name])
        assert config.load(env).kafka_security == kafka_security.from_environ(login), name


class _JsonHandler(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        status = 200 if self.path == "/json/" else 404
        self.send_response(status)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args: object) -> None:
        pass


def _spark_check(test: list[str], ui_port: int, body: bytes | None) -> int:
    """``test`` run against a stand-in UI answering ``body`` (None: nothing listens)."""
    assert test[:2] == ["CMD", "python"]
    handler = type("Handler", (_JsonHandler,), {"body": body or b""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    port = server.server_address[1]
    if body is None:
        server.server_close()
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    command = [sys.executable, *test[2:]]
    command[-1] = command[-1].replace(f":{ui_port}/", f":{port}/")
    try:
        return subprocess.run(command, capture_output=True, check=False, timeout=30).returncode
    finally:
        if body is not None:
            server.shutdown()
            server.server_close()


def test_spark_health_checks(compose: dict[str, Any]) -> None:
    """The master is healthy once its UI says ALIVE (not STANDBY); a worker once its UI answers."""
    master = compose["services"]["spark-master"]["healthcheck"]["test"]
    assert _spark_check(master, 8080, b'{"status": "ALIVE", "workers": []}') == 0
    assert _spark_check(master, 8080, b'{"status": "STANDBY", "workers": []}') != 0
    assert _spark_check(master, 8080, None) != 0
    worker = compose["services"]["spark-worker"]["healthcheck"]["test"]
    assert _spark_check(worker, 8081, b'{"cores": 4}') == 0
    assert _spark_check(worker, 8081, None) != 0


def _listeners(value: str) -> dict[str, str]:
    return dict(item.split("://") for item in value.split(","))


def test_kafka_cluster_nodes_form_one_quorum(compose: dict[str, Any]) -> None:
    services = compose["services"]
    envs = {name: service_environment(services[name]) for name in KAFKA_NODES}
    assert {name: int(env["KAFKA_NODE_ID"]) for name, env in envs.items()} == KAFKA_NODES
    # One cluster id (the native cluster's) and one list of voters, naming every node.
    assert {env["CLUSTER_ID"] for env in envs.values()} == {config.KAFKA_CLUSTER_ID}
    [voters] = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs.values()}
    voter_addresses = dict(voter.split("@") for voter in voters.split(","))
    assert {int(node) for node in voter_addresses} == set(KAFKA_NODES.values())
    for name, env in envs.items():
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller", name
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", name
        listeners = _listeners(env["KAFKA_LISTENERS"])
        controller_host, _, controller_port = voter_addresses[env["KAFKA_NODE_ID"]].rpartition(":")
        # A node's voter entry is its own service name and CONTROLLER port.
        assert controller_host == name and listeners["CONTROLLER"] == f":{controller_port}"
        assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
        advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        broker_listener = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
        assert set(advertised) == {broker_listener}, "controllers are not advertised"
        assert advertised[broker_listener] == f"{name}{listeners[broker_listener]}"
        protocols = dict(
            item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
        )
        assert set(protocols) == set(listeners), name
        # Each node's log is on its own volume, and its health check asks itself.
        assert services[name]["volumes"] == [f"{name}-data:{env['KAFKA_LOG_DIRS']}"]
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"--bootstrap-server {advertised[broker_listener]}" in check, name


def test_kafka_cluster_replicates_like_the_native_cluster(compose: dict[str, Any]) -> None:
    """Three replicas, two in sync for a write (the native cluster's and kafka_io's figures),
    for the internal topics too: losing any one broker loses no committed offset or
    transaction, and writes go on."""
    expected = {
        "KAFKA_DEFAULT_REPLICATION_FACTOR": "3",
        "KAFKA_MIN_INSYNC_REPLICAS": "2",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "3",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "2",
    }
    for name in KAFKA_NODES:
        env = service_environment(compose["services"][name])
        assert {key: env.get(key) for key in expected} == expected, name
        # The replication factor cannot exceed the cluster, and a write survives one loss.
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < 3 <= len(KAFKA_NODES)
    # The single broker stays a single replica.
    single = service_environment(compose["services"]["kafka"])
    assert single["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_every_broker_keeps_the_coordinators_logs_small_like_the_native_one(
    compose: dict[str, Any],
) -> None:
    """The offsets and transaction-state topics roll their segments as the native brokers' do
    (deploy/kafka/server.properties): a node that takes one of their partitions over reads it
    whole before it coordinates again, and compaction keeps only closed segments small."""
    native = native_kafka_properties()
    expected = {
        "KAFKA_OFFSETS_TOPIC_SEGMENT_BYTES": native["offsets.topic.segment.bytes"],
        "KAFKA_TRANSACTION_STATE_LOG_SEGMENT_BYTES": native["transaction.state.log.segment.bytes"],
    }
    for name in ("kafka", *KAFKA_NODES):
        env = service_environment(compose["services"][name])
        assert {key: env.get(key) for key in expected} == expected, name


def test_the_bootstrap_variable_points_every_skewer_service_at_the_cluster(
    raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    nodes = [
        _listeners(service_environment(compose["services"][name])["KAFKA_ADVERTISED_LISTENERS"])
        for name in sorted(KAFKA_NODES)
    ]
    bootstrap = ",".join(node["INTERNAL"] for node in nodes)
    assert bootstrap == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_KAFKA_BOOTSTRAP": bootstrap})
    for name in SKEWER_COMMANDS:
        settings = config.load(service_environment(switched["services"][name]))
        assert config.host_ports(settings.kafka_bootstrap, config.ENV_KAFKA_BOOTSTRAP) == [
            (f"kafka-{node}", 9092) for node in (1, 2, 3)
        ], name
    # .env.example and docs/compose.md give exactly this list.
    assert f"SKEWER_KAFKA_BOOTSTRAP={bootstrap}" in ENV_EXAMPLE.read_text()
    assert f"SKEWER_KAFKA_BOOTSTRAP={bootstrap}" in (ROOT / "docs" / "compose.md").read_text()
