"""`skewer work`: the W workers, one Spark Structured Streaming query on topic ``work``.

Layer: cli.

Kafka partition w of ``work`` is worker w (Spark ``local[max(T, 2)]`` for T tasks by default, or
the cluster ``--spark-master`` names, whose executors must offer a core per task: W by default);
each worker counts its records per (key, tumbling window) into Redis, idempotently per
(worker, micro-batch), and tracks its watermark (see pipeline/stages/worker_job.py).
``--cpu-cost-us C`` makes each worker spend C µs per record, as a wait, so W workers on a
small machine behave like W machines. ``--checkpoint DIR`` is Spark's checkpoint (default
``.cache/checkpoints/{topic prefix}{run id}/work``): restart with the same one after a crash.
``--until-end`` stops once every worker's watermark is END_OF_STREAM. ``--sources S`` is the
number of grouping sources (default: the partition count of topic ``keys``, or of the user's
topic a grouping stage with ``--input-topic`` recorded for the run). ``--jit quick`` has the
driver's JVM compile with C1 only: warm within a second, at about half the peak rate of a
backlog (docs/performance.md#start-up). ``--trigger real-time`` (or ``$SKEWER_TRIGGER``) runs
the workers in Spark's Real-Time Mode: each record applied within milliseconds, by a writer in
the JVM (docs/design.md#real-time-mode). Exit 2 on bad
arguments, 1 when Kafka or Redis does not answer or the query fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.arguments import (
    add_command,
    add_jit_argument,
    add_spark_master_argument,
    add_stage_arguments,
    add_trigger_argument,
    add_window_argument,
    spark_master_from_args,
    stop_on_sigterm,
    trigger_from_args,
)
from pipeline.observe import workers as worker_metrics
from pipeline.observe.exporter import scheme_label, start_exporter

if TYPE_CHECKING:
    from pipeline.io.kafka_io import RunNames

#: How long to wait for topic ``keys`` to appear when ``--sources`` is not given.
KEYS_TOPIC_WAIT_SECONDS = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "work",
        help="run the Spark workers on topic work (partition w = worker w), state in Redis",
        doc=__doc__,
        paragraph=1,
    )
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    add_window_argument(parser)
    parser.add_argument(
        "--cpu-cost-us", type=float, default=0.0, metavar="C", help="wait per record, µs (0)"
    )
    parser.add_argument("--sources", type=int, metavar="S", help="grouping sources")
    parser.add_argument("--checkpoint", type=Path, metavar="DIR", help="Spark checkpoint folder")
    parser.add_argument(
        "--max-records-per-batch",
        type=int,
        metavar="N",
        help="records per micro-batch over all workers (Spark's maxOffsetsPerTrigger)",
    )
    parser.add_argument(
        "--tasks",
        type=int,
        metavar="T",
        help="Spark tasks per micro-batch, each holding W/T workers (default: cores, at most W)",
    )
    add_spark_master_argument(parser)
    add_jit_argument(parser, "peak")
    add_trigger_argument(parser)
    add_stage_arguments(parser, scheme_label=True, until_end="stop at END_OF_STREAM")
    parser.add_argument("--verbose", action="store_true", help="a line per micro-batch")
    parser.set_defaults(handler=run)


def _sources(bootstrap: str, redis_url: str, names: RunNames) -> int:
    """The run's grouping sources: the partitions of its input, a user's topic the grouping
    stage recorded (``--input-topic``) or else ``keys`` (waited for a while)."""
    from pipeline.cli.arguments import UsageError
    from pipeline.io import kafka_io
    from pipeline.io.redis_client import connect_redis
    from pipeline.stages.user_topic import recorded

    client = connect_redis(redis_url)
    try:
        found = recorded(client, names.run_id)
    finally:
        client.close()
    keys_topic = found[0].topic if found is not None else names.keys_topic
    deadline = time.monotonic() + KEYS_TOPIC_WAIT_SECONDS
    while (partitions := kafka_io.topic_partitions(bootstrap, keys_topic)) is None:
        if time.monotonic() > deadline:
            raise UsageError(f"topic {keys_topic!r} does not exist: pass --sources")
        time.sleep(0.5)
    return partitions


def run(args: argparse.Namespace) -> int:
    from pipeline.cli.arguments import UsageError
    from pipeline.io import config, kafka_io
    from pipeline.io.redis_client import connect_redis
    from pipeline.io.state_store import StateStore
    from pipeline.stages import worker_job

    settings = config.load()
    names = kafka_io.RunNames(args.run_id, args.topic_prefix)
    checkpoint = args.checkpoint or (
        settings.cache_dir / "checkpoints" / f"{args.topic_prefix}{args.run_id}" / "work"
    )
    options = worker_job.WorkOptions(
        workers=args.workers,
        sources=args.sources or 1,  # checked again below once known
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        checkpoint=checkpoint.resolve(),
        work_topic=names.work_topic,
        window_ms=args.window_ms,
        cpu_cost_us=args.cpu_cost_us,
        run_id=args.run_id,
        until_end=args.until_end,
        max_records_per_batch=args.max_records_per_batch,
        tasks=args.tasks,
        spark_master=spark_master_from_args(args, settings.spark_master),
        jit=args.jit,
        trigger=trigger_from_args(args),
    )
    try:
        options.validate()
    except worker_job.WorkerConfigError as error:
        raise UsageError(str(error)) from None
    if args.sources is not None and args.sources < 1:
        raise UsageError(f"--sources must be >= 1, got {args.sources}")
    kafka_io.require_kafka(settings.kafka_bootstrap)
    connect_redis(settings.redis_url).close()
    kafka_io.ensure_topic(
        settings.kafka_bootstrap,
        names.work_topic,
        args.workers,
        replication=settings.kafka_replication,
    )
    if args.sources is None:
        sources = _sources(settings.kafka_bootstrap, settings.redis_url, names)
        options = dataclasses.replace(options, sources=sources)
    scheme = scheme_label(args.scheme)
    exporter = start_exporter("work", args.run_id, scheme, args.metrics_port)
    if exporter.enabled:  # the workers' series: Redis and Kafka, read at each scrape
        applied = None
        if options.trigger == config.REAL_TIME:  # its checkpoint lags by up to an interval
            store = StateStore.from_url(settings.redis_url, args.run_id)
            applied = functools.partial(store.applied_batches, args.workers)
        lag = worker_metrics.WorkTopicLag(
            settings.kafka_bootstrap, names.work_topic, args.workers, options.checkpoint, applied
        )
        exporter.register(
            worker_metrics.WorkerCollector(exporter.labels, args.workers, settings.redis_url, lag)
        )
    stop_on_sigterm()
    try:
        summary = worker_job.run(
            options,
            on_batch=worker_job.log_batch if args.verbose else None,
            on_progress=worker_job.log_progress if args.verbose else None,
        )
    except worker_job.WorkerConfigError as error:
        raise UsageError(str(error)) from None
    except worker_job.WorkerJobError as error:
        print(f"skewer work: error: {error}", file=sys.stderr)
        return 1
    finally:
        exporter.close()
    if args.json:
        print(json.dumps({"run_id": args.run_id, "workers": args.workers, **vars(summary)}))
    else:
        real_time = options.trigger == config.REAL_TIME
        batches = "real-time batch(es)" if real_time else "micro-batch(es)"
        print(
            f"worker job: {summary.batches} {batches} in {summary.seconds:.1f} s, "
            f"records per worker {summary.processed} (total {sum(summary.processed):,})"
            + ("" if summary.finished else ", stopped before END_OF_STREAM")
        )
    return 0
