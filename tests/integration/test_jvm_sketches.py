"""The Java twins of skewer's sketches give, on the golden vectors, what the Python ones give.

Maven runs jvm/sketches' JUnit tests (``mvn test``, the plugins and JUnit fetched into
``.cache/m2`` the first time) on ``tests/vectors/``, the files the Python tests check too
(``tests/unit/test_log_buckets.py``); the test reports say how many ran, so a run that found no
test fails here.
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ElementTree

import pytest

from pipeline.io import config

pytestmark = pytest.mark.integration

PROJECT = config.PROJECT_ROOT / "jvm" / "sketches"
REPORTS = config.PROJECT_ROOT / ".cache" / "jvm-sketches" / "surefire-reports"


def test_the_java_sketches_give_the_golden_vectors() -> None:
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
    [report] = REPORTS.glob("TEST-skewer.sketch.LogBucketsTest.xml")
    suite = ElementTree.parse(report).getroot()
    assert int(suite.get("tests", "0")) >= 1
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
