"""Where skewer's services listen and where its downloads and run state live: the one place.

Layer: io.

Every address has a default on 127.0.0.1 with a non-default port, so a developer's own Kafka,
Redis or Prometheus never collides with ours, and an environment variable that overrides it
(also how tests point at a container). Paths live under a git-ignored ``.cache/`` in the
repository unless ``SKEWER_CACHE_DIR`` says otherwise.

:func:`load` reads the environment each time it is called, so a test can set a variable and
see its effect without reloading modules.

Example:
    >>> settings = load({})
    >>> settings.kafka_bootstrap, settings.redis_url, settings.prometheus_url
    ('127.0.0.1:19092', 'redis://127.0.0.1:16379/0', 'http://127.0.0.1:19090')
    >>> settings.kafka_controller
    '127.0.0.1:19093'
    >>> load({"SKEWER_KAFKA_BOOTSTRAP": "127.0.0.1:29092"}).kafka_port
    29092
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.io.kafka_security import KafkaSecurity
from pipeline.io.kafka_security import from_environ as kafka_security_from_environ

#: The repository: pipeline/io/ is two levels below it (the project installs editable).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = PROJECT_ROOT / "deploy"

ENV_KAFKA_BOOTSTRAP = "SKEWER_KAFKA_BOOTSTRAP"
ENV_KAFKA_CONTROLLER = "SKEWER_KAFKA_CONTROLLER"
#: Replicas of each topic skewer creates: ``auto`` (the default: min(3, brokers)) or a number,
#: refused when the cluster has fewer brokers (pipeline.io.kafka_io.topic_replication).
ENV_KAFKA_REPLICATION = "SKEWER_KAFKA_REPLICATION"
#: The nodes of ``skewer services up --kafka-brokers 3``: node i (1, 2, 3) listens on the
#: bootstrap and controller ports plus 2 (i - 1), so node 1 takes the single broker's ports.
KAFKA_CLUSTER_NODES = 3
ENV_REDIS_URL = "SKEWER_REDIS_URL"
ENV_PROMETHEUS_URL = "SKEWER_PROMETHEUS_URL"
ENV_CACHE_DIR = "SKEWER_CACHE_DIR"
#: Where the workers' Spark driver sends its tasks: ``local`` (the default: threads in the
#: driver, as many as the job has tasks), ``local[...]``, ``spark://``, ``k8s://`` or ``yarn``.
ENV_SPARK_MASTER = "SKEWER_SPARK_MASTER"
DEFAULT_SPARK_MASTER = "local"
#: The native Spark standalone master (``skewer services up --spark-workers N``): its RPC
#: address; its web UI listens on the next port, worker i's on the port after that plus i.
ENV_SPARK_STANDALONE = "SKEWER_SPARK_STANDALONE"
DEFAULT_SPARK_STANDALONE = "127.0.0.1:17077"
#: When the native Redis flushes its append-only file to disk (README, "Durability").
ENV_REDIS_APPENDFSYNC = "SKEWER_REDIS_APPENDFSYNC"
REDIS_APPENDFSYNC_POLICIES = ("always", "everysec", "no")
DEFAULT_REDIS_APPENDFSYNC = "everysec"
#: The native Redis Sentinel set (``skewer services up --redis-sentinel``): sentinel i (1, 2, 3)
#: listens on this port plus i - 1 and monitors the native Redis as service ``skewer``; the
#: primary's replicas i listen on the Redis port plus i (pipeline.services.redis_sentinel).
ENV_REDIS_SENTINEL = "SKEWER_REDIS_SENTINEL"
DEFAULT_REDIS_SENTINEL = "127.0.0.1:36379"
REDIS_SENTINEL_SERVICE = "skewer"
REDIS_SENTINEL_NODES = 3
#: Pid files, logs and data of running services; a second set of services (a test of the
#: service manager itself) runs beside the first by pointing this elsewhere with other ports.
ENV_RUN_DIR = "SKEWER_RUN_DIR"
#: The one environment variable that names the grouping scheme; every stage's ``--scheme``
#: falls back to it.
SCHEME_VARIABLE = "GROUPING_SCHEME"
#: "docker", "native" or "auto" (the default): which services the test fixtures use.
ENV_TEST_BACKEND = "SKEWER_TEST_BACKEND"
#: Where Docker's clients find the engine, read as Docker's own clients read it: the engine
#: ``skewer services up --docker`` starts listens on this variable's socket when it is a
#: ``unix://`` URL, and on Docker's default socket otherwise.
ENV_DOCKER_HOST = "DOCKER_HOST"
DEFAULT_DOCKER_SOCKET = Path("/var/run/docker.sock")

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:19092"
DEFAULT_KAFKA_CONTROLLER = "127.0.0.1:19093"
DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"
DEFAULT_PROMETHEUS_URL = "http://127.0.0.1:19090"

#: Fixed KRaft cluster id: base64url of the 16 bytes b"skewer-kafka-001", so the storage
#: formatted once stays valid across restarts and fresh clones alike.
KAFKA_CLUSTER_ID = "c2tld2VyLWthZmthLTAwMQ"


def host_ports(addresses: str, variable: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]`` (a Kafka bootstrap list) as (host, port) pairs; an IPv6
    host is written in brackets, ``[::1]:9092``, and comes back without them.

    Example:
        >>> host_ports("k1:9092, k2:9093,[::1]:9094", "SKEWER_KAFKA_BOOTSTRAP")
        [('k1', 9092), ('k2', 9093), ('::1', 9094)]
    """
    pairs = []
    for address in addresses.split(","):
        host, separator, port = address.strip().rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            host = ""  # an IPv6 address without brackets: its port is ambiguous
        if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{variable}={addresses!r} is not HOST:PORT[,HOST:PORT...]")
        pairs.append((host, int(port)))
    return pairs


