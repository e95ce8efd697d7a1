"""The one way skewer builds a SparkSession: Kafka source on the classpath, quiet, local or not.

Layer: io.

Spark's Kafka source is Apache's ``spark-sql-kafka-0-10_2.13`` at exactly PySpark's version,
fetched once by Maven into ``.cache/spark-jars`` (:func:`pipeline.io.artifacts.ensure_spark_jars`)
and handed to Spark as ``spark.jars`` files: no ``--packages``, no Ivy, nothing downloaded when
a session starts, so it works offline after the first install.

The Kafka source makes one input partition per topic partition (as long as ``minPartitions`` is
not set), so each Spark task reads exactly one partition of topic ``work``: partition w IS
worker w (docs/design.md#spark-pitfalls).

The master is any Spark takes (``local[...]``, ``spark://``, ``k8s://``, ``yarn``). On a
cluster the driver stays in the ``skewer`` process (PySpark has no cluster deploy mode on
standalone), the executors run the Python named by ``PYSPARK_PYTHON`` (default: the driver's
own interpreter, so the same path must hold Python with skewer installed on every node), and
the jars above are served by the driver. The driver binds to 127.0.0.1 when every executor is
on this machine (a local master, or a ``spark://`` master on a loopback address); otherwise
Spark's own choice holds, which ``SPARK_LOCAL_IP`` or ``spark.driver.host`` in
``$SPARK_CONF_DIR/spark-defaults.conf`` override.

The driver's JVM maps a worker stage's classes from a class-data-sharing archive built for this
JDK and these jars (:func:`class_archive_path`; docs/performance.md#start-up).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pipeline.io import config
from pipeline.io.artifacts import ensure_spark_jars
from pipeline.io.probes import accepts_connections, spark_status

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: log4j2 configuration of the driver JVM: warnings and errors only, on standard error.
LOG4J2_CONFIG = config.DEPLOY_DIR / "spark" / "log4j2.properties"

#: ``off``: start the driver without the class archive (the start-up benchmark measures both);
#: ``dump:PATH``: the archive's training run, whose JVM writes the classes it loaded to PATH
#: when it exits.
CLASS_ARCHIVE_ENV = "SKEWER_SPARK_CLASS_ARCHIVE"
#: A stale or foreign archive is ignored by the JVM; these keep it from saying so on stderr.
_QUIET_ARCHIVE = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")

#: How the driver JVM compiles (``skewer work --jit``): ``peak`` is HotSpot's default tiered
#: compilation (C1, then C2 for hot code); ``quick`` stops at C1, whose code is ready within a
#: second of traffic but runs the Kafka read and the Arrow hand-over at about half C2's peak
#: rate (docs/performance.md#start-up).
JIT_MODES = ("peak", "quick")
_JIT_OPTIONS = {"peak": (), "quick": ("-XX:TieredStopAtLevel=1",)}


#: Seconds a new session on a cluster may take until its executors offer the cores it needs,
#: and how long the cores offered may stay the same, once some executor registered, before
#: the session is taken to have all it will get (a cluster manager launches its executors
#: together at an application's start) -- unless the master says its live workers have the
#: cores: then an executor still starting, or an earlier application still letting go of its
#: cores, is waited for until the first limit.
EXECUTOR_WAIT_SECONDS = 90.0
EXECUTOR_SETTLE_SECONDS = 15.0


class SparkClusterError(Exception):
    """The Spark master does not answer, or its executors are too few; one line."""


Answer = TypeVar("Answer")


def ask_the_driver(read: Callable[[], Answer]) -> Answer:
    """``read()``, a question to the driver's JVM, asked once more on a new connection when
    py4j lost the one it asked on before the answer came.

    py4j resends a command only when it could not send it, because it cannot know whether the
    JVM ran one it did send. A question that changes nothing (a query's state, its error, its
    progress) is safe to ask twice, and a long-running job should not end because one of its
    connections to a live JVM broke. An error the JVM raised, or a second loss, is raised.
    """
    from py4j.protocol import Py4JError, Py4JJavaError

    try:
        return read()
    except Py4JJavaError:
        raise
    except Py4JError:
        return read()


def is_local(master: str) -> bool:
    """Whether ``master`` runs every task in the driver's JVM (``local``, ``local[...]``)."""
    return master == "local" or master.startswith("local[")


