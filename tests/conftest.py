"""Fixtures for tests that need real services: Kafka, Redis, Prometheus and Spark.

Two backends, the same tests, nothing mocked (docs/testing.md says how each works, which
images the Docker one runs, and which tests run on both):

- ``docker``: containers started by testcontainers from docker-compose.yml's images
  (``KAFKA_IMAGE``, ``REDIS_IMAGE``, ``PROMETHEUS_IMAGE``; ``SKEWER_TEST_IMAGES=local`` takes
  deploy/images/local.env's stand-ins), when a Docker engine answers a ping within 2 s;
- ``native``: skewer's own native services (:mod:`pipeline.services.manager`), started on first
  use if they are not running, and stopped at the end of the session only if a test session started
  them and no other test session still uses them (leases; services started with
  ``skewer services up`` are never stopped by tests).

``SKEWER_TEST_BACKEND=docker|native`` forces one; a bad setting, or ``docker`` without an
engine, stops the session with one line. The pytest header says which backend runs and, for
docker, which images. Services start lazily, when the first test asks for one, so unit tests
start nothing. Tests marked ``native_only(reason)`` skip on the docker backend with the reason;
``live_path`` marks the modules that must pass on both.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import work_units
from hypothesis import settings as hypothesis_settings
from service_backends import (
    BackendError,
    DockerBackend,
    NativeBackend,
    ServiceImage,
    choose_backend,
    disable_ryuk_if_absent,
    resolve_images,
)

from pipeline.io import config, kafka_io
from pipeline.services import process

if TYPE_CHECKING:
    import redis as redis_module
    from pyspark.sql import SparkSession

#: Redis databases test sessions may claim, one each, so they never touch the pipeline's data
#: in database 0 nor each other's keys.
TEST_REDIS_DBS = range(1, 16)
TEST_DB_CLAIM = "skewer-tests:claim:db{}"


@dataclass(frozen=True)
class BackendChoice:
    """What :func:`pytest_configure` decided: the backend, why, and (docker) its images."""

    name: str
    reason: str
    images: dict[str, ServiceImage] = field(default_factory=dict)
    ryuk: str = ""

    def header(self) -> list[str]:
        lines = [f"skewer services backend: {self.name} ({self.reason})"]
        if self.images:
            lines.append(
                "skewer docker images: "
                + ", ".join(f"{s} {i.image} ({i.origin})" for s, i in self.images.items())
                + f"; {self.ryuk}"
            )
        return lines


_BACKEND_KEY = pytest.StashKey[BackendChoice]()

#: Hypothesis everywhere without its 200 ms deadline (a busy 2-core machine is no measure of a
#: property), and in CI (``CI`` set) from a fixed seed, each failure printed with the blob that
#: reproduces it (``@reproduce_failure``), and no example database to carry between runs.
hypothesis_settings.register_profile("skewer", deadline=None, print_blob=True)
hypothesis_settings.register_profile(
    "skewer-ci", deadline=None, print_blob=True, derandomize=True, database=None
)
hypothesis_settings.load_profile("skewer-ci" if os.environ.get("CI") else "skewer")

#: Where an integration test that failed keeps the stage and service logs of its runs.
KEPT_LOGS = config.PROJECT_ROOT / ".cache" / "test-logs"


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` by :func:`work_units.work_unit`, the longest units first
    (:func:`work_units.order_units`); any other mode as xdist has it."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    seconds = work_units.load_table(work_units.pass_name(config.stash[_BACKEND_KEY].name))

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_units.work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            sizes = {unit: len(tests) for unit, tests in self.workqueue.items()}
            self.workqueue.move_to_end(work_units.order_units(sizes, seconds)[0], last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def pytest_configure(config: pytest.Config) -> None:
    try:
        name, reason = choose_backend()
        if name == "docker":
            # Before anything imports testcontainers: it reads the Ryuk switch once.
            choice = BackendChoice(name, reason, resolve_images(), disable_ryuk_if_absent())
        else:
            choice = BackendChoice(name, reason)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    config.stash[_BACKEND_KEY] = choice


#: Seconds of setup, call and teardown per work unit, summed as the session's reports arrive.
_UNIT_SECONDS: dict[str, float] = {}
_SESSION_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION_STARTED] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    unit = work_units.work_unit(report.nodeid)
    _UNIT_SECONDS[unit] = _UNIT_SECONDS.get(unit, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller (or a session without workers) records what each unit took."""
    config = session.config
    if hasattr(config, "workerinput") or not _UNIT_SECONDS:
        return
    wall = time.monotonic() - config.stash[_SESSION_STARTED]
    name = work_units.pass_name(config.stash[_BACKEND_KEY].name)
    work_units.record(name, _UNIT_SECONDS, wall, int(exitstatus))


