"""The services integration tests run on, two backends behind one set of fixtures
(tests/conftest.py): skewer's native services, or containers started by testcontainers.

``SKEWER_TEST_BACKEND=docker|native|auto`` picks one (:func:`choose_backend`); the Docker
backend runs docker-compose.yml's images, or with ``SKEWER_TEST_IMAGES=local`` the stand-ins of
deploy/images/local.env (:func:`resolve_images`). Which tests run on which backend, and why:
docs/testing.md.

Example (no engine needed):
    >>> images = resolve_images({"SKEWER_TEST_IMAGES": "local", "REDIS_IMAGE": "mine:1"})
    >>> images["kafka"].image, images["kafka"].origin
    ('skewer-local/kafka:4.3.1', 'deploy/images/local.env')
    >>> images["redis"].image, images["redis"].origin
    ('mine:1', 'REDIS_IMAGE')
    >>> resolve_images({})["prometheus"].image
    'prom/prometheus:v2.53.0'
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from live_runs import free_port

from pipeline.io import config, probes
from pipeline.services import docker_engine, docker_images, manager, process

if TYPE_CHECKING:
    import docker as docker_module
    from testcontainers.core.container import DockerContainer

#: "official" (compose's defaults) or "local" (deploy/images/local.env first).
ENV_TEST_IMAGES = "SKEWER_TEST_IMAGES"
IMAGE_CHOICES = ("official", "local")
#: Each service of the Docker backend and docker-compose.yml's variable that names its image.
IMAGE_VARIABLES = {"kafka": "KAFKA_IMAGE", "redis": "REDIS_IMAGE", "prometheus": "PROMETHEUS_IMAGE"}
COMPOSE_FILE = config.PROJECT_ROOT / "docker-compose.yml"
#: testcontainers' switch and image of its reaper (testcontainers.core.config, 4.15.0's default;
#: tests/unit/test_service_backends.py checks it against the installed package).
ENV_RYUK_DISABLED = "TESTCONTAINERS_RYUK_DISABLED"
ENV_RYUK_IMAGE = "RYUK_CONTAINER_IMAGE"
DEFAULT_RYUK_IMAGE = "testcontainers/ryuk:0.8.1"
#: A label on every container of a Docker backend, naming its test session (:func:`session_name`),
#: so that what a killed session left can be found and removed (:func:`sweep_dead_sessions`).
SESSION_LABEL = "skewer.test-session"
#: Compose's label on what a stack creates, and the test stacks' project names (plus a session).
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_TEST_PROJECT = "skewer-test-"
#: How long a container may take to answer its probe.
START_TIMEOUT = 120.0


def session_name(pid: int | None = None) -> str:
    """This test session's name on what it starts: ``{pid}-{start ticks}-{random}``, so that
    a later session can tell whether the process that started it still lives (a pid alone may
    have been reused)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{process.start_ticks(pid)}-{uuid.uuid4().hex[:8]}"


def session_alive(name: str) -> bool:
    """Whether the test session ``name`` (:func:`session_name`) still runs on this machine; a
    name of another form counts as alive, so nothing of unknown origin is removed.

    >>> session_alive(session_name()), session_alive("999999999-1-abcdef12")
    (True, False)
    >>> session_alive("someone-elses")
    True
    """
    parts = name.split("-")
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return True
    return process.start_ticks(int(parts[0])) == int(parts[1])


def sweep_dead_sessions(client: docker_module.DockerClient) -> list[str]:
    """Remove from a local engine what killed test sessions left: containers with
    :data:`SESSION_LABEL` (testcontainers' Ryuk, which would remove them, is off where its image
    is absent), and the containers, volumes and networks of compose test stacks
    (``skewer-test-{session}``) whose session is gone. Returns what was removed, one line each;
    called before a session starts its first container."""
    from docker.errors import DockerException

    # Sparse lists: a full one inspects each container it found, and fails on one that another
    # session (the other xdist worker, sweeping or removing its own) removed in between.
    removed = []
    for container in client.containers.list(
        all=True, sparse=True, filters={"label": SESSION_LABEL}
    ):
        if not session_alive(_labels(container).get(SESSION_LABEL, "")):
            with contextlib.suppress(DockerException):
                container.remove(force=True, v=True)
                removed.append(f"container {_container_name(container)} of a killed test session")
    compose = {"label": COMPOSE_PROJECT_LABEL}
    found = [
        *client.containers.list(all=True, sparse=True, filters=compose),
        *client.volumes.list(filters=compose),
        *client.networks.list(filters=compose),
    ]
    projects = {_labels(item).get(COMPOSE_PROJECT_LABEL, "") for item in found}
    for project in sorted(p for p in projects if p.startswith(COMPOSE_TEST_PROJECT)):
        if session_alive(project.removeprefix(COMPOSE_TEST_PROJECT)):
            continue
        selector = {"label": f"{COMPOSE_PROJECT_LABEL}={project}"}
        with contextlib.suppress(DockerException):
            for container in client.containers.list(all=True, sparse=True, filters=selector):
                container.remove(force=True, v=True)
            for network in client.networks.list(filters=selector):
                network.remove()
            for volume in client.volumes.list(filters=selector):
                volume.remove(force=True)
            removed.append(f"compose project {project} of a killed test session")
    return removed


