"""`skewer group`: the grouping stage, topic ``keys`` -> topic ``work`` (partition w = worker w).

Layer: cli.

S sources, one per partition of ``keys``, each with its own scheme object; the scheme is
``--scheme``, else the environment variable ``GROUPING_SCHEME``, else ``key``. Records are
validated (bad ones go to ``dead-letters`` with a reason), routed in batches and written to
``work`` exactly once (one Kafka transaction per batch, with the consumed offset; a batch waits
at most ``--commit-interval-ms`` to fill up, 100 by default). One source runs in this process;
several run as one process each (``--source s ...`` picks some).
``--until-end`` exits once END_OF_STREAM of the source's producers is forwarded. Exit 2 on a
bad scheme, W or topic, 1 when Kafka or Redis does not answer or a source fails.

``--input-topic T`` reads a topic of your own instead of ``keys``: one source per partition of
T, the key and event time taken from each record (``--key``, ``--time``), the watermark from the
data (``--max-out-of-order``, ``--idle-timeout``), records later than their window's close sent
to topic ``late`` (:mod:`pipeline.stages.user_topic`). ``--until-end`` then reads what T holds
when the stage starts and exits, or up to ``--ending-offsets`` (a topic still being written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from pipeline.cli.arguments import (
    add_command,
    add_commit_interval_argument,
    add_input_topic_arguments,
    add_param_argument,
    add_scheme_argument,
    add_stage_arguments,
    add_window_argument,
)
from pipeline.observe.exporter import start_exporter

if TYPE_CHECKING:
    from pipeline.stages.user_topic import UserTopic

DEFAULT_SCHEME = "key"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "group",
        help="grouping stage: route topic keys into partition w of topic work, exactly once",
        doc=__doc__,
        paragraph=0,
    )
    add_scheme_argument(parser, DEFAULT_SCHEME)
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    parser.add_argument(
        "--sources", type=int, metavar="S", help="(default 1; with --input-topic its partitions)"
    )
    parser.add_argument(
        "--source", type=int, nargs="+", metavar="s", help="run only these sources (0..S-1)"
    )
    parser.add_argument("--batch-size", type=int, default=20_000, help="records per transaction")
    add_commit_interval_argument(parser)
    add_param_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the scheme objects")
    parser.add_argument(
        "--control-every",
        type=int,
        metavar="N",
        help="routing-table schemes: rounds every N records of all sources, each source "
        "reporting after every N/S of its own (as skewer control --every N); default: when "
        "the controller opens a round",
    )
    add_window_argument(parser, by_query=True)
    parser.add_argument(
        "--lateness-ms", type=int, default=0, help="the aggregator's allowed lateness (0)"
    )
    add_input_topic_arguments(parser)
    parser.add_argument(
        "--ending-offsets",
        metavar="O0,O1,...",
        help="with --input-topic and --until-end: end at these offsets, one per partition, "
        "instead of each partition's end when the run starts (a topic still being written)",
    )
    add_stage_arguments(parser, scheme_label=False, until_end="exit after forwarding END_OF_STREAM")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from operators.params import parse_params
    from pipeline.cli.arguments import (
        DEFAULT_WINDOW_MS,
        UsageError,
        job_from_args,
        require_at_least,
        user_topic_from_args,
        window_ms_from_args,
    )
    from pipeline.io import config, kafka_io
    from pipeline.stages import grouping

    require_at_least(1, ("--commit-interval-ms", args.commit_interval_ms))
    scheme = config.resolve_scheme(args.scheme, DEFAULT_SCHEME)
    settings = config.load()
    job = job_from_args(args)
    args.window_ms = window_ms_from_args(
        args, job, "--window-ms", args.window_ms, DEFAULT_WINDOW_MS
    )
    user_topic = user_topic_from_args(
        args, window_ms=args.window_ms, lateness_ms=args.lateness_ms, job=job
    )
    if args.sources is None:
        args.sources = 1
        if user_topic is not None:
            kafka_io.require_kafka(settings.kafka_bootstrap)
            partitions = kafka_io.topic_partitions(settings.kafka_bootstrap, user_topic.topic)
            if partitions is None:
                raise UsageError(f"--input-topic {user_topic.topic}: no such topic")
            args.sources = partitions
    require_at_least(1, ("--sources", args.sources), ("--batch-size", args.batch_size))
    if args.control_every is not None:
        require_at_least(1, ("--control-every", args.control_every))
    if args.ending_offsets is not None:
        user_topic = with_ending_offsets(user_topic, args.ending_offsets, args.sources)
    sources = sorted(set(args.source)) if args.source else list(range(args.sources))
    if any(not 0 <= s < args.sources for s in sources):
        raise UsageError(f"--source must lie in 0..{args.sources - 1}, got {args.source}")
    stage = grouping.StageConfig(
        bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        names=kafka_io.RunNames(args.run_id, args.topic_prefix),
        scheme=scheme,
        n_workers=args.workers,
        n_sources=args.sources,
        params=parse_params(args.param),
        seed=args.seed,
        batch_size=args.batch_size,
        commit_interval_ms=args.commit_interval_ms,
        control_every=args.control_every,
        until_end=args.until_end,
        input=user_topic,
        replication=settings.kafka_replication,
    )
    try:
        grouping.prepare(stage)
        # Several sources run as child processes: they record into the exporter's
        # multiprocess folder, which it sets before they start.
        exporter = start_exporter(
            "group", args.run_id, scheme, args.metrics_port, multiprocess=len(sources) > 1
        )
        try:
            summaries = grouping.run_sources(stage, sources)
        finally:
            exporter.close()
    except grouping.StageError as error:
        print(f"skewer group: error: {error}", file=sys.stderr)
        return 1
    total = {
        "scheme": scheme,
        "workers": args.workers,
        "sources": sources,
        "records": sum(s.records for s in summaries),
        "data": sum(s.data for s in summaries),
        "watermarks": sum(s.watermarks for s in summaries),
        "dead_letters": {
            reason: sum(s.dead_letters[reason] for s in summaries) for reason in grouping.REASONS
        },
        "routed": [sum(s.routed[w] for s in summaries) for w in range(args.workers)],
        "late": sum(s.late for s in summaries),
        "seconds": round(max((s.seconds for s in summaries), default=0.0), 3),
        "ended": all(s.ended for s in summaries),
        # Sources whose process the stage started again (stuck in librdkafka): their counts
        # above are their last process's.
        "source_restarts": sum(s.restarts for s in summaries),
    }
    if args.json:
        print(json.dumps(total))
    else:
        bad = sum(total["dead_letters"].values())
        print(
            f"group ({scheme}, W={args.workers}): {total['data']:,} records routed from "
            f"source(s) {', '.join(map(str, sources))}, {bad:,} dead letter(s) "
            f"{total['dead_letters']}, {total['late']:,} late, in {total['seconds']:.2f} s"
        )
    return 0


def with_ending_offsets(topic: UserTopic | None, listed: str, sources: int) -> UserTopic:
    """``topic`` ending at ``--ending-offsets`` (one per partition); UsageError with one line
    for a list of other length or of anything but offsets, or without ``--input-topic``."""
    from pipeline.cli.arguments import UsageError

    if topic is None:
        raise UsageError("--ending-offsets needs --input-topic")
    try:
        offsets = tuple(int(word) for word in listed.split(","))
    except ValueError:
        raise UsageError(f"--ending-offsets {listed!r}: not a list of offsets") from None
    if len(offsets) != sources:
        raise UsageError(
            f"--ending-offsets gives {len(offsets)} offset(s) for {sources} partition(s)"
        )
    ending = dataclasses.replace(topic, ending_offsets=offsets)
    try:
        ending.validate()
    except ValueError as error:
        raise UsageError(str(error)) from None
    return ending
