"""Fixtures for tests that need real services: Kafka, Redis, Prometheus and Spark.

Two backends, the same tests, nothing mocked:

- ``docker``: testcontainers (Confluent's cp-kafka in KRaft mode, redis, prom/prometheus) when a
  Docker engine answers a ping within 2 s;
- ``native``: skewer's own native services (:mod:`pipeline.services.manager`), started on first
  use if they are not running, and stopped at the end of the session only if a test session started
  them and no other test session still uses them (leases; services started with
  ``skewer services up`` are never stopped by tests).

``SKEWER_TEST_BACKEND=docker|native`` forces one. The pytest header says which one runs.
Services start lazily, when the first test asks for one, so unit tests start nothing.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from pipeline.io import config, kafka_io, probes
from pipeline.services import manager, process

if TYPE_CHECKING:
    import redis as redis_module
    from pyspark.sql import SparkSession

#: Images of the Docker backend, pinned. testcontainers' KafkaContainer boots only Confluent's
#: images (its start script edits their configure script); 7.6.0 is its tested default.
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
REDIS_IMAGE = "redis:7.0.15"
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"

#: Redis databases test sessions may claim, one each, so they never touch the pipeline's data
#: in database 0 nor each other's keys.
TEST_REDIS_DBS = range(1, 16)
TEST_DB_CLAIM = "skewer-tests:claim:db{}"


def _docker_engine_answers(timeout: float = 2.0) -> tuple[bool, str]:
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as error:  # the SDK raises many kinds: missing socket, refused, timeout
        return False, f"no Docker engine answered ({type(error).__name__})"
    return True, "a Docker engine answered"


def _choose_backend() -> tuple[str, str]:
    forced = os.environ.get(config.ENV_TEST_BACKEND, "auto").strip().lower()
    if forced in ("docker", "native"):
        return forced, f"{config.ENV_TEST_BACKEND}={forced}"
    if forced != "auto":
        raise pytest.UsageError(f"{config.ENV_TEST_BACKEND} must be docker, native or auto")
    answers, reason = _docker_engine_answers()
    return ("docker" if answers else "native"), reason


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


class DockerBackend:
    """Containers started by testcontainers, one of each at most, removed at the end."""

    name = "docker"

    def __init__(self) -> None:
        self._containers: dict[str, Any] = {}

    def kafka_bootstrap(self) -> str:
        if "kafka" not in self._containers:
            try:
                from testcontainers.community.kafka import KafkaContainer
            except ImportError:
                from testcontainers.kafka import KafkaContainer
            self._containers["kafka"] = KafkaContainer(KAFKA_IMAGE).with_kraft().start()
        return self._containers["kafka"].get_bootstrap_server()

    def redis_url(self) -> str:
        if "redis" not in self._containers:
            try:
                from testcontainers.community.redis import RedisContainer
            except ImportError:
                from testcontainers.redis import RedisContainer
            self._containers["redis"] = RedisContainer(REDIS_IMAGE).start()
        container = self._containers["redis"]
        return f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"

    def prometheus_url(self) -> str:
        if "prometheus" not in self._containers:
            from testcontainers.core.container import DockerContainer

            container = DockerContainer(PROMETHEUS_IMAGE).with_exposed_ports(9090).start()
            self._containers["prometheus"] = container
            url = self._prometheus_url(container)
            deadline = time.monotonic() + 60
            while not probes.prometheus_answers(url):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus container not ready at {url}")
                time.sleep(0.5)
        return self._prometheus_url(self._containers["prometheus"])

    @staticmethod
    def _prometheus_url(container: Any) -> str:
        return f"http://{container.get_container_host_ip()}:{container.get_exposed_port(9090)}"

    def close(self) -> None:
        for container in self._containers.values():
            container.stop()


_BACKEND_KEY = pytest.StashKey[tuple[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_BACKEND_KEY] = _choose_backend()


def pytest_report_header(config: pytest.Config) -> str:
    backend, reason = config.stash[_BACKEND_KEY]
    return f"skewer services backend: {backend} ({reason})"


@pytest.fixture(scope="session")
def service_backend(request: pytest.FixtureRequest) -> Iterator[NativeBackend | DockerBackend]:
    backend_name, _ = request.config.stash[_BACKEND_KEY]
    backend = DockerBackend() if backend_name == "docker" else NativeBackend()
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="session")
def kafka(service_backend: NativeBackend | DockerBackend) -> str:
    """Bootstrap servers (``host:port``) of a running Kafka broker."""
    return service_backend.kafka_bootstrap()


@pytest.fixture(scope="session")
def redis(service_backend: NativeBackend | DockerBackend) -> Iterator[redis_module.Redis]:
    """A client of a Redis database of this test session's own, empty at the start.

    Tests share it; each keeps its keys apart with :func:`redis_prefix`. Test sessions that
    run at the same moment (developers, helpers, CI) each claim a different database
    (:func:`claim_test_database`), so one session's flush never deletes another's keys.
    """
    import redis as redis_module

    # Not from_url(url, db=...): the database in the URL's path would win over the keyword.
    address = urlsplit(service_backend.redis_url())
    connection = {
        "host": address.hostname or "127.0.0.1",
        "port": address.port or 6379,
        "password": address.password,
    }
    claims = redis_module.Redis(**connection, db=0)
    database = claim_test_database(claims)
    client = redis_module.Redis(**connection, db=database)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()
        claims.delete(TEST_DB_CLAIM.format(database))
        claims.close()


@pytest.fixture(scope="session")
def redis_url(redis: redis_module.Redis) -> str:
    """The URL of the test session's Redis database (what ``SKEWER_REDIS_URL`` takes)."""
    kwargs = redis.connection_pool.connection_kwargs
    password = f":{kwargs['password']}@" if kwargs.get("password") else ""
    return f"redis://{password}{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"


