"""The Spark driver's class archive: which JVM options a session gets, and how a build ends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.io import config, spark_session
from pipeline.io.spark_session import (
    CLASS_ARCHIVE_ENV,
    class_archive_options,
    class_archive_path,
)
from pipeline.runs import class_archive


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setenv(config.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    return config.load()


def archive_of(settings: config.Settings) -> Path:
    path = class_archive_path(settings)
    assert path is not None, "these tests need a java on PATH or JAVA_HOME"
    return path


def test_no_archive_no_option(settings: config.Settings) -> None:
    # -XX:SharedArchiveFile naming a missing file would switch off the JDK's base archive too.
    assert class_archive_options(settings) == []


def test_an_archive_is_mapped_quietly(settings: config.Settings) -> None:
    archive = archive_of(settings)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    options = class_archive_options(settings)
    assert options[0] == f"-XX:SharedArchiveFile={archive}"
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_off_and_dump(settings: config.Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = archive_of(settings)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    assert class_archive_options(settings) == []
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "dump:/tmp/x.jsa")
    assert class_archive_options(settings)[0] == "-XX:ArchiveClassesAtExit=/tmp/x.jsa"


def test_another_jdk_is_another_archive(
    settings: config.Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("one build")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    first = class_archive_path(settings)
    java.write_text("another build")
    assert first is not None and class_archive_path(settings) not in (None, first)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert class_archive_path(settings) is None


def fake_training(
    monkeypatch: pytest.MonkeyPatch, *, code: int, writes: bool, stderr: str = ""
) -> list[dict[str, str]]:
    environs: list[dict[str, str]] = []

    def run(command: list[str], *, env: dict[str, str], **_: object) -> subprocess.CompletedProcess:
        environs.append(env)
        if writes:
            Path(env[CLASS_ARCHIVE_ENV].removeprefix("dump:")).write_bytes(b"classes")
        return subprocess.CompletedProcess(command, code, "", stderr)

    monkeypatch.setattr(class_archive.subprocess, "run", run)
    return environs


def test_a_build_replaces_stale_archives(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = archive_of(settings)
    archive.parent.mkdir(parents=True)
    stale = archive.parent / "driver-classes-0000000000000000.jsa"
    stale.write_bytes(b"old")
    environs = fake_training(monkeypatch, code=0, writes=True)
    assert class_archive.ensure_class_archive(settings) == archive
    assert archive.read_bytes() == b"classes" and not stale.exists()
    assert list(archive.parent.iterdir()) == [archive]
    # The training run reaches the services this process does.
    assert environs[0][config.ENV_KAFKA_BOOTSTRAP] == settings.kafka_bootstrap
    # Built once: a second call finds it.
    assert class_archive.ensure_class_archive(settings) == archive and len(environs) == 1


def test_a_failed_build_says_why_and_leaves_nothing(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_training(monkeypatch, code=1, writes=True, stderr="Traceback\nKafkaIOError: no broker")
    lines: list[str] = []
    assert class_archive.ensure_class_archive(settings, lines.append) is None
    assert lines[-1] == (
        "the Spark class archive was not built (KafkaIOError: no broker); Spark starts without it"
    )
    assert list(archive_of(settings).parent.iterdir()) == []
    assert spark_session.class_archive_options(settings) == []
