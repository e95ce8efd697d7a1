"""Stopping a query while its ``foreachBatch`` collects: the stop must end the query cleanly.

Spark tells a stop from a failure by matching the Python traceback ``foreachBatch`` returns
against a regex that recurses once per character; on the traceback of an interrupted
``collect()`` (the whole Java stack trace) it overflows the stream thread's stack, the thread
dies with ``StackOverflowError`` and, depending on where it was, the driver's
``processAllAvailable()`` or ``stop()`` waits forever or its Py4J connection is reset
(docs/design.md#spark-pitfalls). The worker job collects with
:func:`pipeline.stages.worker_job.collect_in_foreach_batch`, which answers the interruption
with a short error. Here a stop lands in the middle of such a ``collect()``, in a Spark
application of its own, whose standard error shows what the stream thread died of.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

STOP_DURING_COLLECT = textwrap.dedent(
    """
    import threading, time
    from pyspark.sql import functions
    from pyspark.sql.types import LongType
    from pipeline.io.spark_session import build_spark_session
    from pipeline.stages.worker_job import collect_in_foreach_batch

    spark = build_spark_session("stop-during-collect", shuffle_partitions=1)
    collecting = threading.Event()

    @functions.udf(LongType())
    def slow(value):
        time.sleep(8)
        return value

    def collect(frame, batch_id):
        collecting.set()
        collect_in_foreach_batch(frame.select(slow("value")))

    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        .writeStream.foreachBatch(collect).start()
    )
    assert collecting.wait(60), "no micro-batch reached foreachBatch"
    time.sleep(2)  # the collect's job is running, its one task asleep in the UDF
    query.stop()
    print("stopped", query.isActive, query.exception(), flush=True)
    spark.stop()
    """
)


def test_a_stop_during_collect_in_foreach_batch_ends_the_query_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOP_DURING_COLLECT],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "stopped False None"
    died = [line for line in done.stderr.splitlines() if line.startswith("Exception in thread")]
    assert not died, "\n".join(died)