def _on_this_machine(master: str) -> bool:
    addresses = config.spark_master_addresses(master)
    return is_local(master) or (
        bool(addresses) and all(host in ("127.0.0.1", "localhost", "::1") for host, _ in addresses)
    )


def require_master_answers(master: str, timeout: float = 5.0) -> None:
    """Raise :class:`SparkClusterError` unless some master of a ``spark://`` URL accepts a
    connection: without this a driver retries an absent master for a minute. Other masters
    (local, ``k8s://``, ``yarn``) are Spark's to check."""
    addresses = config.spark_master_addresses(master)
    if addresses and not any(
        accepts_connections(f"{host}:{port}", timeout) for host, port in addresses
    ):
        raise SparkClusterError(f"the Spark master {master} does not answer")


def executor_cores(spark: SparkSession) -> int:
    """The cores the session's executors offer now (a cluster master; 0 before any registered)."""
    backend = spark.sparkContext._jsc.sc().schedulerBackend()  # type: ignore[union-attr]
    return int(backend.totalCoreCount())


def alive_worker_cores(master_web_url: str, timeout: float = 2.0) -> int | None:
    """The cores of a standalone master's live workers, from its web UI's ``/json/``; None
    when it does not answer."""
    status = spark_status(master_web_url, timeout)
    if status is None:
        return None
    workers = status.get("workers", [])
    return sum(int(w.get("cores", 0)) for w in workers if w.get("state") == "ALIVE")


def require_executor_cores(
    spark: SparkSession,
    needed: int,
    *,
    master_web_url: str | None = None,
    timeout: float = EXECUTOR_WAIT_SECONDS,
    settle: float = EXECUTOR_SETTLE_SECONDS,
) -> int:
    """Wait until a cluster session's executors offer ``needed`` cores and return how many they
    offer; raise :class:`SparkClusterError` if they do not within ``timeout`` seconds, or if
    some offer cores but their number stayed the same for ``settle`` seconds while the master
    (its web UI at ``master_web_url``, when known) does not have ``needed`` cores on live
    workers. A local session passes at once (its slots are threads)."""
    master = spark.sparkContext.master
    if is_local(master):
        return needed
    started = time.monotonic()
    last_cores, last_change = 0, started
    while (cores := executor_cores(spark)) < needed:
        now = time.monotonic()
        if cores != last_cores:
            last_cores, last_change = cores, now
        settled = cores > 0 and now - last_change > settle
        alive = alive_worker_cores(master_web_url) if settled and master_web_url else None
        if now - started > timeout or (settled and (alive is None or alive < needed)):
            on_workers = "" if alive is None else f" (its live workers have {alive} in all)"
            raise SparkClusterError(
                f"the Spark cluster at {master} offers {cores} executor core(s){on_workers}, "
                f"fewer than the {needed} tasks of a micro-batch, which must all run at once: "
                "add workers or cores, or pass --tasks"
            )
        time.sleep(0.2)
    return cores


def kafka_source_jars(settings: config.Settings | None = None) -> list[Path]:
    """The jar files Spark needs for ``format("kafka")``, fetched on first use."""
    return ensure_spark_jars(settings)


