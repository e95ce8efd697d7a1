"""What Maven put in the cache: Kafka at the pinned version, Spark's Kafka source at PySpark's."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from pipeline.io import artifacts, config

pytestmark = pytest.mark.integration

POM_NAMESPACE = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pom_property(pom: Path, name: str) -> str:
    return ElementTree.parse(pom).find(f"m:properties/m:{name}", POM_NAMESPACE).text


def test_kafka_classpath_is_the_pinned_release_with_a_log_binding() -> None:
    version = _pom_property(config.DEPLOY_DIR / "kafka" / "pom.xml", "kafka.version")
    libs = {jar.name for jar in artifacts.ensure_kafka_libs().glob("*.jar")}
    assert f"kafka_2.13-{version}.jar" in libs
    assert f"kafka-clients-{version}.jar" in libs
    assert f"kafka-raft-{version}.jar" in libs
    log4j = _pom_property(config.DEPLOY_DIR / "kafka" / "pom.xml", "log4j.version")
    assert {f"log4j-core-{log4j}.jar", f"log4j-slf4j-impl-{log4j}.jar"} <= libs


def test_spark_kafka_source_is_exactly_pysparks_version_and_adds_nothing_pyspark_ships() -> None:
    import pyspark

    jars = {jar.name for jar in artifacts.ensure_spark_jars()}
    version = pyspark.__version__
    assert f"spark-sql-kafka-0-10_2.13-{version}.jar" in jars
    assert f"spark-token-provider-kafka-0-10_2.13-{version}.jar" in jars
    shipped = {
        artifacts.artifact_id(jar.name)
        for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")
    }
    assert {artifacts.artifact_id(name) for name in jars} & shipped == set()
    # The pom's default is the pin too, so the file alone tells which connector is used.
    assert _pom_property(config.DEPLOY_DIR / "spark" / "pom.xml", "spark.version") == version
