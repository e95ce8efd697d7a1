"""docker-compose.yml as a whole, checked without a Docker daemon: the Compose Specification's
keys it uses (a misspelt key fails), its services and images, ports on the bind address,
health checks and start order, no literal secrets, every variable documented in .env.example
with the same default, the files it mounts present, Redis's append-only file on its volume,
Grafana's provisioning, and the compose Prometheus config (``promtool check config``). When the
Docker CLI has its compose plugin, ``docker compose config -q`` validates the file too.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from compose_files import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    INFRASTRUCTURE,
    KAFKA_NODES,
    METRICS_PORT,
    PROFILES,
    PROMETHEUS_DIR,
    REQUIRED_SECRETS,
    ROOT,
    SKEWER_COMMANDS,
    SPARK_SERVICES,
    TEST_SECRETS,
    MissingVariableError,
    VariableUse,
    dockerfile_arguments,
    dockerignore,
    interpolate,
    published_ports,
    service_environment,
    service_mounts,
    strings,
    variable_defaults,
)
from service_backends import compose_command_environment, require_part

from pipeline.io import config
from pipeline.services.redis_server import RedisService

# --- the file as a whole ----------------------------------------------------------------------


#: The Compose Specification's keys this stack may use (a subset of compose-spec.io's service
#: and top-level keys); a misspelt or unsupported key fails the check below.
SERVICE_KEYS = frozenset(
    {
        "build", "command", "container_name", "depends_on", "entrypoint", "environment",
        "env_file", "healthcheck", "image", "init", "labels", "logging", "networks", "ports",
        "profiles", "restart", "stop_grace_period", "stop_signal", "ulimits", "user", "volumes",
        "working_dir",
    }
)  # fmt: skip
TOP_LEVEL_KEYS = frozenset({"name", "services", "volumes", "networks", "configs", "secrets"})
HEALTHCHECK_KEYS = frozenset({"test", "interval", "timeout", "retries", "start_period"})
RESTART_POLICIES = frozenset({"no", "always", "on-failure", "unless-stopped"})


def unknown_keys(compose: dict[str, Any]) -> list[str]:
    """Keys of the file outside the specification subset above, as ``path: key``."""
    found = [
        f"(top): {key}" for key in compose if key not in TOP_LEVEL_KEYS and not key.startswith("x-")
    ]
    for name, service in compose["services"].items():
        found += [f"{name}: {key}" for key in service if key not in SERVICE_KEYS]
        found += [
            f"{name}/healthcheck: {key}"
            for key in service.get("healthcheck", {})
            if key not in HEALTHCHECK_KEYS
        ]
        if service.get("restart", "no") not in RESTART_POLICIES:
            found.append(f"{name}/restart: {service['restart']}")
    return found


def test_the_file_uses_only_known_compose_keys(compose: dict[str, Any]) -> None:
    assert unknown_keys(compose) == []


def test_the_key_check_rejects_an_unknown_service_key(compose: dict[str, Any]) -> None:
    """The check above can fail: a misspelt key is an error."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["work"]["helthcheck"] = broken["services"]["work"].pop("healthcheck")
    assert unknown_keys(broken) == ["work: helthcheck"]


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == INFRASTRUCTURE | set(SKEWER_COMMANDS) | set().union(*PROFILES.values())
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ElementTree.parse(ROOT / "deploy" / "kafka" / "pom.xml")
    kafka_version = pom.find("m:properties/m:kafka.version", namespace).text
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_version}"
    assert services["redis"]["image"].startswith("redis:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    for name in INFRASTRUCTURE:
        tag = services[name]["image"].rpartition(":")[2]
        assert re.fullmatch(r"v?\d+(\.\d+)+", tag), f"{name}: image tag {tag!r} is not a version"
    # The Spark daemons run the image's own PySpark, so the very Spark and Python of the driver.
    for name in [*SKEWER_COMMANDS, *SPARK_SERVICES]:
        service = services[name]
        assert service["build"] == {
            "context": ".",
            "dockerfile": "deploy/Dockerfile",
            "args": dockerfile_arguments(),
        }, name
        assert service["image"] == "skewer:local", name
        assert service["init"] is True, f"{name}: tini as PID 1 forwards SIGTERM to skewer"
    for name in KAFKA_NODES:
        assert services[name]["image"] == services["kafka"]["image"], name


def test_kafka_is_a_single_kraft_node_without_topic_auto_creation(
    compose: dict[str, Any],
) -> None:
    env = service_environment(compose["services"]["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:19093"
    assert env["CLUSTER_ID"] == config.KAFKA_CLUSTER_ID
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert listeners == {"INTERNAL": ":29092", "EXTERNAL": ":19092", "CONTROLLER": ":19093"}
    assert advertised == {"INTERNAL": "kafka:29092", "EXTERNAL": config.DEFAULT_KAFKA_BOOTSTRAP}
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    protocols = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert protocols == {
        "INTERNAL": "PLAINTEXT",
        "EXTERNAL": "PLAINTEXT",
        "CONTROLLER": "PLAINTEXT",
    }
    # The log lives on the named volume, so a recreated container keeps the topics.
    assert f"kafka-data:{env['KAFKA_LOG_DIRS']}" in compose["services"]["kafka"]["volumes"]


# --- ports --------------------------------------------------------------------------------------

_BOUND_PORT = re.compile(r"\$\{SKEWER_BIND_ADDRESS:-127\.0\.0\.1\}:(\d+):(\d+)")


def test_every_published_port_is_bound_to_the_bind_address(raw: dict[str, Any]) -> None:
    for name, service in raw["services"].items():
        for entry in service.get("ports", []):
            assert isinstance(entry, str) and _BOUND_PORT.fullmatch(entry), (
                f"{name}: port {entry!r} is not ${{SKEWER_BIND_ADDRESS:-127.0.0.1}}:HOST:CONTAINER"
            )


def test_host_ports_are_the_native_defaults_on_loopback(compose: dict[str, Any]) -> None:
    settings = config.load({})
    services = compose["services"]
    assert published_ports(services["kafka"]) == {19092: settings.kafka_port}
    assert published_ports(services["redis"]) == {6379: settings.redis_port}
    assert published_ports(services["prometheus"]) == {9090: settings.prometheus_port}
    assert published_ports(services["grafana"]) == {3000: 13000}
    # The standalone master's web UI is on the native master's UI port (its RPC port plus 1).
    assert published_ports(services["spark-master"]) == {8080: settings.spark_standalone_port + 1}
    for name in [*SKEWER_COMMANDS, "spark-worker", *KAFKA_NODES]:
        assert "ports" not in services[name], f"{name}: reached through the compose network only"


def test_the_bind_address_variable_moves_every_port(raw: dict[str, Any]) -> None:
    exposed = interpolate(raw, {**TEST_SECRETS, "SKEWER_BIND_ADDRESS": "0.0.0.0"})
    addresses = {
        str(entry).split(":")[0]
        for service in exposed["services"].values()
        for entry in service.get("ports", [])
    }
    assert addresses == {"0.0.0.0"}


# --- health checks and start order ----------------------------------------------------------

VALID_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
HEALTHY = {"condition": "service_healthy"}
AFTER_GROUP = {"kafka": HEALTHY, "redis": HEALTHY, "group": HEALTHY}


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name
    services = compose["services"]
    kafka_check = " ".join(services["kafka"]["healthcheck"]["test"])
    assert "kafka-broker-api-versions.sh --bootstrap-server kafka:29092" in kafka_check
    # redis-cli authenticates from REDISCLI_AUTH: the password is not in the check's command.
    assert services["redis"]["healthcheck"]["test"] == [
        "CMD-SHELL",
        "redis-cli ping | grep -q PONG",
    ]
    assert service_environment(services["redis"])["REDISCLI_AUTH"] == TEST_SECRETS["REDIS_PASSWORD"]
    assert "/-/ready" in services["prometheus"]["healthcheck"]["test"][-1]
    assert "/api/health" in services["grafana"]["healthcheck"]["test"][-1]


def test_start_order(compose: dict[str, Any]) -> None:
    depends = {name: s.get("depends_on", {}) for name, s in compose["services"].items()}
    assert depends == {
        "kafka": {},
        "redis": {},
        "prometheus": {},
        "grafana": {"prometheus": HEALTHY},
        "group": {"kafka": HEALTHY, "redis": HEALTHY},
        "work": AFTER_GROUP,
        "aggregate": AFTER_GROUP,
        # The controller exits 0 at once for a scheme without a routing table: started is enough.
        "control": AFTER_GROUP,
        "producer": {
            "group": HEALTHY,
            "work": HEALTHY,
            "aggregate": HEALTHY,
            "control": {"condition": "service_started"},
        },
        # `work` cannot wait for the master (a service of no profile may not depend on one of a
        # profile): on a cluster it exits 2 until the master answers, and is restarted.
        "spark-master": {},
        "spark-worker": {"spark-master": HEALTHY},
        # Three voters wait for each other's quorum, which depends_on cannot express (a cycle).
        "kafka-1": {},
        "kafka-2": {},
        "kafka-3": {},
    }
    for name, dependencies in depends.items():
        for dependency, condition in dependencies.items():
            assert condition["condition"] in VALID_CONDITIONS, (name, dependency)
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in compose["services"][dependency], (name, dependency)


def test_restart_policies(compose: dict[str, Any]) -> None:
    policies = {name: service.get("restart") for name, service in compose["services"].items()}
    # The producer ends after its records, the controller at once without a routing table.
    once = {"producer", "control"}
    assert policies == {
        name: "on-failure" if name in once else "unless-stopped" for name in policies
    }


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/metrics" else 404
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"skewer_up 1\n")

    def log_message(self, *_args: object) -> None:
        pass


def _run_health_check(test: list[str], port: int) -> int:
    assert test[:2] == ["CMD", "python"]
    command = [sys.executable, *test[2:]]
    command[-1] = command[-1].replace(f":{METRICS_PORT}/", f":{port}/")
    return subprocess.run(command, capture_output=True, check=False, timeout=30).returncode


def test_skewer_health_checks_probe_the_metrics_endpoint(compose: dict[str, Any]) -> None:
    """The check command itself is run: 0 while an endpoint answers, non-zero once it is gone."""
    tests = set()
    for name in SKEWER_COMMANDS:
        service = compose["services"][name]
        test = service["healthcheck"]["test"]
        env = service_environment(service)
        assert (env["SKEWER_METRICS_HOST"], env["SKEWER_METRICS_PORT"]) == ("0.0.0.0", "9464")
        assert f"http://127.0.0.1:{env['SKEWER_METRICS_PORT']}/metrics" in test[-1], name
        tests.add(tuple(test))
    [test] = tests
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert _run_health_check(list(test), port) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert _run_health_check(list(test), port) != 0


# --- secrets and variables ----------------------------------------------------------------------

_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|(?:^|_)AUTH$", re.IGNORECASE)


def test_no_literal_secrets(raw: dict[str, Any]) -> None:
    for name, service in raw["services"].items():
        for key, value in service_environment(service).items():
            if _SECRET_NAME.search(key):
                assert "${" in value, f"{name}: {key} holds a literal value"
        command = service.get("command", [])
        for flag, value in itertools.pairwise(command):
            if flag in ("--requirepass", "--password", "--masterauth"):
                assert str(value).startswith("${"), f"{name}: {flag} {value!r}"
    for path, value in strings(raw):
        for credentials in re.findall(r"://[^/@\s]*:([^/@\s]+)@", value):
            assert credentials.startswith("${"), f"{path}: a password in a URL: {value!r}"


def test_passwords_are_required_and_never_defaulted(
    raw: dict[str, Any], variables: dict[str, list[VariableUse]]
) -> None:
    for name in REQUIRED_SECRETS:
        assert variables[name], name
        assert {use.operator for use in variables[name]} == {":?"}, name
    for name in variables:
        if _SECRET_NAME.search(name) and name not in REQUIRED_SECRETS:
            # Optional, as a login to a Kafka of the user's own is: nothing but empty by default.
            uses = {(use.operator, use.arg) for use in variables[name]}
            assert uses == {(":-", "")}, f"{name} looks secret but has a default: {uses}"
    for missing in REQUIRED_SECRETS:
        env = {key: value for key, value in TEST_SECRETS.items() if key != missing}
        with pytest.raises(MissingVariableError, match=missing):
            interpolate(raw, env)
        with pytest.raises(MissingVariableError, match=missing):
            interpolate(raw, {**env, missing: ""})


def test_redis_and_grafana_use_the_passwords(compose: dict[str, Any]) -> None:
    services = compose["services"]
    command = services["redis"]["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--requirepass") + 1] == TEST_SECRETS["REDIS_PASSWORD"]
    grafana = service_environment(services["grafana"])
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == TEST_SECRETS["GRAFANA_ADMIN_PASSWORD"]
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"


@dataclass
class EnvExample:
    required: dict[str, str] = field(default_factory=dict)  # uncommented: NAME=value
    optional: dict[str, str] = field(default_factory=dict)  # commented: # NAME=default


def _env_example() -> EnvExample:
    entries = EnvExample()
    for line in ENV_EXAMPLE.read_text().splitlines():
        if match := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line):
            entries.required[match[1]] = match[2]
        elif match := re.fullmatch(r"# ([A-Z][A-Z0-9_]*)=(.*)", line):
            entries.optional[match[1]] = match[2]
    return entries