def build_spark_session(
    app_name: str = "skewer",
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    settings: config.Settings | None = None,
    extra_conf: dict[str, str] | None = None,
    jit: str = "peak",
    extra_jars: Sequence[Path] = (),
    driver_heap: str | None = None,
) -> SparkSession:
    """A SparkSession on ``master`` that can read and write Kafka, its driver JVM compiling as
    ``jit`` says (:data:`JIT_MODES`; on a local master the driver runs the tasks too).
    ``driver_heap`` (``"1g"``) fixes the driver's heap at that size, touched at start: its
    memory is then what it will be, and an RSS that grows has a leak to look for.

    ``shuffle_partitions`` is small because the default (200) makes every aggregation of a
    small job schedule 200 tasks. The driver binds to 127.0.0.1 like every other service when
    all executors are on this machine (module docstring).
    """
    executor_python()  # sets PYSPARK_PYTHON: PySpark's own default is "python3", not this venv
    loopback = _on_this_machine(master)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    jars = ",".join(str(jar) for jar in [*kafka_source_jars(settings), *extra_jars])
    java_options = driver_java_options(settings or config.load(), jit)
    if driver_heap is not None:
        java_options += fixed_heap_options(driver_heap)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.jars", jars)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", " ".join(java_options))
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    if loopback:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if driver_heap is not None:
        builder = builder.config("spark.driver.memory", driver_heap)  # -Xmx, set by Spark
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def executor_python(environ: Mapping[str, str] | None = None) -> str:
    """The Python the executors run: ``PYSPARK_PYTHON`` of ``environ`` (this process's
    environment by default, where it is set to this interpreter, the project's virtualenv,
    unless given: PySpark's own default is ``python3``)."""
    import sys

    if environ is None:
        return os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return environ.get("PYSPARK_PYTHON", sys.executable)


#: The most cores of one executor on a standalone cluster (:func:`executor_size`).
EXECUTOR_MAX_CORES = 4


