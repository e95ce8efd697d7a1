"""The workers' Python daemon: Spark's own, with the tasks' kernels loaded before it forks."""

from __future__ import annotations

import subprocess
import sys

from pipeline.stages import worker_job
from pipeline.stages.worker_task import load_kernels


def test_the_daemon_module_is_the_one_the_job_names() -> None:
    # Spark runs it as ``python -m MODULE``: a module that does not import fails every task.
    done = subprocess.run(
        [sys.executable, "-c", f"import {worker_job.PYTHON_DAEMON_MODULE}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_loading_the_kernels_runs_a_tasks_pure_part() -> None:
    load_kernels()  # raises if the decode, count or script-argument path breaks
