"""The one way skewer builds a SparkSession: local mode, Kafka source on the classpath, quiet.

Layer: io.

Spark's Kafka source is Apache's ``spark-sql-kafka-0-10_2.13`` at exactly PySpark's version,
fetched once by Maven into ``.cache/spark-jars`` (:func:`pipeline.io.artifacts.ensure_spark_jars`)
and handed to Spark as ``spark.jars`` files: no ``--packages``, no Ivy, nothing downloaded when
a session starts, so it works offline after the first install.

The Kafka source makes one input partition per topic partition (as long as ``minPartitions`` is
not set), so each Spark task reads exactly one partition of topic ``work``: partition w IS
worker w (DESIGN.md, "Known pitfalls").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.io import config
from pipeline.io.artifacts import ensure_spark_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: log4j2 configuration of the driver JVM: warnings and errors only, on standard error.
LOG4J2_CONFIG = config.DEPLOY_DIR / "spark" / "log4j2.properties"


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
    """A local SparkSession that can read and write Kafka.

    ``shuffle_partitions`` is small because the default (200) makes every aggregation of a
    small local job schedule 200 tasks. The driver binds to 127.0.0.1 like every other service.
    """
    # The Python workers must be this interpreter (the project's virtualenv), not "python3".
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", quiet_logging)
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
