"""The local images' pure parts, checked without a Docker engine: the mirror read from apt's
sources, the build order and names (deploy/images/local.env), the Dockerfiles' bases and
contexts, the base's trimming, the Kafka image's mapping of KAFKA_* variables to
server.properties and its tools, the Redis image's entrypoint, and the one-line errors of
``skewer images build`` (no engine, bad flags)."""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_files import dockerfile_lines

from pipeline.cli import app
from pipeline.io import config
from pipeline.services import debian_base, docker_images
from pipeline.services.debian_base import AptSource

IMAGES_DIR = config.DEPLOY_DIR / "images"
KAFKA_DIR = IMAGES_DIR / "kafka"

# --- the mirror apt uses -------------------------------------------------------------------------

HOST_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def test_deb822_sources_as_debian_writes_them() -> None:
    sources = debian_base.parse_apt_sources(HOST_SOURCES, deb822=True)
    assert sources == [
        AptSource(("deb",), ("http://deb.debian.org/debian",), ("bookworm", "bookworm-updates")),
        AptSource(("deb",), ("http://deb.debian.org/debian-security",), ("bookworm-security",)),
    ]
    assert debian_base.host_mirrors(sources) == (
        "http://deb.debian.org/debian",
        "http://deb.debian.org/debian-security",
    )


def test_deb822_continuation_lines_disabled_stanzas_and_source_types() -> None:
    text = (
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n\n"
        "types: deb deb-src\nuris: cdrom:[Debian]/\n  https://m.example/debian/\n"
        "suites: bookworm\n"
    )
    sources = debian_base.parse_apt_sources(text, deb822=True)
    assert [source.uris for source in sources] == [
        ("http://src.example/debian",),
        ("cdrom:[Debian]/", "https://m.example/debian/"),
    ]
    # Sources only (deb-src) and a cdrom are no mirror; the trailing slash goes.
    assert debian_base.host_mirrors(sources)[0] == "https://m.example/debian"


def test_one_line_sources() -> None:
    text = """
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://m.example/debian bookworm main
deb http://m.example/debian-security/ bookworm-security main  # security
deb http://other.example/debian bookworm-backports main
"""
    sources = debian_base.parse_apt_sources(text)
    assert [source.types for source in sources] == [("deb-src",), ("deb",), ("deb",), ("deb",)]
    assert debian_base.host_mirrors(sources) == (
        "http://m.example/debian",
        "http://m.example/debian-security",
    )


def test_without_a_bookworm_entry_the_mirrors_are_debians_own() -> None:
    ubuntu = debian_base.parse_apt_sources("deb http://archive.ubuntu.com/ubuntu noble main")
    assert debian_base.host_mirrors(ubuntu) == (
        debian_base.DEFAULT_MIRROR,
        debian_base.DEFAULT_SECURITY_MIRROR,
    )
    assert debian_base.DEFAULT_MIRROR == "http://deb.debian.org/debian"


def test_host_sources_are_read_in_apts_order(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "b.sources").write_text(HOST_SOURCES)
    (tmp_path / "sources.list.d" / "a.list").write_text("deb http://first.example/d bookworm main")
    (tmp_path / "sources.list.d" / "c.list.save").write_text("deb http://no.example/d bookworm x")
    assert debian_base.host_mirrors(debian_base.read_host_sources(tmp_path))[0] == (
        "http://first.example/d"
    )
    (tmp_path / "sources.list").write_text("deb http://top.example/d bookworm main\n")
    sources = debian_base.read_host_sources(tmp_path)
    assert [source.uris[0] for source in sources] == [
        "http://top.example/d",
        "http://first.example/d",
        "http://deb.debian.org/debian",
        "http://deb.debian.org/debian-security",
    ]
    assert debian_base.read_host_sources(tmp_path / "missing") == []


def test_the_images_apt_sources_name_the_hosts_mirrors() -> None:
    text = debian_base.image_apt_sources("http://m/debian", "http://s/debian-security")
    sources = debian_base.parse_apt_sources(text, deb822=True)
    assert debian_base.host_mirrors(sources) == ("http://m/debian", "http://s/debian-security")
    assert {suite for source in sources for suite in source.suites} == {
        "bookworm",
        "bookworm-updates",
        "bookworm-security",
    }


# --- the images and their names ------------------------------------------------------------------


