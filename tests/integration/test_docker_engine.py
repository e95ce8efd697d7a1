"""The Docker engine of `skewer services up --docker`, for real: installed when missing, started
on a socket of its own, answering `docker version`, `docker compose version` and a container
run through it, and gone after `down` with everything it started (dockerd, containerd, mounts,
bridges, iptables rules).

Skipped unless SKEWER_TEST_DOCKER_ENGINE=1: the first run installs Debian's docker.io as root and
fetches the Compose plugin from PyPI, and `make test` must not start a Docker engine unasked.
CI's Docker pass runs it first, alone, before it starts the engine its tests run on
(tests/run-with-docker.sh): a second engine beside a running one would share its bridge and
iptables chains, and this test checks that `down` leaves the host's as they were.
The engine listens on a socket in the test's own folder, never on Docker's default one, where
the test session looks for an engine to run the integration tests on (tests/conftest.py); the
plugin stays in the checkout's `.cache/docker-config`, so only the first run fetches it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from pipeline.io import config, probes
from pipeline.services import docker_engine, manager

ENGINE_VARIABLE = "SKEWER_TEST_DOCKER_ENGINE"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get(ENGINE_VARIABLE) != "1",
        reason=f"starts a Docker engine (installing docker.io and Compose the first time): "
        f"set {ENGINE_VARIABLE}=1 to run it",
    ),
]


def _processes_of(exec_root: Path) -> list[str]:
    """dockerd, containerd and shims whose command line names ``exec_root``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        program = Path(words[0]).name if words and words[0] else ""
        if (program == "dockerd" or program.startswith("containerd")) and any(
            str(exec_root) in word for word in words
        ):
            found.append(f"{entry.name} {' '.join(words)}")
    return found


def _mounts_under(folder: Path) -> list[str]:
    return [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(folder))
    ]


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


def _docker(settings: config.Settings, *args: str, timeout: float = 120) -> str:
    docker = shutil.which("docker")
    assert docker is not None, "no docker client on PATH (docker.io brings one)"
    result = subprocess.run(
        [docker, *args],
        env=docker_engine.client_environment(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr.strip()}"
    return result.stdout.strip()


def test_an_engine_of_its_own_answers_and_leaves_nothing_behind(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short folder: containerd's socket under the exec root must fit a unix socket's path.
    folder = tmp_path_factory.mktemp("dk")
    socket_path = folder / "sock" / "docker.sock"
    monkeypatch.setenv(config.ENV_RUN_DIR, str(folder / "run"))
    monkeypatch.setenv(config.ENV_DOCKER_HOST, f"unix://{socket_path}")
    settings = config.load()
    assert settings.docker_socket == socket_path != config.DEFAULT_DOCKER_SOCKET
    assert not probes.docker_answers(socket_path)
    [engine] = manager.native_services(settings, ["docker"])
    assert isinstance(engine, docker_engine.DockerEngineService)
    timings: dict[str, float] = {}

    started = time.monotonic()
    engine.install()
    timings["install"] = time.monotonic() - started
    # Idempotent: the second time nothing runs (the install log stays as it was) and the
    # plugin is kept.
    install_log = settings.run_dir / "docker-install.log"
    plugin = docker_engine.compose_plugin_path(settings)
    logged, fetched = _mtime(install_log), _mtime(plugin)
    started = time.monotonic()
    engine.install()
    timings["install again"] = time.monotonic() - started
    assert (_mtime(install_log), _mtime(plugin)) == (logged, fetched)
    network_before = docker_engine.host_state()
    try:
        started = time.monotonic()
        [state] = manager.up(settings, ["docker"])
        timings["up"] = time.monotonic() - started
        assert (state.name, state.state, state.address) == (
            "docker",
            "started",
            f"unix://{socket_path}",
        )
        [again] = manager.up(settings, ["docker"])  # a second up changes nothing
        assert (again.state, again.pid) == ("running", state.pid)
        # (Only the engine: Kafka, Redis and Prometheus of this run dir share ports with any
        # the rest of the test session runs.)
        assert [s.state for s in manager.status(settings, ["docker"])] == ["running"]

        server = _docker(settings, "version", "--format", "{{.Server.Version}}")
        driver = _docker(settings, "info", "--format", "{{.Driver}}")
        compose = _docker(settings, "compose", "version")
        assert server and driver
        assert docker_engine.COMPOSE_VERSION in compose

        # A container runs: an image imported from a tar of one static binary (no registry
        # here), the Compose plugin itself, on the default bridge network.
        archive = folder / "image.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(docker_engine.compose_plugin_path(settings), arcname="docker-compose")
        _docker(settings, "import", str(archive), "skewer-test/static:1")
        started = time.monotonic()
        inside = _docker(
            settings, "run", "--rm", "skewer-test/static:1", "/docker-compose", "version", "--short"
        )
        timings["container run"] = time.monotonic() - started
        assert inside == docker_engine.COMPOSE_VERSION.removeprefix("v")
        assert "docker0" in docker_engine.host_state()["bridges"]
    finally:
        started = time.monotonic()
        [stopped] = manager.down(settings, ["docker"])
        timings["down"] = time.monotonic() - started
    print(
        f"\ndocker engine: server {server}, storage driver {driver}; {compose}; "
        + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in timings.items())
    )
    assert stopped.state == "stopped"
    assert not probes.docker_answers(socket_path)
    assert _processes_of(engine.exec_root) == []
    assert _mounts_under(folder) == []
    assert docker_engine.host_state() == network_before
    assert not engine.pid_path.exists() and not socket_path.exists()
