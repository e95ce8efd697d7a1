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


def test_what_the_daemon_loads_is_frozen_out_of_the_collectors_sight() -> None:
    # A reused worker runs gc.collect() after every task: what the daemon loaded must not be
    # walked each time. In a subprocess, so this test's own collector stays as it is.
    script = (
        "import gc\n"
        "from pipeline.stages.python_daemon import load_and_freeze\n"
        "before = gc.get_freeze_count()\n"
        "load_and_freeze()\n"
        "import numba, pyarrow, redis\n"
        "print(before, gc.get_freeze_count(), len(gc.get_objects(generation=2)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    before, frozen, old = map(int, done.stdout.split())
    assert before == 0
    assert frozen > 50_000  # the loaded modules' objects: tens of thousands
    assert old < frozen // 10  # what a full collection still walks