def test_build_order_adds_what_an_image_needs() -> None:
    names = [image.name for image in docker_images.build_order([])]
    assert names == list(docker_images.IMAGE_NAMES)
    assert names[0] == "debian" and names[-1] == "skewer"
    for image in docker_images.IMAGES:
        for need in image.needs:
            assert names.index(need) < names.index(image.name), (image.name, need)
    order = docker_images.build_order(["redis", "skewer"])
    assert [image.name for image in order] == ["debian", "python", "maven", "redis", "skewer"]
    with pytest.raises(docker_images.ImageError, match="no image grafana, x; the images are"):
        docker_images.build_order(["grafana", "x"])


def _pom_kafka_version() -> str:
    pom = (config.DEPLOY_DIR / "kafka" / "pom.xml").read_text()
    return re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)[1]


def test_local_env_names_every_local_image() -> None:
    tags = docker_images.local_tags()
    assert set(tags) == set(docker_images.IMAGE_NAMES)
    assert tags["debian"] == docker_images.BASE_IMAGE == "skewer-local/debian:bookworm"
    assert tags["skewer"] == docker_images.SKEWER_IMAGE == "skewer:local"
    values = docker_images.read_env_file(docker_images.LOCAL_ENV.read_text())
    assert set(values) == {i.variable for i in docker_images.IMAGES if i.variable}
    assert "GRAFANA_IMAGE" not in values, "Grafana cannot be built here"
    for name, tag in tags.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9./-]*:[\w.-]+", tag), (name, tag)
        if name != "skewer":
            assert tag.startswith("skewer-local/"), (name, tag)
    # The broker's jars are the native broker's: the tag says their release.
    assert tags["kafka"] == f"skewer-local/kafka:{_pom_kafka_version()}"


def test_local_tags_name_a_missing_variable(tmp_path: Path) -> None:
    env_file = tmp_path / "local.env"
    env_file.write_text("KAFKA_IMAGE=k:1\n")
    with pytest.raises(docker_images.ImageError, match="does not set SKEWER_BASE_IMAGE"):
        docker_images.local_tags(env_file)


def test_build_arguments_and_command() -> None:
    tags = docker_images.local_tags()
    by_name = {image.name: image for image in docker_images.IMAGES}
    for name in ("python", "maven", "kafka", "redis", "prometheus"):
        assert docker_images.build_arguments(by_name[name], tags) == {
            "BASE_IMAGE": docker_images.BASE_IMAGE
        }
    assert docker_images.build_arguments(by_name["skewer"], tags) == {
        "BASE_IMAGE": tags["python"],
        "MAVEN_IMAGE": tags["maven"],
    }
    assert by_name["skewer"].dockerfile == config.DEPLOY_DIR / "Dockerfile"
    command = docker_images.build_command(
        "docker", "t:1", Path("/f/Dockerfile"), Path("/ctx"), {"BASE_IMAGE": "b:1"}
    )
    assert command[:2] == ["docker", "build"] and command[-1] == "/ctx"


def test_debootstrap_builds_a_minimal_bookworm_from_the_mirror() -> None:
    command = debian_base.debootstrap_command(Path("/r"), "http://m/debian", Path("/c"))
    assert command[0] == "debootstrap"
    assert "--variant=minbase" in command and "--cache-dir=/c" in command
    assert command[-3:] == ["bookworm", "/r", "http://m/debian"]


@pytest.mark.parametrize("name", ["python", "maven", "kafka", "redis", "prometheus"])
def test_each_local_dockerfile_builds_on_the_base_from_its_own_context(name: str) -> None:
    dockerfile = IMAGES_DIR / name / "Dockerfile"
    header = dockerfile.read_text().split("\n\n", 1)[0]
    assert header.startswith("# Stand-in for "), f"{dockerfile}: say what it stands in for"
    lines = dockerfile_lines(dockerfile)
    assert lines[0] == f"ARG BASE_IMAGE={docker_images.BASE_IMAGE}"
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM ${BASE_IMAGE}"]
    # What the builder puts in the Kafka image's context besides this folder.
    extra = {"libs", "log4j2.properties"} if name == "kafka" else set()
    for line in lines:
        if line.startswith(("COPY ", "ADD ")):
            *sources, _target = shlex.split(line)[1:]
            for source in sources:
                top = source.rstrip("/").split("/")[0]
                assert top in extra or (dockerfile.parent / top).exists(), (name, source)
    assert any(line.startswith(("USER ", "CMD ", "ENTRYPOINT ")) for line in lines)
    for line in lines:
        if line.startswith("RUN ") and "apt-get install" in line:
            assert "--no-install-recommends" in line and "rm -rf /var/lib/apt/lists/*" in line