def _address(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (as :func:`host_ports` reads it back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def replication_setting(value: str, variable: str = ENV_KAFKA_REPLICATION) -> int | None:
    """``auto`` (None: min(3, brokers)) or a positive replica count; else a ValueError.

    >>> replication_setting("auto"), replication_setting("3")
    (None, 3)
    >>> replication_setting("0")
    Traceback (most recent call last):
    ...
    ValueError: SKEWER_KAFKA_REPLICATION='0' is not auto or a number of replicas (1, 2, 3 ...)
    """
    value = value.strip()
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{variable}={value!r} is not auto or a number of replicas (1, 2, 3 ...)")
    return int(value)


def check_spark_master(url: str, variable: str = ENV_SPARK_MASTER) -> str:
    """``url`` if Spark accepts it as a master (``local``, ``local[N]``, ``local[*]``,
    ``local[N,F]``, ``spark://HOST:PORT[,HOST:PORT...]``, ``k8s://...``, ``yarn``); else a
    ValueError naming ``variable``.

    Example:
        >>> check_spark_master("spark://m1:7077,m2:7077"), check_spark_master("local[4,2]")
        ('spark://m1:7077,m2:7077', 'local[4,2]')
        >>> check_spark_master("spark://m", "-m")
        Traceback (most recent call last):
        ...
        ValueError: -m='spark://m' is not local[...], spark://HOST:PORT, k8s://URL or yarn
    """
    url = url.strip()
    valid = (
        url in ("local", "yarn")
        or re.fullmatch(r"local\[(\*|[1-9]\d*)(,[1-9]\d*)?\]", url) is not None
        or (url.startswith("k8s://") and len(url) > len("k8s://"))
    )
    if url.startswith("spark://"):
        try:
            host_ports(url[len("spark://") :], variable)
            valid = True
        except ValueError:
            valid = False
    if not valid:
        raise ValueError(
            f"{variable}={url!r} is not local[...], spark://HOST:PORT, k8s://URL or yarn"
        )
    return url


def spark_master_addresses(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each master of a ``spark://`` URL; empty for any other master.

    >>> spark_master_addresses("spark://m1:7077,m2:7078"), spark_master_addresses("yarn")
    ([('m1', 7077), ('m2', 7078)], [])
    """
    if not url.startswith("spark://"):
        return []
    return host_ports(url[len("spark://") :], ENV_SPARK_MASTER)


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs.

    >>> redacted_url("redis://:s3cret@redis:6379/0"), redacted_url("redis://127.0.0.1:16379/0")
    ('redis://:***@redis:6379/0', 'redis://127.0.0.1:16379/0')
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


@dataclass(frozen=True)
class Settings:
    """Addresses of the services and the folders skewer writes, resolved from the environment."""

    kafka_bootstrap: str
    kafka_controller: str
    redis_url: str
    prometheus_url: str
    cache_dir: Path
    run_dir: Path
    #: The native Redis's ``appendfsync`` policy (its append-only file is always on).
    redis_appendfsync: str = DEFAULT_REDIS_APPENDFSYNC
    #: The first native sentinel's address (``SKEWER_REDIS_SENTINEL``).
    redis_sentinel: str = DEFAULT_REDIS_SENTINEL
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_standalone: str = DEFAULT_SPARK_STANDALONE
    #: Replicas of the topics skewer creates; None: min(3, brokers).
    kafka_replication: int | None = None
    #: ``$DOCKER_HOST`` as given (empty when unset); see :attr:`docker_socket`.
    docker_host: str = ""
    #: How the Kafka clients authenticate and encrypt (``SKEWER_KAFKA_SECURITY_PROTOCOL`` ...);
    #: each client reads them from its process's environment (pipeline.io.kafka_security).
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)

    @property
    def kafka_host(self) -> str:
        """The first bootstrap address's host: the native broker's, when skewer runs one."""
        return host_ports(self.kafka_bootstrap, ENV_KAFKA_BOOTSTRAP)[0][0]

    @property
    def kafka_port(self) -> int:
        return host_ports(self.kafka_bootstrap, ENV_KAFKA_BOOTSTRAP)[0][1]

    @property
    def kafka_hosts(self) -> list[str]:
        """Every host of the bootstrap list."""
        return [host for host, _ in host_ports(self.kafka_bootstrap, ENV_KAFKA_BOOTSTRAP)]

    @property
    def kafka_controller_port(self) -> int:
        return host_ports(self.kafka_controller, ENV_KAFKA_CONTROLLER)[0][1]

    def kafka_node_address(self, node: int) -> str:
        """Where node ``node`` (1..KAFKA_CLUSTER_NODES) of the native cluster takes clients.

        >>> load({}).kafka_node_address(3)
        '127.0.0.1:19096'
        """
        return _address(self.kafka_host, self.kafka_port + 2 * (node - 1))

    def kafka_node_controller(self, node: int) -> str:
        """Where node ``node`` of the native cluster's controller listens (its quorum voter).

        >>> load({}).kafka_node_controller(2)
        '127.0.0.1:19095'
        """
        host = host_ports(self.kafka_controller, ENV_KAFKA_CONTROLLER)[0][0]
        return _address(host, self.kafka_controller_port + 2 * (node - 1))

    @property
    def kafka_cluster_bootstrap(self) -> str:
        """Every node of the native cluster: the bootstrap list clients that must start while
        any one node is down need (``SKEWER_KAFKA_BOOTSTRAP``).

        >>> load({}).kafka_cluster_bootstrap
        '127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096'
        """
        nodes = range(1, KAFKA_CLUSTER_NODES + 1)
        return ",".join(self.kafka_node_address(node) for node in nodes)

    @property
    def spark_standalone_url(self) -> str:
        """The native standalone master's URL, as ``--spark-master`` takes it."""
        return f"spark://{self.spark_standalone}"

    @property
    def spark_standalone_port(self) -> int:
        return host_ports(self.spark_standalone, ENV_SPARK_STANDALONE)[0][1]

    @property
    def spark_standalone_web_port(self) -> int:
        """The native master's web UI port: the one after the master's."""
        return self.spark_standalone_port + 1

    @property
    def spark_standalone_web_url(self) -> str:
        """The native master's web UI, whose ``/json/`` lists its workers and applications."""
        return f"http://{self.spark_standalone_host}:{self.spark_standalone_web_port}"

    @property
    def spark_standalone_host(self) -> str:
        return host_ports(self.spark_standalone, ENV_SPARK_STANDALONE)[0][0]

    @property
    def native_redis_url(self) -> str:
        """The native Redis (the Sentinel set's primary): ``redis_url``, unless that is a
        ``redis+sentinel://`` URL, which names no Redis port; then the default one.

        >>> load({"SKEWER_REDIS_URL": "redis+sentinel://h:1/s"}).native_redis_url
        'redis://127.0.0.1:16379/0'
        """
        sentinel = urlsplit(self.redis_url).scheme == "redis+sentinel"
        return DEFAULT_REDIS_URL if sentinel else self.redis_url

    @property
    def redis_host(self) -> str:
        return urlsplit(self.native_redis_url).hostname or "127.0.0.1"

    @property
    def redis_port(self) -> int:
        return urlsplit(self.native_redis_url).port or 6379

    def redis_sentinel_address(self, node: int) -> tuple[str, int]:
        """(host, port) of native sentinel ``node`` (1..REDIS_SENTINEL_NODES)."""
        host, port = host_ports(self.redis_sentinel, ENV_REDIS_SENTINEL)[0]
        return host, port + node - 1

    @property
    def redis_sentinel_url(self) -> str:
        """The native Sentinel set as ``SKEWER_REDIS_URL`` takes it (the native Redis's
        credentials and database).

        >>> load({}).redis_sentinel_url
        'redis+sentinel://127.0.0.1:36379,127.0.0.1:36380,127.0.0.1:36381/skewer/0'
        """
        native = urlsplit(self.native_redis_url)
        nodes = range(1, REDIS_SENTINEL_NODES + 1)
        hosts = ",".join(_address(*self.redis_sentinel_address(node)) for node in nodes)
        userinfo = native.netloc.rpartition("@")[0]
        database = native.path.strip("/") or "0"
        at = f"{userinfo}@" if userinfo else ""
        return f"redis+sentinel://{at}{hosts}/{REDIS_SENTINEL_SERVICE}/{database}"

    @property
    def prometheus_host(self) -> str:
        return urlsplit(self.prometheus_url).hostname or "127.0.0.1"

    @property
    def prometheus_port(self) -> int:
        return urlsplit(self.prometheus_url).port or 9090

    @property
    def docker_socket(self) -> Path:
        """The unix socket of the Docker engine skewer starts when asked: the path of
        ``DOCKER_HOST`` if that is a ``unix://`` URL, else Docker's default socket.

        >>> load({}).docker_socket, load({"DOCKER_HOST": "unix:///tmp/d.sock"}).docker_socket
        (PosixPath('/var/run/docker.sock'), PosixPath('/tmp/d.sock'))
        >>> load({"DOCKER_HOST": "tcp://10.0.0.5:2375"}).docker_socket
        PosixPath('/var/run/docker.sock')
        """
        if self.docker_host.startswith("unix://") and len(self.docker_host) > len("unix://"):
            return Path(self.docker_host[len("unix://") :])
        return DEFAULT_DOCKER_SOCKET

    @property
    def docker_config_dir(self) -> Path:
        """``DOCKER_CONFIG`` of skewer's own ``docker`` calls: its ``cli-plugins/`` holds the
        Compose plugin installed into the cache."""
        return self.cache_dir / "docker-config"

    def environ(self) -> dict[str, str]:
        """These settings as the environment variables :func:`load` reads them from, so a child
        process (a stage of a run) sees the same services.

        >>> load(environ := load({"SKEWER_KAFKA_REPLICATION": "2"}).environ()) == load(environ)
        True
        >>> load({}).environ()["SKEWER_KAFKA_REPLICATION"]
        'auto'
        """
        replication = "auto" if self.kafka_replication is None else str(self.kafka_replication)
        return {
            ENV_KAFKA_BOOTSTRAP: self.kafka_bootstrap,
            ENV_KAFKA_CONTROLLER: self.kafka_controller,
            ENV_KAFKA_REPLICATION: replication,
            ENV_REDIS_URL: self.redis_url,
            ENV_REDIS_APPENDFSYNC: self.redis_appendfsync,
            ENV_REDIS_SENTINEL: self.redis_sentinel,
            ENV_PROMETHEUS_URL: self.prometheus_url,
            ENV_CACHE_DIR: str(self.cache_dir),
            ENV_RUN_DIR: str(self.run_dir),
            ENV_SPARK_MASTER: self.spark_master,
            ENV_SPARK_STANDALONE: self.spark_standalone,
            **self.kafka_security.environ(),
        }

    @property
    def kafka_libs_dir(self) -> Path:
        """Kafka's classpath, copied here by Maven from deploy/kafka/pom.xml."""
        return self.cache_dir / "kafka" / "libs"

    @property
    def spark_jars_dir(self) -> Path:
        """Spark's Kafka source and the runtime jars PySpark lacks (deploy/spark/pom.xml)."""
        return self.cache_dir / "spark-jars"

    @property
    def realtime_writer_jar(self) -> Path:
        """The real-time workers' writer (jvm/realtime-writer), compiled here on first use."""
        return self.cache_dir / "realtime-writer" / "skewer-realtime-writer.jar"

    @property
    def executor_warmup_jar(self) -> Path:
        """The executors' warm-up plugin (jvm/executor-warmup), compiled here on first use."""
        return self.cache_dir / "executor-warmup" / "skewer-executor-warmup.jar"

    @property
    def prometheus_targets_dir(self) -> Path:
        """Where each stage's exporter writes its file_sd target file and the native Prometheus
        looks for them."""
        return self.run_dir / "prometheus" / "targets"

    @property
    def maven_repository(self) -> Path:
        """Maven's local repository, kept in the cache so one ``rm -rf .cache`` is a cold start."""
        return self.cache_dir / "m2"


def resolve_scheme(flag: str | None, default: str, environ: Mapping[str, str] | None = None) -> str:
    """The grouping scheme in force: the ``--scheme`` flag, else ``$GROUPING_SCHEME``, else
    ``default``.

    >>> resolve_scheme(None, "key", {"GROUPING_SCHEME": " fish "}), resolve_scheme("pkg", "key", {})
    ('fish', 'pkg')
    """
    env = os.environ if environ is None else environ
    return (flag or "").strip() or env.get(SCHEME_VARIABLE, "").strip() or default


#: The workers' triggers (``skewer work --trigger``, else this variable, else micro-batch):
#: Spark's micro-batches, or Spark's Real-Time Mode (docs/design.md#real-time-mode).
ENV_TRIGGER = "SKEWER_TRIGGER"
MICRO_BATCH, REAL_TIME = "micro-batch", "real-time"
TRIGGERS = (MICRO_BATCH, REAL_TIME)


def resolve_trigger(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The workers' trigger in force: ``--trigger``, else ``$SKEWER_TRIGGER``, else
    micro-batch; a :class:`SettingsError` (one line) for anything else.

    >>> resolve_trigger(None, {"SKEWER_TRIGGER": "real-time"}), resolve_trigger(None, {})
    ('real-time', 'micro-batch')
    >>> resolve_trigger(None, {"SKEWER_TRIGGER": "fast"})
    Traceback (most recent call last):
    ...
    pipeline.io.config.SettingsError: SKEWER_TRIGGER='fast' is not one of micro-batch, real-time
    """
    env = os.environ if environ is None else environ
    if flag:
        chosen, named = flag, "--trigger"
    else:
        chosen, named = env.get(ENV_TRIGGER, "").strip() or MICRO_BATCH, ENV_TRIGGER
    if chosen not in TRIGGERS:
        raise SettingsError(f"{named}={chosen!r} is not one of {', '.join(TRIGGERS)}")
    return chosen


class SettingsError(ValueError):
    """A setting that cannot work; the message is one line naming its variable (exit 2)."""


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in force: environment variables over the defaults; a
    :class:`SettingsError` naming the variable when one cannot work.

    >>> load({"SKEWER_KAFKA_BOOTSTRAP": "kafka"})
    Traceback (most recent call last):
    ...
    pipeline.io.config.SettingsError: SKEWER_KAFKA_BOOTSTRAP='kafka' is not HOST:PORT[,HOST:PORT...]
    """
    try:
        return _load(os.environ if environ is None else environ)
    except ValueError as error:
        raise SettingsError(str(error)) from None


def _load(env: Mapping[str, str]) -> Settings:
    cache_dir = Path(env.get(ENV_CACHE_DIR, str(PROJECT_ROOT / ".cache"))).resolve()
    settings = Settings(
        kafka_bootstrap=env.get(ENV_KAFKA_BOOTSTRAP, DEFAULT_KAFKA_BOOTSTRAP),
        kafka_controller=env.get(ENV_KAFKA_CONTROLLER, DEFAULT_KAFKA_CONTROLLER),
        redis_url=env.get(ENV_REDIS_URL, DEFAULT_REDIS_URL),
        prometheus_url=env.get(ENV_PROMETHEUS_URL, DEFAULT_PROMETHEUS_URL).rstrip("/"),
        cache_dir=cache_dir,
        run_dir=Path(env.get(ENV_RUN_DIR, str(cache_dir / "run"))).resolve(),
        redis_appendfsync=env.get(ENV_REDIS_APPENDFSYNC, DEFAULT_REDIS_APPENDFSYNC),
        redis_sentinel=env.get(ENV_REDIS_SENTINEL, DEFAULT_REDIS_SENTINEL),
        spark_master=env.get(ENV_SPARK_MASTER, DEFAULT_SPARK_MASTER).strip(),
        spark_standalone=env.get(ENV_SPARK_STANDALONE, DEFAULT_SPARK_STANDALONE),
        kafka_replication=replication_setting(env.get(ENV_KAFKA_REPLICATION, "auto")),
        docker_host=env.get(ENV_DOCKER_HOST, "").strip(),
        kafka_security=kafka_security_from_environ(env),
    )
    if settings.redis_appendfsync not in REDIS_APPENDFSYNC_POLICIES:
        raise ValueError(
            f"{ENV_REDIS_APPENDFSYNC}={settings.redis_appendfsync!r} is not one of "
            f"{', '.join(REDIS_APPENDFSYNC_POLICIES)}"
        )
    # Validate the addresses now so a typo fails with the variable's name, not deep in a client.
    host_ports(settings.kafka_bootstrap, ENV_KAFKA_BOOTSTRAP)
    host_ports(settings.kafka_controller, ENV_KAFKA_CONTROLLER)
    host_ports(settings.spark_standalone, ENV_SPARK_STANDALONE)
    host_ports(settings.redis_sentinel, ENV_REDIS_SENTINEL)
    check_spark_master(settings.spark_master)
    return settings
