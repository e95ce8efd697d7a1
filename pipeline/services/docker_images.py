"""Images without a registry: a Debian base from ``debootstrap``, and on it skewer's own image
and stand-ins for the official Kafka, Redis and Prometheus images. (layer: services)

``skewer images build --local`` builds, with the Docker engine of ``DOCKER_HOST`` (the one
``skewer services up docker`` runs), images from the same software the native services run,
for a machine that reaches Debian's mirror, PyPI and Maven Central but no image registry:

- ``skewer-local/debian:bookworm``: ``debootstrap --variant=minbase`` of Debian bookworm from
  the mirror apt uses here (:func:`host_mirrors`), with deploy/images/debian/rootfs/ laid over
  it (no daemons started by package scripts, no apt caches or manuals in layers) and this
  machine's own CA certificates (:func:`add_local_certificates`), put in by ``docker
  import``. Skipped when the image exists (``--rebuild`` makes it again, and with it every
  image on it);
- on that base, from deploy/images/NAME/Dockerfile: ``python`` (bookworm's Python 3.11) and
  ``maven`` (bookworm's Maven), the stand-ins deploy/Dockerfile takes as ``BASE_IMAGE`` and
  ``MAVEN_IMAGE``; ``kafka`` (the jars of deploy/kafka/pom.xml, from the cache
  ``skewer services install`` fills, configured by apache/kafka's variables); ``redis`` and
  ``prometheus`` (Debian's packages, run with compose's commands);
- ``skewer:local``, compose's image of skewer's services, from deploy/Dockerfile with the
  ``python`` and ``maven`` stand-ins as its build arguments, and in its context Spark's Kafka
  jars as this machine fetched them (:meth:`Builder.prefetch_for_skewer`), not fetched twice.

Their names are deploy/images/local.env's (:data:`LOCAL_ENV`): the variables
docker-compose.yml takes its image names from, so ``docker compose --env-file .env --env-file
deploy/images/local.env up`` runs the stand-ins. Each build's output goes to
``.cache/run/images/NAME.log``; a failure is one line naming it (:class:`ImageError`).
Without ``--local`` only ``skewer:local`` is built, from the official images (pulled).

Example (no engine needed):
    >>> sources = parse_apt_sources("deb [arch=amd64] http://mirror.example/debian bookworm main")
    >>> host_mirrors(sources)
    ('http://mirror.example/debian', 'http://deb.debian.org/debian-security')
    >>> [image.name for image in build_order(["skewer"])]
    ['debian', 'python', 'maven', 'skewer']
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import config
from pipeline.io.artifacts import ArtifactError, ensure_kafka_libs, ensure_spark_jars
from pipeline.io.config import Settings
from pipeline.io.probes import docker_answers
from pipeline.services import docker_engine
from pipeline.services.native import last_log_line

#: The Debian release of every image (the native services' packages are bookworm's too).
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
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
#: The archive key debootstrap checks the mirror's signatures with (Debian's own, on any Debian).
ARCHIVE_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
#: Certificate authorities this machine's administrator added (Debian's place for them): the
#: base takes them along, so that builds trust what the host trusts (a TLS-inspecting proxy).
LOCAL_CERTIFICATES = Path("/usr/local/share/ca-certificates")
#: The URL schemes of a mirror debootstrap can use.
_MIRROR_SCHEMES = ("http://", "https://", "file:/")
#: What of the debootstrapped tree no image needs: manuals, translations (glibc's locale.alias
#: stays) and documentation (the licences stay); the base's dpkg excludes keep the packages
#: images install later from adding them (deploy/images/debian/rootfs/etc/dpkg/dpkg.cfg.d/).
_TRIMMED = ("usr/share/man", "usr/share/info", "usr/share/lintian")
_KEPT = {"usr/share/doc": "copyright", "usr/share/locale": "locale.alias"}


class ImageError(Exception):
    """An image could not be built, or no engine answers; the message is one line."""


# --------------------------------------------------------------------------------------------
# The mirror apt uses


@dataclass(frozen=True)
class AptSource:
    """One entry of apt's sources: a ``deb`` line, or a deb822 stanza of ``.sources``."""

    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]


