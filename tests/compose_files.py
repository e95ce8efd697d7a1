"""The compose stack's files as data, for tests/compose/ and
tests/unit/test_docker_images.py (no Docker daemon needed).

docker-compose.yml interpolated the way compose does it (``${VAR:-default}``,
``${VAR:?error}``, ``$$``; :func:`interpolate`), the names the tests share, and deploy/Dockerfile
and .dockerignore parsed with Docker's meaning (:func:`dockerfile_stages`, :class:`DockerIgnore`).

>>> interpolate("${A:-x}-${B:?B is required}-$$HOME", {"B": "b"})
'x-b-$HOME'
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.io import config

ROOT = config.PROJECT_ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"

INFRASTRUCTURE = {"kafka", "redis", "prometheus", "grafana"}
#: The services of each profile; every other service has none (``docker compose up`` runs it).
PROFILES = {
    "spark-cluster": {"spark-master", "spark-worker"},
    "kafka-cluster": {"kafka-1", "kafka-2", "kafka-3"},
}
SPARK_SERVICES = PROFILES["spark-cluster"]
KAFKA_NODES = {f"kafka-{node}": node for node in (1, 2, 3)}
#: skewer's own services and the ``skewer`` subcommand each runs.
SKEWER_COMMANDS = {
    "group": "group",
    "work": "work",
    "aggregate": "aggregate",
    "control": "control",
    "producer": "produce",
}
#: Variables compose must refuse to start without (``${VAR:?message}``, no default).
REQUIRED_SECRETS = {"REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD"}
#: Values the tests give the required secrets.
TEST_SECRETS = {"REDIS_PASSWORD": "redis-test-password", "GRAFANA_ADMIN_PASSWORD": "grafana-test"}
METRICS_PORT = 9464


# --- compose's variable interpolation ---------------------------------------------------------

VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<operator>:?[-?+])(?P<arg>.*))?")


class MissingVariableError(Exception):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is unset: compose refuses."""


@dataclass(frozen=True)
class VariableUse:
    name: str
    operator: str  # "", "-", ":-", "?", ":?", "+", ":+"
    arg: str


def variable_uses(text: str) -> list[VariableUse]:
    uses = []
    for match in VARIABLE.finditer(text):
        if match["named"]:
            uses.append(VariableUse(match["named"], "", ""))
        elif match["braced"] is not None:
            parts = _BRACED.fullmatch(match["braced"])
            assert parts, f"invalid interpolation ${{{match['braced']}}} in {text!r}"
            uses.append(VariableUse(parts["name"], parts["operator"] or "", parts["arg"] or ""))
    return uses


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    if match["escaped"]:
        return "$"
    if match["named"]:
        return env.get(match["named"], "")
    [use] = variable_uses(match[0])
    value = env.get(use.name)
    empty = value is None or (value == "" and use.operator.startswith(":"))
    if use.operator.endswith("-"):
        return use.arg if empty else str(value)
    if use.operator.endswith("?"):
        if empty:
            raise MissingVariableError(f"{use.name}: {use.arg}")
        return str(value)
    if use.operator.endswith("+"):
        return "" if empty else use.arg
    return value or ""


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """``node`` with every string interpolated as compose does (values, not keys)."""
    if isinstance(node, str):
        return VARIABLE.sub(lambda match: _substitute(match, env), node)
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    return node


def strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, value) of every string value in a parsed YAML document."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from strings(item, f"{path}[{index}]")


def variable_defaults(variables: dict[str, list[VariableUse]]) -> dict[str, str]:
    return {
        name: uses[0].arg for name, uses in variables.items() if uses[0].operator in (":-", "-")
    }


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port of an interpolated service."""
    mapping = {}
    for entry in service.get("ports", []):
        address, host, container = str(entry).split(":")
        assert address == "127.0.0.1", f"{entry!r}: published beyond loopback by default"
        mapping[int(container)] = int(host)
    return mapping


def service_profiles(service: dict[str, Any]) -> set[str]:
    return set(service.get("profiles", []))


def enabled_services(compose: dict[str, Any], active: set[str]) -> set[str]:
    """The services compose runs with the profiles ``active`` (those of no profile always)."""
    return {
        name
        for name, service in compose["services"].items()
        if not service_profiles(service) or service_profiles(service) & active
    }


def service_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    return [tuple(str(volume).split(":")[:2]) for volume in service.get("volumes", [])]


# --- the Dockerfile and .dockerignore -------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    arguments: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]


def dockerfile_arguments() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` lines before its first FROM: the images its
    stages start from (a FROM names them as ``${NAME}``)."""
    arguments = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM "):
            break
        if line.startswith("ARG "):
            name, _, default = line.removeprefix("ARG ").strip().partition("=")
            arguments[name] = default
    return arguments


def dockerfile_lines(path: Path = DOCKERFILE) -> list[str]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, f"{path} ends inside a continued line"
    return lines


def dockerfile_stages() -> list[Stage]:
    """The stages, their base images with the build arguments' defaults (the official images)."""
    stages: list[Stage] = []
    for text in dockerfile_lines():
        keyword, _, arguments = text.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            continue  # the base images' arguments (dockerfile_arguments)
        if keyword == "FROM":
            words = VARIABLE.sub(
                lambda match: dockerfile_arguments()[match["braced"] or match["named"]],
                arguments,
            ).split()
            assert len(words) in (1, 3), f"FROM {arguments}"
            stages.append(Stage(words[0], words[2] if len(words) == 3 else None))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append(Instruction(keyword, arguments.strip()))
    return stages


def copy_parts(arguments: str) -> tuple[dict[str, str], list[str], str]:
    words = shlex.split(arguments)
    flags = dict(word[2:].split("=", 1) for word in words if word.startswith("--"))
    paths = [word for word in words if not word.startswith("--")]
    return flags, paths[:-1], paths[-1]


def stage_env(stages: list[Stage], upto: int) -> dict[str, str]:
    """The ENV in force in stage ``upto`` (inherited through ``FROM <stage>``)."""
    names = {stage.name: index for index, stage in enumerate(stages)}
    chain, index = [], upto
    while index is not None:
        chain.append(stages[index])
        index = names.get(stages[index].image)
    env: dict[str, str] = {}
    for stage in reversed(chain):
        for arguments in stage.all("ENV"):
            for word in shlex.split(arguments):
                key, _, value = word.partition("=")
                env[key] = value
    return env


class DockerIgnore:
    """.dockerignore's patterns with Docker's meaning: the last matching pattern wins, ``!``
    re-includes, ``**`` spans folders, and a pattern matching a folder covers its contents."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            regex = ""
            for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
                regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                    part, re.escape(part)
                )
            self.rules.append((include, re.compile(regex)))

    def excludes(self, path: str) -> bool:
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[: index + 1]) for index in range(len(parts))]
        excluded = False
        for include, regex in self.rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                excluded = not include
        return excluded


def dockerignore() -> DockerIgnore:
    return DockerIgnore(DOCKERIGNORE.read_text())