def test_env_example_lists_every_variable_with_its_default(
    variables: dict[str, list[VariableUse]],
) -> None:
    example = _env_example()
    assert set(example.required) | set(example.optional) == set(variables)
    assert set(example.required) == REQUIRED_SECRETS
    # Placeholders only: the secrets are left empty, so a copied .env fails until filled in.
    assert set(example.required.values()) == {""}
    assert example.optional == variable_defaults(variables)


def test_each_variable_has_one_default(variables: dict[str, list[VariableUse]]) -> None:
    for name, uses in variables.items():
        assert len({(use.operator, use.arg) for use in uses}) == 1, (name, uses)
        assert uses[0].operator in (":-", ":?"), f"{name}: unset and empty must mean the same"


def test_secrets_stay_out_of_git_and_the_image() -> None:
    assert ".env" in ROOT.joinpath(".gitignore").read_text().splitlines()
    ignore = dockerignore()
    assert ignore.excludes(".env") and ignore.excludes(".env.local")
    assert ignore.excludes(".venv/bin/python") and ignore.excludes(".cache/run/docker/key.json")
    # Of the cache, only what skewer's image takes instead of downloading it again.
    assert ignore.excludes(".cache/m2/org/x.jar") and ignore.excludes(".cache/go/pkg/mod/y")
    assert not ignore.excludes(".cache/spark-jars/a.jar")


