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
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.io import config
from pipeline.io.artifacts import ensure_spark_jars
from pipeline.io.probes import accepts_connections

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: log4j2 configuration of the driver JVM: warnings and errors only, on standard error.
LOG4J2_CONFIG = config.DEPLOY_DIR / "spark" / "log4j2.properties"


#: Seconds a new session on a cluster may take until its executors offer the cores it needs,
#: and how long the cores offered may stay the same, once some executor registered, before
#: the session is taken to have all it will get (a cluster manager launches its executors
#: together at an application's start).
EXECUTOR_WAIT_SECONDS = 90.0
EXECUTOR_SETTLE_SECONDS = 15.0


class SparkClusterError(Exception):
    """The Spark master does not answer, or its executors are too few; one line."""


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


def require_executor_cores(
    spark: SparkSession,
    needed: int,
    *,
    timeout: float = EXECUTOR_WAIT_SECONDS,
    settle: float = EXECUTOR_SETTLE_SECONDS,
) -> int:
    """Wait until a cluster session's executors offer ``needed`` cores and return how many they
    offer; raise :class:`SparkClusterError` if they do not within ``timeout`` seconds, or if
    some offer cores but their number stayed the same for ``settle`` seconds. A local session
    passes at once (its slots are threads)."""
    master = spark.sparkContext.master
    if is_local(master):
        return needed
    started = time.monotonic()
    last_cores, last_change = 0, started
    while (cores := executor_cores(spark)) < needed:
        now = time.monotonic()
        if cores != last_cores:
            last_cores, last_change = cores, now
        if now - started > timeout or (cores > 0 and now - last_change > settle):
            raise SparkClusterError(
                f"the Spark cluster at {master} offers {cores} executor core(s), fewer than "
                f"the {needed} tasks of a micro-batch, which must all run at once: add "
                "workers or cores, or pass --tasks"
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
) -> SparkSession:
    """A SparkSession on ``master`` that can read and write Kafka.

    ``shuffle_partitions`` is small because the default (200) makes every aggregation of a
    small job schedule 200 tasks. The driver binds to 127.0.0.1 like every other service when
    all executors are on this machine (module docstring).
    """
    # The Python workers must be this interpreter (the project's virtualenv), not "python3".
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    loopback = _on_this_machine(master)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    jars = ",".join(str(jar) for jar in kafka_source_jars(settings))
    quiet_logging = f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}"
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.jars", jars)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", quiet_logging)
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    if loopback:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
