"""docker-compose.yml is complete and consistent, checked without a Docker daemon.

The file is parsed as YAML and checked against what the stack needs: Kafka in KRaft mode from
Apache's image at the native broker's version, Redis, Prometheus and Grafana, each with a health
check and its ports bound to 127.0.0.1, the files they mount present, and the host ports the
native services' defaults (so the same client settings reach either). When the Docker CLI has
its compose plugin, ``docker compose config -q`` validates the file too; it is not required.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline import config

ROOT = config.PROJECT_ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _kafka_version_of_native_broker() -> str:
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ElementTree.parse(ROOT / "deploy" / "kafka" / "pom.xml")
    return pom.find("m:properties/m:kafka.version", namespace).text


def _host_ports(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port, checking each mapping is bound to 127.0.0.1."""
    mapping = {}
    for entry in service.get("ports", []):
        match = re.fullmatch(r"127\.0\.0\.1:(\d+):(\d+)", str(entry))
        assert match, f"port {entry!r} is not bound to 127.0.0.1"
        mapping[int(match.group(2))] = int(match.group(1))
    return mapping


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"kafka", "redis", "prometheus", "grafana"}
    assert services["kafka"]["image"] == f"apache/kafka:{_kafka_version_of_native_broker()}"
    assert services["redis"]["image"].startswith("redis:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    for name, service in services.items():
        tag = service["image"].rpartition(":")[2]
        assert tag and tag != "latest", f"{name}: image tag must be pinned"


def test_kafka_is_a_single_kraft_node_without_topic_auto_creation(
    compose: dict[str, Any],
) -> None:
    env = {key: str(value) for key, value in compose["services"]["kafka"]["environment"].items()}
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


def test_host_ports_are_the_native_defaults_on_loopback(compose: dict[str, Any]) -> None:
    settings = config.load({})
    services = compose["services"]
    assert _host_ports(services["kafka"]) == {19092: settings.kafka_port}
    assert _host_ports(services["redis"]) == {6379: settings.redis_port}
    assert _host_ports(services["prometheus"]) == {9090: settings.prometheus_port}
    assert _host_ports(services["grafana"]) == {3000: 13000}


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name
    kafka_check = " ".join(compose["services"]["kafka"]["healthcheck"]["test"])
    assert "kafka-broker-api-versions.sh --bootstrap-server kafka:29092" in kafka_check
    assert compose["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "/-/ready" in compose["services"]["prometheus"]["healthcheck"]["test"][-1]


def test_grafana_waits_for_a_healthy_prometheus(compose: dict[str, Any]) -> None:
    assert compose["services"]["grafana"]["depends_on"] == {
        "prometheus": {"condition": "service_healthy"}
    }
    for name, service in compose["services"].items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in compose["services"], f"{name} depends on unknown {dependency}"
            assert condition["condition"] == "service_healthy"


def _bind_mounts(compose: dict[str, Any]) -> list[tuple[str, Path, str]]:
    mounts = []
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith("."):
                mounts.append((name, (ROOT / source).resolve(), target))
    return mounts


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    mounts = _bind_mounts(compose)
    assert {(name, target) for name, _, target in mounts} == {
        ("prometheus", "/etc/prometheus/prometheus.yml"),
        ("grafana", "/etc/grafana/provisioning"),
    }
    for name, source, _ in mounts:
        assert source.exists(), f"{name} mounts {source}, which does not exist"


def test_prometheus_config_and_grafana_datasource_point_at_the_compose_services(
    compose: dict[str, Any],
) -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["prometheus"]["static_configs"][0]["targets"] == ["localhost:9090"]

    datasources = yaml.safe_load(
        (ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert datasources["apiVersion"] == 1
    [source] = datasources["datasources"]
    assert (source["type"], source["url"], source["isDefault"]) == (
        "prometheus",
        "http://prometheus:9090",
        True,
    )
    assert "9090" in str(compose["services"]["prometheus"]["ports"][0])


def _compose_plugin_installed() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _compose_plugin_installed(), reason="docker compose plugin not installed")
def test_docker_compose_config_accepts_the_file() -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
