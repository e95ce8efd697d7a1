"""The Docker backend of the test fixtures (tests/service_backends.py), for real, beside the
session's own: a backend of the test's own starts a service from the configured image, publishes
it on the loopback address, labels it, and removes it when closed; an image that is neither
present nor pullable, and a container that exits at start, are one line each and leave no
container behind (no Ryuk reaper here to take it away later); what a killed session left is
removed by the next one, and nothing of a live session is.

Runs on the docker backend only (``SKEWER_TEST_BACKEND=docker``, or an engine answering): the
native backend has no containers to check.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from service_backends import (
    COMPOSE_PROJECT_LABEL,
    COMPOSE_TEST_PROJECT,
    SESSION_LABEL,
    BackendError,
    DockerBackend,
    NativeBackend,
    ServiceImage,
    resolve_images,
    session_name,
    sweep_dead_sessions,
)

from pipeline.io import probes

pytestmark = [pytest.mark.integration, pytest.mark.docker]


@pytest.fixture
def backend(service_backend: NativeBackend | DockerBackend) -> DockerBackend:
    """A Docker backend of the test's own, with the session's images; closed by the test."""
    if service_backend.name != "docker":
        pytest.skip("tests the docker backend (SKEWER_TEST_BACKEND=docker)")
    return DockerBackend(resolve_images())


def containers_of(backend: DockerBackend) -> list[Any]:
    import docker

    client = docker.from_env()
    try:
        return client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={backend.session}"}
        )
    finally:
        client.close()


def test_a_service_runs_from_its_image_on_loopback_and_is_removed_on_close(
    backend: DockerBackend,
) -> None:
    try:
        url = backend.redis_url()
        assert probes.redis_answers(url)
        [container] = containers_of(backend)
        assert container.image.tags[0] == backend.images["redis"].image
        [binding] = container.attrs["NetworkSettings"]["Ports"]["6379/tcp"]
        if backend.host == "127.0.0.1":  # an engine on this machine
            assert binding["HostIp"] == "127.0.0.1"
        assert url.endswith(f":{binding['HostPort']}/0")
    finally:
        backend.close()
    assert containers_of(backend) == []
    assert not probes.redis_answers(url, timeout=0.5)


def test_an_image_neither_present_nor_pullable_is_one_line(backend: DockerBackend) -> None:
    backend.images["redis"] = ServiceImage("skewer-test/absent:0", "REDIS_IMAGE")
    try:
        with pytest.raises(BackendError) as failed:
            backend.redis_url()
    finally:
        backend.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("redis image skewer-test/absent:0 (REDIS_IMAGE) is not present")
    assert "skewer images build --local" in message
    assert containers_of(backend) == []


def test_a_container_that_exits_at_start_is_removed_and_named_with_its_log(
    backend: DockerBackend,
) -> None:
    from testcontainers.core.container import DockerContainer

    image = backend.require_image("redis")
    container = DockerContainer(image).with_command("redis-server --no-such-directive yes")
    try:
        with pytest.raises(BackendError) as failed:
            backend.start("redis", container, ready=lambda: False)
    finally:
        backend.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"redis container ({image}) exited at start; its log ends: ")
    assert message.endswith("Bad directive or wrong number of arguments")  # Redis's last line
    assert containers_of(backend) == []


def test_what_a_killed_session_left_is_swept_and_a_live_sessions_is_not(
    backend: DockerBackend,
) -> None:
    """A container and a compose project's network named after a session whose process is
    gone are removed; the same of a live session (this one) stay."""
    import docker

    client = docker.from_env()
    dead, live = "999999999-1-deadbeef", session_name()
    image = backend.require_image("redis")
    made: list[Any] = []
    try:
        for session in (dead, live):
            made.append(
                client.containers.create(image, command=["true"], labels={SESSION_LABEL: session})
            )
            made.append(
                client.networks.create(
                    f"{COMPOSE_TEST_PROJECT}{session}_default",
                    labels={COMPOSE_PROJECT_LABEL: f"{COMPOSE_TEST_PROJECT}{session}"},
                )
            )
        removed = sweep_dead_sessions(client)
        # The other xdist worker's session sweeps at its start too, and may have been first.
        assert set(removed) <= {
            "container " + made[0].name + " of a killed test session",
            f"compose project {COMPOSE_TEST_PROJECT}{dead} of a killed test session",
        }
        left = {c.id for c in client.containers.list(all=True)} | {
            n.id for n in client.networks.list()
        }
        assert made[0].id not in left and made[1].id not in left
        assert made[2].id in left and made[3].id in left
    finally:
        for item in made:
            with contextlib.suppress(docker.errors.NotFound):
                if isinstance(item, docker.models.containers.Container):
                    item.remove(v=True)  # with the image's anonymous volumes
                else:
                    item.remove()
        client.close()
        backend.close()
