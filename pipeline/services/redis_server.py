"""Debian's redis-server as a local process, durable with its append-only file. (layer: services)

The window state in Redis holds counts Spark has already committed: a Redis that lost them
would break exactness for good. So the append-only file is on (``appendonly yes``) under the
service's data folder, which outlives a restart, and every write is in it before Redis replies
(Redis writes the file before answering its clients): a kill -9 of the process loses nothing.
What a crash of the *machine* may lose is the ``appendfsync`` policy's to say
(``SKEWER_REDIS_APPENDFSYNC``): ``always`` (nothing; the slowest), ``everysec`` (the default:
at most the last second), ``no`` (whatever the OS has not flushed, usually up to 30 s). Script
effects are logged (one apply is ~14 KB of AOF), so the file is rewritten once it doubled past
64 MB. Healthy when it answers PING. A restarted node reads its append-only files before it
answers, so its start may take as long as they are large (:attr:`RedisService.start_timeout`).
"""

from __future__ import annotations

from pipeline.io.probes import redis_answers
from pipeline.services.native import NativeService

#: Seconds to start a node that holds nothing.
START_SECONDS = 20.0
#: Seconds per MB of append-only files to load them: about twice what a restarted node took on
#: the two-core machine under the soak's load (``skewer bench soak``).
LOAD_SECONDS_PER_MB = 0.4


class RedisService(NativeService):
    """Debian's redis-server with its append-only file (no RDB snapshots)."""

    name = "redis"
    #: Copies of its data it loads before it is healthy: its own append-only files.
    loads = 1

    @property
    def start_timeout(self) -> float:  # type: ignore[override]
        """:data:`START_SECONDS`, plus :data:`LOAD_SECONDS_PER_MB` for each MB it loads before
        it is healthy: its append-only files, times :attr:`loads`.

        >>> from pipeline.io import config
        >>> RedisService(config.load({"SKEWER_RUN_DIR": "/nonexistent"})).start_timeout
        20.0
        """
        aof = self.data_dir / "appendonlydir"
        held = sum(f.stat().st_size for f in aof.iterdir()) if aof.is_dir() else 0
        return START_SECONDS + self.loads * LOAD_SECONDS_PER_MB * held / 1e6

    @property
    def port(self) -> int:
        return self.settings.redis_port

    @property
    def address(self) -> str:
        """Its own URL (``redis_url``, unless that names a Sentinel set)."""
        return self.settings.native_redis_url

    def install(self) -> None:
        self._require_binary("redis-server")

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind",
            self.settings.redis_host,
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.settings.redis_appendfsync,
            "--auto-aof-rewrite-percentage",
            "100",
            "--auto-aof-rewrite-min-size",
            "64mb",
            # A replica (pipeline.services.redis_sentinel) syncs at once, not after 5 s.
            "--repl-diskless-sync-delay",
            "0",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            # An empty log file name means standard output, which goes to redis.log.
            "--logfile",
            "",
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return redis_answers(self.address, timeout)
