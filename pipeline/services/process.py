"""The processes native services run as: pid files that survive pid reuse, start and stop.

A pid file holds the pid and the kernel's start time of the process, so a later ``down`` stops
exactly the process ``up`` started and never one that merely inherited a recycled pid.
Every service process runs in its own session (a Ctrl-C in the shell that started it does not
reach it) and logs to ``.cache/run/<name>.log``. (layer: services)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import file_lock
from pipeline.io.config import Settings

#: Popen handles of the processes this interpreter started, so stopping one also reaps it (a
#: test session starts services as its own children).
children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class PidRecord:
    """What a pid file holds: enough to recognise the process later, even after pid reuse."""

    pid: int
    start_ticks: int
    command: tuple[str, ...]


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/{pid}/stat`` from field 3 (the state) on; None if the process is gone, a zombie
    or dead (states Z, X): [0] state, [2] process group, [19] start time in clock ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def child_pids(pid: int, command_has: bytes = b"") -> list[int]:
    """The pids of ``pid``'s child processes whose command line holds ``command_has``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))  # [1]: the parent
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if fields is not None and int(fields[1]) == pid and command_has in command:
            found.append(int(entry.name))
    return sorted(found)


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if gone or a zombie."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def group_alive(pgid: int) -> bool:
    """Whether any process (not a zombie) is still in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields is not None and int(fields[2]) == pgid:
                return True
    return False


def die_with_parent(signum: int) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (``PR_SET_PDEATHSIG``);
    a no-op where there is no such call."""
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signum)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    return start_ticks(pid) is not None


def reap(pid: int) -> None:
    child = children.get(pid)
    if child is not None and child.poll() is not None:
        del children[pid]


def is_alive(record: PidRecord) -> bool:
    reap(record.pid)
    return start_ticks(record.pid) == record.start_ticks


def read_pid_file(path: Path) -> PidRecord | None:
    try:
        data = json.loads(path.read_text())
        return PidRecord(int(data["pid"]), int(data["start_ticks"]), tuple(data["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_pid_file(path: Path, record: PidRecord) -> None:
    payload = {"pid": record.pid, "start_ticks": record.start_ticks, "command": record.command}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload) + "\n")
    temporary.replace(path)


@contextlib.contextmanager
def services_lock(settings: Settings) -> Iterator[None]:
    """Serialise ``up`` and ``down`` (two test sessions, or a test beside the CLI)."""
    with file_lock.exclusive(settings.run_dir / "services.lock"):
        yield


def spawn(
    name: str,
    command: list[str],
    *,
    log_path: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> PidRecord | None:
    """Start service ``name``'s ``command`` in its own session, logging to ``log_path``; None
    if it exited at once.

    Its own session: a Ctrl-C in the shell that ran `skewer services up` or pytest does not
    reach the service, and the process outlives the command that started it.
    """
    with open(log_path, "ab") as log:
        log.write(f"\n=== skewer: starting {name} at {time.ctime()}\n".encode())
        log.flush()
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    children[child.pid] = child
    ticks = start_ticks(child.pid)
    return None if ticks is None else PidRecord(child.pid, ticks, tuple(command))


def terminate(record: PidRecord, grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_seconds``; only if the pid is still our process."""
    terminate_all([record], grace_seconds)


def terminate_all(records: Sequence[PidRecord], grace_seconds: float, *, quorum: int = 0) -> None:
    """:func:`terminate` of every process at once: each gets SIGTERM now, and SIGKILL if it is
    still running ``grace_seconds`` later.

    ``quorum``: how many of them must run for any to finish a clean shutdown (the majority of
    a Raft quorum, such as a Kafka cluster's controllers). Once fewer run, the ones left can
    only wait out the grace, so they get SIGKILL at once; what they hold is on disk already
    (the OS keeps what a killed process wrote), and they recover it when started again.
    """
    running = [record for record in records if is_alive(record)]
    for record in running:
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while running and time.monotonic() < deadline:
        running = [record for record in running if is_alive(record)]
        if len(running) < quorum:
            break
        if running:
            time.sleep(0.1)
    for record in running:
        if is_alive(record):
            os.kill(record.pid, signal.SIGKILL)
    for record in running:
        wait_gone(record)


def kill(record: PidRecord, signum: int = signal.SIGKILL) -> bool:
    """Signal ``record``'s process if it is still the one the record names (same pid and start
    time): a pid the kernel has handed to another process since -- a test session's Spark
    JVM, say -- is left alone. False if it was gone."""
    if not is_alive(record):
        return False
    os.kill(record.pid, signum)
    return True


def wait_gone(record: PidRecord, timeout: float | None = None) -> bool:
    """Wait until ``record``'s process has exited and is reaped (its ports and files are
    free); False if it still runs after ``timeout`` seconds (None: wait for as long as it
    takes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while is_alive(record):
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def this_process() -> PidRecord:
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    return PidRecord(os.getpid(), ticks, ())