def _labels(item: Any) -> dict[str, str]:
    """The labels of a container (sparse or inspected), volume or network."""
    return item.attrs.get("Labels") or item.attrs.get("Config", {}).get("Labels") or {}


def _container_name(container: Any) -> str:
    """A container's name, from a sparse list (``Names``) or an inspection (``Name``)."""
    names = container.attrs.get("Names") or [container.attrs.get("Name") or container.short_id]
    return names[0].lstrip("/")


class BackendError(Exception):
    """The Docker backend cannot start a service; the message is one line."""


@dataclass(frozen=True)
class ServiceImage:
    """One service's image and where its name came from (a variable, the env file, compose)."""

    image: str
    origin: str


def compose_image_defaults(text: str | None = None) -> dict[str, str]:
    """``variable -> default`` of docker-compose.yml's ``${VARIABLE:-default}`` image names.

    >>> compose_image_defaults("image: ${REDIS_IMAGE:-redis:7.0.15}\\nx: ${KAFKA_IMAGE:-k:1}")
    {'REDIS_IMAGE': 'redis:7.0.15', 'KAFKA_IMAGE': 'k:1'}
    """
    text = COMPOSE_FILE.read_text() if text is None else text
    names = "|".join(IMAGE_VARIABLES.values())
    return dict(re.findall(r"\$\{(" + names + r"):-([^}]+)\}", text))