def _one_line_sources(text: str) -> list[AptSource]:
    sources = []
    for line in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0])  # comments, [options]
        words = line.split()
        if len(words) >= 3:
            sources.append(AptSource((words[0],), (words[1],), (words[2],)))
    return sources


def _deb822_sources(text: str) -> list[AptSource]:
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        name = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and name is not None:  # a continuation line
                fields[name] += " " + line.strip()
            elif ":" in line:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                fields[name] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if {"types", "uris", "suites"} <= set(fields):
            sources.append(
                AptSource(
                    tuple(fields["types"].split()),
                    tuple(fields["uris"].split()),
                    tuple(fields["suites"].split()),
                )
            )
    return sources


def parse_apt_sources(text: str, *, deb822: bool = False) -> list[AptSource]:
    """The entries of one apt sources file: one-line ``sources.list`` syntax, or deb822 (a
    ``.sources`` file) when ``deb822``. Comments, options and disabled stanzas are skipped.

    >>> parse_apt_sources("deb http://d.example/debian bookworm main # the main archive")
    [AptSource(types=('deb',), uris=('http://d.example/debian',), suites=('bookworm',))]
    >>> parse_apt_sources("Types: deb\\nURIs: http://a/ http://b/\\nSuites: bookworm\\n"
    ...                   "Components: main\\n", deb822=True)[0].uris
    ('http://a/', 'http://b/')
    """
    return _deb822_sources(text) if deb822 else _one_line_sources(text)


def read_host_sources(apt_dir: Path = Path("/etc/apt")) -> list[AptSource]:
    """apt's sources on this machine: ``sources.list``, then ``sources.list.d/*.list`` and
    ``*.sources`` in name order (apt's own order). Unreadable files count as empty."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    sources = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        sources += parse_apt_sources(text, deb822=path.suffix == ".sources")
    return sources


def _first_uri(sources: Iterable[AptSource], suite: str) -> str | None:
    for source in sources:
        if "deb" not in source.types or suite not in source.suites:
            continue
        for uri in source.uris:
            if uri.startswith(_MIRROR_SCHEMES):
                return uri.rstrip("/")
    return None


def host_mirrors(sources: Iterable[AptSource], suite: str = SUITE) -> tuple[str, str]:
    """(archive, security archive) of ``suite`` in apt's ``sources``: the first ``deb`` entry
    of ``suite`` (``suite-security``) with an http(s) or file URI, else Debian's own.

    >>> entries = parse_apt_sources(
    ...     "Types: deb\\nURIs: http://m.example/debian/\\nSuites: bookworm bookworm-updates\\n\\n"
    ...     "Types: deb\\nURIs: http://m.example/debian-security\\nSuites: bookworm-security\\n",
    ...     deb822=True)
    >>> host_mirrors(entries)
    ('http://m.example/debian', 'http://m.example/debian-security')
    >>> host_mirrors(parse_apt_sources("deb http://archive.ubuntu.com/ubuntu noble main"))
    ('http://deb.debian.org/debian', 'http://deb.debian.org/debian-security')
    """
    sources = list(sources)
    archive = _first_uri(sources, suite) or DEFAULT_MIRROR
    security = _first_uri(sources, f"{suite}-security") or DEFAULT_SECURITY_MIRROR
    return archive, security


def image_apt_sources(archive: str, security: str, suite: str = SUITE) -> str:
    """The base image's ``/etc/apt/sources.list.d/debian.sources``: the release, its updates
    and its security archive, as Debian's own images list them, from the host's mirrors.

    >>> print(image_apt_sources("http://m/debian", "http://m/debian-security"))
    Types: deb
    URIs: http://m/debian
    Suites: bookworm bookworm-updates
    Components: main
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
    <BLANKLINE>
    Types: deb
    URIs: http://m/debian-security
    Suites: bookworm-security
    Components: main
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
    <BLANKLINE>
    """
    stanzas = [(archive, f"{suite} {suite}-updates"), (security, f"{suite}-security")]
    return "\n".join(
        f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: main\n"
        f"Signed-By: {ARCHIVE_KEYRING}\n"
        for uri, suites in stanzas
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
    pipeline.services.docker_images.ImageError: no image grafana; the images are debian, ...
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


def debootstrap_command(rootfs: Path, mirror: str, cache: Path, suite: str = SUITE) -> list[str]:
    """The base's ``debootstrap``: the smallest system with apt (minbase), its packages kept in
    ``cache`` for a later ``--rebuild``.

    >>> " ".join(debootstrap_command(Path("/r"), "http://m/debian", Path("/c")))
    'debootstrap --variant=minbase --cache-dir=/c --keyring=... bookworm /r http://m/debian'
    """
    return [
        "debootstrap",
        "--variant=minbase",
        f"--cache-dir={cache}",
        f"--keyring={ARCHIVE_KEYRING}",
        suite,
        str(rootfs),
        mirror,
    ]


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


def _mounts_under(folder: Path) -> list[Path]:
    """Mount points at or under ``folder``, deepest first."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = Path(line.split()[1].replace("\\040", " "))
        if point == folder or folder in point.parents:
            mounts.append(point)
    return sorted(mounts, key=lambda point: len(point.parts), reverse=True)