@pytest.fixture(scope="module")
def settings(kafka: str, redis_url: str) -> Iterator[config.Settings]:
    """The test services' settings, also in the environment of every ``skewer`` subprocess the
    module's tests start (exporters on free ports, whatever the caller's environment says)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(config.ENV_KAFKA_BOOTSTRAP, kafka)
        patch.setenv(config.ENV_REDIS_URL, redis_url)
        patch.delenv("SKEWER_METRICS_PORT", raising=False)
        yield config.load()


def claim_test_database(claims: redis_module.Redis) -> int:
    """The first database in :data:`TEST_REDIS_DBS` no live test session holds (a key in
    database 0 with this process's id, expiring after a day in case the session is killed)."""
    for database in TEST_REDIS_DBS:
        key = TEST_DB_CLAIM.format(database)
        holder = claims.get(key)
        if holder is not None and not process.process_alive(int(holder)):
            claims.delete(key)  # a session killed before it could release its claim
        if claims.set(key, os.getpid(), nx=True, ex=86_400):
            return database
    raise RuntimeError(f"every test Redis database {list(TEST_REDIS_DBS)} is claimed")


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test uses."""
    return f"{_safe_name(request.node.name)}:{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="session")
def prometheus(service_backend: NativeBackend | DockerBackend) -> str:
    """Base URL (no trailing slash) of a running Prometheus."""
    return service_backend.prometheus_url()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local SparkSession with Spark's Kafka source on its classpath."""
    from pipeline.io.spark_session import build_spark_session

    session = build_spark_session("skewer-tests", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:80].strip("-")


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test (or earlier run) has used; the topic is not created."""
    return f"test-{_safe_name(request.node.name)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def create_topic(kafka: str) -> Iterator[Callable[[str, int], str]]:
    """``create_topic(name, partitions)`` creates a topic; it is deleted after the test."""
    created: list[str] = []

    def create(name: str, partitions: int) -> str:
        kafka_io.ensure_topic(kafka, name, partitions)
        created.append(name)
        return name

    yield create
    kafka_io.delete_topics(kafka, created)
