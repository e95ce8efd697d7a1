"""JVM artifacts from Maven Central, fetched once into the cache (layer: io).

- Kafka's classpath (deploy/kafka/pom.xml) into ``.cache/kafka/libs``: the native broker runs
  ``java -cp libs/* kafka.Kafka`` from it.
- Spark's Kafka source, Apache's ``spark-sql-kafka-0-10`` at exactly PySpark's version, and
  Redis's Java client, with what PySpark's own jars lack (deploy/spark/pom.xml), into
  ``.cache/spark-jars``: every Spark session puts them in ``spark.jars``.
- The real-time workers' writer (jvm/realtime-writer) and the executors' warm-up plugin
  (jvm/executor-warmup), each compiled by the JDK's ``javac`` against those jars and
  PySpark's into one jar, when a run first needs it.

Maven's local repository lives in the cache too, so one ``rm -rf .cache`` is a cold start, and
the Docker image build reuses the same call (``skewer services install``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pipeline.io import config, file_lock
from pipeline.io.config import Settings


class ArtifactError(Exception):
    """Maven could not fetch what is needed; the message is one line."""


def _maven_copy(
    settings: Settings, pom: Path, output_dir: Path, extra: Sequence[str], what: str
) -> None:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``output_dir``, once per input.

    A marker file records a digest of the pom and the arguments, so a changed pin downloads
    again while an unchanged one costs nothing (and needs no network).
    """
    digest = hashlib.sha256(pom.read_bytes() + "\0".join(extra).encode()).hexdigest()
    marker = output_dir / ".skewer-complete"

    def fetched() -> bool:
        return marker.exists() and marker.read_text().strip() == digest

    if fetched():
        return
    with file_lock.exclusive(settings.run_dir / f"{output_dir.name}.lock"):
        if fetched():
            return  # another process fetched them while this one waited
        _maven_fetch(settings, pom, output_dir, extra, what)
        marker.write_text(digest + "\n")


def _maven_fetch(
    settings: Settings, pom: Path, output_dir: Path, extra: Sequence[str], what: str
) -> None:
    if shutil.which("mvn") is None:
        raise ArtifactError(f"{what}: mvn is not installed; run `make install`")
    if output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True)
    log_path = settings.run_dir / "maven.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        "mvn",
        "--batch-mode",
        "--quiet",
        "--file",
        str(pom),
        f"-Dmaven.repo.local={settings.maven_repository}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output_dir}",
        *extra,
    ]
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise ArtifactError(f"{what}: Maven could not fetch the jars; see {log_path}")


def ensure_kafka_libs(settings: Settings | None = None) -> Path:
    """Kafka's classpath in the cache, downloaded by Maven on first use."""
    settings = settings or config.load()
    pom = config.DEPLOY_DIR / "kafka" / "pom.xml"
    _maven_copy(settings, pom, settings.kafka_libs_dir, [], "kafka")
    return settings.kafka_libs_dir


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def artifact_id(jar_name: str) -> str:
    """The artifact a jar file name carries: everything before its version.

    The version is the last dash-separated part that starts with a digit and has a dot, which
    also handles artifacts whose names hold numbers (``spark-sql-kafka-0-10_2.13-4.0.0.jar``,
    ``log4j-1.2-api-2.24.3.jar``) and versions with suffixes (``zstd-jni-1.5.6-9.jar``).

    >>> artifact_id("spark-sql-kafka-0-10_2.13-4.0.0.jar"), artifact_id("zstd-jni-1.5.6-9.jar")
    ('spark-sql-kafka-0-10_2.13', 'zstd-jni')
    """
    parts = jar_name.removesuffix(".jar").split("-")
    for index in range(len(parts) - 1, 0, -1):
        if parts[index][:1].isdigit() and "." in parts[index]:
            return "-".join(parts[:index])
    return "-".join(parts)


