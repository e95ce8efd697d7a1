"""Debian's redis-server as a local process, in memory only. (layer: services)

Healthy when it answers PING.
"""

from __future__ import annotations

from pipeline.io.probes import redis_answers
from pipeline.services.native import NativeService


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
