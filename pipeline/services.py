"""Native services: a real Kafka broker, Redis and Prometheus as local processes, no Docker.

- Kafka: Apache's own artifacts from Maven Central (deploy/kafka/pom.xml), copied once into
  ``.cache/kafka/libs`` and run as ``java -cp libs/* kafka.Kafka`` in KRaft combined mode
  (one node is broker and controller); its storage is formatted once with a fixed cluster id.
- Redis and Prometheus: the binaries of Debian's packages (deploy/install-system.sh), run as our
  own processes with data and config under ``.cache/run``, never the packages' system services.
- Spark's Kafka source: :func:`ensure_spark_jars` copies Apache's ``spark-sql-kafka-0-10`` at
  exactly PySpark's version (deploy/spark/pom.xml) into ``.cache/spark-jars``, once.

Every process listens on 127.0.0.1 only (ports in :mod:`pipeline.config`), runs in its own
session, logs to ``.cache/run/<name>.log`` and is remembered by a pid file holding its pid and
its kernel start time, so :func:`down` stops exactly the processes :func:`up` started and never a
process that merely inherited a recycled pid. :func:`up` is idempotent: a service that answers
its health check is left alone (also when someone else runs it, which is then reported as
"external"), and a dead one (killed by hand, say) is started again. Test sessions use
:func:`acquire` and :func:`release` instead: leases let concurrent sessions in one checkout share
the services, and the last one out stops what a session had to start.

Health checks: Kafka answers a metadata request (confluent-kafka ``AdminClient.list_topics``),
Redis answers ``PING``, Prometheus answers ``GET /-/ready`` with 200.

Example (no process is started; the layout of what would run):
    >>> from pipeline import config
    >>> settings = config.load({"SKEWER_CACHE_DIR": "/tmp/skewer-doc"})
    >>> [service.name for service in native_services(settings)]
    ['kafka', 'redis', 'prometheus']
    >>> redis_service = native_services(settings, ["redis"])[0]
    >>> redis_service.command()[:5]
    ['redis-server', '--bind', '127.0.0.1', '--port', '16379']
    >>> str(redis_service.log_path)
    '/tmp/skewer-doc/run/redis.log'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from pipeline import config
from pipeline.config import Settings

SERVICE_NAMES = ("kafka", "redis", "prometheus")

#: Popen handles of the processes this interpreter started, so stopping one also reaps it (a
#: test session starts services as its own children).
_children: dict[int, subprocess.Popen[bytes]] = {}


class ServiceError(Exception):
    """A service could not be installed, started or stopped; the message is one line."""


# --------------------------------------------------------------------------------------------
# Processes and pid files


@dataclass(frozen=True)
class PidRecord:
    """What a pid file holds: enough to recognise the process later, even after pid reuse."""

    pid: int
    start_ticks: int
    command: tuple[str, ...]


def _start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start_ticks = fields[0], int(fields[19])
    if state in ("Z", "X"):
        return None
    return start_ticks


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    return _start_ticks(pid) is not None


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        del _children[pid]


def _is_alive(record: PidRecord) -> bool:
    _reap(record.pid)
    return _start_ticks(record.pid) == record.start_ticks


def _read_pid_file(path: Path) -> PidRecord | None:
    try:
        data = json.loads(path.read_text())
        return PidRecord(int(data["pid"]), int(data["start_ticks"]), tuple(data["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_pid_file(path: Path, record: PidRecord) -> None:
    payload = {"pid": record.pid, "start_ticks": record.start_ticks, "command": record.command}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload) + "\n")
    temporary.replace(path)


@contextlib.contextmanager
def _services_lock(settings: Settings) -> Iterator[None]:
    """Serialise ``up`` and ``down`` (two test sessions, or a test beside the CLI)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.run_dir / "services.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# The three services


