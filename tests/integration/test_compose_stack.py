"""The compose stack end to end: docker-compose.yml built and run as a user runs it, under two
schemes one after the other, every count exact; Prometheus in the stack scrapes every skewer
service and records the imbalance; nothing of the project is left after ``down -v``.

Under a project name and an env file of its own (:func:`session_name`, random passwords, a
small run), with the Compose plugin and the file unchanged, it runs ``docker compose build`` (the
classic builder, as ``skewer images build --local``), then docs/compose.md's ``up -d
prometheus producer`` under ``pkg`` and again under ``mixed`` with a new ``RUN_ID`` (compose
recreates skewer's services only); each run must pass ``skewer verify``'s check from the host.
Then Prometheus's ``skewer`` job must have had its five stage targets up and the imbalance
series of both runs (:data:`IMBALANCE_SERIES`), the overview dashboard's imbalance panel a first
point soon after each ``up`` (:func:`imbalance_panel_expression`), and ``down -v``, pass or
fail, must leave no container, volume or network of the project.

Published ports go to a random loopback address of the test's own
(:func:`free_loopback_address`), as the stack's host ports are the native services'.
``SKEWER_TEST_IMAGES=local`` adds deploy/images/local.env, as for the test fixtures. Skips with
the reason unless a Docker engine answers and the Compose plugin is present, and in CI's Docker
pass fails instead (:func:`service_backends.require_part`; docs/testing.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grafana_dashboards import load_dashboards, metric_names, queries, substitute
from service_backends import (
    COMPOSE_TEST_PROJECT,
    ENV_TEST_IMAGES,
    IMAGE_VARIABLES,
    compose_command_environment,
    docker_engine_answers,
    require_part,
    session_name,
    sweep_dead_sessions,
)

from pipeline.io import config
from pipeline.io.state_store import StateStore
from pipeline.runs.verify import RunVerification, verify_run
from pipeline.services import docker_images

COMPOSE_FILE = config.PROJECT_ROOT / "docker-compose.yml"
SKEWER = str(Path(sys.executable).with_name("skewer"))
#: The run: ~15 s of records at RATE/s (two or three 10 s windows; Prometheus scrapes every
#: 5 s, so every stage is scraped while it runs and the rate rules get their samples).
RECORDS = 30_000
RATE = 2_000
WORKERS = 4
SOURCES = 2
SCHEMES = ("pkg", "mixed")
#: The skewer job's targets in deploy/prometheus/prometheus.yml, by their ``stage`` label.
STAGES = ("produce", "group", "work", "aggregate", "control")
IMBALANCE_SERIES = (
    "skewer_imbalance_fraction",
    "skewer_load_max_over_avg",
    "skewer:imbalance_fraction:rate1m",
    "skewer:load_max_over_avg:rate1m",
)
#: The overview dashboard's imbalance panel and the recording rule its live target reads.
IMBALANCE_PANEL = "Imbalance I(t) as a fraction of records"
IMBALANCE_RULE = "skewer:imbalance_fraction:rate1m"
#: Seconds from a run's ``up`` to the panel's first point, at most: about three times the
#: slowest span measured on two cores shared with other test runs. What it waits for (each
#: dependency healthy, the work stage's JVM, Spark's first micro-batches, a scrape and a rule
#: evaluation; docs/compose.md) slows down with a busy machine, hence the room; beyond it the
#: stack stalled on the way (a restart loop, a health check that never passes).
FIRST_POINT_BOUND = 180.0
#: Host ports the stack publishes (on the bind address) without the profiles and Grafana.
PUBLISHED_PORTS = (19092, 16379, 19090)
BUILD_TIMEOUT = 1800.0
UP_TIMEOUT = 600.0
RUN_TIMEOUT = 300.0


def compose_environment() -> tuple[dict[str, str], str]:
    """The environment of the test's ``docker`` calls and why the stack cannot run ("" if it
    can): an engine must answer and ``docker compose`` must work, with the caller's
    DOCKER_CONFIG or else the checkout's (where ``skewer services up docker`` puts the plugin)."""
    env = dict(os.environ)
    answers, reason = docker_engine_answers()
    if not answers:
        return env, reason
    if shutil.which("docker") is None:
        return env, "no docker command on PATH"
    found = compose_command_environment(env)
    if found is not None:
        return found, ""
    return env, (
        "the Docker Compose plugin is missing (`skewer services up docker` builds it into "
        ".cache/docker-config)"
    )


pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.docker,
]


def compose_variables(text: str) -> set[str]:
    """The variables docker-compose.yml interpolates.

    >>> sorted(compose_variables("a: ${RUN_ID:-live}\\nb: ${REDIS_PASSWORD:?set it}-$${X}"))
    ['REDIS_PASSWORD', 'RUN_ID']
    """
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def stack_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what would change the stack behind the test's back: compose's own
    variables and those docker-compose.yml reads, the image names aside (they win over the env
    files, as for the test fixtures)."""
    dropped = compose_variables(COMPOSE_FILE.read_text()) - set(IMAGE_VARIABLES.values())
    return {
        name: value
        for name, value in environ.items()
        if name not in dropped and not name.startswith("COMPOSE_")
    }


def free_loopback_address() -> str:
    """A loopback address 127.x.y.z (not 127.0.0.x) on which every published port is free."""
    for _ in range(100):
        address = (
            f"127.{random.randrange(1, 255)}.{random.randrange(0, 256)}.{random.randrange(1, 255)}"
        )
        probes = [socket.socket() for _ in PUBLISHED_PORTS]
        try:
            for probe, port in zip(probes, PUBLISHED_PORTS, strict=True):
                probe.bind((address, port))
            return address
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError("no loopback address with the stack's ports free")


def documented_command(
    docker: str, project: str, env_file: Path, local: bool
) -> tuple[list[str], list[str]]:
    """docs/compose.md's command that starts the stack without Grafana (``COMPOSE_UP_LOCAL``), as
    (the ``docker compose`` part, the ``up`` part), with the test's project name, compose file
    and env file in place of ``.env``; without ``local``, without deploy/images/local.env.

    >>> base, up = documented_command("docker", "p", Path("/t/s.env"), local=True)
    >>> " ".join(base[2:])
    '-p p -f .../docker-compose.yml --env-file /t/s.env --env-file deploy/images/local.env'
    >>> " ".join(up)
    'up -d prometheus producer'
    >>> " ".join(documented_command("docker", "p", Path("/t/s.env"), local=False)[0][-2:])
    '--env-file /t/s.env'
    """
    words = shlex.split(docker_images.COMPOSE_UP_LOCAL)
    assert words[:2] == ["docker", "compose"], docker_images.COMPOSE_UP_LOCAL
    up = words.index("up")
    options, files = words[2:up], []
    while options:
        flag, value = options.pop(0), options.pop(0)
        assert flag == "--env-file", docker_images.COMPOSE_UP_LOCAL
        if value == ".env":
            files += [flag, str(env_file)]
        elif local or value != str(docker_images.LOCAL_ENV.relative_to(config.PROJECT_ROOT)):
            files += [flag, value]
    base = [docker, "compose", "-p", project, "-f", str(COMPOSE_FILE), *files]
    return base, words[up:]


@dataclass
class RunOutcome:
    scheme: str
    run_id: str
    started: float
    verification: RunVerification
    cli_exit: int
    cli_report: dict[str, Any]


@dataclass
class Down:
    code: int
    stderr: str
    containers: list[str]
    volumes: list[str]
    networks: list[str]


@dataclass
class StackOutcome:
    project: str
    runs: dict[str, RunOutcome] = field(default_factory=dict)
    #: stage -> the highest ``up`` of its target during the mixed run.
    target_up: dict[str, float] = field(default_factory=dict)
    #: The skewer job's active targets, by stage label.
    targets: list[str] = field(default_factory=list)
    #: (series name, run) pairs Prometheus holds.
    series: set[tuple[str, str]] = field(default_factory=set)
    #: scheme -> seconds from its run's ``up`` to the imbalance panel's first point.
    first_imbalance: dict[str, float] = field(default_factory=dict)
    down: Down | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Stack:
    """``docker compose`` on docker-compose.yml under the test's project name and env files."""

    def __init__(
        self,
        project: str,
        env_file: Path,
        address: str,
        password: str,
        environment: Mapping[str, str],
    ) -> None:
        self.project = project
        self.address = address
        self.password = password
        docker = shutil.which("docker")
        assert docker is not None
        self.docker = docker
        self.base, self.up = documented_command(
            docker,
            project,
            env_file,
            os.environ.get(ENV_TEST_IMAGES, "").strip().lower() == "local",
        )
        self.env = stack_environment(environment)

    def compose(
        self, *args: str, timeout: float = 120.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.base, *args],
            env={**self.env, **(env or {})},
            cwd=config.PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def must(self, *args: str, timeout: float = 120.0, env: Mapping[str, str] | None = None) -> str:
        result = self.compose(*args, timeout=timeout, env=env)
        assert result.returncode == 0, (
            f"docker compose {' '.join(args)} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-3000:]}"
        )
        return result.stdout

    def docker_ids(self, kind: str) -> list[str]:
        """Ids of the project's containers (all), volumes or networks, by compose's label."""
        command = [self.docker, kind, "ls"] if kind != "container" else [self.docker, "ps"]
        if kind == "container":
            command.append("-a")
        result = subprocess.run(
            [*command, "-q", "--filter", f"label=com.docker.compose.project={self.project}"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return result.stdout.split()

    def service_state(self, service: str) -> tuple[str, int]:
        """(state, exit code) of the service's container ("missing", -1 when it has none)."""
        out = self.must("ps", "-a", "--format", "json", service)
        rows = _json_rows(out)
        if not rows:
            return "missing", -1
        return str(rows[0].get("State", "")), int(rows[0].get("ExitCode", -1))

    def diagnosis(self) -> str:
        ps = self.compose("ps", "-a", "--format", "{{.Service}} {{.State}} {{.Status}}")
        logs = self.compose(
            "logs", "--no-color", "--tail", "8", "group", "work", "aggregate", "control", "producer"
        )
        return f"\n--- compose ps:\n{ps.stdout}\n--- last log lines:\n{logs.stdout[-6000:]}"

    def redis(self) -> Any:
        import redis

        return redis.Redis(host=self.address, port=16379, password=self.password, db=0)

    @property
    def redis_url(self) -> str:
        return f"redis://:{self.password}@{self.address}:16379/0"

    @property
    def prometheus(self) -> str:
        return f"http://{self.address}:19090"


def _json_rows(text: str) -> list[dict[str, Any]]:
    """``docker compose ps --format json``: one object per line (v2.21+) or one array."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _prometheus(url: str, path: str, params: Mapping[str, Any]) -> Any:
    query = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]


def imbalance_panel_expression() -> str:
    """The PromQL of the overview dashboard's imbalance panel's live target, as Grafana sends
    it: :data:`IMBALANCE_RULE` with ``$run`` and ``$scheme`` left to fill in. Not the panel's
    cumulative target: the work stage exports that gauge as 0 from its first scrape on, before
    any record, so its first point says when ``work`` was scraped, not that a load was measured.
    """
    found = [
        query.expr
        for query in queries(load_dashboards()["overview"])
        if query.panel_title == IMBALANCE_PANEL and metric_names(query.expr) == {IMBALANCE_RULE}
    ]
    assert len(found) == 1, f"overview panel {IMBALANCE_PANEL!r}: {found}"
    return found[0]


def first_point(url: str, expr: str, start: float, end: float) -> float | None:
    """The first time from ``start`` (Unix seconds) at which ``expr`` has a value, as a panel
    at a 1 s step shows it; None if it has none up to ``end``."""
    data = _prometheus(
        url, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": 1}
    )
    times = [float(one["values"][0][0]) for one in data["result"] if one["values"]]
    return min(times, default=None)


def run_scheme(stack: Stack, scheme: str, run_id: str) -> RunOutcome:
    """``up -d`` the stack for ``scheme`` under ``run_id``, wait until the run is exact (or the
    timeout), then ``skewer verify`` it from the host."""
    env = {"GROUPING_SCHEME": scheme, "RUN_ID": run_id}
    # Wall-clock, not monotonic: it is compared with Prometheus's sample times.
    started = time.time()
    stack.must(*stack.up, timeout=UP_TIMEOUT, env=env)
    client = stack.redis()
    store = StateStore(client, run_id)
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while True:
            state, code = stack.service_state("producer")
            verification = verify_run(store)
            if state == "exited" and code == 0 and verification.exact:
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{scheme} run {run_id} not exact after {RUN_TIMEOUT:.0f} s (producer "
                    f"{state}, exit {code}):\n"
                    + "\n".join(verification.lines())
                    + stack.diagnosis()
                )
            time.sleep(2)
    finally:
        client.close()
    cli = subprocess.run(
        [SKEWER, "verify", "--run-id", run_id, "--json"],
        env={**os.environ, config.ENV_REDIS_URL: stack.redis_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(cli.stdout) if cli.stdout.strip().startswith("{") else {}
    return RunOutcome(scheme, run_id, started, verification, cli.returncode, report)


def read_prometheus(stack: Stack, outcome: StackOutcome) -> None:
    """Targets, their ``up`` during the mixed run, the imbalance series and the imbalance
    panel's first point after each run's ``up``, into ``outcome``; read again for up to 30 s
    until complete (the last scrapes and rule evaluations)."""
    runs = {run.run_id for run in outcome.runs.values()}
    first = min(run.started for run in outcome.runs.values())
    mixed = outcome.runs["mixed"].started
    panel = imbalance_panel_expression()
    deadline = time.monotonic() + 30
    while True:
        now = time.time()
        targets = _prometheus(stack.prometheus, "/api/v1/targets", {"state": "active"})
        outcome.targets = sorted(
            t["labels"].get("stage", "?")
            for t in targets["activeTargets"]
            if t["labels"].get("job") == "skewer"
        )
        up = _prometheus(
            stack.prometheus,
            "/api/v1/query_range",
            {"query": 'up{job="skewer"}', "start": mixed, "end": now, "step": 1},
        )
        outcome.target_up = {
            one["metric"].get("stage", "?"): max(float(v) for _, v in one["values"])
            for one in up["result"]
        }
        names = "|".join(re.escape(name) for name in IMBALANCE_SERIES)
        found = _prometheus(
            stack.prometheus,
            "/api/v1/series",
            {
                "match[]": f'{{__name__=~"{names}",run=~"{"|".join(sorted(runs))}"}}',
                "start": first,
                "end": now,
            },
        )
        outcome.series = {(s["__name__"], s["run"]) for s in found}
        for run in outcome.runs.values():
            expr = substitute(panel, {"run": run.run_id, "scheme": run.scheme})
            shown = first_point(stack.prometheus, expr, run.started, now)
            if shown is not None:
                outcome.first_imbalance[run.scheme] = shown - run.started
        complete = (
            len(outcome.series) == len(IMBALANCE_SERIES) * len(runs)
            and all(outcome.target_up.get(stage) == 1.0 for stage in STAGES)
            and len(outcome.first_imbalance) == len(outcome.runs)
        )
        if complete or time.monotonic() > deadline:
            return
        time.sleep(2)


def take_down(stack: Stack) -> Down:
    result = stack.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300)
    return Down(
        result.returncode,
        result.stderr.strip()[-2000:],
        stack.docker_ids("container"),
        stack.docker_ids("volume"),
        stack.docker_ids("network"),
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackOutcome]:
    """The whole story of the module docstring, steps 1 to 5; the tests check what it saw."""
    environment, missing = compose_environment()
    require_part(missing)
    # The session in the name lets a later session remove what a killed one left.
    project = f"{COMPOSE_TEST_PROJECT}{session_name()}"
    address = free_loopback_address()
    password = secrets.token_hex(16)
    env_file = tmp_path_factory.mktemp("compose") / "stack.env"
    env_file.write_text(
        "\n".join(
            [
                f"REDIS_PASSWORD={password}",
                f"GRAFANA_ADMIN_PASSWORD={secrets.token_hex(16)}",
                f"SKEWER_BIND_ADDRESS={address}",
                f"KAFKA_EXTERNAL_HOST={address}",
                f"WORKERS={WORKERS}",
                f"SOURCES={SOURCES}",
                f"RECORDS={RECORDS}",
                f"RATE={RATE}",
                "",
            ]
        )
    )
    stack = Stack(project, env_file, address, password, environment)
    outcome = StackOutcome(project)
    began = time.monotonic()
    import docker

    with contextlib.closing(docker.from_env(environment=environment)) as client:
        for line in sweep_dead_sessions(client):
            print(f"\nskewer tests: removed {line}")
    try:
        stack.must("build", timeout=BUILD_TIMEOUT, env={"DOCKER_BUILDKIT": "0"})
        outcome.seconds["build"] = time.monotonic() - began
        suffix = uuid.uuid4().hex[:6]
        for scheme in SCHEMES:
            started = time.monotonic()
            outcome.runs[scheme] = run_scheme(stack, scheme, f"compose-{scheme}-{suffix}")
            outcome.seconds[scheme] = time.monotonic() - started
        read_prometheus(stack, outcome)
    finally:
        started = time.monotonic()
        outcome.down = take_down(stack)
        outcome.seconds["down"] = time.monotonic() - started
        outcome.seconds["total"] = time.monotonic() - began
        runs = "; ".join(
            f"{run.scheme} {run.verification.result_records} records in "
            f"{run.verification.windows} windows, {run.verification.keys} keys, "
            + ("exact" if run.verification.exact else "NOT exact")
            for run in outcome.runs.values()
        )
        shown = ", ".join(f"{s} {t:.1f} s" for s, t in outcome.first_imbalance.items())
        print(
            f"\ncompose stack {project} on {address}: "
            + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in outcome.seconds.items())
            + (f"; {runs}" if runs else "")
            + (f"; imbalance panel's first point after up: {shown}" if shown else "")
        )
    yield outcome


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_count_is_exact_after_the_scheme_switch(stack: StackOutcome, scheme: str) -> None:
    """pkg, then mixed with a new RUN_ID on the running stack: each run exact (verify_run and
    ``skewer verify`` agree), with every record the producer was told to send, over at least
    two windows."""
    run = stack.runs[scheme]
    verification = run.verification
    assert verification.exact, "\n".join(verification.lines())
    assert verification.truth_records == verification.result_records == RECORDS
    assert verification.produced_records == RECORDS
    assert verification.windows >= 2 and verification.keys > 0
    assert run.cli_exit == 0, run.cli_report
    assert run.cli_report["exact"] is True
    assert run.cli_report["result_records"] == RECORDS


def test_prometheus_scrapes_every_skewer_service_and_records_the_imbalance(
    stack: StackOutcome,
) -> None:
    assert stack.targets == sorted(STAGES)
    assert {stage: stack.target_up.get(stage) for stage in STAGES} == dict.fromkeys(STAGES, 1.0)
    expected = {(name, run.run_id) for name in IMBALANCE_SERIES for run in stack.runs.values()}
    assert expected - stack.series == set()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_imbalance_panel_shows_a_point_soon_after_up(stack: StackOutcome, scheme: str) -> None:
    """The overview's imbalance panel has a point within :data:`FIRST_POINT_BOUND` s of the
    run's ``up``: cold for pkg (Kafka, Redis, Prometheus start too), skewer's services only for
    mixed."""
    seconds = stack.first_imbalance.get(scheme)
    assert seconds is not None, f"no point of {imbalance_panel_expression()} for {scheme}"
    print(f"\n{scheme}: the imbalance panel's first point {seconds:.1f} s after `up`")
    assert 0 < seconds < FIRST_POINT_BOUND


def test_down_leaves_nothing_of_the_project(stack: StackOutcome) -> None:
    assert stack.down is not None
    assert stack.down.code == 0, stack.down.stderr
    assert (stack.down.containers, stack.down.volumes, stack.down.networks) == ([], [], [])