# --- mounts and volumes -------------------------------------------------------------------------


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    bind_mounts = {
        (name, target): source
        for name, service in compose["services"].items()
        for source, target in service_mounts(service)
        if source.startswith(".")
    }
    assert set(bind_mounts) == {
        ("prometheus", "/etc/prometheus/prometheus.yml"),
        ("prometheus", "/etc/prometheus/rules.yml"),
        ("grafana", "/etc/grafana/provisioning"),
        ("grafana", "/var/lib/grafana/dashboards"),
    }
    for (name, _), source in bind_mounts.items():
        assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    for source in bind_mounts.values():
        assert (ROOT / source).resolve().is_relative_to(ROOT), source


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    used = {
        source
        for service in compose["services"].values()
        for source, _ in service_mounts(service)
        if not source.startswith((".", "/"))
    }
    assert (
        used
        == set(compose["volumes"])
        == {
            "kafka-data",
            "kafka-1-data",
            "kafka-2-data",
            "kafka-3-data",
            "redis-data",
            "prometheus-data",
            "checkpoints",
        }
    )


def _container_to_host(service: dict[str, Any], container_path: str) -> Path:
    for source, target in service_mounts(service):
        if container_path == target or container_path.startswith(target + "/"):
            return ROOT / source / container_path.removeprefix(target).lstrip("/")
    raise AssertionError(f"{container_path} is not mounted from the repository")