def pytest_report_header(config: pytest.Config) -> list[str]:
    return config.stash[_BACKEND_KEY].header()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the docker backend, tests marked ``native_only(reason)`` skip with their reason."""
    if config.stash[_BACKEND_KEY].name != "docker":
        return
    for item in items:
        marker = item.get_closest_marker("native_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "needs the native services"
            item.add_marker(pytest.mark.skip(reason=f"native backend only: {why}"))


@pytest.fixture(scope="session")
def service_backend(request: pytest.FixtureRequest) -> Iterator[NativeBackend | DockerBackend]:
    """The session's backend; at its end every container it started is removed (docker), or its
    leases on the native services are released, even when tests failed."""
    choice = request.config.stash[_BACKEND_KEY]
    backend = DockerBackend(choice.images) if choice.name == "docker" else NativeBackend()
    try:
        yield backend
    finally:
        backend.close()


def _start(start: Callable[[], str]) -> str:
    """A service's address; a service the docker backend cannot start fails with one line."""
    try:
        return start()
    except BackendError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def kafka(service_backend: NativeBackend | DockerBackend) -> str:
    """Bootstrap servers (``host:port``) of a running Kafka broker."""
    return _start(service_backend.kafka_bootstrap)


@pytest.fixture(scope="session")
def redis(service_backend: NativeBackend | DockerBackend) -> Iterator[redis_module.Redis]:
    """A client of a Redis database of this test session's own, empty at the start.

    Tests share it; each keeps its keys apart with :func:`redis_prefix`. Test sessions that
    run at the same moment (developers, helpers, CI) each claim a different database
    (:func:`claim_test_database`), so one session's flush never deletes another's keys.
    """
    import redis as redis_module

    # Not from_url(url, db=...): the database in the URL's path would win over the keyword.
    address = urlsplit(_start(service_backend.redis_url))
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


@pytest.fixture(scope="session")
def spark_class_archive(kafka: str, redis_url: str) -> Path | None:
    """The Spark driver's class archive, built once if missing, as ``skewer services up``
    does: every Spark session the tests start (theirs and the stages') maps it."""
    from pipeline.runs.class_archive import ensure_class_archive

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(config.ENV_KAFKA_BOOTSTRAP, kafka)
        patch.setenv(config.ENV_REDIS_URL, redis_url)
        return ensure_class_archive(config.load(), print)


@pytest.fixture(scope="module")
def settings(
    kafka: str, redis_url: str, spark_class_archive: Path | None
) -> Iterator[config.Settings]:
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
    return _start(service_backend.prometheus_url)


@pytest.fixture(scope="session")
def spark(spark_class_archive: Path | None) -> Iterator[SparkSession]:
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


_TEST_STARTED = pytest.StashKey[float]()
#: Files a failed test's logs are taken from: stage and service logs, Spark's executor logs.
LOG_SUFFIXES = (".out", ".err", ".log", ".txt")
LOG_NAMES = ("stderr", "stdout")
#: A log longer than this is kept from its end.
LOG_TAIL_BYTES = 8 << 20


@pytest.fixture(autouse=True)
def _integration_test_started(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("integration") is not None:
        request.node.stash[_TEST_STARTED] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """An integration test that failed keeps the logs its runs and services wrote while it ran
    (:func:`keep_logs`), and its failure names the folder."""
    report = yield
    if report.failed and report.when in ("setup", "call") and _TEST_STARTED in item.stash:
        folder = keep_logs(item, item.stash[_TEST_STARTED])
        if folder is not None:
            where = f"logs of this test's runs kept in {folder}"
            if hasattr(report.longrepr, "addsection"):
                report.longrepr.addsection("kept logs", where)
            crash = getattr(report.longrepr, "reprcrash", None)
            if crash is not None:
                crash.message = f"{crash.message} [{where}]"
    return report


def keep_logs(item: pytest.Item, since: float) -> Path | None:
    """Copy the logs written since ``since`` (a wall-clock time) to ``.cache/test-logs/TEST/``:
    the stages' logs of every run in the session's run folder (``demo/RUN/``, another test's
    running beside this one included) and every log under this pytest worker's temporary
    folders (the runs and services of a test's own). Data files are left out (a Kafka
    segment's name is its offset); the folder, or None if no log was written."""
    sources = [
        (config.load().run_dir / "demo", "runs"),
        (item.config._tmp_path_factory.getbasetemp(), "tmp"),  # type: ignore[attr-defined]
    ]
    folder = KEPT_LOGS / _safe_name(item.nodeid.split("/")[-1])
    shutil.rmtree(folder, ignore_errors=True)
    kept = 0
    for root, name in sources:
        for path in root.rglob("*") if root.is_dir() else ():
            is_log = path.suffix in LOG_SUFFIXES or path.name in LOG_NAMES
            if not is_log or path.stem.isdigit() or not path.is_file():
                continue
            try:
                if path.stat().st_mtime < since:
                    continue
                target = folder / name / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                with path.open("rb") as source, target.open("wb") as copy:
                    source.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                    shutil.copyfileobj(source, copy)
                kept += 1
            except OSError:
                continue  # deleted meanwhile
    return folder if kept else None