def executor_size(task_count: int, *, spare: bool = False) -> int:
    """Cores of each executor of a run of ``task_count`` tasks on a standalone cluster: the
    largest divisor of ``task_count`` that is at most :data:`EXECUTOR_MAX_CORES` and, for a run
    that asks for its tasks' cores only, at most half of them (1 for a single task), so its
    cores are whole executors, two at least. A run with ``spare`` cores asks for twice its
    tasks' (:func:`executor_request`), so executors of up to all its tasks are two already.

    Without ``spark.executor.cores`` a standalone master gives an application one executor per
    worker, holding every core it got there: when a worker is lost, the application cannot
    start another on a worker where it already has one, and waits for the lost one to come
    back. With a fixed size it gets its cores back on any worker with room at once.

    >>> [executor_size(t) for t in (1, 2, 3, 4, 6, 8, 12, 20)]
    [1, 1, 1, 2, 3, 4, 4, 4]
    >>> [executor_size(t, spare=True) for t in (1, 2, 3, 4, 6, 8, 12, 20)]
    [1, 2, 3, 4, 3, 4, 4, 4]
    """
    if task_count < 1:
        raise ValueError(f"a run has at least one task, got {task_count}")
    largest = min(task_count if spare else task_count // 2, EXECUTOR_MAX_CORES)
    return next(c for c in range(max(1, largest), 0, -1) if task_count % c == 0)


def executor_request(task_count: int, *, spare: bool) -> dict[str, str]:
    """The cores a run of ``task_count`` tasks asks of a standalone master, and their size
    (:func:`executor_size`). With ``spare`` it asks for twice its tasks' cores: the master
    spreads an application's executors over the workers, so each of two workers holds a core
    for every task, and when one is lost the other runs every task at once, while the run's
    lost executors wait for room, which comes back with the lost worker, on another host. A
    cold executor's first tasks (its JVM and Python workers starting on a busy machine) are
    then copied by speculation to an executor that is warm, which Spark does only across
    hosts; without the spare the replacement starts beside the survivors, and every batch
    waits for its first tasks (docs/design.md#spark-pitfalls).

    >>> executor_request(4, spare=True)
    {'spark.cores.max': '8', 'spark.executor.cores': '4'}
    >>> executor_request(4, spare=False)
    {'spark.cores.max': '4', 'spark.executor.cores': '2'}
    """
    cores = task_count * (2 if spare else 1)
    size = executor_size(task_count, spare=spare)
    return {"spark.cores.max": str(cores), "spark.executor.cores": str(size)}


def submitted_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings given to ``spark-submit`` as ``--conf KEY=VALUE`` in
    ``PYSPARK_SUBMIT_ARGS`` (of ``environ``, by default this process's environment); a
    session's own settings would override them.

    >>> submitted_conf({"PYSPARK_SUBMIT_ARGS": "--conf spark.executor.cores=1 pyspark-shell"})
    {'spark.executor.cores': '1'}
    """
    words = shlex.split((os.environ if environ is None else environ).get("PYSPARK_SUBMIT_ARGS", ""))
    settings: dict[str, str] = {}
    for flag, setting in itertools.pairwise(words):
        if flag == "--conf" and "=" in setting:
            key, value = setting.split("=", 1)
            settings[key] = value
    return settings


def fixed_heap_options(heap: str) -> list[str]:
    """A JVM's options that take its whole heap of ``heap`` at start and touch it; its ``-Xmx``
    is Spark's own setting (``spark.driver.memory``, ``spark.executor.memory``,
    ``SPARK_DAEMON_MEMORY``).

    >>> fixed_heap_options("1g")
    ['-Xms1g', '-XX:+AlwaysPreTouch']
    """
    return [f"-Xms{heap}", "-XX:+AlwaysPreTouch"]


def executor_java_options(settings: config.Settings, heap: str, master: str) -> list[str]:
    """A standalone executor's JVM options: its fixed heap (:func:`fixed_heap_options`), and,
    when every executor runs on this machine, the driver's class archive, which the same JDK
    maps over the same class path (Spark's jars): a replacement executor, started while the
    machine is busy with the runs, loads Spark's classes from it instead of the jars. Never a
    training run's options: only the driver writes the archive."""
    options = fixed_heap_options(heap)
    if not _on_this_machine(master) or os.environ.get(CLASS_ARCHIVE_ENV, "").startswith("dump:"):
        return options
    return [*options, *class_archive_options(settings)]


def driver_java_options(settings: config.Settings, jit: str = "peak") -> list[str]:
    """The driver JVM's options: warnings and errors only, the class archive, the JIT mode.

    >>> driver_java_options(config.load({}), "quick")[-1]
    '-XX:TieredStopAtLevel=1'
    """
    if jit not in _JIT_OPTIONS:
        raise ValueError(f"jit must be one of {', '.join(JIT_MODES)}, got {jit!r}")
    return [
        f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}",
        *class_archive_options(settings),
        *_JIT_OPTIONS[jit],
    ]


def _java_executable() -> Path | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def class_archive_path(settings: config.Settings) -> Path | None:
    """Where the driver's class archive for this JDK and these jars lives (None without java).

    The JVM only maps an archive written by the same JDK build over the same class path, and
    checks that itself; the name's digest of the java binary and of every jar on Spark's
    class path makes a new JDK or PySpark build a new archive instead of an unused old one.
    """
    java = _java_executable()
    if java is None:
        return None
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    digest = hashlib.sha256()
    for path in (java, *jars):
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return settings.cache_dir / "spark" / f"driver-classes-{digest.hexdigest()[:16]}.jsa"


def class_archive_options(settings: config.Settings) -> list[str]:
    """The driver JVM's options for its class archive (:data:`CLASS_ARCHIVE_ENV`): map it
    when it exists, write it in a training run, nothing when switched off or absent."""
    mode = os.environ.get(CLASS_ARCHIVE_ENV, "")
    if mode.startswith("dump:"):
        return [f"-XX:ArchiveClassesAtExit={mode.removeprefix('dump:')}", *_QUIET_ARCHIVE]
    archive = None if mode == "off" else class_archive_path(settings)
    # A missing file would switch off the JDK's own base archive too.
    if archive is None or not archive.is_file():
        return []
    return [f"-XX:SharedArchiveFile={archive}", *_QUIET_ARCHIVE]
