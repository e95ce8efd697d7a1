"""`skewer control`: the controller of routing-table schemes (scan, redist, readj, llfd, mintable,
minmig, mixed).

Every `--interval` seconds it collects the grouping sources' key statistics, measures the
imbalance against the scheme's tolerance and, when exceeded, plans a new routing table with the
simulator's code, publishes it with a version number and migrates the moved keys' window state
between workers in Redis, exactly once (see pipeline/control_plane.py). For a scheme without a
routing table it prints one line and exits 0. `--until-end` exits once every worker has seen
END_OF_STREAM and no migration runs. Exit 2 on bad arguments, 1 when Redis does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pipeline import metrics
from pipeline.commands.produce import add_run_arguments
from pipeline.commands.work import stop_on_sigterm


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "control",
        help="plan and publish routing tables, migrate key state (routing-table schemes)",
        description=__doc__.split("\n\n")[1].replace("``", "`"),
    )
    parser.add_argument(
        "--scheme",
        default=os.environ.get("GROUPING_SCHEME"),
        help="grouping scheme (default: $GROUPING_SCHEME)",
    )
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    parser.add_argument("--sources", type=int, default=1, metavar="S", help="grouping sources")
    parser.add_argument(
        "--interval", type=float, default=5.0, metavar="SECONDS", help="seconds per round (5)"
    )
    parser.add_argument(
        "--report-wait",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds a round waits for a late source's statistics (1)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a scheme parameter, e.g. theta_max=0.1 (repeatable; the same as skewer group's)",
    )
    parser.add_argument("--until-end", action="store_true", help="exit after END_OF_STREAM")
    add_run_arguments(parser)
    metrics.add_arguments(parser, scheme=False)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from operators.base import SchemeError
    from pipeline import config, kafka_io
    from pipeline.cli import UsageError
    from pipeline.commands.route import parse_params
    from pipeline.controller import Controller, ControllerError, ControllerOptions, create_planner

    if not args.scheme:
        raise UsageError("no scheme: pass --scheme or set GROUPING_SCHEME")
    for name, value in (("--workers", args.workers), ("--sources", args.sources)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    for name, value in (("--interval", args.interval), ("--report-wait", args.report_wait)):
        if not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    settings = config.load()
    options = ControllerOptions(
        scheme=args.scheme,
        workers=args.workers,
        sources=args.sources,
        run_id=args.run_id,
        redis_url=settings.redis_url,
        interval=args.interval,
        report_wait=args.report_wait,
        params=parse_params(args.param),
        until_end=args.until_end,
    )
    try:
        create_planner(options)
    except SchemeError as error:
        if "routes without a routing table" in str(error):
            print(f"skewer control: {error}")
            return 0
        raise
    try:
        client = kafka_io.connect_redis(settings.redis_url)
    except kafka_io.ServiceUnavailableError as error:
        print(f"skewer control: error: {error}", file=sys.stderr)
        return 1
    try:
        exporter = metrics.start_exporter("control", args.run_id, args.scheme, args.metrics_port)
    except metrics.MetricsError as error:
        client.close()
        raise UsageError(str(error)) from None
    stop_on_sigterm()
    try:
        telemetry = metrics.ControllerMetrics(exporter.labels)
        summary = Controller(options, client, telemetry).run()
    except ControllerError as error:
        print(f"skewer control: error: {error}", file=sys.stderr)
        return 1
    finally:
        exporter.close()
        client.close()
    if args.json:
        print(json.dumps({"run_id": args.run_id, "scheme": args.scheme, **summary.as_dict()}))
    else:
        print(
            f"controller: {sum(summary.intervals.values())} interval(s) "
            f"{summary.intervals}, {len(summary.completed)} migration(s) completed"
        )
    return 0