def test_the_scripts_of_the_images_are_executable_and_valid_shell() -> None:
    policy = IMAGES_DIR / "debian" / "rootfs" / "usr" / "sbin" / "policy-rc.d"
    scripts = [*sorted(IMAGES_DIR.rglob("*.sh")), policy]
    assert len(scripts) == 5
    for script in scripts:
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"
        shell = script.read_text().splitlines()[0].removeprefix("#!")
        assert shell in ("/bin/sh", "/bin/bash"), script
        check = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


# --- the base's tree ---------------------------------------------------------------------------


def test_trim_rootfs_keeps_licences_and_writes_the_sources(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for name in (
        "usr/share/doc/bash/copyright",
        "usr/share/doc/bash/FAQ",
        "usr/share/doc/gone/README",
        "usr/share/man/man1/ls.1.gz",
        "usr/share/locale/de/LC_MESSAGES/apt.mo",
        "usr/share/locale/locale.alias",
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease",
        "var/cache/apt/archives/bash.deb",
        "var/log/dpkg.log",
        "etc/apt/sources.list",
        "usr/bin/bash",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    overlay = tmp_path / "overlay"
    (overlay / "usr" / "sbin").mkdir(parents=True)
    (overlay / "usr" / "sbin" / "policy-rc.d").write_text("exit 101\n")
    debian_base.trim_rootfs(root, overlay, "Types: deb\n")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == [
        "etc/apt/sources.list.d/debian.sources",
        "usr/bin/bash",
        "usr/sbin/policy-rc.d",
        "usr/share/doc/bash/copyright",
        "usr/share/locale/locale.alias",
    ]
    assert not (root / "usr/share/doc/gone").exists()


def test_the_base_overlay_forbids_daemons_and_apt_caches() -> None:
    overlay = IMAGES_DIR / "debian" / "rootfs"
    policy = overlay / "usr" / "sbin" / "policy-rc.d"
    assert subprocess.run([str(policy)], check=False).returncode == 101
    apt = (overlay / "etc" / "apt" / "apt.conf.d" / "90skewer-image").read_text()
    assert 'Dir::Cache::pkgcache "";' in apt
    dpkg = (overlay / "etc" / "dpkg" / "dpkg.cfg.d" / "90skewer-image").read_text()
    assert "path-include /usr/share/doc/*/copyright" in dpkg


def test_remove_tree_removes_a_plain_tree(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "c").write_text("x")
    debian_base.remove_tree(tree)
    assert not tree.exists()
    debian_base.remove_tree(tree)  # nothing there: nothing to do


# --- the Kafka image: environment to server.properties, and the tools ----------------------------


def _properties(environment: dict[str, Any]) -> dict[str, str]:
    """The properties env-to-properties.sh writes for ``environment`` (and nothing else)."""
    result = subprocess.run(
        ["bash", str(KAFKA_DIR / "env-to-properties.sh")],
        env={name: str(value) for name, value in environment.items()},
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    properties = dict(line.split("=", 1) for line in lines)
    assert len(properties) == len(lines), "a property twice"
    return properties


def test_kafka_variables_become_properties_as_apache_kafka_reads_them() -> None:
    properties = _properties(
        {
            "KAFKA_NODE_ID": 3,
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "A:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "KAFKA_LISTENER_NAME_INTERNAL_SASL_ENABLED__MECHANISMS": "PLAIN",
            "KAFKA_SOME___DASHED_NAME": "x",
            "KAFKA_EMPTY": "",
            # The JVM's settings and CLUSTER_ID are no properties.
            "KAFKA_HEAP_OPTS": "-Xmx512m",
            "KAFKA_OPTS": "-Dx=y",
            "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseG1GC",
            "KAFKA_JMX_PORT": "9999",
            "KAFKA_LOG4J_ROOT_LOGLEVEL": "WARN",
            "KAFKA_TOOLS_LOG4J_LOGLEVEL": "ERROR",
            "CLUSTER_ID": "abc",
            "KAFKA_": "no name",
            "PATH": "/usr/bin:/bin",
        }
    )
    assert properties == {
        "node.id": "3",
        "listener.security.protocol.map": "A:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "listener.name.internal.sasl.enabled_mechanisms": "PLAIN",
        "some-dashed.name": "x",
        "empty": "",
    }
    assert _properties({"PATH": "/usr/bin:/bin", "CLUSTER_ID": "abc"}) == {}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((config.PROJECT_ROOT / "docker-compose.yml").read_text())


@pytest.mark.parametrize("service", ["kafka", "kafka-1"])
def test_composes_kafka_environment_makes_a_complete_kraft_config(service: str) -> None:
    """Compose's own variables (defaults applied) give every property a KRaft node needs."""
    environment = _compose()["services"][service]["environment"]
    environment = {
        name: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
        for name, value in environment.items()
    }
    properties = _properties(environment)
    for required in (
        "node.id",
        "process.roles",
        "controller.quorum.voters",
        "listeners",
        "advertised.listeners",
        "controller.listener.names",
        "inter.broker.listener.name",
        "listener.security.protocol.map",
        "log.dirs",
    ):
        assert required in properties, (service, required)
    assert properties["log.dirs"] == "/var/lib/kafka/data"
    assert properties["auto.create.topics.enable"] == "false"
    assert not any(name.endswith("opts") for name in properties)


def test_the_default_config_is_a_single_kraft_node() -> None:
    text = (KAFKA_DIR / "default-server.properties").read_text()
    properties = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert properties["process.roles"] == "broker,controller"
    assert properties["controller.quorum.voters"] == "1@localhost:9093"
    assert properties["log.dirs"] == "/var/lib/kafka/data"


def _tool_classes() -> dict[str, str]:
    script = (KAFKA_DIR / "kafka-tool.sh").read_text()
    return dict(re.findall(r"^\s+(kafka-[\w-]+\.sh)\) main=([\w.]+) ;;$", script, re.M))


def test_every_linked_tool_has_a_main_class() -> None:
    classes = _tool_classes()
    dockerfile = (KAFKA_DIR / "Dockerfile").read_text()
    loop = re.search(r"for tool in ([^;]+); do", dockerfile.replace("\\\n", " "))[1]
    linked = {f"{name}.sh" for name in loop.split()}
    assert linked == set(classes)
    # compose's health checks call this one.
    assert "kafka-broker-api-versions.sh" in linked


def test_an_unknown_tool_name_fails_with_one_line(tmp_path: Path) -> None:
    link = tmp_path / "kafka-nothing.sh"
    link.symlink_to(KAFKA_DIR / "kafka-tool.sh")
    result = subprocess.run(["bash", str(link)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "kafka-nothing.sh: not one of the Kafka tools of this image (ls /opt/kafka/bin)"
    ]


@pytest.mark.skipif(
    not config.load().kafka_libs_dir.is_dir(), reason="Kafka's jars not fetched (make install)"
)
def test_the_tools_and_the_broker_classes_are_in_the_native_brokers_jars() -> None:
    classes = {}
    for jar in config.load().kafka_libs_dir.glob("*.jar"):
        with zipfile.ZipFile(jar) as archive:
            classes.update(dict.fromkeys(archive.namelist(), jar.name))
    script = (KAFKA_DIR / "kafka-run.sh").read_text()
    mains = {*_tool_classes().values(), *re.findall(r"\b(kafka\.(?:Kafka|tools\.\w+))\b", script)}
    assert {"kafka.Kafka", "kafka.tools.StorageTool"} <= mains
    for main in mains:
        assert main.replace(".", "/") + ".class" in classes, main


# --- the Redis image's entrypoint ----------------------------------------------------------------


def _entrypoint(tmp_path: Path, *arguments: str) -> list[str]:
    """The command redis-entrypoint.sh runs for ``arguments`` (programs faked on PATH)."""
    for program in ("redis-server", "redis-cli"):
        fake = tmp_path / program
        fake.write_text(f'#!/bin/sh\nfor a in {program} "$@"; do printf "%s\\n" "$a"; done\n')
        fake.chmod(0o755)
    result = subprocess.run(
        ["sh", str(IMAGES_DIR / "redis" / "redis-entrypoint.sh"), *arguments],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.splitlines()


def test_redis_entrypoint_turns_protected_mode_off_for_command_line_servers(
    tmp_path: Path,
) -> None:
    composed = ["redis-server", "--requirepass", "pw", "--appendonly", "yes", "--save", ""]
    assert _entrypoint(tmp_path, *composed) == [
        "redis-server",
        "--protected-mode",
        "no",
        *composed[1:],
    ]
    assert _entrypoint(tmp_path, "redis-server") == ["redis-server", "--protected-mode", "no"]
    # Options alone go to redis-server; a config file decides for itself; other programs run.
    assert _entrypoint(tmp_path, "--port", "7000") == [
        "redis-server",
        "--protected-mode",
        "no",
        "--port",
        "7000",
    ]
    assert _entrypoint(tmp_path, "redis-server", "/etc/r.conf", "--port", "1") == [
        "redis-server",
        "/etc/r.conf",
        "--port",
        "1",
    ]
    assert _entrypoint(tmp_path, "redis-cli", "ping") == ["redis-cli", "ping"]


# --- skewer images build: one-line errors --------------------------------------------------------


def _run_cli(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str], list[str]]:
    code = app.main(argv)
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


def test_no_engine_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    socket = tmp_path / "docker.sock"
    monkeypatch.setenv(config.ENV_DOCKER_HOST, f"unix://{socket}")
    monkeypatch.setenv(config.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(docker_images.docker_engine, "find_binary", lambda _name: "/bin/docker")
    code, out, err = _run_cli(["images", "build", "--local"], capsys)
    assert (code, out) == (1, [])
    assert err == [
        f"skewer images: no Docker engine answers on unix://{socket}; start one with "
        f"`skewer services up docker` (as root), or set DOCKER_HOST to an engine's socket"
    ]


def test_no_docker_command_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(docker_images.docker_engine, "find_binary", lambda _name: None)
    code, _, err = _run_cli(["images", "build", "--local", "kafka"], capsys)
    assert code == 1
    assert err == [
        "skewer images: the docker command is missing; `skewer services up docker` installs "
        "Debian's docker.io"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rebuild"], "--rebuild is an option of --local builds"),
        (["kafka"], "without --local only skewer's own image is built; add --local"),
        (["--local", "grafana"], "no image grafana; the images are debian, python, maven, "),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run_cli(["images", "build", *argv], capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"skewer images: error: {message}")


def test_a_result_line_names_the_image_its_time_and_size() -> None:
    line = docker_images.Built("kafka", "skewer-local/kafka:4.3.1", "built", 83.4, 412_000_000)
    assert line.line().split() == ["kafka", "skewer-local/kafka:4.3.1", "built", "in", "1m23s",
                                   "412.0", "MB"]  # fmt: skip
    kept = docker_images.Built("debian", "skewer-local/debian:bookworm", "kept", 0.1, 74_800_000)
    assert kept.line().split() == ["debian", "skewer-local/debian:bookworm", "kept", "74.8", "MB"]


def test_the_builder_talks_to_the_configured_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docker_images.docker_engine, "find_binary", lambda _name: "/bin/docker")
    settings = config.load(
        {config.ENV_CACHE_DIR: str(tmp_path), config.ENV_DOCKER_HOST: "unix:///x/d.sock"}
    )
    builder = docker_images.Builder(settings, report=lambda _line: None)
    assert builder.env[config.ENV_DOCKER_HOST] == "unix:///x/d.sock"
    assert builder.env["DOCKER_CONFIG"] == str(tmp_path / "docker-config")
    assert builder.env["DOCKER_BUILDKIT"] == "0"
    assert builder.log_path("kafka") == tmp_path / "run" / "images" / "kafka.log"


def test_the_hosts_own_certificates_go_into_the_base(tmp_path: Path) -> None:
    source = tmp_path / "usr" / "local" / "share" / "ca-certificates"
    source.mkdir(parents=True)
    (source / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (source / "notes.txt").write_text("not a certificate")
    rootfs = tmp_path / "rootfs"
    assert debian_base.add_local_certificates(rootfs, source) == ["proxy.crt"]
    copied = rootfs / source.relative_to("/")
    assert sorted(p.name for p in copied.iterdir()) == ["proxy.crt"]
    assert debian_base.add_local_certificates(rootfs, tmp_path / "none") == []
