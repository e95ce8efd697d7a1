"""The stack's images, checked without a Docker daemon: the official images by default and the
local stand-ins through deploy/images/local.env, and deploy/Dockerfile (pinned base images,
COPY sources present and not excluded by .dockerignore, valid RUN steps, a non-root user,
``ENTRYPOINT ["skewer"]``, paths that agree with pipeline/io/config.py and the volumes).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess
import sys
import tomllib
from typing import Any

from compose_files import (
    DOCKERFILE,
    KAFKA_NODES,
    ROOT,
    SKEWER_COMMANDS,
    SPARK_SERVICES,
    TEST_SECRETS,
    DockerIgnore,
    copy_parts,
    dockerfile_arguments,
    dockerfile_stages,
    dockerignore,
    enabled_services,
    interpolate,
    service_mounts,
    stage_env,
    variable_uses,
)

from pipeline.io import config
from pipeline.services import docker_images

#: The project's own top-level packages.
PROJECT = ("pipeline", "operators", "producers", "bench")


# --- images: the official ones by default, local stand-ins through one env file -----------------

#: The variable each infrastructure service takes its image from.
IMAGE_VARIABLES = {
    "kafka": "KAFKA_IMAGE",
    "redis": "REDIS_IMAGE",
    "prometheus": "PROMETHEUS_IMAGE",
    "grafana": "GRAFANA_IMAGE",
}
#: deploy/Dockerfile's build arguments and the variable compose passes each from.
BUILD_ARGUMENTS = {"BASE_IMAGE": "SKEWER_BASE_IMAGE", "MAVEN_IMAGE": "SKEWER_MAVEN_IMAGE"}
LOCAL_ENV = ROOT / "deploy" / "images" / "local.env"


def test_image_names_are_variables_whose_defaults_are_the_official_images(
    raw: dict[str, Any],
) -> None:
    services = raw["services"]
    for name, variable in IMAGE_VARIABLES.items():
        [use] = variable_uses(services[name]["image"])
        assert (use.name, use.operator) == (variable, ":-"), name
        assert services[name]["image"] == f"${{{variable}:-{use.arg}}}", name
        assert not use.arg.startswith("skewer-local/"), f"{name}: the default is the official image"
    for name in KAFKA_NODES:
        assert services[name]["image"] == services["kafka"]["image"], name
    # The skewer build passes the Dockerfile's own defaults unless a variable says otherwise.
    defaults = dockerfile_arguments()
    assert set(defaults) == set(BUILD_ARGUMENTS)
    for name in [*SKEWER_COMMANDS, *SPARK_SERVICES]:
        assert services[name]["build"]["args"] == {
            argument: f"${{{variable}:-{defaults[argument]}}}"
            for argument, variable in BUILD_ARGUMENTS.items()
        }, name
    raw_froms = [
        line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")
    ]
    assert {"${BASE_IMAGE}", "${MAVEN_IMAGE}"} <= set(raw_froms)


def test_the_local_env_file_switches_every_image_grafana_aside(raw: dict[str, Any]) -> None:
    local = docker_images.read_env_file(LOCAL_ENV.read_text())
    assert set(local) == (set(IMAGE_VARIABLES.values()) - {"GRAFANA_IMAGE"}) | set(
        BUILD_ARGUMENTS.values()
    )
    switched = interpolate(raw, {**TEST_SECRETS, **local})
    official = interpolate(raw, TEST_SECRETS)
    for name, variable in IMAGE_VARIABLES.items():
        expected = local.get(variable, official["services"][name]["image"])
        assert switched["services"][name]["image"] == expected, name
    assert switched["services"]["grafana"]["image"].startswith("grafana/grafana:")
    for name in KAFKA_NODES:
        assert switched["services"][name]["image"] == local["KAFKA_IMAGE"], name
    # skewer's services keep their image name: the build arguments change what it is built on.
    for name in [*SKEWER_COMMANDS, *SPARK_SERVICES]:
        assert switched["services"][name]["image"] == official["services"][name]["image"], name
    build = switched["services"]["work"]["build"]["args"]
    assert build == {argument: local[variable] for argument, variable in BUILD_ARGUMENTS.items()}
    # The builder tags its images with exactly these names.
    tags = docker_images.local_tags(LOCAL_ENV)
    for image in docker_images.IMAGES:
        if image.variable:
            assert tags[image.name] == local[image.variable], image.name
    assert tags["skewer"] == official["services"]["work"]["image"]


def test_the_stack_without_grafana_is_two_services_and_what_they_need(
    compose: dict[str, Any],
) -> None:
    """Grafana has no local image: ``up prometheus producer`` starts the rest of the default
    stack, as compose also starts every service a named one depends on."""
    services = compose["services"]
    started, pending = set(), list(docker_images.STACK_WITHOUT_GRAFANA)
    while pending:
        name = pending.pop()
        if name not in started:
            started.add(name)
            pending += list(services[name].get("depends_on", {}))
    assert started == enabled_services(compose, set()) - {"grafana"}
    assert docker_images.COMPOSE_UP_LOCAL.endswith(
        "up -d " + " ".join(docker_images.STACK_WITHOUT_GRAFANA)
    )
    assert "--env-file .env --env-file deploy/images/local.env" in docker_images.COMPOSE_UP_LOCAL
    assert docker_images.COMPOSE_UP_LOCAL in (ROOT / "docs" / "compose.md").read_text()


# --- the Dockerfile -----------------------------------------------------------------------------


def test_dockerignore_semantics() -> None:
    ignore = DockerIgnore("**/__pycache__\n.cache\ntests\n!tests/keep.py\n")
    assert ignore.excludes("pipeline/__pycache__/config.cpython-311.pyc")
    assert ignore.excludes("__pycache__/x.pyc")
    assert ignore.excludes(".cache/spark-jars/kafka.jar")
    assert ignore.excludes("tests/compose/conftest.py") and not ignore.excludes("tests/keep.py")
    assert not ignore.excludes("pipeline/io/config.py")


def test_dockerfile_base_images_are_pinned() -> None:
    stages = dockerfile_stages()
    names = {stage.name for stage in stages}
    external = [stage.image for stage in stages if stage.image not in names]
    assert external
    for image in external:
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{image} has no tag"
        assert tag != "latest" and re.match(r"v?\d+(\.\d+)+", tag), f"{image}: pin a version"
    python_image = next(image for image in external if image.startswith("python:"))
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.search(r">=(\d+\.\d+)", requires)[1]
    assert python_image.startswith(f"python:{minor}."), (python_image, requires)
    assert sys.version.startswith(f"{minor}.")


def test_dockerfile_copies_existing_files_that_the_context_keeps() -> None:
    stages = dockerfile_stages()
    ignore = dockerignore()
    names = {stage.name for stage in stages}
    copied = set()
    for stage in stages:
        for arguments in stage.all("COPY") + stage.all("ADD"):
            flags, sources, _ = copy_parts(arguments)
            if "from" in flags:
                assert flags["from"] in names, f"COPY --from={flags['from']}: no such stage"
                continue
            # A glob is a source that may be absent (what this machine fetched already, in
            # .cache/); both builders refuse a COPY that matches nothing, so one must be there.
            optional = [source for source in sources if re.search(r"[*?\[]", source)]
            assert len(optional) < len(sources), f"COPY {arguments}: may match nothing"
            for source in sources:
                assert not ignore.excludes(source.replace("[", "").replace("]", "")), (
                    f"COPY {source}: excluded by .dockerignore"
                )
                if source in optional:
                    continue
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source.rstrip("/"))
    # Everything `pip install -e .` needs: the packages of pyproject.toml and its readme.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages | {"pyproject.toml", pyproject["project"]["readme"], "deploy"} <= copied


def _assert_project_names_resolve(program: str) -> None:
    """Every ``from pipeline|operators|producers... import NAME`` of ``program`` imports, and
    every ``NAME.attribute`` it uses of such a name exists."""
    imported: dict[str, object] = {}
    tree = ast.parse(program)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT:
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                imported[alias.asname or alias.name] = value
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            assert hasattr(imported[node.value.id], node.attr), f"{node.value.id}.{node.attr}"


def test_dockerfile_run_steps_are_valid_shell_and_python() -> None:
    """`sh -n` on every RUN; every inline `python -c` program compiles, and the project names
    it imports and uses exist (a module that moved breaks the image build otherwise)."""
    programs = 0
    for stage in dockerfile_stages():
        for run in stage.all("RUN"):
            check = subprocess.run(["sh", "-n", "-c", run], capture_output=True, text=True)
            assert check.returncode == 0, f"RUN {run}\n{check.stderr}"
            words = shlex.split(run.replace(";", " ; "))
            for index, word in enumerate(words[:-2]):
                if word.rpartition("/")[2] in ("python", "python3") and words[index + 1] == "-c":
                    compile(words[index + 2], "<RUN python -c>", "exec")
                    _assert_project_names_resolve(words[index + 2])
                    programs += 1
    assert programs == 3


def test_dockerfile_runs_as_a_non_root_user_with_skewer_as_entrypoint() -> None:
    final = dockerfile_stages()[-1]
    users = final.all("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json.loads(final.all("ENTRYPOINT")[-1]) == ["skewer"]
    last_user = max(i for i, step in enumerate(final.instructions) if step.keyword == "USER")
    assert all(step.keyword != "RUN" for step in final.instructions[last_user:])


def test_dockerfile_paths_agree_with_the_config_and_the_volumes(compose: dict[str, Any]) -> None:
    stages = dockerfile_stages()
    env = stage_env(stages, len(stages) - 1)
    settings = config.load({config.ENV_CACHE_DIR: env[config.ENV_CACHE_DIR]})
    final = stages[-1]
    copies = [copy_parts(arguments) for arguments in final.all("COPY")]
    jar_targets = [target for flags, _, target in copies if flags.get("from") == "spark-jars"]
    # Spark's Kafka source, then skewer's own jars (jvm/), each with its marker, where the
    # config looks for them.
    assert jar_targets == [
        str(settings.spark_jars_dir),
        str(settings.executor_warmup_jar.parent),
        str(settings.realtime_writer_jar.parent),
    ]
    # The jar stage fetches with the project's own code, which writes the marker that makes
    # `skewer work` use the jars without Maven (pipeline.io.artifacts._maven_copy).
    jar_stage = next(stage for stage in stages if stage.name == "spark-jars")
    assert any("artifacts.ensure_spark_jars()" in run for run in jar_stage.all("RUN"))
    assert any("artifacts.ensure_executor_warmup()" in run for run in jar_stage.all("RUN"))
    assert stage_env(stages, stages.index(jar_stage))[config.ENV_CACHE_DIR] == str(
        settings.cache_dir
    )
    # Spark's checkpoints (work.py's default place) are on the named volume.
    work_mounts = dict(service_mounts(compose["services"]["work"]))
    assert work_mounts["checkpoints"] == str(settings.cache_dir / "checkpoints")
    # Editable install in place: config.PROJECT_ROOT (and so DEPLOY_DIR) is the WORKDIR.
    assert "/opt/venv/bin/pip install --no-deps -e ." in " ".join(final.all("RUN"))
    workdirs = final.all("WORKDIR")
    assert workdirs[0] == "/opt/skewer"
    # The pins live in pyproject.toml only.
    assert "==" not in DOCKERFILE.read_text()