def resolve_images(environ: Mapping[str, str] | None = None) -> dict[str, ServiceImage]:
    """The image of each service: the environment's variable, else (``SKEWER_TEST_IMAGES=local``)
    deploy/images/local.env's, else docker-compose.yml's default. A bad setting raises ValueError
    with one line."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV_TEST_IMAGES, "official").strip().lower() or "official"
    if choice not in IMAGE_CHOICES:
        raise ValueError(f"{ENV_TEST_IMAGES} must be one of {', '.join(IMAGE_CHOICES)}")
    local = (
        docker_images.read_env_file(docker_images.LOCAL_ENV.read_text())
        if choice == "local"
        else {}
    )
    defaults = compose_image_defaults()
    local_origin = str(docker_images.LOCAL_ENV.relative_to(config.PROJECT_ROOT))
    images = {}
    for service, variable in IMAGE_VARIABLES.items():
        if env.get(variable, "").strip():
            images[service] = ServiceImage(env[variable].strip(), variable)
        elif local.get(variable):
            images[service] = ServiceImage(local[variable], local_origin)
        elif variable in defaults:
            images[service] = ServiceImage(defaults[variable], "docker-compose.yml")
        else:
            raise ValueError(f"docker-compose.yml names no default for {variable}")
    return images


def docker_engine_answers(timeout: float = 2.0) -> tuple[bool, str]:
    """Does the engine of ``DOCKER_HOST`` (else Docker's default socket) answer a ping?"""
    where = os.environ.get(config.ENV_DOCKER_HOST) or f"unix://{config.DEFAULT_DOCKER_SOCKET}"
    try:
        import docker

        client = docker.from_env(timeout=int(max(timeout, 1)))
        try:
            client.ping()
        finally:
            client.close()
    except Exception as error:  # the SDK raises many kinds: missing socket, refused, timeout
        return False, f"no Docker engine answered at {where} ({type(error).__name__})"
    return True, f"a Docker engine answered at {where}"


def compose_command_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` as ``docker compose`` works under it: with its own DOCKER_CONFIG, else with
    the checkout's (where ``skewer services up docker`` builds the plugin); None without a
    ``docker`` command or a plugin. Compose's own commands need no engine."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    candidates = [dict(environ)]
    plugin = docker_engine.compose_plugin_path(config.load())
    if plugin.exists():
        candidates.append({**environ, "DOCKER_CONFIG": str(plugin.parent.parent)})
    for candidate in candidates:
        probe = subprocess.run(
            [docker, "compose", "version"], env=candidate, capture_output=True, check=False
        )
        if probe.returncode == 0:
            return candidate
    return None


def choose_backend(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(backend, why): ``SKEWER_TEST_BACKEND`` if it forces one, else docker when an engine
    answers. A bad value, or a forced docker without an engine, raises ValueError (one line)."""
    env = os.environ if environ is None else environ
    forced = env.get(config.ENV_TEST_BACKEND, "auto").strip().lower() or "auto"
    if forced not in ("docker", "native", "auto"):
        raise ValueError(f"{config.ENV_TEST_BACKEND} must be docker, native or auto")
    if forced == "native":
        return "native", f"{config.ENV_TEST_BACKEND}=native"
    answers, reason = docker_engine_answers()
    if forced == "docker":
        if not answers:
            raise ValueError(
                f"{config.ENV_TEST_BACKEND}=docker, but {reason}; start one with "
                "`skewer services up docker` and export the DOCKER_HOST it prints"
            )
        return "docker", f"{config.ENV_TEST_BACKEND}=docker; {reason}"
    return ("docker" if answers else "native"), reason


def require_part(missing: str, environ: Mapping[str, str] | None = None) -> None:
    """Skip the calling test with ``missing`` (why a part it needs is not there, "" if none
    is), except in a session forced onto the docker backend (``SKEWER_TEST_BACKEND=docker``,
    CI's Docker pass), which makes every part first: there a missing part fails the test.

    >>> require_part("")
    >>> require_part("no plugin", {config.ENV_TEST_BACKEND: "docker"})
    Traceback (most recent call last):
    ...
    Failed: in the Docker pass, no plugin
    """
    import pytest

    if not missing:
        return
    env = os.environ if environ is None else environ
    if env.get(config.ENV_TEST_BACKEND, "").strip().lower() == "docker":
        pytest.fail(f"in the Docker pass, {missing}", pytrace=False)
    pytest.skip(missing)


def ryuk_image(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(ENV_RYUK_IMAGE, DEFAULT_RYUK_IMAGE)


def disable_ryuk_if_absent(environ: MutableMapping[str, str] | None = None) -> str:
    """Switch testcontainers' Ryuk reaper off (``TESTCONTAINERS_RYUK_DISABLED=true`` in
    ``environ``) when its image is not present on the engine; the backend removes its containers
    itself either way. Call before testcontainers is imported (it reads the switch once). A
    switch already set is left as it is. Returns what was decided, for the pytest header."""
    env = os.environ if environ is None else environ
    image = ryuk_image(env)
    if ENV_RYUK_DISABLED in env:
        return f"Ryuk as {ENV_RYUK_DISABLED}={env[ENV_RYUK_DISABLED]} says"
    import docker
    from docker.errors import ImageNotFound

    client = docker.from_env()
    try:
        client.images.get(image)
    except ImageNotFound:
        env[ENV_RYUK_DISABLED] = "true"
        return f"Ryuk off ({image} absent); the session removes its containers"
    finally:
        client.close()
    return f"Ryuk on ({image})"


class NativeBackend:
    """Skewer's native services, under a lease of this test session (:func:`manager.acquire`).

    A service this session (or another test session) had to start is stopped when the last
    session using it ends; one started by ``skewer services up`` keeps running.
    """

    name = "native"

    def __init__(self) -> None:
        self.settings = config.load()
        self.leased: list[str] = []

    def _ensure(self, name: str) -> None:
        if name not in self.leased:
            manager.acquire(self.settings, [name])
            self.leased.append(name)

    def kafka_bootstrap(self) -> str:
        self._ensure("kafka")
        return self.settings.kafka_bootstrap

    def redis_url(self) -> str:
        self._ensure("redis")
        return self.settings.redis_url

    def prometheus_url(self) -> str:
        self._ensure("prometheus")
        return self.settings.prometheus_url

    def close(self) -> None:
        if self.leased:
            manager.release(self.settings, self.leased)


def parse_properties(text: str) -> dict[str, str]:
    r"""A Java properties file's settings, name -> value (one ``name=value`` a line; blank lines
    and ``#`` comments skipped).

    >>> parse_properties("# a comment\nnode.id=2\n\nlog.dirs=/tmp/a=b")
    {'node.id': '2', 'log.dirs': '/tmp/a=b'}
    """
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def native_kafka_properties() -> dict[str, str]:
    """The native broker's settings, name -> value, as deploy/kafka/server.properties spells
    them (its ``${...}`` fields unfilled)."""
    return parse_properties((config.DEPLOY_DIR / "kafka" / "server.properties").read_text())


def kafka_environment(host: str, port: int) -> dict[str, str]:
    """The ``KAFKA_*`` variables of a single KRaft node whose clients connect to ``host:port``,
    set like the native broker's server.properties (deploy/kafka/server.properties).

    >>> environment = kafka_environment("127.0.0.1", 23456)
    >>> environment["KAFKA_LISTENERS"], environment["KAFKA_ADVERTISED_LISTENERS"]
    ('PLAINTEXT://:23456,CONTROLLER://:9093', 'PLAINTEXT://127.0.0.1:23456')
    """
    return {
        "CLUSTER_ID": config.KAFKA_CLUSTER_ID,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        # Topics are created with their partition count: partition w is worker w.
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "8",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "8",
        "KAFKA_OFFSETS_TOPIC_SEGMENT_BYTES": "1048576",
        "KAFKA_TRANSACTION_STATE_LOG_SEGMENT_BYTES": "1048576",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_DEFAULT_REPLICATION_FACTOR": "1",
        "KAFKA_MIN_INSYNC_REPLICAS": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_LOG_RETENTION_HOURS": "24",
        "KAFKA_HEAP_OPTS": "-Xms256m -Xmx768m",
    }


class DockerBackend:
    """Containers started by testcontainers from :func:`resolve_images`, one of each at most, all
    removed by :meth:`close` (and one that fails to start at once)."""

    name = "docker"

    def __init__(self, images: Mapping[str, ServiceImage]) -> None:
        self.images = dict(images)
        self._containers: dict[str, DockerContainer] = {}
        self._client: docker_module.DockerClient | None = None
        self._host: str | None = None
        self._kafka_bootstrap = ""
        #: The value of :data:`SESSION_LABEL` on this backend's containers.
        self.session = session_name()
        self._swept = False

    # -- the engine --------------------------------------------------------------------------

    @property
    def client(self) -> docker_module.DockerClient:
        if self._client is None:
            import docker

            self._client = docker.from_env()
        return self._client

    @property
    def host(self) -> str:
        """The address of the engine's host as the tests reach its published ports."""
        if self._host is None:
            from testcontainers.core.docker_client import DockerClient

            found = DockerClient().host()
            self._host = "127.0.0.1" if found in ("localhost", "127.0.0.1", "::1") else found
        return self._host

    def _bind(self, port: int | None) -> tuple[str, int] | tuple[str] | int | None:
        """A published port: on the loopback address when the engine is on this machine."""
        if self.host == "127.0.0.1":
            return ("127.0.0.1", port) if port is not None else ("127.0.0.1",)
        return port

    def require_image(self, service: str) -> str:
        """The service's image, pulled if it is not present; one line when neither works."""
        from docker.errors import DockerException, ImageNotFound

        image = self.images[service]
        try:
            self.client.images.get(image.image)
        except ImageNotFound:
            try:
                self.client.images.pull(image.image)
            except DockerException as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                hint = (
                    "build them with `skewer images build --local`"
                    if image.origin.endswith(docker_images.LOCAL_ENV.name)
                    else f"`skewer images build --local` and {ENV_TEST_IMAGES}=local build and "
                    "use stand-ins"
                )
                raise BackendError(
                    f"{service} image {image.image} ({image.origin}) is not present and cannot "
                    f"be pulled ({reason}); {hint}"
                ) from None
        return image.image

    def start(
        self, service: str, container: DockerContainer, ready: Callable[[], bool]
    ) -> DockerContainer:
        """Start ``container`` as the backend's ``service``, then wait until ``ready()``; if it
        fails to start, exits or does not get ready within :data:`START_TIMEOUT`, remove it
        and raise (a :class:`BackendError` of one line with its log's last line)."""
        if not self._swept and self.host == "127.0.0.1":  # pids name this machine's processes
            self._swept = True
            for line in sweep_dead_sessions(self.client):
                print(f"\nskewer tests: removed {line}")
        container.with_kwargs(labels={SESSION_LABEL: self.session})
        try:
            container.start()
            deadline = time.monotonic() + START_TIMEOUT
            while not ready():
                wrapped = container.get_wrapped_container()
                wrapped.reload()
                if wrapped.status in ("exited", "dead"):
                    raise BackendError(
                        f"{service} container ({container.image}) exited at start; its log "
                        f"ends: {_last_log_line(wrapped)}"
                    )
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"{service} container ({container.image}) did not answer within "
                        f"{START_TIMEOUT:.0f} s; its log ends: {_last_log_line(wrapped)}"
                    )
                time.sleep(0.5)
        except BaseException:
            _remove(container)
            raise
        self._containers[service] = container
        return container

    # -- the services ------------------------------------------------------------------------

    def kafka_bootstrap(self) -> str:
        if "kafka" not in self._containers:
            from docker.errors import APIError
            from testcontainers.core.container import DockerContainer

            image = self.require_image("kafka")
            for attempt in range(3):
                port = free_port()
                container = DockerContainer(image)
                container.env.update(kafka_environment(self.host, port))
                # The same port number inside and out: what the broker advertises is right for
                # the tests and for the broker itself.
                container.ports[f"{port}/tcp"] = self._bind(port)  # type: ignore[assignment]
                bootstrap = f"{self.host}:{port}"
                try:
                    self.start("kafka", container, lambda b=bootstrap: probes.kafka_answers(b))
                except APIError as error:
                    # The free port was taken before the engine bound it: draw another.
                    if attempt == 2 or "already" not in str(error):
                        raise
                    continue
                self._kafka_bootstrap = bootstrap
                break
        return self._kafka_bootstrap

    def redis_url(self) -> str:
        if "redis" not in self._containers:
            from testcontainers.core.container import DockerContainer

            container = DockerContainer(self.require_image("redis"))
            container.ports["6379/tcp"] = self._bind(None)  # type: ignore[assignment]
            self.start("redis", container, lambda: probes.redis_answers(self._redis_url(container)))
        return self._redis_url(self._containers["redis"])

    def _redis_url(self, container: DockerContainer) -> str:
        return f"redis://{self.host}:{_published_port(container, 6379)}/0"

    def prometheus_url(self) -> str:
        if "prometheus" not in self._containers:
            from testcontainers.core.container import DockerContainer

            container = DockerContainer(self.require_image("prometheus"))
            container.ports["9090/tcp"] = self._bind(None)  # type: ignore[assignment]
            self.start(
                "prometheus",
                container,
                lambda: probes.prometheus_answers(self._prometheus_url(container)),
            )
        return self._prometheus_url(self._containers["prometheus"])

    def _prometheus_url(self, container: DockerContainer) -> str:
        return f"http://{self.host}:{_published_port(container, 9090)}"

    def container_ids(self) -> list[str]:
        """The ids of the containers this backend runs now."""
        return [c.get_container_id() for c in self._containers.values()]

    def close(self) -> None:
        """Remove every container, each even when another's removal fails."""
        containers, self._containers = self._containers, {}
        for container in containers.values():
            _remove(container)
        if self._client is not None:
            self._client.close()
            self._client = None


def _published_port(container: DockerContainer, port: int) -> int:
    """The host port of ``port``, or 0 while the engine has not published it yet."""
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    bindings = (wrapped.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp")
    return int(bindings[0]["HostPort"]) if bindings else 0


def _last_log_line(wrapped: Any) -> str:
    try:
        lines = wrapped.logs(tail=5).decode(errors="replace").strip().splitlines()
    except Exception as error:  # the container may be gone already
        return f"(no log: {type(error).__name__})"
    return lines[-1] if lines else "(empty)"


def _remove(container: DockerContainer) -> None:
    """Remove ``container`` with its anonymous volumes; an error is reported, not raised, so
    that the other containers are removed too."""
    try:
        container.stop()
    except Exception as error:
        print(f"\nskewer tests: could not remove the {container.image} container: {error}")
