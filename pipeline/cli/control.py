"""`skewer control`: the controller of routing-table schemes (scan, redist, readj, llfd, mintable,
minmig, mixed).

Layer: cli.

Every `--interval` seconds (or, with `--every N`, every N records the grouping stage, run with
`--control-every N`, routes) it collects the grouping sources' key statistics, measures the
imbalance against the scheme's tolerance and, when exceeded, plans a new routing table with the
simulator's code, publishes it with a version number and migrates the moved keys' window state
between workers in Redis, exactly once (see pipeline/stages/control_plane.py). For a scheme
without a routing table it prints one line and exits 0. `--until-end` exits once every worker
has seen END_OF_STREAM and no migration runs. Exit 2 on bad arguments, 1 when Redis does not answer.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.cli.arguments import (
    add_command,
    add_param_argument,
    add_scheme_argument,
    add_stage_arguments,
    stop_on_sigterm,
)
from pipeline.observe import controller as controller_metrics
from pipeline.observe.exporter import start_exporter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "control",
        help="plan and publish routing tables, migrate key state (routing-table schemes)",
        doc=__doc__,
        paragraph=1,
    )
    add_scheme_argument(parser, default=None)
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    parser.add_argument("--sources", type=int, default=1, metavar="S", help="grouping sources")
    parser.add_argument(
        "--interval", type=float, default=5.0, metavar="SECONDS", help="seconds per round (5)"
    )
    parser.add_argument(
        "--every",
        type=int,
        metavar="N",
        help="rounds every N records instead of every --interval: each source reports after "
        "every N/S of its records (skewer group --control-every N)",
    )
    parser.add_argument(
        "--report-wait",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds a round waits for a late source's statistics (1)",
    )
    add_param_argument(parser)
    add_stage_arguments(parser, scheme_label=False, until_end="exit after END_OF_STREAM")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from operators.base import SchemeError
    from operators.params import parse_params
    from pipeline.cli.arguments import UsageError, require_at_least
    from pipeline.io import config
    from pipeline.io.redis_client import connect_redis
    from pipeline.stages.controller import (
        Controller,
        ControllerError,
        ControllerOptions,
        create_planner,
    )

    scheme = config.resolve_scheme(args.scheme, default="")
    if not scheme:
        raise UsageError(f"no scheme: pass --scheme or set {config.SCHEME_VARIABLE}")
    require_at_least(1, ("--workers", args.workers), ("--sources", args.sources))
    if args.every is not None:
        require_at_least(1, ("--every", args.every))
    for name, value in (("--interval", args.interval), ("--report-wait", args.report_wait)):
        if not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    settings = config.load()
    options = ControllerOptions(
        scheme=scheme,
        workers=args.workers,
        sources=args.sources,
        run_id=args.run_id,
        redis_url=settings.redis_url,
        interval=args.interval,
        every=args.every,
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
    client = connect_redis(settings.redis_url)
    exporter = start_exporter("control", args.run_id, scheme, args.metrics_port)
    stop_on_sigterm()
    try:
        telemetry = controller_metrics.ControllerMetrics(exporter.labels)
        summary = Controller(options, client, telemetry).run()
    except ControllerError as error:
        print(f"skewer control: error: {error}", file=sys.stderr)
        return 1
    finally:
        exporter.close()
        client.close()
    if args.json:
        print(json.dumps({"run_id": args.run_id, "scheme": scheme, **summary.as_dict()}))
    else:
        print(
            f"controller: {sum(summary.intervals.values())} interval(s) "
            f"{summary.intervals}, {len(summary.completed)} migration(s) completed"
        )
    return 0
