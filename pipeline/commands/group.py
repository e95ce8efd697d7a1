"""`skewer group`: the grouping stage, topic ``keys`` -> topic ``work`` (partition w = worker w).

S sources, one per partition of ``keys``, each with its own scheme object; the scheme is
``--scheme``, else the environment variable ``GROUPING_SCHEME``, else ``key``. Records are
validated (bad ones go to ``dead-letters`` with a reason), routed in batches and written to
``work`` exactly once (one Kafka transaction per batch, with the consumed offset). One source
runs in this process; several run as one process each (``--source s ...`` picks some).
``--until-end`` exits once END_OF_STREAM of the source's producers is forwarded. Exit 2 on a
bad scheme, W or topic, 1 when Kafka or Redis does not answer or a source fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pipeline import metrics
from pipeline.commands.produce import add_run_arguments

#: The environment variable that names the scheme (DESIGN.md: "one environment variable").
SCHEME_VARIABLE = "GROUPING_SCHEME"
DEFAULT_SCHEME = "key"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "group",
        help="grouping stage: route topic keys into partition w of topic work, exactly once",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--scheme", help=f"grouping scheme (default: ${SCHEME_VARIABLE}, else {DEFAULT_SCHEME})"
    )
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    parser.add_argument("--sources", type=int, default=1, metavar="S", help="(default 1)")
    parser.add_argument(
        "--source", type=int, nargs="+", metavar="s", help="run only these sources (0..S-1)"
    )
    add_run_arguments(parser)
    parser.add_argument(
        "--until-end", action="store_true", help="exit after forwarding END_OF_STREAM"
    )
    parser.add_argument("--batch-size", type=int, default=20_000, help="records per transaction")
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="scheme parameter"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the scheme objects")
    parser.add_argument("--json", action="store_true", help="print one JSON summary at exit")
    metrics.add_arguments(parser, scheme=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline import config, grouping_stage, kafka_io
    from pipeline.cli import UsageError
    from pipeline.commands.route import parse_params

    scheme = args.scheme or os.environ.get(SCHEME_VARIABLE, "").strip() or DEFAULT_SCHEME
    if args.sources < 1:
        raise UsageError(f"--sources must be >= 1, got {args.sources}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    sources = sorted(set(args.source)) if args.source else list(range(args.sources))
    if any(not 0 <= s < args.sources for s in sources):
        raise UsageError(f"--source must lie in 0..{args.sources - 1}, got {args.source}")
    settings = config.load()
    stage = grouping_stage.StageConfig(
        bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        names=kafka_io.RunNames(args.run_id, args.topic_prefix),
        scheme=scheme,
        n_workers=args.workers,
        n_sources=args.sources,
        params=parse_params(args.param),
        seed=args.seed,
        batch_size=args.batch_size,
        until_end=args.until_end,
    )
    try:
        grouping_stage.prepare(stage)
        # Several sources run as child processes: they record into the exporter's
        # multiprocess folder, which it sets before they start.
        exporter = metrics.start_exporter(
            "group", args.run_id, scheme, args.metrics_port, multiprocess=len(sources) > 1
        )
        try:
            summaries = grouping_stage.run_sources(stage, sources)
        finally:
            exporter.close()
    except metrics.MetricsError as error:
        raise UsageError(str(error)) from None
    except kafka_io.ServiceUnavailableError as error:
        print(f"skewer group: error: {error}", file=sys.stderr)
        return 1
    except kafka_io.KafkaIOError as error:
        raise UsageError(str(error)) from None
    except grouping_stage.StageError as error:
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
            reason: sum(s.dead_letters[reason] for s in summaries)
            for reason in grouping_stage.REASONS
        },
        "routed": [sum(s.routed[w] for s in summaries) for w in range(args.workers)],
        "seconds": round(max((s.seconds for s in summaries), default=0.0), 3),
        "ended": all(s.ended for s in summaries),
    }
    if args.json:
        print(json.dumps(total))
    else:
        bad = sum(total["dead_letters"].values())
        print(
            f"group ({scheme}, W={args.workers}): {total['data']:,} records routed from "
            f"source(s) {', '.join(map(str, sources))}, {bad:,} dead letter(s) "
            f"{total['dead_letters']}, in {total['seconds']:.2f} s"
        )
    return 0
