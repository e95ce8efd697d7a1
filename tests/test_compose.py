"""The docker compose stack is complete, consistent and safe, checked without a Docker daemon.

There is no Docker engine on the development machines, so everything compose and the image
builder would reject is checked here instead, against the real files:

- ``docker-compose.yml`` is interpolated the way compose does it (``${VAR:-default}``,
  ``${VAR:?error}``, ``$$``; :func:`interpolate`), its keys checked against the subset of the
  Compose Specification the stack uses (a misspelt key fails), then checked for what the stack
  needs: start order, health checks, ports on the bind address, no literal
  secrets, every variable documented in .env.example with the same default, the files it
  mounts present;
- every skewer service's command is parsed by the real ``skewer`` argument parser, so a wrong
  flag fails here, and the services agree on run id, topics, W and S;
- the two profiles: ``spark-cluster`` (a standalone master and scalable workers from the
  skewer image, their launcher run for real; ``work`` the driver) and ``kafka-cluster``
  (three KRaft nodes agreeing on quorum, cluster id and replication), neither changing what
  ``docker compose up`` starts, and the variables that point skewer at them;
- the compose Prometheus config scrapes exactly the skewer services and passes
  ``promtool check config`` (with the shared recording rules next to it);
- deploy/Dockerfile: pinned base images, COPY sources present and not excluded by
  .dockerignore, a non-root user, ``ENTRYPOINT ["skewer"]``, and paths that agree with
  pipeline/io/config.py and the compose volumes.

When the Docker CLI has its compose plugin, ``docker compose config -q`` validates the file too.

>>> interpolate("${A:-x}-${B:?B is required}-$$HOME", {"B": "b"})
'x-b-$HOME'
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from service_backends import compose_command_environment

from pipeline.cli import demo
from pipeline.cli.app import build_parser
from pipeline.io import config, kafka_io, kafka_security, spark_session
from pipeline.services import docker_images, spark_standalone
from pipeline.services.redis_server import RedisService
from pipeline.stages import grouping
from producers.workloads import DEFAULT_WORKLOAD

ROOT = config.PROJECT_ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"

INFRASTRUCTURE = {"kafka", "redis", "prometheus", "grafana"}
#: The services of each profile; every other service has none (``docker compose up`` runs it).
PROFILES = {
    "spark-cluster": {"spark-master", "spark-worker"},
    "kafka-cluster": {"kafka-1", "kafka-2", "kafka-3"},
}
SPARK_SERVICES = PROFILES["spark-cluster"]
KAFKA_NODES = {f"kafka-{node}": node for node in (1, 2, 3)}
#: skewer's own services and the ``skewer`` subcommand each runs.
SKEWER_COMMANDS = {
    "group": "group",
    "work": "work",
    "aggregate": "aggregate",
    "control": "control",
    "producer": "produce",
}
#: Variables compose must refuse to start without (``${VAR:?message}``, no default).
REQUIRED_SECRETS = {"REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD"}
#: Values the tests give the required secrets.
TEST_SECRETS = {"REDIS_PASSWORD": "redis-test-password", "GRAFANA_ADMIN_PASSWORD": "grafana-test"}
METRICS_PORT = 9464


# --- compose's variable interpolation ---------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<operator>:?[-?+])(?P<arg>.*))?")


class MissingVariableError(Exception):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is unset: compose refuses."""


@dataclass(frozen=True)
class VariableUse:
    name: str
    operator: str  # "", "-", ":-", "?", ":?", "+", ":+"
    arg: str


#: The project's own top-level packages.
PROJECT = ("pipeline", "operators", "producers", "bench")


