"""The Spark driver maps its classes from the archive the test session (like ``skewer services
up``) built, and loads them from the jars when the archive is switched off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.io import config
from pipeline.io.spark_session import CLASS_ARCHIVE_ENV

pytestmark = pytest.mark.integration

PROBE = (
    "from pipeline.io.spark_session import build_spark_session\n"
    "build_spark_session('skewer-class-archive-probe', master='local[1]').stop()\n"
)


def where_spark_context_came_from(log_dir: Path, environ: dict[str, str]) -> set[str]:
    """Where the driver JVM loaded SparkContext from (the JVM's class-loading log)."""
    log = f"-Xlog:class+load=info:file={log_dir}/classes-%p.log"
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**environ, "JDK_JAVA_OPTIONS": log},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sources = set()
    for path in log_dir.glob("classes-*.log"):
        for line in path.read_text().splitlines():
            if line.split("] ", 1)[-1].startswith("org.apache.spark.SparkContext source: "):
                sources.add(line.split(" source: ", 1)[1])
    return sources


@pytest.mark.slow
def test_the_driver_maps_spark_from_the_archive(
    spark_class_archive: Path | None, settings: config.Settings, tmp_path: Path
) -> None:
    assert spark_class_archive is not None and spark_class_archive.is_file()
    environ = {k: v for k, v in os.environ.items() if k != CLASS_ARCHIVE_ENV}
    mapped = tmp_path / "mapped"
    mapped.mkdir()
    assert where_spark_context_came_from(mapped, environ) == {"shared objects file (top)"}
    loaded = tmp_path / "loaded"
    loaded.mkdir()
    sources = where_spark_context_came_from(loaded, {**environ, CLASS_ARCHIVE_ENV: "off"})
    assert len(sources) == 1 and next(iter(sources)).endswith(".jar")
