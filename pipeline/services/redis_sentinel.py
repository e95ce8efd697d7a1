"""Redis with failover as local processes: 2 replicas of the native Redis and 3 sentinels.
(layer: services)

``skewer services up --redis-sentinel`` runs, beside the native Redis (the primary), two
replicas (``replicaof`` it, on its port plus 1 and 2) and three sentinels
(``redis-server --sentinel``, on ``SKEWER_REDIS_SENTINEL``'s port plus 0-2) watching service
``skewer`` with quorum 2, all on 127.0.0.1. Two replicas, since a primary left without one would
block every ``WAIT`` of the workers' applies; clients reach the promoted replica through
``Settings.redis_sentinel_url`` (docs/design.md#redis-pitfalls). Each sentinel's configuration
names every member when it starts (:meth:`RedisSentinelService.prepare`).

Example (no process is started):
    >>> from pipeline.io import config
    >>> settings = config.load({"SKEWER_CACHE_DIR": "/tmp/skewer-doc"})
    >>> [service.name for service in services(settings)]  # doctest: +NORMALIZE_WHITESPACE
    ['redis-replica-1', 'redis-replica-2', 'redis-sentinel-1', 'redis-sentinel-2',
     'redis-sentinel-3']
    >>> replica = RedisReplicaService(settings, 2)
    >>> replica.address, replica.command()[-3:]
    ('redis://127.0.0.1:16381/0', ['--replicaof', '127.0.0.1', '16379'])
    >>> RedisSentinelService(settings, 3).address
    '127.0.0.1:36381'
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.io import config, redis_client
from pipeline.io.config import Settings
from pipeline.io.probes import redis_replica_synced
from pipeline.services.native import NativeService
from pipeline.services.redis_server import RedisService

REPLICAS = 2
#: A primary that does not answer this long is down for a sentinel (quorum 2 of 3 agree).
#: Not shorter: a replica just promoted, on a busy machine, can miss a second of pings, and a
#: second failover then promotes another replica while clients still write to the first,
#: whose writes (acknowledged by a replica of its own) are dropped when it is demoted.
DOWN_AFTER_MS = 5_000
#: How long a failover may take before Sentinel tries another replica.
FAILOVER_TIMEOUT_MS = 5_000
QUORUM = 2


def replica_name(index: int) -> str:
    return f"redis-replica-{index}"


def sentinel_name(index: int) -> str:
    return f"redis-sentinel-{index}"


#: Every service of the set besides the primary, in start order.
NAMES = (
    *(replica_name(i) for i in range(1, REPLICAS + 1)),
    *(sentinel_name(i) for i in range(1, config.REDIS_SENTINEL_NODES + 1)),
)


class RedisReplicaService(RedisService):
    """Replica ``index`` (1, 2) of the native Redis, durable like it (append-only file)."""

    #: Its own files, then the primary's copy, which a restarted replica (its replication
    #: history lost with the process) takes whole and loads before its link is up: about as
    #: large as its own.
    loads = 2

    def __init__(self, settings: Settings, index: int) -> None:
        super().__init__(settings)
        self.index = index
        self.name = replica_name(index)

    @property
    def port(self) -> int:
        return self.settings.redis_port + self.index

    @property
    def address(self) -> str:
        own = urlsplit(self.settings.native_redis_url)
        netloc = own.netloc.rpartition(":")[0] + f":{self.port}"
        return own._replace(netloc=netloc).geturl()

    def command(self) -> list[str]:
        primary = [self.settings.redis_host, str(self.settings.redis_port)]
        return [*super().command(), "--replicaof", *primary]

    def healthy(self, timeout: float = 2.0) -> bool:
        """It answers, and holds the primary's data: its link to the primary is up (or
        Sentinel promoted it), so an apply's ``WAIT`` does not wait for its first sync."""
        return redis_replica_synced(self.address, timeout)


def _sentinel_id(host: str, port: int) -> str:
    """A sentinel's fixed id (40 hex digits), so the others' configurations can name it."""
    return hashlib.sha1(f"skewer-sentinel {host}:{port}".encode()).hexdigest()


class RedisSentinelService(NativeService):
    """Sentinel ``index`` (1..3), monitoring the native Redis as service ``skewer``."""

    start_timeout = 20.0

    def __init__(self, settings: Settings, index: int) -> None:
        super().__init__(settings)
        self.index = index
        self.name = sentinel_name(index)
        self.host, self.port = settings.redis_sentinel_address(index)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "sentinel.conf"

    def install(self) -> None:
        self._require_binary("redis-server")

    def prepare(self) -> None:
        """Write the configuration afresh: the primary, and the other replicas and sentinels as
        known (fixed ids), so a set started together knows its members at once instead of
        discovering them over ~10 s. Sentinel rewrites the file while it runs; one restarted
        alone learns the current primary from the others (its configuration epoch is behind)."""
        super().prepare()
        service = config.REDIS_SENTINEL_SERVICE
        primary = f"{self.settings.redis_host} {self.settings.redis_port}"
        lines = [
            f"port {self.port}",
            f"bind {self.host}",
            "daemonize no",
            'logfile ""',
            f"dir {self.data_dir}",
            f"sentinel myid {_sentinel_id(self.host, self.port)}",
            f"sentinel monitor {service} {primary} {QUORUM}",
            f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {service} {REPLICAS}",
        ]
        for index in range(1, REPLICAS + 1):
            replica = f"{self.settings.redis_host} {RedisReplicaService(self.settings, index).port}"
            lines.append(f"sentinel known-replica {service} {replica}")
        for index in range(1, config.REDIS_SENTINEL_NODES + 1):
            if index != self.index:
                host, port = self.settings.redis_sentinel_address(index)
                known = f"{host} {port} {_sentinel_id(host, port)}"
                lines.append(f"sentinel known-sentinel {service} {known}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return ["redis-server", str(self.config_path), "--sentinel"]

    def healthy(self, timeout: float = 2.0) -> bool:
        """It answers and names a primary that is up."""
        url = f"redis+sentinel://{self.address}/{config.REDIS_SENTINEL_SERVICE}"
        try:
            redis_client.require_primary(url, timeout)
        except (redis_client.NoPrimaryError, redis_client.NoSentinelAnswersError):
            return False
        return True


def services(settings: Settings, names: tuple[str, ...] = NAMES) -> list[NativeService]:
    """The services of the set called ``names`` (:data:`NAMES`), in start order."""
    made: list[NativeService] = []
    for name in names:
        kind, _, index = name.rpartition("-")
        if kind == "redis-replica":
            made.append(RedisReplicaService(settings, int(index)))
        elif kind == "redis-sentinel":
            made.append(RedisSentinelService(settings, int(index)))
        else:
            raise ValueError(f"{name!r} is not a service of the Redis Sentinel set")
    return made