def variable_uses(text: str) -> list[VariableUse]:
    uses = []
    for match in _VARIABLE.finditer(text):
        if match["named"]:
            uses.append(VariableUse(match["named"], "", ""))
        elif match["braced"] is not None:
            parts = _BRACED.fullmatch(match["braced"])
            assert parts, f"invalid interpolation ${{{match['braced']}}} in {text!r}"
            uses.append(VariableUse(parts["name"], parts["operator"] or "", parts["arg"] or ""))
    return uses


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    if match["escaped"]:
        return "$"
    if match["named"]:
        return env.get(match["named"], "")
    [use] = variable_uses(match[0])
    value = env.get(use.name)
    empty = value is None or (value == "" and use.operator.startswith(":"))
    if use.operator.endswith("-"):
        return use.arg if empty else str(value)
    if use.operator.endswith("?"):
        if empty:
            raise MissingVariableError(f"{use.name}: {use.arg}")
        return str(value)
    if use.operator.endswith("+"):
        return "" if empty else use.arg
    return value or ""


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """``node`` with every string interpolated as compose does (values, not keys)."""
    if isinstance(node, str):
        return _VARIABLE.sub(lambda match: _substitute(match, env), node)
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    return node


def strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, value) of every string value in a parsed YAML document."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from strings(item, f"{path}[{index}]")


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml as written (YAML anchors and merge keys resolved, no interpolation)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """The file as compose runs it with only the required secrets set: every default applies."""
    return interpolate(raw, TEST_SECRETS)


@pytest.fixture(scope="module")
def variables(raw: dict[str, Any]) -> dict[str, list[VariableUse]]:
    found: dict[str, list[VariableUse]] = {}
    for _, value in strings(raw):
        for use in variable_uses(value):
            found.setdefault(use.name, []).append(use)
    return found


def _defaults(variables: dict[str, list[VariableUse]]) -> dict[str, str]:
    return {
        name: uses[0].arg for name, uses in variables.items() if uses[0].operator in (":-", "-")
    }


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


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
            "args": _global_arguments(),
        }, name
        assert service["image"] == "skewer:local", name
        assert service["init"] is True, f"{name}: tini as PID 1 forwards SIGTERM to skewer"
    for name in KAFKA_NODES:
        assert services[name]["image"] == services["kafka"]["image"], name


def test_kafka_is_a_single_kraft_node_without_topic_auto_creation(
    compose: dict[str, Any],
) -> None:
    env = _environment(compose["services"]["kafka"])
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


