"""Spark's Python daemon for the workers' tasks, with their modules and kernels loaded first.

Layer: stages.

Spark forks each Python worker from one daemon process (``spark.python.daemon.module``; the
worker job's session names this module). Loading the workers' modules and compiled kernels
here, before the daemon forks, gives every worker them at once, so a micro-batch's first tasks
do not each load them (docs/performance.md#start-up).
"""

from __future__ import annotations

from pyspark import daemon

from pipeline.stages.worker_task import load_kernels

if __name__ == "__main__":
    load_kernels()
    daemon.manager()
