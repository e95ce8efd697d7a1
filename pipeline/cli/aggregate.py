"""`skewer aggregate`: final counts and top-k of every window once all workers passed it.

Layer: cli.

When the minimum over the W workers' watermarks reaches a window's last millisecond plus
``--lateness-ms``, the window's partial counts are merged across workers, the final counts and
the ``--top-k`` keys go to Redis (``result:{window}``, ``topk:{window}``) and as JSON to topic
``results``, and the partial state is freed; idempotent across crashes (see
pipeline/stages/aggregator.py). ``--keep-results S`` checks each published window against
the ground truth and lets its keys expire S seconds later. ``--until-end`` exits once every
window is final after END_OF_STREAM. Exit 2 on bad arguments, 1 when Kafka or Redis does not
answer.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.cli.arguments import (
    add_command,
    add_keep_results_argument,
    add_stage_arguments,
    add_window_argument,
    stop_on_sigterm,
)
from pipeline.observe import aggregator as aggregator_metrics
from pipeline.observe.exporter import scheme_label, start_exporter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "aggregate",
        help="merge the workers' window states into final counts and top-k (topic results)",
        doc=__doc__,
        paragraph=1,
    )
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    add_window_argument(parser)
    parser.add_argument("--lateness-ms", type=int, default=0, help="allowed lateness (0)")
    parser.add_argument("--top-k", type=int, default=10, metavar="K", help="top keys (10)")
    add_keep_results_argument(parser)
    add_stage_arguments(parser, scheme_label=True, until_end="exit after END_OF_STREAM")
    parser.add_argument("--verbose", action="store_true", help="a line per finalized window")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from pipeline.cli.arguments import UsageError
    from pipeline.io import config, kafka_io
    from pipeline.io.redis_client import connect_redis
    from pipeline.io.state_store import StateStore
    from pipeline.stages.aggregator import (
        AggregateOptions,
        AggregateSummary,
        Aggregator,
        KafkaPublisher,
    )

    options = AggregateOptions(
        workers=args.workers,
        window_ms=args.window_ms,
        lateness_ms=args.lateness_ms,
        top_k=args.top_k,
        run_id=args.run_id,
        until_end=args.until_end,
        keep_results_s=args.keep_results_s,
    )
    try:
        options.validate()
    except ValueError as error:
        raise UsageError(str(error)) from None
    settings = config.load()
    names = kafka_io.RunNames(args.run_id, args.topic_prefix)
    kafka_io.require_kafka(settings.kafka_bootstrap)
    client = connect_redis(settings.redis_url)
    kafka_io.ensure_topic(
        settings.kafka_bootstrap, names.results_topic, 1, replication=settings.kafka_replication
    )
    try:
        publisher = KafkaPublisher(
            settings.kafka_bootstrap, names.results_topic, names.aggregate_transactional_id
        )
        aggregator = Aggregator(StateStore(client, args.run_id), options, publisher)
        aggregator.check_config()
        aggregator.resume(publisher.published_windows())
    except ValueError as error:
        client.close()
        raise UsageError(str(error)) from None
    except (KafkaException, kafka_io.KafkaIOError) as error:  # a broker gone since the check
        client.close()
        print(f"skewer aggregate: error: {names.results_topic}: {error}", file=sys.stderr)
        return 1

    def report(step: AggregateSummary) -> None:
        for window in step.finalized:
            print(f"window {window} final", file=sys.stderr)

    scheme = scheme_label(args.scheme)
    exporter = start_exporter("aggregate", args.run_id, scheme, args.metrics_port)
    if exporter.enabled:  # the aggregator's series: Redis, read at each scrape
        exporter.register(
            aggregator_metrics.AggregatorCollector(
                exporter.labels, args.workers, settings.redis_url
            )
        )
    stop_on_sigterm()
    try:
        summary = aggregator.run(on_step=report if args.verbose else None)
    except RuntimeError as error:
        print(f"skewer aggregate: error: {error}", file=sys.stderr)
        return 1
    finally:
        exporter.close()
        client.close()
    if args.json:
        print(json.dumps({"run_id": args.run_id, **vars(summary)}))
    else:
        print(
            f"aggregator: {len(summary.finalized)} window(s) finalized, "
            f"{len(summary.published)} published to {names.results_topic}"
        )
    return 0