def _host_ports(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port of an interpolated service."""
    mapping = {}
    for entry in service.get("ports", []):
        address, host, container = str(entry).split(":")
        assert address == "127.0.0.1", f"{entry!r}: published beyond loopback by default"
        mapping[int(container)] = int(host)
    return mapping


def test_host_ports_are_the_native_defaults_on_loopback(compose: dict[str, Any]) -> None:
    settings = config.load({})
    services = compose["services"]
    assert _host_ports(services["kafka"]) == {19092: settings.kafka_port}
    assert _host_ports(services["redis"]) == {6379: settings.redis_port}
    assert _host_ports(services["prometheus"]) == {9090: settings.prometheus_port}
    assert _host_ports(services["grafana"]) == {3000: 13000}
    # The standalone master's web UI is on the native master's UI port (its RPC port plus 1).
    assert _host_ports(services["spark-master"]) == {8080: settings.spark_standalone_port + 1}
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
    assert _environment(services["redis"])["REDISCLI_AUTH"] == TEST_SECRETS["REDIS_PASSWORD"]
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
        env = _environment(service)
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
        for key, value in _environment(service).items():
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
    grafana = _environment(services["grafana"])
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
    assert example.optional == _defaults(variables)


def test_each_variable_has_one_default(variables: dict[str, list[VariableUse]]) -> None:
    for name, uses in variables.items():
        assert len({(use.operator, use.arg) for use in uses}) == 1, (name, uses)
        assert uses[0].operator in (":-", ":?"), f"{name}: unset and empty must mean the same"


def test_secrets_stay_out_of_git_and_the_image() -> None:
    assert ".env" in ROOT.joinpath(".gitignore").read_text().splitlines()
    ignore = _dockerignore()
    assert ignore.excludes(".env") and ignore.excludes(".env.local")
    assert ignore.excludes(".venv/bin/python") and ignore.excludes(".cache/run/docker/key.json")
    # Of the cache, only what skewer's image takes instead of downloading it again.
    assert ignore.excludes(".cache/m2/org/x.jar") and ignore.excludes(".cache/go/pkg/mod/y")
    assert not ignore.excludes(".cache/spark-jars/a.jar")


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
    kafka = _environment(services["kafka"])
    internal = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    redis_port = next(iter(_host_ports(services["redis"])))
    for name in SKEWER_COMMANDS:
        env = _environment(services[name])
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
            assert _environment(compose["services"][name])["GROUPING_SCHEME"] == scheme


def test_control_interval_default_is_the_controllers(
    variables: dict[str, list[VariableUse]],
) -> None:
    own_default = _parse(["control", "--workers", "1"]).interval
    assert float(_defaults(variables)["CONTROL_INTERVAL"]) == own_default


def test_the_default_scheme_runs_live(variables: dict[str, list[VariableUse]]) -> None:
    defaults = _defaults(variables)
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


def _profiles(service: dict[str, Any]) -> set[str]:
    return set(service.get("profiles", []))


def _enabled(compose: dict[str, Any], active: set[str]) -> set[str]:
    """The services compose runs with the profiles ``active`` (those of no profile always)."""
    return {
        name
        for name, service in compose["services"].items()
        if not _profiles(service) or _profiles(service) & active
    }


def test_profiles_leave_the_default_stack_unchanged(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for profile, members in PROFILES.items():
        assert {name for name, s in services.items() if profile in _profiles(s)} == members
        assert all(_profiles(services[name]) == {profile} for name in members), profile
    assert _enabled(compose, set()) == INFRASTRUCTURE | set(SKEWER_COMMANDS)


@pytest.mark.parametrize(
    "active", [set(), {"spark-cluster"}, {"kafka-cluster"}, {"spark-cluster", "kafka-cluster"}]
)
def test_services_depend_only_on_services_their_profiles_enable(
    compose: dict[str, Any], active: set[str]
) -> None:
    """Compose refuses a model in which an enabled service depends on one that no active
    profile enables (it does not start the dependency instead)."""
    enabled = _enabled(compose, active)
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
    stages = _dockerfile_stages()
    assert _env(stages, len(stages) - 1)["PATH"].startswith("/opt/venv/bin:")


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
    assert master_flags["--webui-port"] == "8080" and 8080 in _host_ports(services["spark-master"])

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
    assert _environment(worker_service)["SPARK_WORKER_OPTS"] == native["SPARK_WORKER_OPTS"]
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
    work = _environment(compose["services"]["work"])
    assert config.load(work).spark_master == config.DEFAULT_SPARK_MASTER == "local"

    switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_SPARK_MASTER": url})
    for name in SKEWER_COMMANDS:
        assert config.load(_environment(switched["services"][name])).spark_master == url, name
    # Not a loopback master, so the session leaves the driver's address to Spark, whose
    # default (spark.driver.host) is SPARK_LOCAL_HOSTNAME: the name executors reach `work` by.
    assert not spark_session._on_this_machine(url)
    assert _environment(switched["services"]["work"])["SPARK_LOCAL_HOSTNAME"] == "work"
    # The default run fits the default two workers: a micro-batch runs its W tasks at once.
    defaults = _defaults(variables)
    assert int(defaults["WORKERS"]) <= 2 * int(defaults["SPARK_WORKER_CORES"])
    assert f"SKEWER_SPARK_MASTER={url}" in ENV_EXAMPLE.read_text()


def test_the_kafka_login_variables_reach_every_skewer_service(
    raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    """Plaintext unless set; set, every skewer service's clients log in with them."""
    for name in SKEWER_COMMANDS:
        env = _environment(compose["services"][name])
        assert config.load(env).kafka_security == kafka_security.KafkaSecurity(), name
    login = {
        kafka_security.ENV_SECURITY_PROTOCOL: "SASL_PLAINTEXT",
        kafka_security.ENV_SASL_MECHANISM: "SCRAM-SHA-512",
        kafka_security.ENV_SASL_USERNAME: "skewer",
        kafka_security.ENV_SASL_PASSWORD: "s3cret",
    }
    switched = interpolate(raw, {**TEST_SECRETS, **login})
    for name in SKEWER_COMMANDS:
        env = _environment(switched["services"][name])
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
    envs = {name: _environment(services[name]) for name in KAFKA_NODES}
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
        env = _environment(compose["services"][name])
        assert {key: env.get(key) for key in expected} == expected, name
        # The replication factor cannot exceed the cluster, and a write survives one loss.
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < 3 <= len(KAFKA_NODES)
    # The single broker stays a single replica.
    single = _environment(compose["services"]["kafka"])
    assert single["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_the_bootstrap_variable_points_every_skewer_service_at_the_cluster(
    raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    nodes = [
        _listeners(_environment(compose["services"][name])["KAFKA_ADVERTISED_LISTENERS"])
        for name in sorted(KAFKA_NODES)
    ]
    bootstrap = ",".join(node["INTERNAL"] for node in nodes)
    assert bootstrap == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_KAFKA_BOOTSTRAP": bootstrap})
    for name in SKEWER_COMMANDS:
        settings = config.load(_environment(switched["services"][name]))
        assert config.host_ports(settings.kafka_bootstrap, config.ENV_KAFKA_BOOTSTRAP) == [
            (f"kafka-{node}", 9092) for node in (1, 2, 3)
        ], name
    # .env.example and the README give exactly this list.
    assert f"SKEWER_KAFKA_BOOTSTRAP={bootstrap}" in ENV_EXAMPLE.read_text()
    assert f"SKEWER_KAFKA_BOOTSTRAP={bootstrap}" in (ROOT / "README.md").read_text()


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
    assert ("redis-data", "/data") in _mounts(redis)
    for policy in config.REDIS_APPENDFSYNC_POLICIES:
        switched = interpolate(raw, {**TEST_SECRETS, "SKEWER_REDIS_APPENDFSYNC": policy})
        command = switched["services"]["redis"]["command"]
        assert command[command.index("--appendfsync") + 1] == policy


# --- mounts and volumes -------------------------------------------------------------------------


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    return [tuple(str(volume).split(":")[:2]) for volume in service.get("volumes", [])]


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    bind_mounts = {
        (name, target): source
        for name, service in compose["services"].items()
        for source, target in _mounts(service)
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
        for source, _ in _mounts(service)
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
    for source, target in _mounts(service):
        if container_path == target or container_path.startswith(target + "/"):
            return ROOT / source / container_path.removeprefix(target).lstrip("/")
    raise AssertionError(f"{container_path} is not mounted from the repository")


def test_grafana_opens_on_the_overview_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    home = _environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
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
    assert url.port in _host_ports(compose["services"][url.hostname])
    prometheus = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]


# --- images: the official ones by default, local stand-ins through one env file -----------------

#: The variable each infrastructure service takes its image from.
IMAGE_VARIABLES = {
    "kafka": "KAFKA_IMAGE",
    "redis": "REDIS_IMAGE",
    "prometheus": "PROMETHEUS_IMAGE",
    "grafana": "GRAFANA_IMAGE",
}
#: deploy/Dockerfile's build arguments and the variable compose passes each from.
BUILD_ARGUMENTS = {"BASE_IMAGE": "SKEWER_BASE_IMAGE", "MAVEN_IMAGE": "SKEWER_MAVEN_IMAGE"}
LOCAL_ENV = ROOT / "deploy" / "images" / "local.env"


def test_image_names_are_variables_whose_defaults_are_the_official_images(
    raw: dict[str, Any],
) -> None:
    services = raw["services"]
    for name, variable in IMAGE_VARIABLES.items():
        [use] = variable_uses(services[name]["image"])
        assert (use.name, use.operator) == (variable, ":-"), name
        assert services[name]["image"] == f"${{{variable}:-{use.arg}}}", name
        assert not use.arg.startswith("skewer-local/"), f"{name}: the default is the official image"
    for name in KAFKA_NODES:
        assert services[name]["image"] == services["kafka"]["image"], name
    # The skewer build passes the Dockerfile's own defaults unless a variable says otherwise.
    defaults = _global_arguments()
    assert set(defaults) == set(BUILD_ARGUMENTS)
    for name in [*SKEWER_COMMANDS, *SPARK_SERVICES]:
        assert services[name]["build"]["args"] == {
            argument: f"${{{variable}:-{defaults[argument]}}}"
            for argument, variable in BUILD_ARGUMENTS.items()
        }, name
    raw_froms = [
        line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")
    ]
    assert {"${BASE_IMAGE}", "${MAVEN_IMAGE}"} <= set(raw_froms)


def test_the_local_env_file_switches_every_image_grafana_aside(raw: dict[str, Any]) -> None:
    local = docker_images.read_env_file(LOCAL_ENV.read_text())
    assert set(local) == (set(IMAGE_VARIABLES.values()) - {"GRAFANA_IMAGE"}) | set(
        BUILD_ARGUMENTS.values()
    )
    switched = interpolate(raw, {**TEST_SECRETS, **local})
    official = interpolate(raw, TEST_SECRETS)
    for name, variable in IMAGE_VARIABLES.items():
        expected = local.get(variable, official["services"][name]["image"])
        assert switched["services"][name]["image"] == expected, name
    assert switched["services"]["grafana"]["image"].startswith("grafana/grafana:")
    for name in KAFKA_NODES:
        assert switched["services"][name]["image"] == local["KAFKA_IMAGE"], name
    # skewer's services keep their image name: the build arguments change what it is built on.
    for name in [*SKEWER_COMMANDS, *SPARK_SERVICES]:
        assert switched["services"][name]["image"] == official["services"][name]["image"], name
    build = switched["services"]["work"]["build"]["args"]
    assert build == {argument: local[variable] for argument, variable in BUILD_ARGUMENTS.items()}
    # The builder tags its images with exactly these names.
    tags = docker_images.local_tags(LOCAL_ENV)
    for image in docker_images.IMAGES:
        if image.variable:
            assert tags[image.name] == local[image.variable], image.name
    assert tags["skewer"] == official["services"]["work"]["image"]


def test_the_stack_without_grafana_is_two_services_and_what_they_need(
    compose: dict[str, Any],
) -> None:
    """Grafana has no local image: ``up prometheus producer`` starts the rest of the default
    stack, as compose also starts every service a named one depends on."""
    services = compose["services"]
    started, pending = set(), list(docker_images.STACK_WITHOUT_GRAFANA)
    while pending:
        name = pending.pop()
        if name not in started:
            started.add(name)
            pending += list(services[name].get("depends_on", {}))
    assert started == _enabled(compose, set()) - {"grafana"}
    assert docker_images.COMPOSE_UP_LOCAL.endswith(
        "up -d " + " ".join(docker_images.STACK_WITHOUT_GRAFANA)
    )
    assert "--env-file .env --env-file deploy/images/local.env" in docker_images.COMPOSE_UP_LOCAL
    assert docker_images.COMPOSE_UP_LOCAL in (ROOT / "README.md").read_text()


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
        port = _environment(compose["services"][name])["SKEWER_METRICS_PORT"]
        expected[f"{name}:{port}"] = command
    assert targets == expected


def test_prometheus_reads_the_shared_rules_where_compose_mounts_them(
    compose: dict[str, Any], prometheus_config: dict[str, Any]
) -> None:
    mounts = {target: source for source, target in _mounts(compose["services"]["prometheus"])}
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


# --- the Dockerfile -----------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    arguments: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]


def _global_arguments() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` lines before its first FROM: the images its
    stages start from (a FROM names them as ``${NAME}``)."""
    arguments = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM "):
            break
        if line.startswith("ARG "):
            name, _, default = line.removeprefix("ARG ").strip().partition("=")
            arguments[name] = default
    return arguments


def _dockerfile_stages() -> list[Stage]:
    """The stages, their base images with the build arguments' defaults (the official images)."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for text in logical:
        keyword, _, arguments = text.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            continue  # the base images' arguments (_global_arguments)
        if keyword == "FROM":
            words = _VARIABLE.sub(
                lambda match: _global_arguments()[match["braced"] or match["named"]],
                arguments,
            ).split()
            assert len(words) in (1, 3), f"FROM {arguments}"
            stages.append(Stage(words[0], words[2] if len(words) == 3 else None))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append(Instruction(keyword, arguments.strip()))
    return stages


def _copy_parts(arguments: str) -> tuple[dict[str, str], list[str], str]:
    words = shlex.split(arguments)
    flags = dict(word[2:].split("=", 1) for word in words if word.startswith("--"))
    paths = [word for word in words if not word.startswith("--")]
    return flags, paths[:-1], paths[-1]


def _env(stages: list[Stage], upto: int) -> dict[str, str]:
    """The ENV in force in stage ``upto`` (inherited through ``FROM <stage>``)."""
    names = {stage.name: index for index, stage in enumerate(stages)}
    chain, index = [], upto
    while index is not None:
        chain.append(stages[index])
        index = names.get(stages[index].image)
    env: dict[str, str] = {}
    for stage in reversed(chain):
        for arguments in stage.all("ENV"):
            for word in shlex.split(arguments):
                key, _, value = word.partition("=")
                env[key] = value
    return env


class DockerIgnore:
    """.dockerignore's patterns with Docker's meaning: the last matching pattern wins, ``!``
    re-includes, ``**`` spans folders, and a pattern matching a folder covers its contents."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            regex = ""
            for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
                regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                    part, re.escape(part)
                )
            self.rules.append((include, re.compile(regex)))

    def excludes(self, path: str) -> bool:
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[: index + 1]) for index in range(len(parts))]
        excluded = False
        for include, regex in self.rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                excluded = not include
        return excluded


def _dockerignore() -> DockerIgnore:
    return DockerIgnore(DOCKERIGNORE.read_text())


def test_dockerignore_semantics() -> None:
    ignore = DockerIgnore("**/__pycache__\n.cache\ntests\n!tests/keep.py\n")
    assert ignore.excludes("pipeline/__pycache__/config.cpython-311.pyc")
    assert ignore.excludes("__pycache__/x.pyc")
    assert ignore.excludes(".cache/spark-jars/kafka.jar")
    assert ignore.excludes("tests/test_compose.py") and not ignore.excludes("tests/keep.py")
    assert not ignore.excludes("pipeline/io/config.py")


def test_dockerfile_base_images_are_pinned() -> None:
    stages = _dockerfile_stages()
    names = {stage.name for stage in stages}
    external = [stage.image for stage in stages if stage.image not in names]
    assert external
    for image in external:
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{image} has no tag"
        assert tag != "latest" and re.match(r"v?\d+(\.\d+)+", tag), f"{image}: pin a version"
    python_image = next(image for image in external if image.startswith("python:"))
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.search(r">=(\d+\.\d+)", requires)[1]
    assert python_image.startswith(f"python:{minor}."), (python_image, requires)
    assert sys.version.startswith(f"{minor}.")


def test_dockerfile_copies_existing_files_that_the_context_keeps() -> None:
    stages = _dockerfile_stages()
    ignore = _dockerignore()
    names = {stage.name for stage in stages}
    copied = set()
    for stage in stages:
        for arguments in stage.all("COPY") + stage.all("ADD"):
            flags, sources, _ = _copy_parts(arguments)
            if "from" in flags:
                assert flags["from"] in names, f"COPY --from={flags['from']}: no such stage"
                continue
            # A glob is a source that may be absent (what this machine fetched already, in
            # .cache/); both builders refuse a COPY that matches nothing, so one must be there.
            optional = [source for source in sources if re.search(r"[*?\[]", source)]
            assert len(optional) < len(sources), f"COPY {arguments}: may match nothing"
            for source in sources:
                assert not ignore.excludes(source.replace("[", "").replace("]", "")), (
                    f"COPY {source}: excluded by .dockerignore"
                )
                if source in optional:
                    continue
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source.rstrip("/"))
    # Everything `pip install -e .` needs: the packages of pyproject.toml and its readme.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages | {"pyproject.toml", pyproject["project"]["readme"], "deploy"} <= copied


def _assert_project_names_resolve(program: str) -> None:
    """Every ``from pipeline|operators|producers... import NAME`` of ``program`` imports, and
    every ``NAME.attribute`` it uses of such a name exists."""
    imported: dict[str, object] = {}
    tree = ast.parse(program)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT:
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                imported[alias.asname or alias.name] = value
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            assert hasattr(imported[node.value.id], node.attr), f"{node.value.id}.{node.attr}"


def test_dockerfile_run_steps_are_valid_shell_and_python() -> None:
    """`sh -n` on every RUN; every inline `python -c` program compiles, and the project names
    it imports and uses exist (a module that moved breaks the image build otherwise)."""
    programs = 0
    for stage in _dockerfile_stages():
        for run in stage.all("RUN"):
            check = subprocess.run(["sh", "-n", "-c", run], capture_output=True, text=True)
            assert check.returncode == 0, f"RUN {run}\n{check.stderr}"
            words = shlex.split(run.replace(";", " ; "))
            for index, word in enumerate(words[:-2]):
                if word.rpartition("/")[2] in ("python", "python3") and words[index + 1] == "-c":
                    compile(words[index + 2], "<RUN python -c>", "exec")
                    _assert_project_names_resolve(words[index + 2])
                    programs += 1
    assert programs == 2


def test_dockerfile_runs_as_a_non_root_user_with_skewer_as_entrypoint() -> None:
    final = _dockerfile_stages()[-1]
    users = final.all("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json.loads(final.all("ENTRYPOINT")[-1]) == ["skewer"]
    last_user = max(i for i, step in enumerate(final.instructions) if step.keyword == "USER")
    assert all(step.keyword != "RUN" for step in final.instructions[last_user:])


def test_dockerfile_paths_agree_with_the_config_and_the_volumes(compose: dict[str, Any]) -> None:
    stages = _dockerfile_stages()
    env = _env(stages, len(stages) - 1)
    settings = config.load({config.ENV_CACHE_DIR: env[config.ENV_CACHE_DIR]})
    final = stages[-1]
    copies = [_copy_parts(arguments) for arguments in final.all("COPY")]
    jar_targets = [target for flags, _, target in copies if flags.get("from") == "spark-jars"]
    assert jar_targets == [str(settings.spark_jars_dir)]
    # The jar stage fetches with the project's own code, which writes the marker that makes
    # `skewer work` use the jars without Maven (pipeline.io.artifacts._maven_copy).
    jar_stage = next(stage for stage in stages if stage.name == "spark-jars")
    assert any("artifacts.ensure_spark_jars()" in run for run in jar_stage.all("RUN"))
    assert _env(stages, stages.index(jar_stage))[config.ENV_CACHE_DIR] == str(settings.cache_dir)
    # Spark's checkpoints (work.py's default place) are on the named volume.
    work_mounts = dict(_mounts(compose["services"]["work"]))
    assert work_mounts["checkpoints"] == str(settings.cache_dir / "checkpoints")
    # Editable install in place: config.PROJECT_ROOT (and so DEPLOY_DIR) is the WORKDIR.
    assert "/opt/venv/bin/pip install --no-deps -e ." in " ".join(final.all("RUN"))
    workdirs = final.all("WORKDIR")
    assert workdirs[0] == "/opt/skewer"
    # The pins live in pyproject.toml only.
    assert "==" not in DOCKERFILE.read_text()


# --- docker compose itself, when it is installed ------------------------------------------------


# Compose's check of the file: PATH, the caller's DOCKER_CONFIG or the checkout's, and nothing
# else of the environment (a user's .env variables must not fill the file's gaps).
COMPOSE_ENVIRONMENT = compose_command_environment(
    {"PATH": os.environ["PATH"]}
    | {name: os.environ[name] for name in ("DOCKER_CONFIG",) if name in os.environ}
)


# Marked docker: CI runs it in the pass that has built the plugin (tests/run-with-docker.sh).
@pytest.mark.docker
@pytest.mark.skipif(
    COMPOSE_ENVIRONMENT is None,
    reason="no docker compose plugin (`skewer services install --docker` builds one)",
)
@pytest.mark.parametrize("profiles", [[], sorted(PROFILES)])
def test_docker_compose_config_accepts_the_file(profiles: list[str]) -> None:
    assert COMPOSE_ENVIRONMENT is not None
    flags = [word for profile in profiles for word in ("--profile", profile)]
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), *flags, "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        env={**COMPOSE_ENVIRONMENT, **TEST_SECRETS},
    )
    assert result.returncode == 0, result.stderr


def test_ports_are_free_of_collisions(compose: dict[str, Any]) -> None:
    host_ports = [
        port for service in compose["services"].values() for port in _host_ports(service).values()
    ]
    assert len(host_ports) == len(set(host_ports))
