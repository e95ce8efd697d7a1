"""Spark's Python daemon for the workers' tasks, with their modules and kernels loaded first.

Layer: stages.

Spark forks each Python worker from one daemon process (``spark.python.daemon.module``; the
worker job's session names this module). Loading the workers' modules, Spark's worker module
and the compiled kernels here, before the daemon forks, gives every worker them at once, so a
new worker's first task does not load them. What is loaded is then frozen out of the garbage
collector's sight: a reused worker runs a full ``gc.collect()`` after every task, which would
otherwise walk every object of every loaded module each time. When Spark is the installed
pyspark, the daemon imports it compiled from there rather than from Spark's archives
(:func:`without_spark_archives`; docs/performance.md#start-up).
"""

from __future__ import annotations

import gc
import importlib.machinery
import os
import sys
from collections.abc import Sequence

#: Spark's worker module (the daemon's first argument names it), which pyspark's daemon
#: imports in each forked worker unless it is loaded.
SPARK_WORKER_MODULE = "pyspark.worker"
#: Modules a task imports on first use (the Redis client's: :mod:`pipeline.io.redis_client`).
TASK_MODULES = ("redis", "redis.sentinel")


def without_spark_archives(path: Sequence[str], spark_home: str | None) -> list[str]:
    """``path`` without the archives Spark put on it from ``spark_home`` (``pyspark.zip``,
    py4j's zip, its core jar), when ``spark_home`` is the pyspark package that the rest of
    ``path`` imports: the same files, which the installed package has compiled. Otherwise (no
    ``spark_home``, or a Spark of its own) ``path`` as it is.

    Python compiles what it imports from an archive in every process that imports it, and
    Python 3.11 reads an archive's whole directory again whenever a process calls
    ``importlib.invalidate_caches()``, as each new worker does at its first task."""
    if not spark_home:
        return list(path)
    home = os.path.realpath(spark_home)
    kept = [
        entry
        for entry in path
        if not (
            entry.endswith((".zip", ".jar")) and os.path.realpath(entry).startswith(home + os.sep)
        )
    ]
    installed = importlib.machinery.PathFinder.find_spec("pyspark", kept)
    origin = installed.origin if installed is not None else None
    if origin is None or os.path.dirname(os.path.realpath(origin)) != home:
        return list(path)
    return kept


def use_installed_pyspark() -> None:
    """Drop Spark's archives from this process's path and import cache
    (:func:`without_spark_archives`); before anything imports pyspark."""
    kept = without_spark_archives(sys.path, os.environ.get("SPARK_HOME"))
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept


def load_and_freeze(worker_module: str = SPARK_WORKER_MODULE) -> None:
    """Load the tasks' modules, Spark's ``worker_module`` and the kernels, then move every
    object alive into the collector's permanent generation (``gc.freeze``), which forked
    workers inherit."""
    from pipeline.stages.worker_task import load_kernels

    # pyspark's daemon imports the worker module after each fork, lest an import start a
    # thread the fork would not copy; these start none (tests/unit/test_python_daemon.py).
    for module in (worker_module, *TASK_MODULES):
        importlib.import_module(module)
    load_kernels()
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    use_installed_pyspark()
    named = sys.argv[1:2]
    load_and_freeze(named[0] if named and named[0].startswith("pyspark") else SPARK_WORKER_MODULE)
    from pyspark import daemon

    daemon.manager()