def ensure_spark_jars(settings: Settings | None = None) -> list[Path]:
    """Spark's Kafka source at PySpark's version plus what PySpark lacks, fetched once."""
    import pyspark

    settings = settings or config.load()
    shipped = sorted({artifact_id(jar.name) for jar in (_pyspark_home() / "jars").glob("*.jar")})
    _maven_copy(
        settings,
        config.DEPLOY_DIR / "spark" / "pom.xml",
        settings.spark_jars_dir,
        [f"-Dspark.version={pyspark.__version__}", f"-DexcludeArtifactIds={','.join(shipped)}"],
        "spark-sql-kafka",
    )
    return sorted(settings.spark_jars_dir.glob("*.jar"))


# --------------------------------------------------------------------------------------------
# up / down / status


#: The Java sources skewer compiles on first use, one folder per jar.
JVM_SOURCES = config.PROJECT_ROOT / "jvm"
#: The Java sources of the real-time workers' writer (pipeline.stages.worker_job).
REALTIME_WRITER_SOURCES = JVM_SOURCES / "realtime-writer" / "src" / "main" / "java"
#: The Java sources of the executors' warm-up plugin (pipeline.stages.worker_job).
EXECUTOR_WARMUP_SOURCES = JVM_SOURCES / "executor-warmup" / "src" / "main" / "java"


def ensure_realtime_writer(settings: Settings | None = None) -> Path:
    """The real-time workers' writer's jar (:func:`ensure_compiled`)."""
    settings = settings or config.load()
    return ensure_compiled(
        settings, REALTIME_WRITER_SOURCES, settings.realtime_writer_jar, "the real-time writer"
    )


def ensure_executor_warmup(settings: Settings | None = None) -> Path:
    """The executors' warm-up plugin's jar (:func:`ensure_compiled`)."""
    settings = settings or config.load()
    return ensure_compiled(
        settings, EXECUTOR_WARMUP_SOURCES, settings.executor_warmup_jar, "the executor warm-up"
    )


def ensure_compiled(settings: Settings, source_dir: Path, jar_path: Path, what: str) -> Path:
    """The jar of the Java sources under ``source_dir``, compiled against PySpark's jars and
    Spark's Kafka source once per version of its sources and of those jars.

    ``javac`` and ``jar`` are the JDK's own; like :func:`_maven_copy`, a marker holds a digest
    of the inputs, so an unchanged jar costs nothing."""
    classpath = [*sorted((_pyspark_home() / "jars").glob("*.jar")), *ensure_spark_jars(settings)]
    sources = sorted(source_dir.rglob("*.java"))
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for jar in classpath:
        digest.update(jar.name.encode() + b"\0")
    marker = jar_path.with_suffix(".sha256")

    def built() -> bool:
        return (
            jar_path.exists()
            and marker.exists()
            and marker.read_text().strip() == digest.hexdigest()
        )

    if built():
        return jar_path
    with file_lock.exclusive(settings.run_dir / f"{jar_path.stem}.lock"):
        if not built():  # another process may have compiled it while this one waited
            _compile(jar_path, classpath, sources, what)
            marker.write_text(digest.hexdigest() + "\n")
    return jar_path


def _compile(jar_path: Path, classpath: Sequence[Path], sources: Sequence[Path], what: str) -> None:
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise ArtifactError(f"{what}: javac is not installed; run `make install`")
    classes = jar_path.parent / "classes"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    compile_command = [
        javac, "--release", "17", "-nowarn", "-d", str(classes),
        "-cp", ":".join(map(str, classpath)), *map(str, sources),
    ]  # fmt: skip
    result = subprocess.run(compile_command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        first = (result.stderr.strip().splitlines() or ["no output"])[0]
        raise ArtifactError(f"{what} did not compile: {first}")
    subprocess.run([jar_tool, "--create", "--file", str(jar_path), "-C", str(classes), "."],
                   check=True)  # fmt: skip
