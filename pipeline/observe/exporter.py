"""One Prometheus exporter per stage process: its HTTP endpoint, port and target file.

Layer: observe.

:func:`start_exporter` serves prometheus-client's WSGI app on a server of its own, on
``$SKEWER_METRICS_HOST`` (default 127.0.0.1) and ``--metrics-port`` (default
``$SKEWER_METRICS_PORT``, else 0 = a free port; -1 = off), and for the native Prometheus writes
a file_sd target file ``{run_dir}/prometheus/targets/{stage}-{run}-{pid}.json``, deleted when
it closes (files of processes killed with ``kill -9`` by the next exporter). Before it stops it
waits (up to ``$SKEWER_METRICS_LINGER`` s) for one scrape by Prometheus that began after the
stage finished, so a short stage's final counts are seen. The grouping stage's sources are
child processes: prometheus-client's multiprocess mode (``multiprocess=True``), one endpoint
for all. See docs/metrics.md.

Example:
    >>> target_document("0.0.0.0", 9464, "group", "r-1")[0]["labels"]
    {'stage': 'group', 'instance': '127.0.0.1/group/r-1'}
    >>> resolve_port(None, {"SKEWER_METRICS_PORT": "-1"})
    -1
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    make_wsgi_app,
)
from prometheus_client.core import (
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer

from pipeline.io import config
from pipeline.observe.series import STAGES, RunLabels
from pipeline.services import process

if TYPE_CHECKING:
    pass

ENV_METRICS_PORT = "SKEWER_METRICS_PORT"
ENV_METRICS_HOST = "SKEWER_METRICS_HOST"
#: Seconds an exporter waits at the end for a last scrape (0: no wait).
ENV_METRICS_LINGER = "SKEWER_METRICS_LINGER"
#: prometheus-client reads this variable when it is imported (in the grouping stage's sources).
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
UNKNOWN_SCHEME = "unknown"
DEFAULT_HOST = "127.0.0.1"
#: Long enough for Prometheus to find a new file_sd target: its first scrape came 2.6-5.0 s
#: after the target file was written (native Prometheus, 1 s scrape interval, idle 2-core
#: machine; service discovery and the scrape manager both batch updates), so a producer done
#: in half a second went unscraped with 5 s on a busy machine. The wait ends at the first
#: scrape after the stage finished, so a stage Prometheus already scrapes waits ~1 s at most.
DEFAULT_LINGER_SECONDS = 10.0
#: The port every skewer service listens on inside its compose container.
COMPOSE_PORT = 9464
DISABLED_PORT = -1


class MetricsError(Exception):
    """The exporter cannot start as asked (bad port, port taken); one line for the user."""


def scheme_label(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The ``scheme`` label: the flag, else ``$GROUPING_SCHEME``, else ``unknown``."""
    return config.resolve_scheme(flag, UNKNOWN_SCHEME, environ)


PORT_RULE = "-1 (off), 0 (a free port) or 1..65535"


def _port(text: str) -> int | None:
    """``text`` as an exporter port, None if it is none."""
    try:
        port = int(text)
    except ValueError:
        return None
    return port if DISABLED_PORT <= port <= 65535 else None


def port_number(text: str) -> int:
    """argparse type of ``--metrics-port``: a bad value is a usage error at once."""
    import argparse

    port = _port(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"must be {PORT_RULE}, got {text!r}")
    return port


def resolve_port(flag: int | None, environ: Mapping[str, str] | None = None) -> int:
    """The exporter port: the flag, else ``$SKEWER_METRICS_PORT``, else 0; -1 means off."""
    if flag is not None:
        if _port(str(flag)) is None:
            raise MetricsError(f"--metrics-port must be {PORT_RULE}, got {flag}")
        return flag
    env = os.environ if environ is None else environ
    text = env.get(ENV_METRICS_PORT, "").strip()
    if not text:
        return 0
    port = _port(text)
    if port is None:
        raise MetricsError(f"{ENV_METRICS_PORT} must be {PORT_RULE}, got {text!r}")
    return port