class NativeService(ABC):
    """One service run as a local process: how to install, configure, start and probe it."""

    name: str
    #: Seconds to wait for the first healthy answer after starting (a cold JVM is the slowest).
    start_timeout: float = 30.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def log_path(self) -> Path:
        return self.settings.run_dir / f"{self.name}.log"

    @property
    def pid_path(self) -> Path:
        return self.settings.run_dir / f"{self.name}.pid"

    @property
    def data_dir(self) -> Path:
        return self.settings.run_dir / self.name

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients reach it, as shown by ``status``."""

    @abstractmethod
    def install(self) -> None:
        """Make the binaries available (idempotent); raise ServiceError when impossible."""

    def prepare(self) -> None:
        """Write configuration and initialise storage before a start."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def command(self) -> list[str]:
        """The command line of the service process."""

    @abstractmethod
    def healthy(self, timeout: float = 2.0) -> bool:
        """True when the service answers its health check."""

    def reconfigure(self, record: PidRecord) -> bool:
        """Bring a running process of ours up to date with its configuration; True if it
        had to reload. Most services need nothing."""
        return False

    def _require_binary(self, binary: str) -> None:
        if shutil.which(binary) is None:
            raise ServiceError(
                f"{self.name}: {binary} is not installed; run `make install` "
                f"(or `bash {config.DEPLOY_DIR / 'install-system.sh'}`)"
            )


