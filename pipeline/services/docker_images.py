"""Images without a registry: skewer's own image, and stand-ins for the official Kafka, Redis
and Prometheus images on a Debian base of our own. (layer: services)

``skewer images build --local`` builds, with the Docker engine of ``DOCKER_HOST``, images from
the same software the native services run, for a machine that reaches Debian's mirror, PyPI
and Maven Central but no image registry (docs/compose.md):

- ``skewer-local/debian:bookworm``, from ``debootstrap`` (:mod:`pipeline.services.debian_base`),
  kept when it exists (``--rebuild`` makes it and every image on it again);
- on it, from deploy/images/NAME/Dockerfile: ``python`` and ``maven`` (deploy/Dockerfile's
  ``BASE_IMAGE`` and ``MAVEN_IMAGE``), ``kafka`` (the cached jars of deploy/kafka/pom.xml),
  ``redis`` and ``prometheus`` (Debian's packages);
- ``skewer:local`` from deploy/Dockerfile on those two, with Spark's Kafka jars as this machine
  fetched them (:meth:`Builder.prefetch_for_skewer`).

Their names are deploy/images/local.env's (:data:`LOCAL_ENV`), the variables docker-compose.yml
takes its images from. Each build logs to ``.cache/run/images/NAME.log``; a failure is one line
(:class:`ImageError`). Without ``--local`` only ``skewer:local`` is built, on official images.

Example (no engine needed):
    >>> [image.name for image in build_order(["skewer"])]
    ['debian', 'python', 'maven', 'skewer']
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import config
from pipeline.io.artifacts import ArtifactError, ensure_kafka_libs, ensure_spark_jars
from pipeline.io.config import Settings
from pipeline.io.probes import docker_answers
from pipeline.services import docker_engine
from pipeline.services.debian_base import (
    SUITE,
    ImageError,
    add_local_certificates,
    debootstrap_command,
    host_mirrors,
    image_apt_sources,
    read_host_sources,
    remove_tree,
    trim_rootfs,
    unmount_all,
)
from pipeline.services.native import last_log_line

#: Spark's Kafka jars as ``make install`` fetched them: skewer's image takes them from its build
#: context instead of fetching them again (deploy/Dockerfile; .dockerignore lets them in).
PREFETCHED_SPARK_JARS = config.PROJECT_ROOT / ".cache" / "spark-jars"
#: The Debian base every local image builds on (the ``BASE_IMAGE`` default of their Dockerfiles).
BASE_IMAGE = f"skewer-local/debian:{SUITE}"
#: Compose's name of skewer's own image (docker-compose.yml's ``image:`` of its services).
SKEWER_IMAGE = "skewer:local"
IMAGES_DIR = config.DEPLOY_DIR / "images"
#: The env file that points docker-compose.yml's image variables at the local builds.
LOCAL_ENV = IMAGES_DIR / "local.env"
#: The services compose is asked for when Grafana, which has no local image, must stay down:
#: what they depend on is the rest of the default stack.
STACK_WITHOUT_GRAFANA = ("prometheus", "producer")
#: The stack on the local images (compose reads .env only when no --env-file is given).
COMPOSE_UP_LOCAL = (
    "docker compose --env-file .env --env-file deploy/images/local.env up -d "
    + " ".join(STACK_WITHOUT_GRAFANA)
)

# --------------------------------------------------------------------------------------------
# The images


def read_env_file(text: str) -> dict[str, str]:
    """``NAME=value`` lines of an env file as compose reads them (no quotes here); comments
    and blank lines skipped.

    >>> read_env_file("# images\\nKAFKA_IMAGE=skewer-local/kafka:4.3.1\\n\\nA=b=c\\n")
    {'KAFKA_IMAGE': 'skewer-local/kafka:4.3.1', 'A': 'b=c'}
    """
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


@dataclass(frozen=True)
class Image:
    """One image ``skewer images build`` makes."""

    name: str
    #: deploy/images/local.env's variable that names it; None: a fixed name (the base, skewer).
    variable: str | None
    #: The images its build uses, built before it.
    needs: tuple[str, ...] = ()

    @property
    def dockerfile(self) -> Path:
        if self.name == "skewer":
            return config.DEPLOY_DIR / "Dockerfile"
        return IMAGES_DIR / self.name / "Dockerfile"


#: Every image, in build order (what an image needs comes before it).
IMAGES = (
    Image("debian", None),
    Image("python", "SKEWER_BASE_IMAGE", ("debian",)),
    Image("maven", "SKEWER_MAVEN_IMAGE", ("debian",)),
    Image("kafka", "KAFKA_IMAGE", ("debian",)),
    Image("redis", "REDIS_IMAGE", ("debian",)),
    Image("prometheus", "PROMETHEUS_IMAGE", ("debian",)),
    Image("skewer", None, ("python", "maven")),
)
IMAGE_NAMES = tuple(image.name for image in IMAGES)
_BY_NAME = {image.name: image for image in IMAGES}


def build_order(names: Sequence[str]) -> list[Image]:
    """The images to build for ``names`` (all when empty), with what they need, in order.

    >>> [image.name for image in build_order(["kafka", "redis"])]
    ['debian', 'kafka', 'redis']
    >>> build_order(["grafana"])
    Traceback (most recent call last):
    ...
    pipeline.services.debian_base.ImageError: no image grafana; the images are debian, ...
    """
    unknown = [name for name in names if name not in _BY_NAME]
    if unknown:
        raise ImageError(f"no image {', '.join(unknown)}; the images are {', '.join(IMAGE_NAMES)}")
    wanted = set(names or IMAGE_NAMES)
    for image in reversed(IMAGES):  # needs point backwards: one pass adds them all
        if image.name in wanted:
            wanted.update(image.needs)
    return [image for image in IMAGES if image.name in wanted]


def local_tags(env_file: Path = LOCAL_ENV) -> dict[str, str]:
    """Image name -> its local tag: the base's and skewer's fixed names, the others from
    ``env_file`` (an ImageError names a variable it lacks)."""
    values = read_env_file(env_file.read_text())
    tags = {"debian": BASE_IMAGE, "skewer": SKEWER_IMAGE}
    for image in IMAGES:
        if image.variable is not None:
            if not values.get(image.variable):
                raise ImageError(f"{env_file} does not set {image.variable}")
            tags[image.name] = values[image.variable]
    return tags


def build_arguments(image: Image, tags: Mapping[str, str]) -> dict[str, str]:
    """``--build-arg``s of ``image``'s local build: its base, and skewer's two stand-ins.

    >>> tags = {"debian": "d", "python": "p", "maven": "m"}
    >>> build_arguments(_BY_NAME["redis"], tags)
    {'BASE_IMAGE': 'd'}
    >>> build_arguments(_BY_NAME["skewer"], tags)
    {'BASE_IMAGE': 'p', 'MAVEN_IMAGE': 'm'}
    """
    if image.name == "skewer":
        return {"BASE_IMAGE": tags["python"], "MAVEN_IMAGE": tags["maven"]}
    return {"BASE_IMAGE": tags["debian"]}


def build_command(
    docker: str, tag: str, dockerfile: Path, context: Path, arguments: Mapping[str, str]
) -> list[str]:
    """``docker build`` of one image; a failed step leaves no container behind.

    >>> " ".join(build_command("docker", "r:1", Path("/d/Dockerfile"), Path("/c"), {"A": "b"}))
    'docker build --force-rm --tag r:1 --file /d/Dockerfile --build-arg A=b /c'
    """
    words = [docker, "build", "--force-rm", "--tag", tag, "--file", str(dockerfile)]
    for name, value in arguments.items():
        words += ["--build-arg", f"{name}={value}"]
    return [*words, str(context)]


def human_size(size: int) -> str:
    """Bytes as ``docker images`` shows them (decimal units).

    >>> human_size(81_234_567), human_size(1_234_567_890), human_size(999)
    ('81.2 MB', '1.23 GB', '999 B')
    """
    if size >= 1e9:
        return f"{size / 1e9:.3g} GB"
    if size >= 1e6:
        return f"{size / 1e6:.1f} MB"
    if size >= 1e3:
        return f"{size / 1e3:.1f} kB"
    return f"{size} B"


def human_duration(seconds: float) -> str:
    """A build's duration.

    >>> human_duration(4.26), human_duration(754)
    ('4.3 s', '12m34s')
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


