"""What a native service is: how to install, configure, start and probe one local process.

Each service (:mod:`~pipeline.services.kafka_broker`, :mod:`~pipeline.services.redis_server`,
:mod:`~pipeline.services.prometheus_server`, :mod:`~pipeline.services.docker_engine`, ...)
subclasses :class:`NativeService`;
:mod:`~pipeline.services.manager` starts and stops them. Every process listens on 127.0.0.1
only (ports in :mod:`pipeline.io.config`), with its data and log under ``.cache/run``.
(layer: services)
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path

from pipeline.io import config
from pipeline.io.config import Settings
from pipeline.services.process import PidRecord


def last_log_line(path: Path) -> str:
    """The last non-blank line of the log at ``path`` ("" if none, or no log): where a
    process that stopped usually says why."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line), "")


class ServiceError(Exception):
    """A service could not be installed, started or stopped; the message is one line."""


class NativeService(ABC):
    """One service run as a local process: how to install, configure, start and probe it."""

    name: str
    #: Seconds to wait for the first healthy answer after starting (a cold JVM is the slowest).
    start_timeout: float = 30.0
    #: Seconds ``down`` gives the process to exit after SIGTERM before SIGKILL.
    stop_timeout: float = 10.0

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

    def environment(self) -> dict[str, str] | None:
        """The process's environment (None: this process's own)."""
        return None

    @abstractmethod
    def healthy(self, timeout: float = 2.0) -> bool:
        """True when the service answers its health check."""

    def start_failure(self, why: str) -> ServiceError:
        """The one line that says this service did not come up: why, its log, and the log's
        last line (where a JVM or redis-server says what stopped it)."""
        last_line = last_log_line(self.log_path)[:300]
        said = f"; its log ends: {last_line}" if last_line else ""
        return ServiceError(f"{self.name} failed to start ({why}); see {self.log_path}{said}")

    def after_stop(self) -> None:
        """Remove what the stopped process of ours left behind (children that outlived it,
        network rules). Most services leave nothing."""
        return None

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