class KafkaService(NativeService):
    """Apache Kafka, single node, KRaft combined mode (deploy/kafka/server.properties)."""

    name = "kafka"
    start_timeout = 120.0

    @property
    def address(self) -> str:
        return self.settings.kafka_bootstrap

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    def install(self) -> None:
        self._require_binary("java")
        ensure_kafka_libs(self.settings)

    def _classpath(self) -> str:
        return str(self.settings.kafka_libs_dir / "*")

    def server_properties(self) -> str:
        """deploy/kafka/server.properties with this machine's addresses and data folder."""
        controller_host, _, controller_port = self.settings.kafka_controller.rpartition(":")
        template = Template((config.DEPLOY_DIR / "kafka" / "server.properties").read_text())
        return template.substitute(
            broker_host=self.settings.kafka_host,
            broker_port=self.settings.kafka_port,
            controller_host=controller_host,
            controller_port=controller_port,
            data_dir=self.data_dir / "data",
        )

    def prepare(self) -> None:
        super().prepare()
        self.config_path.write_text(self.server_properties())
        if not (self.data_dir / "data" / "meta.properties").exists():
            self._format_storage()

    def _format_storage(self) -> None:
        formatted = subprocess.run(
            [
                "java",
                "-cp",
                self._classpath(),
                *self._jvm_logging_options(),
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                config.KAFKA_CLUSTER_ID,
                "--config",
                str(self.config_path),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        with open(self.log_path, "a") as log:
            log.write(formatted.stdout + formatted.stderr)
        if formatted.returncode != 0:
            raise ServiceError(f"kafka failed to start; see {self.log_path}")

    @staticmethod
    def _jvm_logging_options() -> list[str]:
        return [f"-Dlog4j2.configurationFile={config.DEPLOY_DIR / 'kafka' / 'log4j2.properties'}"]

    def command(self) -> list[str]:
        return [
            "java",
            # A development broker beside Spark on a 2-core machine: a small, fixed heap.
            "-Xms256m",
            "-Xmx768m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            *self._jvm_logging_options(),
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.config_path),
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return kafka_answers(self.settings.kafka_bootstrap, timeout)


class RedisService(NativeService):
    """Debian's redis-server, in memory only (no snapshots, no append-only file)."""

    name = "redis"
    start_timeout = 20.0

    @property
    def address(self) -> str:
        return self.settings.redis_url

    def install(self) -> None:
        self._require_binary("redis-server")

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind",
            self.settings.redis_host,
            "--port",
            str(self.settings.redis_port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            # An empty log file name means standard output, which goes to redis.log.
            "--logfile",
            "",
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return redis_answers(self.settings.redis_url, timeout)


class PrometheusService(NativeService):
    """Debian's prometheus with deploy/prometheus/prometheus-native.yml."""

    name = "prometheus"
    start_timeout = 30.0

    @property
    def address(self) -> str:
        return self.settings.prometheus_url

    @property
    def config_path(self) -> Path:
        return self.data_dir / "prometheus.yml"

    def install(self) -> None:
        self._require_binary("prometheus")

    @property
    def listen_address(self) -> str:
        return f"{self.settings.prometheus_host}:{self.settings.prometheus_port}"

    @property
    def rules_path(self) -> Path:
        """The recording rules, copied next to the configuration (which names them)."""
        return self.data_dir / "rules.yml"

    @property
    def targets_dir(self) -> Path:
        return prometheus_targets_dir(self.settings)

    def prometheus_config(self) -> str:
        """deploy/prometheus/prometheus-native.yml with this machine's address and the folder
        of the stages' target files."""
        template = Template(
            (config.DEPLOY_DIR / "prometheus" / "prometheus-native.yml").read_text()
        )
        return template.substitute(
            prometheus_address=self.listen_address, targets_dir=self.targets_dir
        )

    def rules(self) -> str:
        """deploy/prometheus/rules.yml, shared with the compose Prometheus."""
        return (config.DEPLOY_DIR / "prometheus" / "rules.yml").read_text()

    def write_config(self) -> bool:
        """Write the rules and the configuration where they differ; True if one changed."""
        changed = False
        # Rules first: the configuration names them, and a reload reads both.
        wanted = ((self.rules_path, self.rules()), (self.config_path, self.prometheus_config()))
        for path, text in wanted:
            if not path.exists() or path.read_text() != text:
                temporary = path.with_name(f".{path.name}.tmp")
                temporary.write_text(text)
                temporary.replace(path)
                changed = True
        return changed

    def prepare(self) -> None:
        super().prepare()
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()

    def reconfigure(self, record: PidRecord) -> bool:
        """A running Prometheus of ours whose configuration or rules are stale (an older
        checkout started it) or whose last reload failed: write them and reload (SIGHUP);
        ServiceError if Prometheus rejects them."""
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        before, successful = _prometheus_reload_state(self.settings.prometheus_url)
        if not self.write_config() and successful is not False:
            return False
        os.kill(record.pid, signal.SIGHUP)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            stamp, successful = _prometheus_reload_state(self.settings.prometheus_url)
            if stamp is not None and (before is None or stamp > before) and successful:
                return True
            if stamp is not None and successful is False:
                break
            time.sleep(0.2)
        raise ServiceError(
            f"prometheus did not load the new configuration {self.config_path}; see {self.log_path}"
        )

    def command(self) -> list[str]:
        return [
            "prometheus",
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'data'}",
            "--storage.tsdb.retention.time=2d",
            f"--web.listen-address={self.listen_address}",
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return prometheus_answers(self.settings.prometheus_url, timeout)


_SERVICE_CLASSES: dict[str, type[NativeService]] = {
    "kafka": KafkaService,
    "redis": RedisService,
    "prometheus": PrometheusService,
}


def native_services(settings: Settings, names: Sequence[str] | None = None) -> list[NativeService]:
    """The services called ``names`` (all of them by default), in a fixed order."""
    wanted = SERVICE_NAMES if not names else tuple(names)
    unknown = [name for name in wanted if name not in _SERVICE_CLASSES]
    if unknown:
        raise ServiceError(
            f"unknown service {unknown[0]!r}; valid services: {', '.join(SERVICE_NAMES)}"
        )
    return [_SERVICE_CLASSES[name](settings) for name in SERVICE_NAMES if name in wanted]


# --------------------------------------------------------------------------------------------
# Health checks (also used by the test fixtures against containers)


def _accepts_connections(address: str, timeout: float) -> bool:
    host, _, port = address.strip().rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def kafka_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """A metadata request to ``bootstrap`` returns at least one broker within ``timeout``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # A refused connection is an answer at once; librdkafka would retry until the timeout.
    if not any(_accepts_connections(address, timeout) for address in bootstrap.split(",")):
        return False
    # log_level 0 keeps librdkafka from printing "connection refused" while a broker boots.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return len(metadata.brokers) > 0


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Create topic ``name`` with ``partitions`` partitions and wait until every one has a leader.

    Topics are always created explicitly (the native broker has auto-creation off), because
    partition w of a topic is worker w: the partition count is part of the routing.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=timeout)
    futures[name].result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(partition.leader >= 0 for partition in topic.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise ServiceError(f"kafka: topic {name!r} has no leaders after {timeout:.0f} s")


def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    from confluent_kafka.admin import AdminClient

    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.delete_topics(list(names), request_timeout=timeout).values():
        future.result(timeout=timeout)


def redis_answers(url: str, timeout: float = 2.0) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def prometheus_targets_dir(settings: Settings) -> Path:
    """Where each stage's exporter writes its file_sd target file (pipeline/metrics.py) and
    the native Prometheus looks for them."""
    return settings.run_dir / "prometheus" / "targets"


def _prometheus_reload_state(url: str) -> tuple[float | None, bool | None]:
    """When Prometheus last loaded its configuration successfully, and whether the last
    attempt succeeded (None, None when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None, None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "prometheus_config_last_reload_success_timestamp_seconds",
            "prometheus_config_last_reload_successful",
        ):
            values[name] = float(value)
    stamp = values.get("prometheus_config_last_reload_success_timestamp_seconds")
    successful = values.get("prometheus_config_last_reload_successful")
    return stamp, None if successful is None else successful == 1.0


def prometheus_answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


# --------------------------------------------------------------------------------------------
# Maven downloads


def _maven_copy(
    settings: Settings, pom: Path, output_dir: Path, extra: Sequence[str], what: str
) -> None:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``output_dir``, once per input.

    A marker file records a digest of the pom and the arguments, so a changed pin downloads
    again while an unchanged one costs nothing (and needs no network).
    """
    digest = hashlib.sha256(pom.read_bytes() + "\0".join(extra).encode()).hexdigest()
    marker = output_dir / ".skewer-complete"
    if marker.exists() and marker.read_text().strip() == digest:
        return
    if shutil.which("mvn") is None:
        raise ServiceError(f"{what}: mvn is not installed; run `make install`")
    if output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True)
    log_path = settings.run_dir / "maven.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        "mvn",
        "--batch-mode",
        "--quiet",
        "--file",
        str(pom),
        f"-Dmaven.repo.local={settings.maven_repository}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output_dir}",
        *extra,
    ]
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise ServiceError(f"{what}: Maven could not fetch the jars; see {log_path}")
    marker.write_text(digest + "\n")


def ensure_kafka_libs(settings: Settings | None = None) -> Path:
    """Kafka's classpath in the cache, downloaded by Maven on first use."""
    settings = settings or config.load()
    pom = config.DEPLOY_DIR / "kafka" / "pom.xml"
    _maven_copy(settings, pom, settings.kafka_libs_dir, [], "kafka")
    return settings.kafka_libs_dir


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _artifact_id(jar_name: str) -> str:
    """The artifact a jar file name carries: everything before its version.

    The version is the last dash-separated part that starts with a digit and has a dot, which
    also handles artifacts whose names hold numbers (``spark-sql-kafka-0-10_2.13-4.0.0.jar``,
    ``log4j-1.2-api-2.24.3.jar``) and versions with suffixes (``zstd-jni-1.5.6-9.jar``).

    >>> _artifact_id("spark-sql-kafka-0-10_2.13-4.0.0.jar"), _artifact_id("zstd-jni-1.5.6-9.jar")
    ('spark-sql-kafka-0-10_2.13', 'zstd-jni')
    """
    parts = jar_name.removesuffix(".jar").split("-")
    for index in range(len(parts) - 1, 0, -1):
        if parts[index][:1].isdigit() and "." in parts[index]:
            return "-".join(parts[:index])
    return "-".join(parts)


def ensure_spark_jars(settings: Settings | None = None) -> list[Path]:
    """Spark's Kafka source at PySpark's version plus what PySpark lacks, fetched once."""
    import pyspark

    settings = settings or config.load()
    shipped = sorted({_artifact_id(jar.name) for jar in (_pyspark_home() / "jars").glob("*.jar")})
    _maven_copy(
        settings,
        config.DEPLOY_DIR / "spark" / "pom.xml",
        settings.spark_jars_dir,
        [f"-Dspark.version={pyspark.__version__}", f"-DexcludeArtifactIds={','.join(shipped)}"],
        "spark-sql-kafka",
    )
    return sorted(settings.spark_jars_dir.glob("*.jar"))


# --------------------------------------------------------------------------------------------
# up / down / status


@dataclass(frozen=True)
class ServiceState:
    """One line of ``status``, ``up`` or ``down``."""

    name: str
    address: str
    #: running (ours, healthy), external (healthy, not ours), starting (ours, not yet healthy),
    #: down; after up/down also started, stopped.
    state: str
    pid: int | None = None

    def line(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else ""
        return f"{self.name:<11}{self.state:<9}{self.address:<27}{pid}".rstrip()


def _own_process(service: NativeService) -> PidRecord | None:
    """Our live process for ``service``; a stale pid file is removed."""
    record = _read_pid_file(service.pid_path)
    if record is None:
        service.pid_path.unlink(missing_ok=True)
        return None
    if not _is_alive(record):
        service.pid_path.unlink(missing_ok=True)
        return None
    return record


def _state(service: NativeService) -> ServiceState:
    record = _own_process(service)
    healthy = service.healthy()
    if record is not None:
        state = "running" if healthy else "starting"
        return ServiceState(service.name, service.address, state, record.pid)
    return ServiceState(service.name, service.address, "external" if healthy else "down")


def status(
    settings: Settings | None = None, names: Sequence[str] | None = None
) -> list[ServiceState]:
    settings = settings or config.load()
    return [_state(service) for service in native_services(settings, names)]


def _spawn(service: NativeService) -> PidRecord:
    service.prepare()
    command = service.command()
    with open(service.log_path, "ab") as log:
        log.write(f"\n=== skewer: starting {service.name} at {time.ctime()}\n".encode())
        log.flush()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=service.data_dir,
            # Its own session: a Ctrl-C in the shell that ran `skewer services up` or pytest
            # does not reach the services, and the process outlives the command that started it.
            start_new_session=True,
        )
    _children[process.pid] = process
    start_ticks = _start_ticks(process.pid)
    if start_ticks is None:  # it exited at once; its log says why
        raise ServiceError(f"{service.name} failed to start; see {service.log_path}")
    record = PidRecord(process.pid, start_ticks, tuple(command))
    _write_pid_file(service.pid_path, record)
    return record


def _terminate(record: PidRecord, grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_seconds``; only if the pid is still our process."""
    if not _is_alive(record):
        return
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not _is_alive(record):
            return
        time.sleep(0.1)
    if _is_alive(record):
        os.kill(record.pid, signal.SIGKILL)
        while _is_alive(record):
            time.sleep(0.05)


def up(settings: Settings | None = None, names: Sequence[str] | None = None) -> list[ServiceState]:
    """Start every named service that does not answer yet, and wait until all are healthy.

    Returns one state per service: ``started`` for the ones this call started, ``running``
    or ``external`` for the ones already answering. Raises ServiceError naming the first
    service that failed and its log; a process that failed is stopped again. A service that
    a test session started is adopted: it stays up when the tests end.
    """
    settings = settings or config.load()
    services = native_services(settings, names)
    for service in services:
        service.install()
    with _services_lock(settings):
        states = _up_locked(services)
        for service in services:
            _started_by_lease_marker(service).unlink(missing_ok=True)
    return states


def _up_locked(services: list[NativeService]) -> list[ServiceState]:
    results: dict[str, ServiceState] = {}
    pending: dict[str, tuple[NativeService, PidRecord, bool]] = {}
    try:
        for service in services:
            current = _state(service)
            if current.state in ("running", "external"):
                record = _own_process(service) if current.state == "running" else None
                if record is not None:
                    service.reconfigure(record)  # ours: pick up a changed configuration
                results[service.name] = current
                continue
            record = _own_process(service) if current.state == "starting" else None
            if record is not None:
                pending[service.name] = (service, record, False)
            else:
                pending[service.name] = (service, _spawn(service), True)
        failure = _wait_healthy(pending)
        if failure is not None:
            raise ServiceError(f"{failure.name} failed to start; see {failure.log_path}")
    except BaseException:
        # All or nothing: what this call started does not outlive its failure.
        for service, record, started_here in pending.values():
            if started_here:
                _terminate(record, grace_seconds=10)
                service.pid_path.unlink(missing_ok=True)
        raise
    for service, record, started_here in pending.values():
        state = "started" if started_here else "running"
        results[service.name] = ServiceState(service.name, service.address, state, record.pid)
    return [results[service.name] for service in services]


def _wait_healthy(
    pending: dict[str, tuple[NativeService, PidRecord, bool]],
) -> NativeService | None:
    """Poll until every pending service answers; the first that died or timed out, else None."""
    started_at = time.monotonic()
    waiting = dict(pending)
    while waiting:
        for name, (service, record, _) in list(waiting.items()):
            if service.healthy(timeout=1.0):
                del waiting[name]
            elif not _is_alive(record) or time.monotonic() - started_at > service.start_timeout:
                return service
        if waiting:
            time.sleep(0.25)
    return None


def down(
    settings: Settings | None = None, names: Sequence[str] | None = None
) -> list[ServiceState]:
    """Stop the processes ``up`` started (from their pid files), and nothing else."""
    settings = settings or config.load()
    with _services_lock(settings):
        return [_down_locked(service) for service in native_services(settings, names)]


def _down_locked(service: NativeService) -> ServiceState:
    _started_by_lease_marker(service).unlink(missing_ok=True)
    record = _own_process(service)
    if record is None:
        return ServiceState(service.name, service.address, "down")
    # Kafka's controlled shutdown flushes logs and closes the quorum: give it time.
    _terminate(record, grace_seconds=30 if service.name == "kafka" else 10)
    service.pid_path.unlink(missing_ok=True)
    return ServiceState(service.name, service.address, "stopped", record.pid)


# --------------------------------------------------------------------------------------------
# Leases: test sessions that share the services of one checkout


def _leases_dir(service: NativeService) -> Path:
    return service.settings.run_dir / "leases"


def _started_by_lease_marker(service: NativeService) -> Path:
    return _leases_dir(service) / f"{service.name}.started-by-lease"


def _lease_path(service: NativeService, holder: PidRecord) -> Path:
    return _leases_dir(service) / f"{service.name}.{holder.pid}.{holder.start_ticks}"


def _live_leases(service: NativeService) -> list[Path]:
    """Leases of processes still running; the leases of dead holders are removed."""
    live = []
    for path in _leases_dir(service).glob(f"{service.name}.*.*"):
        pid, ticks = path.name.split(".")[1:3]
        if _start_ticks(int(pid)) == int(ticks):
            live.append(path)
        else:
            path.unlink(missing_ok=True)
    return live


def _this_process() -> PidRecord:
    ticks = _start_ticks(os.getpid())
    assert ticks is not None
    return PidRecord(os.getpid(), ticks, ())


def acquire(settings: Settings, names: Sequence[str]) -> list[ServiceState]:
    """:func:`up` for a process that needs the services only while it runs (a test session).

    The calling process takes a lease on each service. A service that some lease holder had to
    start is stopped by :func:`release` when its last live holder lets go, so concurrent test
    sessions in one checkout never stop a service under each other, and a service someone
    started with ``skewer services up`` is never stopped by tests.
    """
    services = native_services(settings, names)
    for service in services:
        service.install()
    holder = _this_process()
    with _services_lock(settings):
        states = _up_locked(services)
        for service, state in zip(services, states, strict=True):
            _leases_dir(service).mkdir(parents=True, exist_ok=True)
            _lease_path(service, holder).touch()
            if state.state == "started":
                _started_by_lease_marker(service).touch()
    return states


def release(settings: Settings, names: Sequence[str]) -> list[ServiceState]:
    """Drop this process's leases; stop what a lease holder started once no holder is left."""
    holder = _this_process()
    results = []
    with _services_lock(settings):
        for service in native_services(settings, names):
            _lease_path(service, holder).unlink(missing_ok=True)
            if not _live_leases(service) and _started_by_lease_marker(service).exists():
                results.append(_down_locked(service))
            else:
                results.append(_state(service))
    return results
