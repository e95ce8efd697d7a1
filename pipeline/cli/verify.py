"""`skewer verify`: is a run exact? Its final counts against the producers' ground truth, or
(``--recount``) against a Spark batch recount of the user's topic it read.

Layer: cli.

``skewer verify --run-id R`` compares every final (key, window) count of run R with the
ground truth skewer's producers recorded (:mod:`pipeline.runs.verify`). A run on a topic of
your own (``--input-topic``) has none: ``--recount`` recounts that topic, with the extractor,
windows and offsets the run used, in one Spark batch query, leaves out the records the run sent
to its ``late`` topic, and compares (:mod:`pipeline.runs.recount`). Exit 0 if exact, 1 if not
(or a service does not answer), 2 for a run that does not exist or read no topic of its own.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.cli.arguments import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "verify",
        help="check a run's final counts: against the ground truth, or a recount of its topic",
        doc=__doc__,
        paragraph=1,
    )
    parser.add_argument("--run-id", required=True, help="the run to check")
    parser.add_argument(
        "--recount", action="store_true", help="recount the run's input topic with Spark"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.cli.arguments import UsageError
    from pipeline.io import config, kafka_io
    from pipeline.io.redis_client import connect_redis
    from pipeline.io.state_store import StateStore

    settings = config.load()
    client = connect_redis(settings.redis_url)
    store = StateStore(client, args.run_id)
    if not store.final_windows() and not store.any_applied(1):
        raise UsageError(f"run {args.run_id!r} has no results in Redis")
    if args.recount:
        from pipeline.io.spark_session import build_spark_session
        from pipeline.runs.recount import verify_recount
        from pipeline.stages.user_topic import recorded

        found = recorded(client, args.run_id)
        if found is None:
            raise UsageError(
                f"run {args.run_id!r} read no topic of its own (--input-topic): nothing to "
                "recount; drop --recount to check it against its producers' ground truth"
            )
        user_topic, prefix = found
        kafka_io.require_kafka(settings.kafka_bootstrap)
        spark = build_spark_session("skewer-recount", settings=settings)
        try:
            verification = verify_recount(
                spark,
                store,
                settings.kafka_bootstrap,
                kafka_io.RunNames(args.run_id, prefix),
                user_topic,
            )
        finally:
            spark.stop()
    else:
        from pipeline.runs.verify import verify_run

        verification = verify_run(store)
    if args.json:
        print(json.dumps(verification.as_dict()))
    else:
        print("\n".join(verification.lines()))
    sys.stdout.flush()
    return 0 if verification.exact else 1