def linger_seconds(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    text = env.get(ENV_METRICS_LINGER, "").strip()
    try:
        return max(0.0, float(text)) if text else DEFAULT_LINGER_SECONDS
    except ValueError:
        raise MetricsError(f"{ENV_METRICS_LINGER}={text!r} is not a number of seconds") from None


def target_document(host: str, port: int, stage: str, run_id: str) -> list[dict[str, Any]]:
    """The file_sd content of one exporter: where Prometheus scrapes it, its stage, and an
    ``instance`` that names the stage of the run on its host rather than its port: a stage
    started again (after a crash) serves on another free port, and with the port as instance
    every restart would begin new series, which Prometheus keeps in memory until its head
    block is compacted (hours) and which break every panel's lines at the restart."""
    scrape_host = DEFAULT_HOST if host in ("", "0.0.0.0", "::") else host
    if ":" in scrape_host:  # an IPv6 address
        scrape_host = f"[{scrape_host}]"
    labels = {"stage": stage, "instance": f"{scrape_host}/{stage}/{run_id}"}
    return [{"targets": [f"{scrape_host}:{port}"], "labels": labels}]


def target_path(targets_dir: Path, stage: str, run_id: str, pid: int) -> Path:
    return targets_dir / f"{stage}-{run_id}-{pid}.json"


_TARGET_PID = re.compile(r"-(\d+)\.json$")


def remove_stale_targets(targets_dir: Path) -> list[Path]:
    """Delete target files of processes that no longer run (a stage killed with -9)."""
    removed = []
    for path in targets_dir.glob("*.json"):
        match = _TARGET_PID.search(path.name)
        if match and not process.process_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class _PrometheusScrapes:
    """When the latest complete scrape *by Prometheus* began (its User-Agent says so; a test or
    a curl reading the endpoint does not count)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.count = 0
        self._latest_began = -math.inf

    def note(self, began: float) -> None:
        with self._condition:
            self.count += 1
            self._latest_began = max(self._latest_began, began)
            self._condition.notify_all()

    def wait_for_one_after(self, moment: float, timeout: float) -> bool:
        """Until a scrape that began at or after ``moment`` has read everything."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._latest_began < moment:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._condition.wait(remaining)
        return True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        """No line per scrape on the stage's stderr."""


def _serve(host: str, port: int, registry: CollectorRegistry, scrapes: _PrometheusScrapes) -> Any:
    """prometheus-client's WSGI app on a thread-per-request server (as its
    ``start_http_server``), noting each Prometheus scrape once its response is ready."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    metrics_app = make_wsgi_app(registry)

    class Server(ThreadingWSGIServer):
        address_family = family[0][0]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        began = time.monotonic()
        body = metrics_app(environ, start_response)
        if str(environ.get("HTTP_USER_AGENT", "")).startswith("Prometheus/"):
            scrapes.note(began)
        return body  # type: ignore[no-any-return]

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="skewer-metrics", daemon=True).start()
    return server


class _Delegate:
    """Serves another registry (the process's default one) inside a served registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


class Exporter:
    """One stage process's metrics endpoint (see :func:`start_exporter`); a context manager."""

    def __init__(
        self,
        stage: str,
        labels: RunLabels,
        *,
        settings: config.Settings,
        server: Any = None,
        host: str = DEFAULT_HOST,
        registry: CollectorRegistry | None = None,
        scrapes: _PrometheusScrapes | None = None,
        multiprocess_dir: Path | None = None,
    ) -> None:
        self.stage = stage
        self.labels = labels
        self.settings = settings
        self.server = server
        self.host = host
        self.registry = registry or CollectorRegistry()
        self.scrapes = scrapes or _PrometheusScrapes()
        self.multiprocess_dir = multiprocess_dir
        self.target_path: Path | None = None
        self._collectors: list[Any] = []
        self._closed = False
        # Reentrant: the SIGTERM handler may interrupt a close() of the same thread.
        self._close_lock = threading.RLock()

    @property
    def enabled(self) -> bool:
        return self.server is not None

    @property
    def port(self) -> int | None:
        return int(self.server.server_port) if self.server is not None else None

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        document = target_document(self.host, self.port or 0, self.stage, self.labels.run)
        return f"http://{document[0]['targets'][0]}"

    def register(self, collector: Any) -> None:
        """Serve ``collector`` too (closed with the exporter, if it has ``close``)."""
        self._collectors.append(collector)
        if self.enabled:
            self.registry.register(collector)

    def write_target(self) -> Path:
        """The file_sd target file, written atomically; stale ones of dead processes go."""
        directory = self.settings.prometheus_targets_dir
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_targets(directory)
        path = target_path(directory, self.stage, self.labels.run, os.getpid())
        temporary = directory / f".{path.name}.tmp"
        document = target_document(self.host, self.port or 0, self.stage, self.labels.run)
        temporary.write_text(json.dumps(document) + "\n")
        temporary.replace(path)
        self.target_path = path
        return path

    def close(self, linger: float | None = None) -> None:
        """Stop serving, after one last scrape (see the module docstring); idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.server is not None:
                wait = linger_seconds() if linger is None else linger
                watched = wait > 0 and (self.scrapes.count > 0 or self._prometheus_is_up())
                if watched and self.scrapes.wait_for_one_after(time.monotonic(), wait):
                    time.sleep(0.1)  # the scrape's response is still being written
        finally:
            if self.target_path is not None:
                self.target_path.unlink(missing_ok=True)
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()
            for collector in self._collectors:
                closer = getattr(collector, "close", None)
                if closer is not None:
                    with contextlib.suppress(Exception):
                        closer()
            if self.multiprocess_dir is not None:
                if os.environ.get(MULTIPROC_VARIABLE) == str(self.multiprocess_dir):
                    del os.environ[MULTIPROC_VARIABLE]
                shutil.rmtree(self.multiprocess_dir, ignore_errors=True)

    def _prometheus_is_up(self) -> bool:
        from pipeline.io.probes import prometheus_answers

        return prometheus_answers(self.settings.prometheus_url, timeout=0.5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def start_exporter(
    stage: str,
    run_id: str,
    scheme: str,
    port: int | None = None,
    *,
    multiprocess: bool = False,
    settings: config.Settings | None = None,
) -> Exporter:
    """Serve this process's metrics for ``stage`` of run ``run_id`` (see the module docstring).

    ``port`` None reads ``$SKEWER_METRICS_PORT`` (else 0, a free port); -1 returns a disabled
    exporter (nothing served, nothing written; its methods still work). ``multiprocess``: the
    metrics are recorded by child processes started after this call (the grouping stage's
    sources). Raises :class:`MetricsError` for a bad or busy port.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    labels = RunLabels(run_id, scheme)
    settings = settings or config.load()
    port = resolve_port(port)
    if port == DISABLED_PORT:
        return Exporter(stage, labels, settings=settings)
    host = os.environ.get(ENV_METRICS_HOST, "").strip() or DEFAULT_HOST
    registry = CollectorRegistry()
    scrapes = _PrometheusScrapes()
    directory = None
    if multiprocess:
        from prometheus_client.multiprocess import MultiProcessCollector

        directory = Path(tempfile.mkdtemp(prefix=f"skewer-metrics-{stage}-"))
        os.environ[MULTIPROC_VARIABLE] = str(directory)
        MultiProcessCollector(registry, path=str(directory))
    else:
        registry.register(_Delegate(REGISTRY))  # type: ignore[arg-type]
    try:
        server = _serve(host, port, registry, scrapes)
    except OSError as error:
        if directory is not None:
            del os.environ[MULTIPROC_VARIABLE]
            shutil.rmtree(directory, ignore_errors=True)
        raise MetricsError(
            f"cannot serve metrics on {host}:{port}: {error.strerror or error}"
        ) from None
    exporter = Exporter(
        stage,
        labels,
        settings=settings,
        server=server,
        host=host,
        registry=registry,
        scrapes=scrapes,
        multiprocess_dir=directory,
    )
    try:
        exporter.write_target()
    except OSError as error:
        exporter.close(linger=0)
        raise MetricsError(f"cannot write the Prometheus target file: {error}") from None
    atexit.register(exporter.close, 0.0)
    _close_on_sigterm(exporter)
    return exporter


def _close_on_sigterm(exporter: Exporter) -> None:
    """A stage without a SIGTERM handler of its own dies at SIGTERM without running atexit:
    close the exporter (target file, multiprocess folder) first, then die the same way."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the stage handles SIGTERM and leaves through its finally blocks

    def close_and_die(signum: int, _frame: Any) -> None:
        exporter.close(linger=0)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, close_and_die)
