"""The test fixtures' backends, their pure parts (tests/service_backends.py), without an engine:
which images the Docker backend runs (compose's variables and defaults, deploy/images/local.env
when asked, the environment first), how a backend is chosen and refused, testcontainers' Ryuk
image as the package names it, and the container broker configured like the native one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from service_backends import (
    DEFAULT_RYUK_IMAGE,
    ENV_RYUK_DISABLED,
    ENV_RYUK_IMAGE,
    IMAGE_VARIABLES,
    choose_backend,
    compose_image_defaults,
    disable_ryuk_if_absent,
    kafka_environment,
    native_kafka_properties,
    resolve_images,
)

from pipeline.io import config
from pipeline.services import docker_images

COMPOSE = yaml.safe_load((config.PROJECT_ROOT / "docker-compose.yml").read_text())


def test_the_default_images_are_composes_official_ones() -> None:
    defaults = compose_image_defaults()
    assert set(defaults) == set(IMAGE_VARIABLES.values())
    images = resolve_images({})
    for service, variable in IMAGE_VARIABLES.items():
        assert images[service].image == defaults[variable]
        assert images[service].origin == "docker-compose.yml"
        assert not images[service].image.startswith("skewer-local/")
        # The very expression compose interpolates for its service.
        assert COMPOSE["services"][service]["image"] in (
            f"${{{variable}:-{defaults[variable]}}}",
            COMPOSE["x-kafka-image"],
        )
    assert COMPOSE["x-kafka-image"] == f"${{KAFKA_IMAGE:-{defaults['KAFKA_IMAGE']}}}"


def test_local_images_come_from_the_env_file_and_the_environment_wins() -> None:
    local = docker_images.read_env_file(docker_images.LOCAL_ENV.read_text())
    images = resolve_images({"SKEWER_TEST_IMAGES": "local"})
    assert {service: image.image for service, image in images.items()} == {
        service: local[variable] for service, variable in IMAGE_VARIABLES.items()
    }
    assert {image.origin for image in images.values()} == {"deploy/images/local.env"}
    mine = resolve_images({"SKEWER_TEST_IMAGES": "Local", "KAFKA_IMAGE": " my/kafka:1 "})
    assert (mine["kafka"].image, mine["kafka"].origin) == ("my/kafka:1", "KAFKA_IMAGE")
    assert mine["redis"].image == local["REDIS_IMAGE"]
    official = resolve_images({"SKEWER_TEST_IMAGES": "official", "REDIS_IMAGE": "r:2"})
    assert official["redis"].image == "r:2"
    assert official["kafka"].image == compose_image_defaults()["KAFKA_IMAGE"]


def test_a_bad_image_choice_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^SKEWER_TEST_IMAGES must be one of official, local$"):
        resolve_images({"SKEWER_TEST_IMAGES": "registry"})


def test_backend_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert choose_backend({"SKEWER_TEST_BACKEND": "native"}) == (
        "native",
        "SKEWER_TEST_BACKEND=native",
    )
    with pytest.raises(ValueError, match=r"^SKEWER_TEST_BACKEND must be docker, native or auto$"):
        choose_backend({"SKEWER_TEST_BACKEND": "podman"})
    # No engine on this socket: auto falls back to native, a forced docker is refused.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    name, reason = choose_backend({})
    assert name == "native"
    assert reason.startswith(f"no Docker engine answered at unix://{tmp_path}/none.sock")
    with pytest.raises(ValueError) as refused:
        choose_backend({"SKEWER_TEST_BACKEND": "docker"})
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("SKEWER_TEST_BACKEND=docker, but no Docker engine answered at ")
    assert message.endswith(
        "start one with `skewer services up docker` and export the DOCKER_HOST it prints"
    )


def test_the_ryuk_image_is_testcontainers_own() -> None:
    from testcontainers.core.config import TestcontainersConfiguration

    default = TestcontainersConfiguration.__dataclass_fields__["ryuk_image"].default
    if ENV_RYUK_IMAGE in os.environ:
        pytest.skip(f"{ENV_RYUK_IMAGE} is set: testcontainers' default was overridden")
    assert default == DEFAULT_RYUK_IMAGE


def test_a_ryuk_switch_already_set_is_left_alone() -> None:
    environ = {ENV_RYUK_DISABLED: "false"}
    assert disable_ryuk_if_absent(environ) == "Ryuk as TESTCONTAINERS_RYUK_DISABLED=false says"
    assert environ == {ENV_RYUK_DISABLED: "false"}


def _property_name(variable: str) -> str:
    """apache/kafka's (and the stand-in's env-to-properties.sh) mapping of KAFKA_* names."""
    key = variable.removeprefix("KAFKA_").lower()
    return key.replace("___", "-").replace("__", "+").replace("_", ".").replace("+", "_")


#: Native settings the container broker leaves at Kafka's defaults: thread counts and segment
#: size for a shared development machine, and a default that is Kafka's own anyway.
NOT_MIRRORED = {
    "num.network.threads",
    "num.io.threads",
    "background.threads",
    "log.segment.bytes",
    "delete.topic.enable",
}


def test_the_container_broker_is_configured_like_the_native_one() -> None:
    environment = kafka_environment("10.1.2.3", 23456)
    properties = {
        _property_name(name): value
        for name, value in environment.items()
        if name.startswith("KAFKA_") and not name.endswith("_OPTS")
    }
    native = native_kafka_properties()
    # A single node: the template's fields for replication and in-sync replicas are 1.
    single = {"${replication}": "1", "${min_insync}": "1"}
    for name, value in native.items():
        if name in NOT_MIRRORED or re.search(
            r"listener|voters|node\.id|log\.dirs|session|heartbeat", name
        ):
            continue
        assert properties.get(name) == single.get(value, value), name
    assert environment["CLUSTER_ID"] == config.KAFKA_CLUSTER_ID
    assert properties["listeners"] == "PLAINTEXT://:23456,CONTROLLER://:9093"
    assert properties["advertised.listeners"] == "PLAINTEXT://10.1.2.3:23456"
    assert properties["controller.quorum.voters"] == "1@localhost:9093"
    assert properties["process.roles"] == "broker,controller"
    assert properties["auto.create.topics.enable"] == "false"
