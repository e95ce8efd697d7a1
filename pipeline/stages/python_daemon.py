"""Spark's Python daemon for the workers' tasks, with their modules and kernels loaded first.

Layer: stages.

Spark forks each Python worker from one daemon process (``spark.python.daemon.module``; the
worker job's session names this module). Loading the workers' modules and compiled kernels
here, before the daemon forks, gives every worker them at once, so a micro-batch's first tasks
do not each load them. What is loaded is then frozen out of the garbage collector's sight:
a reused worker runs a full ``gc.collect()`` after every task, which would otherwise walk
every object of every loaded module each time (docs/performance.md#start-up).
"""

from __future__ import annotations

import gc

from pyspark import daemon

from pipeline.stages.worker_task import load_kernels


def load_and_freeze() -> None:
    """Load the tasks' modules and kernels, then move every object alive into the collector's
    permanent generation (``gc.freeze``), which forked workers inherit."""
    load_kernels()
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    load_and_freeze()
    daemon.manager()
