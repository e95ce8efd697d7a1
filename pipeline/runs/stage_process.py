"""One stage of a run as a subprocess: started in its own session, its logs and its output.

Layer: runs.

Every stage runs in its own session (process group): Ctrl-C reaches only the orchestrator,
which stops the stages itself, and a signal to the group reaches the stage with all its
children (the Spark JVM and its Python workers, the grouping stage's source processes), the way
a crashed machine would lose them. Each stage also gets SIGTERM if the orchestrator dies
(``PR_SET_PDEATHSIG``, set by util-linux's ``setpriv``, which then executes the stage).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How every stage starts: nothing on stdin, its own session (process group).
SESSION: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True}
#: And SIGTERM when the process that started it dies: ``setpriv`` sets it and executes the
#: stage. Not a ``preexec_fn``: Python code between fork and exec can deadlock in a process
#: with threads (the child finalises the other threads' objects; a Spark gateway connection's
#: close waited forever on a lock another thread held at the fork).
PARENT_DEATH = ("setpriv", "--pdeathsig", "TERM", "--")


def with_parent_death(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when this process dies (as is without setpriv)."""
    return [*PARENT_DEATH, *argv] if shutil.which(PARENT_DEATH[0]) else argv


def start_stage(
    name: str, argv: list[str], log_dir: Path, environ: Mapping[str, str], starts: int = 1
) -> StageProcess:
    """Start ``argv`` as stage ``name``, its output appended to ``{log_dir}/{name}.out|.err``
    (a line with the time and the command first); ``starts`` counts this start."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path = log_dir / f"{name}.out"
    stderr_path = log_dir / f"{name}.err"
    with open(stderr_path, "ab") as stderr:
        stderr.write(f"=== {time.ctime()}: {' '.join(argv)}\n".encode())
    with open(stdout_path, "ab") as stdout, open(stderr_path, "ab") as stderr:
        process = subprocess.Popen(
            with_parent_death(argv), stdout=stdout, stderr=stderr, env=dict(environ), **SESSION
        )
    return StageProcess(name, argv, process, stdout_path, stderr_path, starts)


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to the process group ``pgid`` (a stage and all its children), if any."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@dataclass
class StageProcess:
    """A running (or finished) stage: its process, logs and start count."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    starts: int = 1
    killed: bool = False

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the stage leads its own group

    def exit_code(self) -> int | None:
        return self.process.poll()

    def output(self) -> dict[str, Any] | None:
        """The stage's JSON summary (its last stdout line), if it printed one."""
        lines = [line for line in _read(self.stdout_path).splitlines() if line.strip()]
        if not lines:
            return None
        try:
            parsed = json.loads(lines[-1])
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def reason(self) -> str:
        """The stage's own error line, else the last line of its stderr."""
        lines = [line.strip() for line in _read(self.stderr_path).splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith("skewer ")]
        if ours:
            return ours[-1]
        return lines[-1] if lines else "no error output"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