def unmount_all(folder: Path) -> None:
    """Unmount whatever is mounted at or under ``folder`` (debootstrap mounts ``/proc`` and
    ``/sys`` in its tree and may leave them when it fails); an ImageError if a mount stays."""
    for mount in _mounts_under(folder):
        docker_engine.unmount(mount)
    left = _mounts_under(folder)
    if left:
        raise ImageError(f"{left[0]} is still mounted; unmount it and build again")


def remove_tree(folder: Path) -> None:
    """Remove a debootstrapped tree: its mounts first, then its files, never crossing into
    another file system (``rm --one-file-system``)."""
    if not folder.exists():
        return
    unmount_all(folder)
    subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=True)


def trim_rootfs(rootfs: Path, overlay: Path, sources: str) -> None:
    """Make a debootstrapped tree the base image: lay ``overlay`` over it, write apt's
    ``sources`` (deb822) in place of debootstrap's ``sources.list``, and take out what no
    image needs: manuals, translations, documentation (the licences stay), apt's lists and
    caches, the install logs.
    """
    if overlay.is_dir():
        shutil.copytree(overlay, rootfs, symlinks=True, dirs_exist_ok=True)
    apt = rootfs / "etc" / "apt"
    (apt / "sources.list").unlink(missing_ok=True)
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list.d" / "debian.sources").write_text(sources)
    for folder in _TRIMMED:
        shutil.rmtree(rootfs / folder, ignore_errors=True)
    for folder, kept in _KEPT.items():
        top = rootfs / folder
        paths = top.rglob("*") if top.is_dir() else ()
        for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):  # children first
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path.name != kept:
                path.unlink()
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb"):
        for path in rootfs.glob(pattern):
            if path.is_file():
                path.unlink()
    for log in ("var/log/dpkg.log", "var/log/bootstrap.log", "var/log/alternatives.log"):
        (rootfs / log).unlink(missing_ok=True)


def add_local_certificates(rootfs: Path, source: Path = LOCAL_CERTIFICATES) -> list[str]:
    """Copy the host's own CA certificates (``*.crt`` of ``source``) to the same place in
    ``rootfs``; an image that installs ``ca-certificates`` then trusts them too (its
    post-install adds them to /etc/ssl/certs, and Java's trust store follows). Their names."""
    names = []
    target = rootfs / source.relative_to("/")
    for certificate in sorted(source.glob("*.crt")) if source.is_dir() else ():
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(certificate, target / certificate.name)
        names.append(certificate.name)
    return names


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
