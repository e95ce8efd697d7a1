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
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

#: The repository: pipeline/io/ is two levels below it (the project installs editable).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = PROJECT_ROOT / "deploy"

ENV_KAFKA_BOOTSTRAP = "SKEWER_KAFKA_BOOTSTRAP"
ENV_KAFKA_CONTROLLER = "SKEWER_KAFKA_CONTROLLER"
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
#: Pid files, logs and data of running services; a second set of services (a test of the
#: service manager itself) runs beside the first by pointing this elsewhere with other ports.
ENV_RUN_DIR = "SKEWER_RUN_DIR"
#: The environment variable that names the grouping scheme (DESIGN.md: "one environment
#: variable"); every stage's ``--scheme`` falls back to it.
SCHEME_VARIABLE = "GROUPING_SCHEME"
#: "docker", "native" or "auto" (the default): which services the test fixtures use.
ENV_TEST_BACKEND = "SKEWER_TEST_BACKEND"

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
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_standalone: str = DEFAULT_SPARK_STANDALONE

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

    @property
    def spark_standalone_url(self) -> str:
        """The native standalone master's URL, as ``--spark-master`` takes it."""
        return f"spark://{self.spark_standalone}"

    @property
    def spark_standalone_port(self) -> int:
        return host_ports(self.spark_standalone, ENV_SPARK_STANDALONE)[0][1]

    @property
    def spark_standalone_host(self) -> str:
        return host_ports(self.spark_standalone, ENV_SPARK_STANDALONE)[0][0]

    @property
    def redis_host(self) -> str:
        return urlsplit(self.redis_url).hostname or "127.0.0.1"

    @property
    def redis_port(self) -> int:
        return urlsplit(self.redis_url).port or 6379

    @property
    def prometheus_host(self) -> str:
        return urlsplit(self.prometheus_url).hostname or "127.0.0.1"

    @property
    def prometheus_port(self) -> int:
        return urlsplit(self.prometheus_url).port or 9090

    @property
    def kafka_libs_dir(self) -> Path:
        """Kafka's classpath, copied here by Maven from deploy/kafka/pom.xml."""
        return self.cache_dir / "kafka" / "libs"

    @property
    def spark_jars_dir(self) -> Path:
        """Spark's Kafka source and the runtime jars PySpark lacks (deploy/spark/pom.xml)."""
        return self.cache_dir / "spark-jars"

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


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in force: environment variables over the defaults."""
    env = os.environ if environ is None else environ
    cache_dir = Path(env.get(ENV_CACHE_DIR, str(PROJECT_ROOT / ".cache"))).resolve()
    settings = Settings(
        kafka_bootstrap=env.get(ENV_KAFKA_BOOTSTRAP, DEFAULT_KAFKA_BOOTSTRAP),
        kafka_controller=env.get(ENV_KAFKA_CONTROLLER, DEFAULT_KAFKA_CONTROLLER),
        redis_url=env.get(ENV_REDIS_URL, DEFAULT_REDIS_URL),
        prometheus_url=env.get(ENV_PROMETHEUS_URL, DEFAULT_PROMETHEUS_URL).rstrip("/"),
        cache_dir=cache_dir,
        run_dir=Path(env.get(ENV_RUN_DIR, str(cache_dir / "run"))).resolve(),
        redis_appendfsync=env.get(ENV_REDIS_APPENDFSYNC, DEFAULT_REDIS_APPENDFSYNC),
        spark_master=env.get(ENV_SPARK_MASTER, DEFAULT_SPARK_MASTER).strip(),
        spark_standalone=env.get(ENV_SPARK_STANDALONE, DEFAULT_SPARK_STANDALONE),
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
    check_spark_master(settings.spark_master)
    return settings
