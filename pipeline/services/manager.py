"""``skewer services up|down|status``, and the leases test sessions share the services by.

:func:`up` is idempotent: a service that answers its health check is left alone (also when
someone else runs it, which is then reported as "external"), and a dead one (killed by hand,
say) is started again; what a failed ``up`` started is stopped again. :func:`down` stops
exactly the processes ``up`` started, from their pid files. Test sessions use :func:`acquire`
and :func:`release` instead: leases let concurrent sessions in one checkout share the
services, and the last one out stops what a session had to start. The Docker engine
(:mod:`~pipeline.services.docker_engine`) runs only when asked (``up --docker``, or its name).
(layer: services)

Example (no process is started; the layout of what would run):
    >>> from pipeline.io import config
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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import config
from pipeline.io.config import Settings
from pipeline.services import docker_engine, kafka_broker, process, redis_sentinel, spark_standalone
from pipeline.services.kafka_broker import KafkaNodeService, KafkaService
from pipeline.services.native import NativeService, ServiceError
from pipeline.services.process import PidRecord
from pipeline.services.prometheus_server import PrometheusService
from pipeline.services.redis_server import RedisService

SERVICE_NAMES = ("kafka", "redis", "prometheus")

_SERVICE_CLASSES: dict[str, type[NativeService]] = {
    "kafka": KafkaService,
    "redis": RedisService,
    "prometheus": PrometheusService,
    docker_engine.NAME: docker_engine.DockerEngineService,
}


def native_services(
    settings: Settings,
    names: Sequence[str] | None = None,
    *,
    spark_workers: int = 0,
    spark_worker_cores: int = spark_standalone.DEFAULT_WORKER_CORES,
    kafka_brokers: int = 1,
    redis_sentinel_set: bool = False,
    docker: bool = False,
) -> list[NativeService]:
    """The services called ``names``, in a fixed order (Spark's master before its workers).

    By default: Kafka, Redis and Prometheus, and the Spark standalone master and workers that
    ``up`` started (their pid files), so ``status`` and ``down`` cover them. ``spark_workers``
    N adds the master and workers 1..N (``up --spark-workers N``); the name ``spark`` means the
    master and the workers that run. ``kafka_brokers`` 3 means the nodes ``kafka-1..3`` instead
    of the one broker; so does ``kafka`` while a node runs (its pid file).
    ``redis_sentinel_set`` adds Redis's 2 replicas and 3 sentinels (``up --redis-sentinel``,
    :mod:`~pipeline.services.redis_sentinel`); by default, the ones with a pid file.
    ``docker`` adds the Docker engine (``up --docker``); by default, when one of ours was
    started and not taken down (:func:`~pipeline.services.docker_engine.left_behind`).
    """
    wanted = list(names or SERVICE_NAMES)
    if "kafka" in wanted and (kafka_brokers > 1 or _kafka_nodes_started(settings)):
        at = wanted.index("kafka")
        nodes = range(1, config.KAFKA_CLUSTER_NODES + 1)
        wanted[at : at + 1] = [kafka_broker.node_name(node) for node in nodes]
    if "spark" in wanted:
        wanted.remove("spark")
        wanted += [spark_standalone.MASTER_NAME, *_spark_services_started(settings)]
    elif not names:
        wanted += _spark_services_started(settings, master=True)
    wanted += _redis_sentinel_names(settings, names, redis_sentinel_set)
    if docker or (not names and docker_engine.left_behind(settings)):
        wanted.append(docker_engine.NAME)
    if spark_workers:
        wanted.append(spark_standalone.MASTER_NAME)
        wanted += [spark_standalone.worker_name(i) for i in range(1, spark_workers + 1)]
    services: dict[str, NativeService] = {}
    for name in wanted:
        if name in services:
            continue
        worker = spark_standalone.WORKER_NAME.match(name)
        node = kafka_broker.NODE_NAME.fullmatch(name)
        if name in _SERVICE_CLASSES:
            services[name] = _SERVICE_CLASSES[name](settings)
        elif node is not None and int(node.group(1)) <= config.KAFKA_CLUSTER_NODES:
            services[name] = KafkaNodeService(settings, int(node.group(1)))
        elif name in redis_sentinel.NAMES:
            [services[name]] = redis_sentinel.services(settings, (name,))
        elif name == spark_standalone.MASTER_NAME:
            services[name] = spark_standalone.SparkMasterService(settings)
        elif worker is not None:
            services[name] = spark_standalone.SparkWorkerService(
                settings, int(worker.group(1)), cores=spark_worker_cores
            )
        else:
            raise ServiceError(
                f"unknown service {name!r}; valid services: {', '.join(SERVICE_NAMES)}, "
                f"kafka-1..{config.KAFKA_CLUSTER_NODES}, redis-replica-1..2, "
                "redis-sentinel-1..3, spark, spark-master, spark-worker-N, docker"
            )
    return sorted(services.values(), key=_start_order)


def _start_order(service: NativeService) -> tuple[int, int]:
    if service.name in redis_sentinel.NAMES:  # after their primary, sentinels last
        return (SERVICE_NAMES.index("redis"), 1 + redis_sentinel.NAMES.index(service.name))
    if isinstance(service, KafkaNodeService):
        return (SERVICE_NAMES.index("kafka"), service.node_id)
    if service.name in SERVICE_NAMES:
        return (SERVICE_NAMES.index(service.name), 0)
    if isinstance(service, spark_standalone.SparkWorkerService):
        return (len(SERVICE_NAMES) + 1, service.index)
    if isinstance(service, docker_engine.DockerEngineService):
        return (len(SERVICE_NAMES) + 2, 0)
    return (len(SERVICE_NAMES), 0)


def _kafka_nodes_started(settings: Settings) -> bool:
    """A node of the native Kafka cluster has a pid file (``up --kafka-brokers 3`` ran)."""
    return any(
        kafka_broker.NODE_NAME.fullmatch(path.stem) for path in settings.run_dir.glob("kafka-*.pid")
    )


def _redis_sentinel_names(
    settings: Settings, names: Sequence[str] | None, redis_sentinel_set: bool
) -> list[str]:
    """The Redis Sentinel set's services wanted besides ``names``: all of them with the
    primary for ``up --redis-sentinel``; by default (status, down) the ones with a pid file."""
    if redis_sentinel_set:
        return ["redis", *redis_sentinel.NAMES]
    if names:
        return []
    return [name for name in redis_sentinel.NAMES if (settings.run_dir / f"{name}.pid").exists()]


def _spark_services_started(settings: Settings, *, master: bool = False) -> list[str]:
    """The Spark services with a pid file: workers in index order, the master first if asked."""
    names = sorted(
        (path.stem for path in settings.run_dir.glob("spark-worker-*.pid")),
        key=lambda name: int(name.rpartition("-")[2]),
    )
    has_master = (settings.run_dir / f"{spark_standalone.MASTER_NAME}.pid").exists()
    return ([spark_standalone.MASTER_NAME] if master and has_master else []) + names


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
        name = f"{self.name:<15}" if len(self.name) < 15 else f"{self.name} "  # redis-sentinel-1
        # A long address (unix:///var/run/docker.sock) keeps a space before the pid.
        address = f"{self.address:<27}" if len(self.address) < 27 else f"{self.address} "
        return f"{name}{self.state:<9}{address}{pid}".rstrip()


def _own_process(service: NativeService) -> PidRecord | None:
    """Our live process for ``service``; a stale pid file is removed."""
    record = process.read_pid_file(service.pid_path)
    if record is None:
        service.pid_path.unlink(missing_ok=True)
        return None
    if not process.is_alive(record):
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
    record = process.spawn(
        service.name,
        service.command(),
        log_path=service.log_path,
        cwd=service.data_dir,
        env=service.environment(),
    )
    if record is None:
        raise service.start_failure("it exited at once")
    process.write_pid_file(service.pid_path, record)
    return record


def up(
    settings: Settings | None = None,
    names: Sequence[str] | None = None,
    *,
    spark_workers: int = 0,
    spark_worker_cores: int = spark_standalone.DEFAULT_WORKER_CORES,
    kafka_brokers: int = 1,
    redis_sentinel_set: bool = False,
    docker: bool = False,
) -> list[ServiceState]:
    """Start every named service that does not answer yet, and wait until all are healthy;
    ``spark_workers`` N adds a Spark standalone master and N workers of
    ``spark_worker_cores`` cores each; ``kafka_brokers`` 3 runs Kafka as a cluster of three
    nodes (refused while anything else answers on a node's port, such as the one broker);
    ``docker`` adds the Docker engine.

    Returns one state per service: ``started`` for the ones this call started, ``running``
    or ``external`` for the ones already answering. Raises ServiceError naming the first
    service that failed and its log; a process that failed is stopped again. A service that
    a test session started is adopted: it stays up when the tests end.
    """
    settings = settings or config.load()
    services = native_services(
        settings,
        names,
        spark_workers=spark_workers,
        spark_worker_cores=spark_worker_cores,
        kafka_brokers=kafka_brokers,
        redis_sentinel_set=redis_sentinel_set,
        docker=docker,
    )
    for service in services:
        service.install()
    with process.services_lock(settings):
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
            if current.state == "external" and isinstance(service, KafkaNodeService):
                # Its fellow nodes would wait for a quorum voter that is not there.
                raise ServiceError(
                    f"{service.name}: {service.address} answers already, but not as this "
                    "cluster's node (the one broker? stop it: skewer services down kafka)"
                )
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
            failed, why = failure
            raise failed.start_failure(why)
    except BaseException:
        # All or nothing: what this call started does not outlive its failure.
        for service, record, started_here in pending.values():
            if started_here:
                process.terminate(record, grace_seconds=10)
                service.after_stop()
                service.pid_path.unlink(missing_ok=True)
        raise
    for service, record, started_here in pending.values():
        state = "started" if started_here else "running"
        results[service.name] = ServiceState(service.name, service.address, state, record.pid)
    return [results[service.name] for service in services]


def _wait_healthy(
    pending: dict[str, tuple[NativeService, PidRecord, bool]],
) -> tuple[NativeService, str] | None:
    """Poll until every pending service answers; the first that died or timed out (and which
    of the two), else None. Each service's timeout is read once, as the wait begins: a Redis
    node's depends on the files it is loading, which it rewrites once loaded."""
    started_at = time.monotonic()
    timeouts = {name: service.start_timeout for name, (service, _, _) in pending.items()}
    waiting = dict(pending)
    while waiting:
        for name, (service, record, _) in list(waiting.items()):
            if service.healthy(timeout=1.0):
                del waiting[name]
            elif not process.is_alive(record):
                return service, "it exited"
            elif time.monotonic() - started_at > timeouts[name]:
                return service, f"no healthy answer in {timeouts[name]:.0f} s"
        if waiting:
            time.sleep(0.25)
    return None


def down(
    settings: Settings | None = None, names: Sequence[str] | None = None
) -> list[ServiceState]:
    """Stop the processes ``up`` started (from their pid files), and nothing else."""
    settings = settings or config.load()
    services = native_services(settings, names)
    with process.services_lock(settings):
        stopped = _down_locked(services)
    return [stopped[service.name] for service in services]


def _down_locked(services: Sequence[NativeService]) -> dict[str, ServiceState]:
    """Stop ``services`` (ours only), last first: Spark's workers before their master, so none
    is left retrying a master that is gone. The nodes of a Kafka cluster stop together: the
    last one alone would wait for a quorum that is gone."""
    nodes = [service for service in services if isinstance(service, KafkaNodeService)]
    groups = [[service] for service in reversed(services) if service not in nodes]
    stopped: dict[str, ServiceState] = {}
    for group in ([nodes] if nodes else []) + groups:
        running: list[tuple[NativeService, PidRecord]] = []
        for service in group:
            _started_by_lease_marker(service).unlink(missing_ok=True)
            record = _own_process(service)
            if record is None:
                # Ours died by itself (or was killed): what it left behind is still ours.
                service.after_stop()
                stopped[service.name] = ServiceState(service.name, service.address, "down")
            else:
                running.append((service, record))
        # Kafka's controlled shutdown flushes logs and closes the quorum: give it time
        # (stop_timeout). A node left without a majority of its cluster's voters would wait
        # for them to the end.
        grace = max(service.stop_timeout for service in group)
        quorum = len(group) // 2 + 1 if group is nodes else 0
        process.terminate_all([record for _, record in running], grace, quorum=quorum)
        for service, record in running:
            service.after_stop()
            service.pid_path.unlink(missing_ok=True)
            stopped[service.name] = ServiceState(
                service.name, service.address, "stopped", record.pid
            )
    return stopped


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
        if process.start_ticks(int(pid)) == int(ticks):
            live.append(path)
        else:
            path.unlink(missing_ok=True)
    return live


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
    holder = process.this_process()
    with process.services_lock(settings):
        states = _up_locked(services)
        for service, state in zip(services, states, strict=True):
            _leases_dir(service).mkdir(parents=True, exist_ok=True)
            _lease_path(service, holder).touch()
            if state.state == "started":
                _started_by_lease_marker(service).touch()
    return states


def release(settings: Settings, names: Sequence[str]) -> list[ServiceState]:
    """Drop this process's leases; stop what a lease holder started once no holder is left."""
    holder = process.this_process()
    services = native_services(settings, names)
    with process.services_lock(settings):
        unused = []
        for service in services:
            _lease_path(service, holder).unlink(missing_ok=True)
            if not _live_leases(service) and _started_by_lease_marker(service).exists():
                unused.append(service)
        stopped = _down_locked(unused)
        return [stopped.get(service.name) or _state(service) for service in services]