@dataclass(frozen=True)
class Built:
    """What became of one image: ``built`` (in ``seconds``), ``unchanged`` (every step was in
    Docker's build cache) or ``kept`` (the base, present)."""

    name: str
    tag: str
    action: str
    seconds: float
    size: int

    def line(self) -> str:
        """One line: name, tag, what was done and how long it took, size.

        >>> Built("redis", "skewer-local/redis:bookworm", "unchanged", 0.2, 88_800_000).line()
        'redis      skewer-local/redis:bookworm         unchanged in 0.2 s  88.8 MB'
        """
        done = (
            "kept" if self.action == "kept" else f"{self.action} in {human_duration(self.seconds)}"
        )
        return f"{self.name:<11}{self.tag:<36}{done:<20}{human_size(self.size)}"


# --------------------------------------------------------------------------------------------
# Building them


class Builder:
    """Builds the images with the engine of ``settings.docker_socket``; ``report`` gets one
    line per image as it is done."""

    def __init__(self, settings: Settings, report: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.report = report
        self.env = {
            **docker_engine.client_environment(settings),
            # The classic builder: Debian's engine and CLI have no buildx plugin.
            "DOCKER_BUILDKIT": "0",
        }
        docker = docker_engine.find_binary("docker")
        if docker is None:
            raise ImageError(
                "the docker command is missing; `skewer services up docker` installs Debian's "
                f"{docker_engine.ENGINE_PACKAGE}"
            )
        self.docker = docker

    @property
    def work_dir(self) -> Path:
        """Build logs, the Kafka image's context, the base's tree while it is made."""
        return self.settings.run_dir / "images"

    def log_path(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    def require_engine(self) -> None:
        socket = self.settings.docker_socket
        if not docker_answers(socket, 5.0):
            raise ImageError(
                f"no Docker engine answers on unix://{socket}; start one with `skewer services "
                f"up docker` (as root), or set {config.ENV_DOCKER_HOST} to an engine's socket"
            )

    def _docker(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.docker, *arguments], capture_output=True, text=True, env=self.env, check=False
        )

    def inspect(self, tag: str) -> tuple[str, int] | None:
        """The image's id and size in bytes, None if the engine has no image of that name."""
        result = self._docker("image", "inspect", "--format", "{{.Id}} {{.Size}}", tag)
        if result.returncode != 0:
            return None
        image_id, size = result.stdout.split()
        return image_id, int(size)

    def _run(self, name: str, command: list[str]) -> None:
        log = self.log_path(name)
        if not docker_engine.run_logged(command, log, self.env):
            ends = last_log_line(log)
            raise ImageError(f"{name} failed to build; see {log}; its log ends: {ends}")

    def build_base(self, tag: str, rebuild: bool) -> str:
        """The Debian base: debootstrap, then ``docker import``; "kept" if it exists."""
        if not rebuild and self.inspect(tag) is not None:
            return "kept"
        if os.geteuid() != 0:
            raise ImageError(
                "the Debian base is built with debootstrap, which needs root; run this as root"
            )
        log = self.log_path("debian")
        log.unlink(missing_ok=True)
        if docker_engine.find_binary("debootstrap") is None:
            script = config.DEPLOY_DIR / "install-system.sh"
            docker_engine.run_logged(["bash", str(script), "debootstrap=debootstrap"], log)
            if docker_engine.find_binary("debootstrap") is None:
                raise ImageError(f"could not install Debian's debootstrap; see {log}")
        archive, security = host_mirrors(read_host_sources())
        rootfs = self.work_dir / "debian-rootfs"
        cache = self.settings.cache_dir / "debootstrap"
        cache.mkdir(parents=True, exist_ok=True)
        remove_tree(rootfs)
        try:
            self._run("debian", debootstrap_command(rootfs, archive, cache))
            unmount_all(rootfs)  # nothing of the host's may go into the image
            overlay = IMAGES_DIR / "debian" / "rootfs"
            trim_rootfs(rootfs, overlay, image_apt_sources(archive, security))
            add_local_certificates(rootfs)
            self._import(rootfs, tag, archive)
        finally:
            remove_tree(rootfs)
        return "built"

    def _import(self, rootfs: Path, tag: str, mirror: str) -> None:
        """``tar -C ROOTFS -c . | docker import - TAG``, with bash as the default command."""
        log = self.log_path("debian")
        tar = ["tar", "-C", str(rootfs), "--numeric-owner", "--one-file-system", "-c", "."]
        importer = [
            self.docker,
            "import",
            "--change",
            'CMD ["bash"]',
            "--message",
            f"debootstrap --variant=minbase {SUITE} {mirror}",
            "-",
            tag,
        ]
        with open(log, "a") as output:
            output.write(f"\n=== skewer: {' '.join(tar)} | {' '.join(importer)}\n")
            output.flush()
            packer = subprocess.Popen(tar, stdout=subprocess.PIPE, stderr=output)
            imported = subprocess.run(
                importer, stdin=packer.stdout, stdout=output, stderr=output, env=self.env
            )
            assert packer.stdout is not None
            packer.stdout.close()
            packed = packer.wait()
        if packed != 0 or imported.returncode != 0:
            ends = last_log_line(log)
            raise ImageError(f"debian failed to import; see {log}; its log ends: {ends}")

    def kafka_context(self) -> Path:
        """The Kafka image's build context: deploy/images/kafka/, deploy/kafka/log4j2.properties
        and ``libs/``, the broker's classpath from the cache (hard links where possible)."""
        try:
            libs = ensure_kafka_libs(self.settings)
        except ArtifactError as error:
            raise ImageError(str(error)) from None
        context = self.work_dir / "kafka-context"
        shutil.rmtree(context, ignore_errors=True)
        shutil.copytree(IMAGES_DIR / "kafka", context)
        shutil.copy2(config.DEPLOY_DIR / "kafka" / "log4j2.properties", context)
        (context / "libs").mkdir()
        for jar in sorted(libs.glob("*.jar")):
            try:
                os.link(jar, context / "libs" / jar.name)
            except OSError:
                shutil.copy2(jar, context / "libs" / jar.name)
        return context

    def prefetch_for_skewer(self) -> None:
        """Spark's Kafka jars in skewer's build context (the cache ``make install`` filled, with
        the marker that tells the image's build they are complete), fetched first if missing.
        Nothing when the cache is elsewhere (``SKEWER_CACHE_DIR``): the build fetches them."""
        if self.settings.spark_jars_dir != PREFETCHED_SPARK_JARS:
            return
        try:
            ensure_spark_jars(self.settings)
        except ArtifactError as error:
            raise ImageError(str(error)) from None

    def build_image(
        self, image: Image, tags: Mapping[str, str], arguments: Mapping[str, str]
    ) -> None:
        """``docker build`` of ``image`` as ``tags[image.name]`` with ``arguments``."""
        if image.name == "kafka":
            context = self.kafka_context()
        elif image.name == "skewer":
            self.prefetch_for_skewer()
            context = config.PROJECT_ROOT
        else:
            context = image.dockerfile.parent
        command = build_command(
            self.docker,
            tags[image.name],
            image.dockerfile,
            context,
            arguments,
        )
        self.log_path(image.name).unlink(missing_ok=True)
        self._run(image.name, command)

    def build(
        self, names: Sequence[str] = (), *, local: bool = True, rebuild: bool = False
    ) -> list[Built]:
        """Build ``names`` (every image when empty) and what they need; without ``local``,
        only skewer's image from the official images of deploy/Dockerfile's defaults."""
        if not local:
            if set(names) - {"skewer"}:
                raise ImageError("without --local only skewer's own image is built (`skewer`)")
            order = [_BY_NAME["skewer"]]
            tags = {"skewer": SKEWER_IMAGE}
        else:
            order = build_order(names)
            tags = local_tags()
        self.require_engine()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        done = []
        for image in order:
            started = time.monotonic()
            tag = tags[image.name]
            before = self.inspect(tag)
            if image.name == "debian":
                action = self.build_base(tag, rebuild)
            else:
                self.build_image(image, tags, build_arguments(image, tags) if local else {})
                action = "built"
            after = self.inspect(tag)
            if action == "built" and before is not None and after == before:
                action = "unchanged"
            size = after[1] if after else 0
            result = Built(image.name, tag, action, time.monotonic() - started, size)
            self.report(result.line())
            done.append(result)
        return done
