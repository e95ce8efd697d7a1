"""`skewer services`: up is idempotent, down stops exactly what up started, a killed broker comes
back, and a service that cannot start fails with one line naming it and its log.

These run a second, private set of native services (own run directory, free ports) beside any
services the rest of the test session uses, through the real command line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from live_runs import free_port

from pipeline.cli import app
from pipeline.io import config, probes
from pipeline.services import manager, process

pytestmark = [
    pytest.mark.integration,
    pytest.mark.native_only("tests skewer's native services manager itself"),
]


@pytest.fixture
def private_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setenv(config.ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, f"127.0.0.1:{free_port()}")
    monkeypatch.setenv(config.ENV_KAFKA_CONTROLLER, f"127.0.0.1:{free_port()}")
    monkeypatch.setenv(config.ENV_REDIS_URL, f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setenv(config.ENV_PROMETHEUS_URL, f"http://127.0.0.1:{free_port()}")
    settings = config.load()
    yield settings
    manager.down(settings)  # whatever a failing test left behind


def _skewer(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[list[str]]]:
    """Exit code and the output lines of ``skewer services ARGS``, split into words."""
    capsys.readouterr()
    code = app.main(["services", *args])
    return code, [line.split() for line in capsys.readouterr().out.splitlines()]


def _states(lines: list[list[str]]) -> list[tuple[str, str]]:
    """(service, state) of each line."""
    return [(words[0], words[1]) for words in lines]


def _pids(lines: list[list[str]]) -> dict[str, int]:
    return {words[0]: int(words[-1]) for words in lines if "pid" in words}


def test_up_status_down_twice_and_a_killed_broker_comes_back(
    private_services: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = private_services
    names = ["kafka", "redis", "prometheus"]
    for _round in range(2):
        code, lines = _skewer(capsys, "up")
        assert code == 0
        assert _states(lines) == [(n, "started") for n in names]
        first_pids = _pids(lines)

        code, lines = _skewer(capsys, "up")  # a second up changes nothing
        assert code == 0
        assert _states(lines) == [(n, "running") for n in names]
        assert _pids(lines) == first_pids

        code, lines = _skewer(capsys, "status")
        assert code == 0
        assert [(words[0], words[1], words[2]) for words in lines] == [
            ("kafka", "running", settings.kafka_bootstrap),
            ("redis", "running", settings.redis_url),
            ("prometheus", "running", settings.prometheus_url),
        ]
        assert _pids(lines) == first_pids

        code, lines = _skewer(capsys, "down")
        assert code == 0
        assert _states(lines) == [(n, "stopped") for n in names]
        for pid in first_pids.values():
            assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
        assert sorted(p.name for p in settings.run_dir.glob("*.pid")) == []

        code, lines = _skewer(capsys, "status")
        assert code == 1
        assert _states(lines) == [(n, "down") for n in names]

    # Kill the broker by hand: status says so, and up brings back exactly that one.
    code, lines = _skewer(capsys, "up")
    assert code == 0
    pids = _pids(lines)
    os.kill(pids["kafka"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while probes.kafka_answers(settings.kafka_bootstrap, timeout=0.5):
        assert time.monotonic() < deadline
    code, lines = _skewer(capsys, "status")
    assert code == 1
    assert _states(lines) == [
        ("kafka", "down"),
        ("redis", "running"),
        ("prometheus", "running"),
    ]
    code, lines = _skewer(capsys, "up")
    assert code == 0
    assert _states(lines) == [
        ("kafka", "started"),
        ("redis", "running"),
        ("prometheus", "running"),
    ]
    new_pids = _pids(lines)
    assert new_pids["kafka"] != pids["kafka"]
    assert (new_pids["redis"], new_pids["prometheus"]) == (pids["redis"], pids["prometheus"])
    assert probes.kafka_answers(settings.kafka_bootstrap)
    code, lines = _skewer(capsys, "down")
    assert code == 0


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def test_down_never_kills_a_process_it_did_not_start(
    private_services: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = private_services
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        # A pid file naming a live process whose start time is not the recorded one: the pid
        # was recycled, so the process is not ours.
        settings.run_dir.mkdir(parents=True)
        ticks = process.start_ticks(bystander.pid)
        assert ticks is not None
        (settings.run_dir / "redis.pid").write_text(
            f'{{"pid": {bystander.pid}, "start_ticks": {ticks - 1}, "command": ["redis-server"]}}'
        )
        code, lines = _skewer(capsys, "down", "redis")
        assert code == 0
        assert _states(lines) == [("redis", "down")]
        assert bystander.poll() is None
        assert not (settings.run_dir / "redis.pid").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_service_that_cannot_start_is_one_line_naming_it_and_its_log(
    private_services: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = private_services
    # Something else holds Redis's port and does not speak Redis: redis-server cannot bind.
    with socket.socket() as squatter:
        squatter.bind((settings.redis_host, settings.redis_port))
        squatter.listen()
        capsys.readouterr()
        code = app.main(["services", "up", "redis"])
        captured = capsys.readouterr()
    assert code == 1
    log_path = settings.run_dir / "redis.log"
    assert captured.err.startswith("skewer services: redis failed to start (it exited"), (
        captured.err
    )
    assert f"; see {log_path}; its log ends: " in captured.err
    assert captured.err.count("\n") == 1
    assert "Failed listening on port" in captured.err
    assert "Address already in use" in log_path.read_text()
    assert not (settings.run_dir / "redis.pid").exists()


def test_unknown_service_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["services", "status", "zookeeper"]) == 1
    assert capsys.readouterr().err == (
        "skewer services: unknown service 'zookeeper'; valid services: kafka, redis, prometheus, "
        "kafka-1..3, redis-replica-1..2, redis-sentinel-1..3, spark, spark-master, "
        "spark-worker-N, docker\n"
    )


def _state_of(settings: config.Settings, name: str) -> str:
    [state] = manager.status(settings, [name])
    return state.state


def test_the_last_test_session_out_stops_what_a_session_started(
    private_services: config.Settings,
) -> None:
    settings = private_services
    [state] = manager.acquire(settings, ["redis"])
    assert state.state == "started"
    # A second session (here: a live stand-in process) holds a lease on the same Redis.
    other_session = subprocess.Popen(["sleep", "60"])
    try:
        ticks = process.start_ticks(other_session.pid)
        (settings.run_dir / "leases" / f"redis.{other_session.pid}.{ticks}").touch()
        [state] = manager.release(settings, ["redis"])
        assert (state.state, _state_of(settings, "redis")) == ("running", "running")
    finally:
        other_session.kill()
        other_session.wait()
    # The other session died without releasing: the next session out stops Redis.
    assert manager.acquire(settings, ["redis"])[0].state == "running"
    [state] = manager.release(settings, ["redis"])
    assert (state.state, _state_of(settings, "redis")) == ("stopped", "down")
    assert list((settings.run_dir / "leases").iterdir()) == []


def test_tests_never_stop_what_skewer_services_up_started(
    private_services: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = private_services
    # Started by a user: a test session uses it and leaves it running.
    assert _skewer(capsys, "up", "redis")[0] == 0
    assert manager.acquire(settings, ["redis"])[0].state == "running"
    assert manager.release(settings, ["redis"])[0].state == "running"
    assert _state_of(settings, "redis") == "running"
    # Started by a test session, then adopted by a user's `up`: it stays up too.
    assert manager.acquire(settings, ["prometheus"])[0].state == "started"
    code, lines = _skewer(capsys, "up", "prometheus")
    assert (code, lines[0][1]) == (0, "running")
    assert manager.release(settings, ["prometheus"])[0].state == "running"
    assert _state_of(settings, "prometheus") == "running"
