"""`skewer produce`: send a workload's keys into topic ``keys`` and record the ground truth.

``--workload SPEC`` is a :mod:`producers.workloads` spec; ``--records N`` sets its length.
``--sources S`` producers write partitions 0..S-1 (record i goes to producer i mod S); the topic
is created with S partitions if missing. Event time is synthetic (``--event-rate`` records per
second of event time) unless ``--rate R`` paces real time at R records per second. The count of
every (key, window) goes to Redis (``skewer:{run}:truth:{window}``) before sending; the command
exits when every record is acknowledged. ``--json`` prints one object (records, windows,
seconds, rate). Exit 2 on bad arguments, 1 when Kafka or Redis does not answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from pipeline import metrics

DEFAULT_WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--run-id`` and ``--topic-prefix``: the names of one run (see pipeline.kafka_io)."""
    parser.add_argument("--run-id", default="default", help="namespace of Redis keys")
    parser.add_argument("--topic-prefix", default="", help="prefix of the run's topic names")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="send a workload into topic keys (S partitions) and record the ground truth",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--workload", default=DEFAULT_WORKLOAD, metavar="SPEC", help=f"default {DEFAULT_WORKLOAD}"
    )
    parser.add_argument("--records", type=int, required=True, metavar="N")
    parser.add_argument("--sources", type=int, default=1, metavar="S", help="producers (default 1)")
    parser.add_argument("--rate", type=float, metavar="R", help="pace real time: records/s")
    parser.add_argument("--window-ms", type=int, default=10_000, help="window length (10000)")
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
    add_run_arguments(parser)
    metrics.add_arguments(parser, scheme=True)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline import config, kafka_io
    from pipeline.cli import UsageError
    from producers.kafka_producer import produce_stream
    from producers.workloads import WorkloadError, parse

    if args.records < 1:
        raise UsageError(f"--records must be >= 1, got {args.records}")
    if args.sources < 1:
        raise UsageError(f"--sources must be >= 1, got {args.sources}")
    if args.window_ms < 1:
        raise UsageError(f"--window-ms must be >= 1, got {args.window_ms}")
    if not args.event_rate > 0 or (args.rate is not None and not args.rate > 0):
        raise UsageError("--event-rate and --rate must be > 0")
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
    try:
        kafka_io.require_kafka(settings.kafka_bootstrap)
        redis_client = kafka_io.connect_redis(settings.redis_url)
        kafka_io.ensure_run_topics(settings.kafka_bootstrap, names, sources=args.sources)
    except kafka_io.ServiceUnavailableError as error:
        print(f"skewer produce: error: {error}", file=sys.stderr)
        return 1
    except kafka_io.KafkaIOError as error:
        raise UsageError(str(error)) from None
    try:
        exporter = metrics.start_exporter(
            "produce", args.run_id, metrics.resolve_scheme(args.scheme), args.metrics_port
        )
    except metrics.MetricsError as error:
        redis_client.close()
        raise UsageError(str(error)) from None
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
            on_acked=metrics.ProducerMetrics(exporter.labels, args.sources).acked,
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
