"""Spark's standalone cluster manager as local processes: one master, N workers. (layer: services)

``skewer services up --spark-workers N`` runs them from the pip package's own launcher
(``pyspark/bin/spark-class``; the package has no ``sbin`` scripts), so the cluster runs the
very Spark the driver links: ``org.apache.spark.deploy.master.Master`` on
``settings.spark_standalone`` (``spark://127.0.0.1:17077`` by default, its web UI on the next
port) and ``...deploy.worker.Worker`` i on a web UI port after that, each offering C cores and
M of memory to executors. Everything binds to a loopback address (``SPARK_LOCAL_IP``: without
it the UI listens on every interface and Spark advertises the machine's external address):
the master to 127.0.0.1, worker i and its executors to 127.0.0.i (:func:`worker_host`), and a
worker deletes the folders of finished applications (``spark.worker.cleanup.enabled``: every
executor fetches the driver's jars into one). The master and the workers have a fixed heap of
:data:`DAEMON_HEAP`, touched at start. The master is healthy when its UI says ALIVE; a
worker when its own UI answers and the master lists it ALIVE.

Example (no process is started):
    >>> from pipeline.io import config
    >>> settings = config.load({"SKEWER_CACHE_DIR": "/tmp/skewer-doc"})
    >>> worker = SparkWorkerService(settings, 2, cores=4)
    >>> worker.name, worker.web_url
    ('spark-worker-2', 'http://127.0.0.2:17080')
    >>> worker.command()[1:4]
    ['org.apache.spark.deploy.worker.Worker', 'spark://127.0.0.1:17077', '--host']
    >>> worker.environment()["SPARK_DAEMON_MEMORY"], worker.environment()["SPARK_DAEMON_JAVA_OPTS"]
    ('256m', '-Xms256m -XX:+AlwaysPreTouch')
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.io.config import Settings
from pipeline.io.probes import spark_status
from pipeline.io.spark_session import fixed_heap_options
from pipeline.services.native import NativeService, ServiceError

#: What one worker offers by default: room for an executor of each of two runs of W = 4 with
#: their spare cores (or of the demo's W = 8), four executors of 1 GiB each (~520 MiB are
#: resident with their Python workers). A run in micro-batches asks for twice its tasks' cores
#: (:func:`pipeline.io.spark_session.executor_request`): when a worker is lost, the other
#: already has a core for every task, and the lost executors start again on the worker that
#: comes back, where speculation can copy their slow first tasks to the warm ones.
DEFAULT_WORKER_CORES = 8
DEFAULT_WORKER_MEMORY = "4g"
#: The master's and each worker's own heap (``SPARK_DAEMON_MEMORY``, Spark's default 1 GiB):
#: they only keep the cluster's bookkeeping. Fixed and touched at start, like the executors',
#: so a daemon's memory is what it will be and one whose RSS grows has a leak to look for.
DAEMON_HEAP = "256m"
MASTER_NAME = "spark-master"
WORKER_NAME = re.compile(r"^spark-worker-([1-9]\d*)$")


def worker_name(index: int) -> str:
    """The service name of worker ``index`` (1, 2, ...), as :data:`WORKER_NAME` reads it."""
    return f"spark-worker-{index}"


def worker_host(settings: Settings, index: int) -> str:
    """Where worker ``index`` and its executors bind: a loopback address of its own,
    127.0.0.``index``, when the master's is 127.0.0.1 or ``localhost`` (Linux answers on all of
    127/8), else the master's host.

    Each worker is then a host of its own to Spark, as on separate machines: Spark runs a
    speculative copy of a slow task only on a host where no attempt of it ran
    (docs/design.md#spark-pitfalls), so on one address a stalled executor's tasks would have
    no second chance.

    >>> from pipeline.io import config
    >>> [worker_host(config.load({}), i) for i in (1, 2)]
    ['127.0.0.1', '127.0.0.2']
    >>> worker_host(config.load({"SKEWER_SPARK_STANDALONE": "10.0.0.5:7077"}), 2)
    '10.0.0.5'
    """
    host = settings.spark_standalone_host
    return f"127.0.0.{index}" if host in ("127.0.0.1", "localhost") else host


def spark_home() -> Path:
    """The pip package's Spark distribution (its ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _SparkDaemon(NativeService):
    # A daemon started again while the machine is busy (its cores taken by the executors
    # making up for a lost worker) has taken more than a minute to register.
    start_timeout = 120.0

    @property
    def master_web_port(self) -> int:
        return self.settings.spark_standalone_web_port

    @property
    def host(self) -> str:
        """The address this daemon binds to and advertises."""
        return self.settings.spark_standalone_host

    @property
    def master_web_url(self) -> str:
        return self.settings.spark_standalone_web_url

    def install(self) -> None:
        self._require_binary("java")
        if not (spark_home() / "bin" / "spark-class").exists():
            raise ServiceError(f"{self.name}: pyspark has no bin/spark-class; reinstall pyspark")

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.data_dir),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_DAEMON_MEMORY": DAEMON_HEAP,
            "SPARK_DAEMON_JAVA_OPTS": " ".join(fixed_heap_options(DAEMON_HEAP)),
        }

    def _spark_class(self, main: str, *arguments: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main, *arguments]


