"""The Java side gives, on the golden vectors, what the Python side gives: the sketches'
twins, and the real-time writer's apply ARGV.

Maven runs the JUnit tests of every module of ``jvm/pom.xml`` in one run (``mvn test``, the
plugins and JUnit fetched into ``.cache/m2`` the first time) on ``tests/vectors/``, the files
the Python tests check too (``tests/unit/test_log_buckets.py``,
``tests/unit/test_apply_vectors.py``); the test reports say how many ran, so a module that
found no test fails here.
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ElementTree

import pytest

from pipeline.io import config

pytestmark = pytest.mark.integration

PROJECT = config.PROJECT_ROOT / "jvm"
CACHE = config.PROJECT_ROOT / ".cache"
#: Each module's test report, where its pom builds.
REPORTS = {
    "sketches": CACHE / "jvm-sketches/surefire-reports/TEST-skewer.sketch.LogBucketsTest.xml",
    "realtime-writer": (
        CACHE / "jvm-realtime-writer/surefire-reports/TEST-skewer.realtime.ApplyArgsTest.xml"
    ),
}


def test_the_java_side_gives_the_golden_vectors() -> None:
    settings = config.load()
    done = subprocess.run(
        [
            "mvn",
            "--batch-mode",
            "--file",
            str(PROJECT / "pom.xml"),
            f"-Dmaven.repo.local={settings.maven_repository}",
            "test",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for module, report in REPORTS.items():
        suite = ElementTree.parse(report).getroot()
        assert int(suite.get("tests", "0")) >= 1, module
        assert suite.get("failures") == "0" and suite.get("errors") == "0", module
