"""`skewer produce`: send a workload's keys into topic ``keys`` and record the ground truth.

Layer: cli.

``--workload SPEC`` is a :mod:`producers.workloads` spec; ``--records N`` sets its length.
``--sources S`` producers write partitions 0..S-1 (record i goes to producer i mod S); the topic
is created with S partitions if missing. Event time is synthetic (``--event-rate`` records per
second of event time) unless ``--rate R`` paces real time at R records per second. The count of
every (key, window) goes to Redis (``skewer:{run}:truth:{window}``) before sending; the command
exits when every record is acknowledged. ``--gated`` starts up (workload, plan, truth, Kafka
connection) and then waits for the run's go before it sends. ``--json`` prints one object (records,
windows, seconds, rate). ``--linger-ms`` is the producers' ``linger.ms``. Exit 2 on bad arguments,
1 when Kafka or Redis does not answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from pipeline.cli.arguments import add_command, add_stage_arguments, add_window_argument
from pipeline.observe import producer as producer_metrics
from pipeline.observe.exporter import scheme_label, start_exporter
from producers.workloads import DEFAULT_WORKLOAD


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "produce",
        help="send a workload into topic keys (S partitions) and record the ground truth",
        doc=__doc__,
        paragraph=0,
    )
    parser.add_argument(
        "--workload", default=DEFAULT_WORKLOAD, metavar="SPEC", help=f"default {DEFAULT_WORKLOAD}"
    )
    parser.add_argument("--records", type=int, required=True, metavar="N")
    parser.add_argument("--sources", type=int, default=1, metavar="S", help="producers (default 1)")
    parser.add_argument("--rate", type=float, metavar="R", help="pace real time: records/s")
    add_window_argument(parser)
    parser.add_argument(
        "--event-rate",
        type=float,
        default=4_000.0,
        metavar="E",
        help="synthetic event time: records per second of event time (default 4000)",
    )
    parser.add_argument(
        "--start-ms", type=int, help="synthetic event time of record 0 (default: now, aligned)"
    )
    parser.add_argument(
        "--linger-ms",
        type=int,
        default=None,
        metavar="MS",
        help="Kafka's linger.ms of the producers: how long a record waits for its batch to fill "
        "(default 10; skewer demo --trigger real-time passes 1)",
    )
    parser.add_argument(
        "--gated",
        action="store_true",
        help="start up, then wait for the run's go (skewer demo gives it once the workers are "
        "ready) before sending",
    )
    add_stage_arguments(parser, scheme_label=True, until_end=None)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.cli.arguments import UsageError, require_at_least
    from pipeline.io import config, kafka_io
    from pipeline.io.redis_client import connect_redis, replicas_to_wait
    from producers.kafka_producer import produce_stream, wait_for_go
    from producers.workloads import WorkloadError, parse

    require_at_least(
        1, ("--records", args.records), ("--sources", args.sources), ("--window-ms", args.window_ms)
    )
    if not args.event_rate > 0 or (args.rate is not None and not args.rate > 0):
        raise UsageError("--event-rate and --rate must be > 0")
    linger_ms = kafka_io.LINGER_MS if args.linger_ms is None else args.linger_ms
    if linger_ms < 0:
        raise UsageError(f"--linger-ms must be >= 0, got {linger_ms}")
    try:
        workload = parse(args.workload)
        if any(f.name == "n" for f in dataclasses.fields(workload)):
            workload = dataclasses.replace(workload, n=args.records)
        keys = workload.keys()
    except WorkloadError as error:
        raise UsageError(str(error)) from None
    if len(keys) > args.records:
        keys = keys.slice(0, args.records)

    settings = config.load()
    names = kafka_io.RunNames(args.run_id, args.topic_prefix)
    kafka_io.require_kafka(settings.kafka_bootstrap)
    redis_client = connect_redis(settings.redis_url)
    kafka_io.ensure_run_topics(
        settings.kafka_bootstrap,
        names,
        sources=args.sources,
        replication=settings.kafka_replication,
    )
    exporter = start_exporter("produce", args.run_id, scheme_label(args.scheme), args.metrics_port)
    try:
        result = produce_stream(
            keys,
            bootstrap=settings.kafka_bootstrap,
            redis_client=redis_client,
            names=names,
            sources=args.sources,
            window_ms=args.window_ms,
            event_rate=args.event_rate,
            rate=args.rate,
            start_ms=args.start_ms,
            on_acked=producer_metrics.ProducerMetrics(exporter.labels, args.sources).acked,
            redis_replicas=replicas_to_wait(settings.redis_url),
            wait_to_start=(lambda: wait_for_go(redis_client, names)) if args.gated else None,
            linger_ms=linger_ms,
        )
    except RuntimeError as error:
        print(f"skewer produce: error: {error}", file=sys.stderr)
        return 1
    finally:
        exporter.close()
        redis_client.close()
    summary = {"workload": workload.spec, "run_id": args.run_id, **result.summary()}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"produced {result.records:,} records to {names.keys_topic} "
            f"({args.sources} partition(s)) in {result.seconds:.2f} s "
            f"({result.rate:,.0f} records/s), {len(result.windows)} window(s)"
        )
    return 0