class SparkMasterService(_SparkDaemon):
    """The standalone master (``spark://`` + ``settings.spark_standalone``)."""

    name = MASTER_NAME

    @property
    def address(self) -> str:
        return self.settings.spark_standalone_url

    def command(self) -> list[str]:
        return self._spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            self.settings.spark_standalone_host,
            "--port",
            str(self.settings.spark_standalone_port),
            "--webui-port",
            str(self.master_web_port),
        )

    def healthy(self, timeout: float = 2.0) -> bool:
        status = spark_status(self.master_web_url, timeout)
        return status is not None and status.get("status") == "ALIVE"


class SparkWorkerService(_SparkDaemon):
    """Standalone worker ``index`` (1, 2, ...), registered with the master."""

    def __init__(
        self,
        settings: Settings,
        index: int,
        *,
        cores: int = DEFAULT_WORKER_CORES,
        memory: str = DEFAULT_WORKER_MEMORY,
    ) -> None:
        super().__init__(settings)
        self.index = index
        self.cores = cores
        self.memory = memory
        self.name = worker_name(index)

    @property
    def web_port(self) -> int:
        return self.master_web_port + self.index

    @property
    def host(self) -> str:
        return worker_host(self.settings, self.index)

    @property
    def web_url(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    @property
    def address(self) -> str:
        return self.web_url

    def environment(self) -> dict[str, str]:
        return {
            **super().environment(),
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true "
            "-Dspark.worker.cleanup.interval=300 -Dspark.worker.cleanup.appDataTtl=3600",
        }

    def command(self) -> list[str]:
        return self._spark_class(
            "org.apache.spark.deploy.worker.Worker",
            self.settings.spark_standalone_url,
            "--host",
            self.host,
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(self.data_dir / "work"),
            "--webui-port",
            str(self.web_port),
        )

    def healthy(self, timeout: float = 2.0) -> bool:
        # Its own UI too: the master lists a killed worker as ALIVE for a minute.
        status = spark_status(self.master_web_url, timeout)
        if status is None or spark_status(self.web_url, timeout) is None:
            return False
        return any(
            worker.get("state") == "ALIVE" and worker.get("webuiaddress") == self.web_url
            for worker in status.get("workers", [])
        )


def active_applications(settings: Settings, timeout: float = 10.0) -> list[dict[str, object]]:
    """The applications the native master runs now (its web UI's ``activeapps``); none when
    it does not answer within ``timeout`` seconds."""
    status = spark_status(SparkMasterService(settings).master_web_url, timeout)
    return list(status["activeapps"]) if status is not None else []


def executor_pids(settings: Settings, run_ids: list[str], host: str | None = None) -> list[int]:
    """The pids of the executor JVMs on this machine of the Spark applications of runs
    ``run_ids`` (``RunNames.work_query``, by the application ids the master gives them):
    another application on the cluster may have executors too. With ``host``, only those of
    the worker whose host is ``host``."""
    from pipeline.io.kafka_io import RunNames

    names = {RunNames(run).work_query for run in run_ids}
    ids = {
        f"--app-id\0{a['id']}\0".encode()
        for a in active_applications(settings)
        if a["name"] in names
    }
    if not ids:
        return []
    on_host = b"" if host is None else f"--hostname\0{host}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (
                b"CoarseGrainedExecutorBackend" in command
                and any(i in command for i in ids)
                and on_host in command
            ):
                pids.append(int(entry.name))
    return pids