def test_grafana_opens_on_the_overview_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    home = service_environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/overview.json"
    host_file = _container_to_host(grafana, home)
    assert host_file.is_file(), f"{host_file} does not exist"
    assert json.loads(host_file.read_text())["uid"]
    providers = sorted((ROOT / "grafana" / "provisioning" / "dashboards").glob("*.yml"))
    assert providers, "no dashboard provider in grafana/provisioning/dashboards"
    for provider_file in providers:
        for provider in yaml.safe_load(provider_file.read_text())["providers"]:
            assert _container_to_host(grafana, provider["options"]["path"]).is_dir()


def test_grafana_datasource_is_the_compose_prometheus(compose: dict[str, Any]) -> None:
    datasources = yaml.safe_load(
        (ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    [source] = datasources["datasources"]
    url = urlsplit(source["url"])
    assert url.hostname in compose["services"]
    assert url.port in published_ports(compose["services"][url.hostname])
    prometheus = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]


def test_redis_keeps_an_append_only_file_on_its_volume(
    raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    redis = compose["services"]["redis"]
    command = [str(part) for part in redis["command"]]
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--appendonly"] == "yes" and flags["--save"] == ""
    # The same durability settings as the native Redis, fsync policy default included.
    native = RedisService(config.load({})).command()
    native_flags = dict(zip(native[1::2], native[2::2], strict=True))
    for flag in (
        "--appendonly",
        "--appendfsync",
        "--auto-aof-rewrite-percentage",
        "--auto-aof-rewrite-min-size",
        "--save",
    ):
        assert flags[flag] == native_flags[flag], flag
    assert flags["--appendfsync"] == config.DEFAULT_REDIS_APPENDFSYNC
    # The file is written to the working directory (the image's /data, no --dir): the volume.
    assert "--dir" not in flags
    assert ("redis-data", "/data") in service_mounts(redis)
    for policy in config.REDIS_APPENDFSYNC_POLICIES:
        switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_REDIS_APPENDFSYNC": policy})
        command = switched["services"]["redis"]["command"]
        assert command[command.index("--appendfsync") + 1] == policy


# --- Prometheus ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())


def test_prometheus_scrapes_every_skewer_service(
    compose: dict[str, Any], prometheus_config: dict[str, Any]
) -> None:
    assert prometheus_config["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in prometheus_config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "skewer"}
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["localhost:9090"]}]
    targets = {
        target: group["labels"]["stage"]
        for group in jobs["skewer"]["static_configs"]
        for target in group["targets"]
    }
    expected = {}
    for name, command in SKEWER_COMMANDS.items():
        port = service_environment(compose["services"][name])["SKEWER_METRICS_PORT"]
        expected[f"{name}:{port}"] = command
    assert targets == expected


def test_prometheus_reads_the_shared_rules_where_compose_mounts_them(
    compose: dict[str, Any], prometheus_config: dict[str, Any]
) -> None:
    mounts = {
        target: source for source, target in service_mounts(compose["services"]["prometheus"])
    }
    config_path = PurePosixPath("/etc/prometheus/prometheus.yml")
    assert mounts[str(config_path)] == "./deploy/prometheus/prometheus.yml"
    assert prometheus_config["rule_files"] == ["rules.yml"]
    # Relative rule files are resolved against the config file's folder.
    assert mounts[str(config_path.parent / "rules.yml")] == "./deploy/prometheus/rules.yml"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_compose_config(tmp_path: Path) -> None:
    rules = PROMETHEUS_DIR / "rules.yml"
    assert rules.exists(), "deploy/prometheus/rules.yml (the shared recording rules) is missing"
    shutil.copy(PROMETHEUS_DIR / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(rules, tmp_path / "rules.yml")
    result = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


# --- docker compose itself, when it is installed ------------------------------------------------


# Marked docker: CI runs it in the pass that has built the plugin (tests/run-with-docker.sh),
# where a missing plugin fails it.
@pytest.mark.docker
@pytest.mark.parametrize("profiles", [[], sorted(PROFILES)])
def test_docker_compose_config_accepts_the_file(profiles: list[str]) -> None:
    # Compose's check of the file: PATH, the caller's DOCKER_CONFIG or the checkout's, and
    # nothing else of the environment (a user's .env variables must not fill the file's gaps).
    environment = compose_command_environment(
        {"PATH": os.environ["PATH"]}
        | {name: os.environ[name] for name in ("DOCKER_CONFIG",) if name in os.environ}
    )
    if environment is None:
        require_part("no docker compose plugin (`skewer services install --docker` builds one)")
    assert environment is not None
    flags = [word for profile in profiles for word in ("--profile", profile)]
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), *flags, "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        env={**environment, **TEST_SECRETS},
    )
    assert result.returncode == 0, result.stderr


def test_ports_are_free_of_collisions(compose: dict[str, Any]) -> None:
    host_ports = [
        port
        for service in compose["services"].values()
        for port in published_ports(service).values()
    ]
    assert len(host_ports) == len(set(host_ports))
